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
import json
import re
import statistics
from typing import Callable, Sequence

from app.core.analysis.community_cells import (MAX_CELL, MAX_LINE, MAX_ROWS, RANGES, BadFigure, acceptance,
                                               check_text, clean, figure, in_range, read_table_text, shown,
                                               speedup_figure, split_row)
from app.core.common.errors import UserError
from app.core.common.resources import resource
from app.core.common.units import ratio

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

# a |---|:---:| line, stripped (no run of spaces can be matched two ways: linear in its length)
_SEPARATOR = re.compile(r"\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?")
_BUILD = re.compile(r"\bb\d{3,5}\b")
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
    """The header's index of the first table whose columns name a baseline, with its cells (a
    line longer than MAX_LINE is no table line)."""
    first = None
    for i in range(1, len(lines)):
        if "|" not in lines[i - 1] or len(lines[i]) > MAX_LINE or len(lines[i - 1]) > MAX_LINE \
                or not _SEPARATOR.fullmatch(lines[i].strip()):
            continue
        head = [clean(c).lower() if len(c) <= MAX_CELL else "" for c in split_row(lines[i - 1])]
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
    """The first table in ``text`` with a baseline column; a TableError naming the line otherwise
    (a row whose figure is too long, not finite or implausible included: see community_cells)."""
    check_text(text, source)
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
    rows: list[CommunityRow] = []
    notes = []
    used = set(col.values())  # only these cells are read (a contributor's links are not)
    for n in range(h + 2, len(lines)):
        if not lines[n].strip() or "|" not in lines[n]:
            break
        if len(rows) == MAX_ROWS:
            notes.append(f"only the first {MAX_ROWS:,} rows are read (line {n + 1} on is left out)")
            break
        if len(lines[n]) > MAX_LINE:
            raise TableError(source, n + 1, f"{len(lines[n]):,} characters, more than the {MAX_LINE:,} a table "
                             "line may have")
        cells = split_row(lines[n])
        if len(cells) != len(head):
            raise TableError(source, n + 1, f"{len(cells)} cells where the header (line {h + 1}) has {len(head)}: "
                             "a | missing or one too many (a | inside a cell is written \\|)")
        for j in used:
            if len(cells[j]) > MAX_CELL:
                raise TableError(source, n + 1, f"the {head[j]!r} cell has {len(cells[j]):,} characters, more than "
                                 f"the {MAX_CELL} a cell may have")
        rows.append(_row(n + 1, [clean(c) if j in used else "" for j, c in enumerate(cells)], col, head, source))
    if not rows:
        raise TableError(source, h + 1, "the table has a header but no rows")
    if "reps" not in col:
        notes.append("the table does not say how many repetitions each row had")
    if "parallel" not in col:
        notes.append("the table has no -np column: only rows that write -np N or --parallel N are checked")
    return CommunityTable(tuple(rows), tuple((k, head[j]) for k, j in col.items()),
                          tuple(head[j] for j in range(len(head)) if j not in col.values()), tuple(notes))


_WHAT = {"baseline": "a speed", "spec": "a speed",
         "speedup": "a speedup", "acceptance": "an acceptance", "n_max": "an n-max", "p_min": "a p-min",
         "reps": "a count of repetitions", "parallel": "a count of slots"}


def _row(line: int, cells: list[str], col: dict[str, int], head: list[str], source: str) -> CommunityRow:
    def get(key: str) -> str:
        return cells[col[key]] if key in col else ""

    def bad(key: str, why: str = "") -> TableError:
        return TableError(source, line, f"{head[col[key]]!r} is {shown(get(key))!r}, not {_WHAT[key]}"
                          + (f": {why}" if why else " (a number above 0)"))

    def num(key: str, parse: Callable[[str], float | None] = figure) -> float | None:
        """The cell's figure, held to its plausible range; None when it has none."""
        try:
            v = parse(get(key))
            return None if v is None else in_range(key, v)
        except BadFigure as e:
            raise bad(key, str(e)) from None

    def speed(key: str) -> float:
        v = num(key)
        if v is None:
            raise bad(key)
        return v

    base = speed("baseline")  # the header has the column (_find_header)
    # the speculative tok/s: required without a speedup column, else it may be left blank
    blank = get("spec") in ("", "-", "—", "–")
    spec = speed("spec") if "spec" in col and not ("speedup" in col and blank) else None
    try:
        sp = speedup_figure(get("speedup"))
    except BadFigure as e:
        raise bad("speedup", str(e)) from None
    sp = sp if sp else (spec / base if spec else None)
    if sp is None:
        raise TableError(source, line, f"neither a speculative tok/s nor a speedup ({shown(get('speedup'))!r})")
    try:
        in_range("speedup", sp)
    except BadFigure as e:
        raise (bad("speedup", str(e)) if get("speedup") else
               TableError(source, line, f"the speedup from its tok/s: {e}")) from None
    whole = " ".join(cells)
    build = get("build") or (m.group() if (m := _BUILD.search(whole)) else "")
    reps = int(r) if (r := num("reps")) is not None else None
    par = num("parallel")
    if par is None and (m := _NP.search(whole)):
        par = float(m.group(1)) if len(m.group(1)) <= 6 else RANGES["parallel"][1]  # long: many, surely
    flags = []
    if "reps" in col and (reps is None or reps <= 1):
        flags.append(NO_REPS)
    if par is not None and par > 1:
        flags.append(PARALLEL)
    if not build.strip(" -—"):
        flags.append(NO_BUILD)
    device = get("device") or "?"
    n_max = num("n_max")
    return CommunityRow(line, device, base, spec, sp,
                        int(n_max) if n_max is not None else None, num("p_min"), num("acceptance", acceptance),
                        build.strip() or None, reps, int(par) if par is not None else None, bandwidth_of(device),
                        tuple(flags))


def load_table(path: str) -> CommunityTable:
    """parse_table of a file (community_cells.read_table_text: a regular file, bounded); a
    UserError naming the file when it cannot be read."""
    return parse_table(read_table_text(path), path)


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
    x_of: Callable[[CommunityRow], float | None] = \
        (lambda r: r.bandwidth_gbs) if axis == "bandwidth" else (lambda r: r.baseline)
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
    elif good and ux:  # ux is there when user is
        lines.append(f"your speedup {ratio(speedup)} is above {below} of {len(good)} unflagged rows "
                     f"({100 * below / len(good):.0f} %)")
        near = [p[1] for p in good if abs(p[0] - ux) <= 0.25 * ux]
        if near:
            what = f"memory bandwidth ({ux:g} GB/s)" if axis == "bandwidth" else f"baseline ({ux:.1f} tok/s)"
            lines.append(f"the {len(near)} unflagged row(s) within 25 % of your {what} have a median "
                         f"speedup of {ratio(statistics.median(near))}")
    lines += list(table.notes)
    if len(points) < len(table.rows):
        lines.append(f"{len(table.rows) - len(points)} row(s) not on the plot (no "
                     + ("known memory bandwidth for their device)" if axis == "bandwidth" else "baseline)"))
    return Standing(name, points, user, below, len(good), "\n".join(lines))


def _flag_counts(rows: Sequence[CommunityRow]) -> str:
    counts = {f: sum(1 for r in rows if f in r.flags) for f in (NO_REPS, PARALLEL, NO_BUILD)}
    return ", ".join(f"{f}: {n}" for f, n in counts.items() if n) or "none"
