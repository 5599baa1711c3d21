"""Your machine among others: a community results table (Markdown, pasted or from a file), its rows
flagged where they were measured in a way this tool does not trust, and where a result stands
among them.

    table = parse_table(text, source="README.md")   # a TableError (a UserError) naming the line
    table.rows[0].speedup, table.rows[0].flags, table.notes
    s = place(table, speedup=1.48, baseline=41.2, device="NVIDIA GeForce RTX 3090")
    s.axis, s.points, s.user, s.text

Columns are matched by their header's name (``ALIASES``: the community's "Card / Baseline / With
flag / n-max / Acceptance" as well as the result card's own columns); others are ignored. Each
row needs a baseline tok/s and a speculative tok/s or a speedup. A row is flagged when it says it
had no repetitions, ran with more than one slot (-np > 1: the speculative gain shrinks and the
baseline reads low), or names no llama.cpp build."""

from __future__ import annotations

import dataclasses
import functools
import html
import json
import re
import statistics
from typing import Sequence

from app.core.common.errors import UserError
from app.core.common.resources import resource

ALIASES = {
    "device": ("gpu/cpu", "gpu", "card", "device", "hardware", "gpu / cpu", "machine"),
    "backend": ("backend",),
    "vram": ("vram", "memory"),
    "model": ("model",),
    "quant": ("quant", "quantization"),
    "build": ("build", "llama.cpp build", "llama build", "llama.cpp"),
    "mode": ("mode", "spec type", "spec-type"),
    "n_max": ("n-max", "nmax", "n_max", "k", "draft n-max"),
    "p_min": ("p-min", "pmin", "p_min"),
    "baseline": ("baseline", "baseline tok/s", "base tok/s", "baseline (tok/s)"),
    "spec": ("with flag", "mtp tok/s", "best tok/s", "mtp", "with mtp", "spec tok/s", "mtp (tok/s)"),
    "acceptance": ("acceptance", "accept", "acceptance rate"),
    "speedup": ("speedup", "speedup [ci]", "speed-up", "gain"),
    "task": ("task",),
    "tokens": ("tokens", "n_predict"),
    "reps": ("reps", "runs", "repetitions"),
    "parallel": ("-np", "np", "parallel", "--parallel", "slots"),
}
_BY_HEADER = {h: key for key, names in ALIASES.items() for h in names}
NO_REPS, PARALLEL, NO_BUILD = "no repetitions", "-np > 1", "no build"

_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_TAG = re.compile(r"<[^>]*>")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_NUM = re.compile(r"\d+(?:\.\d+)?")
_RANGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*[-–—]\s*(\d+(?:\.\d+)?)")
_BUILD = re.compile(r"\bb\d{3,5}\b")
_PCT = re.compile(r"([+\-−]?)\s*(\d+(?:\.\d+)?)\s*%")  # a gain written as "+33 %"
_MARKUP = re.compile(r"[<&\[*`\\]|__")
_APPLE = re.compile(r"\b(m\d+(?:\s+(?:pro|max|ultra))?)\b")
_NP = re.compile(r"(?:--parallel|-np)\s*=?\s*(\d+)")


class TableError(UserError):
    """A table that cannot be read, with the line it went wrong on."""

    def __init__(self, source: str, line: int, message: str):
        super().__init__(f"{source}, line {line}: {message}")
        self.line = line


@dataclasses.dataclass(frozen=True)
class CommunityRow:
    line: int  # in the text it came from
    device: str
    baseline: float  # tok/s without speculation
    spec: float | None  # tok/s with it
    speedup: float  # spec / baseline, or the table's own figure
    n_max: int | None
    p_min: float | None
    acceptance: float | None  # one figure; None for a range
    build: str | None
    reps: int | None
    parallel: int | None
    bandwidth_gbs: float | None  # the device's peak memory bandwidth, by its name (bandwidth table)
    flags: tuple[str, ...]  # why it is not to be trusted (NO_REPS, PARALLEL, NO_BUILD); () when fine

    @property
    def reliable(self) -> bool:
        return not self.flags


@dataclasses.dataclass(frozen=True)
class CommunityTable:
    rows: tuple[CommunityRow, ...]
    columns: tuple[tuple[str, str], ...]  # (field, the header as the table writes it)
    ignored: tuple[str, ...]  # headers matched to nothing
    notes: tuple[str, ...]  # what the table as a whole does not say


@functools.lru_cache(maxsize=1 << 16)  # a table repeats its cells (backends, quants, n-max)
def clean(cell: str) -> str:
    """A cell's text: HTML tags out (a <br> is a space), entities decoded, Markdown emphasis,
    code and links reduced to their text."""
    if not _MARKUP.search(cell):  # most cells: plain text
        return " ".join(cell.split())
    s = _TAG.sub(" ", cell.replace("\\|", "|"))
    s = _LINK.sub(r"\1", html.unescape(s))
    return " ".join(s.replace("**", "").replace("`", "").replace("__", "").split()).strip("* ")


def split_row(line: str) -> list[str]:
    """The cells of a table line ("| a | b |" or "a | b"); an escaped \\| stays in its cell."""
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return [c.strip() for c in (re.split(r"(?<!\\)\|", s) if "\\|" in s else s.split("|"))]


@functools.lru_cache(maxsize=1 << 16)  # a table repeats its cells (backends, quants, n-max)
def _number(text: str) -> float | None:
    """The figure of a cell: "41.3", "**108.7**", "28.7 *", "47.8 avg (36.6-53.8)" (its first
    number), "10.5-11.1" (a range: its middle); None when it has none."""
    m = _RANGE.match(text)
    if m:
        return (float(m.group(1)) + float(m.group(2))) / 2
    m = _NUM.search(text)
    return float(m.group()) if m else None


@functools.lru_cache(maxsize=1 << 16)  # a table repeats its cells (backends, quants, n-max)
def _acceptance(text: str) -> float | None:
    """One acceptance figure: "0.78", "78 %", or a range's stated aggregate ("0.47-0.90 (0.73)",
    "0.19-0.85 (0.48 aggregate)"); None for a bare range or nothing."""
    m = re.search(r"\((\d+(?:\.\d+)?)\s*(?:aggregate|avg)?\)", text) or re.search(r"(\d+(?:\.\d+)?)\s*(?:aggregate|avg)", text)
    if m is None and not _RANGE.match(text):
        m = _NUM.search(text)
    if m is None:
        return None
    v = float(m.group(1) if m.groups() else m.group())
    return v / 100 if v > 1 else v


@functools.lru_cache(maxsize=1)
def _bandwidths() -> tuple[tuple[tuple[str, float], ...], dict[str, float]]:
    """(GPU names with their GB/s, longest name first; Apple chips' GB/s by "m3 ultra") from
    resources/bandwidth.json."""
    try:
        t = json.loads(resource("bandwidth.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return (), {}
    gpus = sorted(((k.lower(), float(v)) for k, v in t.get("gpus", {}).items()), key=lambda kv: -len(kv[0]))
    return tuple(gpus), {k.lower(): float(v["*"]) for k, v in t.get("apple", {}).items() if "*" in v}


@functools.lru_cache(maxsize=8192)
def bandwidth_of(device: str) -> float | None:
    """A device's peak memory bandwidth in GB/s by its name, as hardware.bandwidth_by_name matches
    it (the longest table name inside it), or an Apple chip's ("M3 Ultra"); None if unknown."""
    low = device.lower()
    gpus, apple = _bandwidths()
    for key, gbs in gpus:
        if key in low:
            return gbs
    m = _APPLE.search(low)
    return apple.get(" ".join(m.group(1).split())) if m else None


def _find_header(lines: list[str], source: str) -> tuple[int, list[str]]:
    """The header's index of the first table whose columns name a baseline, with its cells."""
    first = None
    for i in range(1, len(lines)):
        if not _SEPARATOR.match(lines[i]) or "|" not in lines[i - 1]:
            continue
        head = [clean(c).lower() for c in split_row(lines[i - 1])]
        if "baseline" in {_BY_HEADER.get(h) for h in head}:
            return i - 1, head
        first = i - 1 if first is None else first
    if first is not None:
        raise TableError(source, first + 1, "this table has no baseline column (a header named Baseline or "
                         "baseline tok/s), so it cannot be placed against")
    row = next((i for i, ln in enumerate(lines) if ln.strip().startswith("|")), None)
    if row is not None:
        raise TableError(source, row + 1, "a table row without a header: a Markdown table starts with a header "
                         "line and a |---|---| line under it")
    raise TableError(source, 1, "no Markdown table found (rows of cells between | marks, under a header line "
                     "and a |---|---| line)")


def parse_table(text: str, source: str = "table") -> CommunityTable:
    """The first table in ``text`` with a baseline column; a TableError naming the line otherwise."""
    lines = text.splitlines()
    h, head = _find_header(lines, source)
    col: dict[str, int] = {}
    for j, name in enumerate(head):
        key = _BY_HEADER.get(name)
        if key is not None and key not in col:
            col[key] = j
    if "spec" not in col and "speedup" not in col:
        raise TableError(source, h + 1, "the header has no speculative tok/s column (With flag, MTP tok/s, best "
                         "tok/s) and no speedup column")
    rows = []
    used = set(col.values())  # only these cells are read (a contributor's links are not)
    for n in range(h + 2, len(lines)):
        if not lines[n].strip():
            break
        if "|" not in lines[n]:
            break
        cells = split_row(lines[n])
        if len(cells) != len(head):
            raise TableError(source, n + 1, f"{len(cells)} cells where the header (line {h + 1}) has {len(head)}: "
                             "a | missing or one too many (a | inside a cell is written \\|)")
        rows.append(_row(n + 1, [clean(c) if j in used else "" for j, c in enumerate(cells)], col, head, source))
    if not rows:
        raise TableError(source, h + 1, "the table has a header but no rows")
    notes = []
    if "reps" not in col:
        notes.append("the table does not say how many repetitions each row had")
    if "parallel" not in col:
        notes.append("the table has no -np column: only rows that write -np N or --parallel N are checked")
    return CommunityTable(tuple(rows), tuple((k, head[j]) for k, j in col.items()),
                          tuple(head[j] for j in range(len(head)) if j not in col.values()), tuple(notes))


def _row(line: int, cells: list[str], col: dict[str, int], head: list[str], source: str) -> CommunityRow:
    def get(key: str) -> str:
        return cells[col[key]] if key in col else ""

    def speed(key: str, required: bool) -> float | None:
        if key not in col or (not required and get(key) in ("", "-", "—", "–")):
            return None
        v = _number(get(key))
        if v is None or v <= 0:
            raise TableError(source, line, f"{head[col[key]]!r} is {get(key)!r}, not a speed (a number above 0)")
        return v

    base = speed("baseline", True)
    spec = speed("spec", "speedup" not in col)
    text = get("speedup")
    pct = _PCT.search(text)
    sp = 1 + float(pct.group(2)) / 100 * (-1 if pct.group(1) in ("-", "−") else 1) if pct else _number(text)
    speedup = sp if sp else (spec / base if spec else None)  # type: ignore[operator]
    if speedup is None:
        raise TableError(source, line, f"neither a speculative tok/s nor a speedup ({text!r})")
    whole = " ".join(cells)
    build = get("build") or (m.group() if (m := _BUILD.search(whole)) else "")
    reps = int(r) if (r := _number(get("reps"))) is not None else None
    par = _number(get("parallel"))
    if par is None and (m := _NP.search(whole)):
        par = float(m.group(1))
    flags = []
    if "reps" in col and (reps is None or reps <= 1):
        flags.append(NO_REPS)
    if par is not None and par > 1:
        flags.append(PARALLEL)
    if not build.strip(" -—"):
        flags.append(NO_BUILD)
    device = get("device") or "?"
    n_max = _number(get("n_max"))
    p_min = _number(get("p_min"))
    return CommunityRow(line, device, base, spec, speedup,  # type: ignore[arg-type]
                        int(n_max) if n_max is not None else None, p_min, _acceptance(get("acceptance")),
                        build.strip() or None, reps, int(par) if par is not None else None, bandwidth_of(device),
                        tuple(flags))


def load_table(path: str) -> CommunityTable:
    """parse_table of a file; a UserError naming the file when it cannot be read."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except FileNotFoundError:
        raise UserError(f"{path}: community table not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the community table ({e})") from None
    return parse_table(text, path)


BANDWIDTH, BASELINE = "memory bandwidth (GB/s)", "baseline tok/s"


@dataclasses.dataclass(frozen=True)
class Standing:
    """Where a result stands in a table: the plot's points (x, speedup, reliable, device) on
    ``axis``, the user's (x, speedup, label), and the same in words."""

    axis: str
    points: tuple[tuple[float, float, bool, str], ...]
    user: tuple[float, float, str] | None
    below: int  # reliable rows with a lower speedup than the user's
    reliable: int  # reliable rows on the plot
    text: str


def place(table: CommunityTable, speedup: float | None, baseline: float | None, device: str,
          label: str = "you", axis: str = "auto") -> Standing:
    """The user's result (speedup over baseline tok/s, on ``device``) among the table's rows, against
    memory bandwidth when the user's device and most rows have one ("auto"), else baseline tok/s."""
    bw = bandwidth_of(device)
    with_bw = sum(1 for r in table.rows if r.bandwidth_gbs)
    if axis == "auto":
        axis = "bandwidth" if bw and with_bw >= len(table.rows) / 2 else "baseline"
    name = BANDWIDTH if axis == "bandwidth" else BASELINE
    x_of = (lambda r: r.bandwidth_gbs) if axis == "bandwidth" else (lambda r: r.baseline)
    points = tuple((x, r.speedup, r.reliable, r.device) for r in table.rows if (x := x_of(r)))
    ux = bw if axis == "bandwidth" else baseline
    user = (ux, speedup, label) if ux and speedup else None
    good = [p for p in points if p[2]]
    below = sum(1 for p in good if speedup is not None and p[1] < speedup)
    lines = [f"{len(table.rows)} rows; {len(table.rows) - sum(r.reliable for r in table.rows)} flagged "
             f"({_flag_counts(table.rows)}): hollow in the plot"]
    if user is None:
        lines.append(f"your result has no {'memory bandwidth (GPU not in the bandwidth table)' if axis == 'bandwidth' else 'baseline'}: "
                     "not placed")
    elif good:
        lines.append(f"your speedup {speedup:.2f}x is above {below} of {len(good)} unflagged rows "
                     f"({100 * below / len(good):.0f} %)")
        near = [p[1] for p in good if abs(p[0] - ux) <= 0.25 * ux]  # type: ignore[operator]
        if near:
            what = f"memory bandwidth ({ux:g} GB/s)" if axis == "bandwidth" else f"baseline ({ux:.1f} tok/s)"
            lines.append(f"the {len(near)} unflagged row(s) within 25 % of your {what} have a median "
                         f"speedup of {statistics.median(near):.2f}x")
    lines += list(table.notes)
    if len(points) < len(table.rows):
        lines.append(f"{len(table.rows) - len(points)} row(s) not on the plot (no "
                     + ("known memory bandwidth for their device)" if axis == "bandwidth" else "baseline)"))
    return Standing(name, points, user, below, len(good), "\n".join(lines))


def _flag_counts(rows: Sequence[CommunityRow]) -> str:
    counts = {f: sum(1 for r in rows if f in r.flags) for f in (NO_REPS, PARALLEL, NO_BUILD)}
    return ", ".join(f"{f}: {n}" for f, n in counts.items() if n) or "none"
