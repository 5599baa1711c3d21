"""The result card: what a user shares of a sweep, built from an allow-list of its fields, so
nothing private goes out (no paths, no user or host names). Three renderings of one ``Card``:

    card = card_of(records)                 # one sweep's runs (analysis optional)
    markdown_row(card)                      # the community's table columns (COLUMNS), one row per task
    card_json(card); card_from_json(text)   # the JSON block; round-trips to an equal Card
    # the PNG: app.drawing.card_png.render_card(card) (Qt, offscreen)

Only file names of the model and drafter go out (the user sees exactly what is shared before it is
copied or saved), the OS by its family ("Linux"), the GPU by its driver's name; the user's and the
machine's names are taken out of the file names and build text (``scrub``)."""

from __future__ import annotations

import dataclasses
import getpass
import json
import re
import socket
import statistics
from pathlib import PurePath
from typing import Any, Iterable, Sequence, TypeVar, cast

from app.core.analysis.compare import server_flags, threads_text
from app.core.analysis.analysis import Analysis, analyze
from app.core.analysis.recommend import parse_mix
from app.core.analysis.stats import Ratio, combine_ratios
from app.core.analysis.watched import WatchSeen, format_seen, newest
from app.core.common.errors import UserError
from app.core.common import jsonsafe
from app.core.common.gpus import is_gpu_vendor
from app.core.common.text import file_name, printable
from app.core.common.units import in_unit, ratio
from app.core.engines.backend_truth import Placement
from app.core.machine.hub import QUANT_RE, SPLIT_RE
from app.core.records.arm import Arm
from app.core.records.rpc import link_text
from app.core.records.schema import RunRecord
from app.core.records.watch import WatchRecord
from app.core.analysis.disturbed import disturbance
from app.core.analysis.placement import FEWER_LAYERS, ON_CPU
from app.core.verdict.verdict import gpu_finding

CARD_SCHEMA = "mtp-tuner-card/1"
ALL_TASKS = "all tasks"
COLUMNS = ("GPU/CPU", "backend", "VRAM", "model", "quant", "build", "mode", "n-max", "p-min", "baseline tok/s",
           "best tok/s", "acceptance", "speedup [CI]", "task", "tokens", "reps")
METHOD = ("paired, interleaved runs (each speculative run against the baseline run of the same prompt next to "
          "it); speedup: geometric mean of the paired ratios with a 95 % t interval; -np 1")


@dataclasses.dataclass(frozen=True)
class CardRow:
    """The best speculative arm of one task (or of all tasks at equal weight): the fastest that is
    reliably faster, else the best estimate; mode "-" when none was measured."""

    task: str
    mode: str
    n_max: int | None
    p_min: float | None
    drafter: str | None  # the drafter's file name (no folder)
    baseline_tok_s: float | None
    best_tok_s: float | None
    acceptance: float | None
    speedup: float | None
    lo: float | None
    hi: float | None
    verdict: str
    pairs: int
    reps: int


@dataclasses.dataclass(frozen=True)
class CardCell:
    """One speculative arm in one task: the PNG's points."""

    task: str
    arm: str  # its label: "K=2", "draft-simple K=3", "ngram-mod"
    speedup: float | None
    lo: float | None
    hi: float | None
    verdict: str
    acceptance: float | None
    tok_s: float | None


@dataclasses.dataclass(frozen=True)
class Card:
    device: str  # the GPU's name, or "CPU (x86_64, 16 threads)"
    backend: str
    vram_gb: float | None
    model: str
    quant: str
    build: str
    engine: str
    os: str  # the family only: Linux, Windows, macOS
    tokens: int
    temperature: float | None
    date: str  # the day of the last run (UTC)
    rows: tuple[CardRow, ...]
    cells: tuple[CardCell, ...]
    warnings: tuple[str, ...] = ()
    method: str = METHOD
    schema: str = CARD_SCHEMA
    watch: tuple[WatchSeen, ...] = ()  # from the user's own use: the newest watch window per server and model
    server_flags: str = ""  # the user's own llama-server flags measured with ("with -fa on ..."; "": the tuner's)
    # the RPC workers the model was split over, never where they are ("over 2 RPC workers, round
    # trip 0.3 ms"; records.rpc.link_text); "": this machine only
    link: str = ""
    # the CPU threads llama.cpp ran with ("2 threads"; several counts joined: "1, 2 threads"; "":
    # not recorded, older files)
    threads: str = ""


def _private_names() -> list[str]:
    """This user's and this machine's names (3 characters or more), to take out of free text."""
    out = []
    for get in (getpass.getuser, socket.gethostname, lambda: socket.gethostname().split(".")[0]):
        try:
            name = get()
        except (OSError, KeyError, ImportError):  # no user database entry, no network name
            continue
        if name and len(name) >= 3:
            out.append(name)
    return out


_WRAPPED_RE = re.compile(r"^([(\[{<\"'`]*)(.*?)([)\]}>\"'`,;:.!?]*)$", re.S)


def _last_part(word: str) -> str:
    """A path-like word's last part, with the brackets, quotes and punctuation around it kept:
    "(/home/u/results):" -> "(results):"."""
    m = _WRAPPED_RE.match(word)
    assert m is not None  # every string matches
    lead, core, trail = m.groups()
    return lead + (file_name(core) if core else "") + trail


def scrub(text: str, names: Sequence[str]) -> str:
    """``text`` without folders (each path-like word keeps its last part) and without ``names``
    (whole words, any case)."""
    text = " ".join(_last_part(w) if ("/" in w or "\\" in w) else w for w in text.split(" "))
    for n in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?i)(?<![A-Za-z0-9]){re.escape(n)}(?![A-Za-z0-9])", "<redacted>", text)
    return text


def model_and_quant(path: str) -> tuple[str, str]:
    """("Qwen3.8-27B", "Q4_K_M") of ".../Qwen3.8-27B-Q4_K_M.gguf"; ("name", "-") without a quant."""
    name = SPLIT_RE.sub(".gguf", file_name(path))
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    m = list(QUANT_RE.finditer(stem + "."))
    if not m:
        return stem, "-"
    q = m[-1]
    return (stem[:q.start(1)].rstrip("-_.") + stem[q.end(1):]).strip("-_.") or stem, q.group(1).upper()


def _machine(recs: Sequence[RunRecord]) -> tuple[str, str, float | None]:
    """(device, backend, VRAM in GB) of where the runs ran: the GPU when the placement says so."""
    r = recs[-1]
    place = Placement.of_record(r)
    gpu = next((g for g in (r.host.get("gpus") or ()) if isinstance(g, dict) and is_gpu_vendor(g.get("vendor"))),
               None)
    backend = r.backend or "not recorded"
    if gpu is not None and (place is None or not place.on_cpu):
        vram = gpu.get("vram_total")
        return str(gpu.get("name") or gpu.get("vendor")), backend, \
            round(in_unit(vram, "GiB"), 1) if isinstance(vram, (int, float)) and vram > 0 else None
    return f"CPU ({r.host.get('machine') or '?'}, {r.host.get('cpu_count') or '?'} threads)", backend, None


def _r(v: float | None, digits: int) -> float | None:
    """Rounded for sharing (the card holds what it shows, so its JSON round-trips)."""
    return None if v is None else round(v, digits)


def _med(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x]
    return round(statistics.median(v), 2) if v else None


def _best(cands: list[tuple[Arm, Ratio]]) -> tuple[Arm, Ratio] | None:
    """The fastest reliably faster arm, else the best estimate (as recommend chooses)."""
    cands = [(a, r) for a, r in cands if r.estimate is not None]
    return max(cands, key=lambda ar: (ar[1].verdict == "faster", ar[1].estimate)) if cands else None


def _row(task: str, pick: tuple[Arm, Ratio] | None, runs: dict[Arm, list[RunRecord]], base: list[RunRecord],
         names: Sequence[str]) -> CardRow:
    base_tok = _med(r.tok_s for r in base)
    if pick is None:
        return CardRow(task, "-", None, None, None, base_tok, None, None, None, None, None, "no speculative arm",
                       0, len({r.rep for r in base}))
    arm, ratio = pick
    rs = runs.get(arm, [])
    drafted = sum(r.draft_n or 0 for r in rs)
    return CardRow(task, arm.mode + (" probabilistic" if arm.probabilistic else ""), arm.k,
                   arm.p_min if arm.k is not None else None,
                   scrub(PurePath(arm.drafter).name, names) if arm.drafter else None, base_tok,
                   _med(r.tok_s for r in rs), _r(sum(r.draft_accepted or 0 for r in rs) / drafted, 4) if drafted else None,
                   _r(ratio.estimate, 4), _r(ratio.lo, 4), _r(ratio.hi, 4), ratio.verdict, ratio.n_pairs,
                   len({r.rep for r in rs}))


def card_watch(watch: Sequence[WatchRecord], names: Sequence[str] | None = None) -> tuple[WatchSeen, ...]:
    """The card's watch section: the newest window of each server and model (``newest``), with
    the model and the build by name and the reason scrubbed of folders and private names (no
    address: WatchSeen holds none)."""
    names = _private_names() if names is None else names
    return _cleaned(tuple(dataclasses.replace(s, model=scrub(s.model, names),
                                              build=scrub(s.build, names) if s.build else s.build,
                                              reason=scrub(s.reason.replace(" / ", "\0"), names).replace("\0", " / "))
                                  for s in newest(watch)))  # "0.61 / 0.52": a list, not a folder


def card_of(records: Sequence[RunRecord], analysis: Analysis | None = None,
            watch: Sequence[WatchRecord] = ()) -> Card:
    """The card of one sweep's runs, with the file's watch windows (``card_watch``) when given; a
    UserError when no run finished."""
    ok = [r for r in records if r.status == "ok"]
    if not ok:
        raise UserError("no finished runs to put on a card")
    a = analysis if analysis is not None else analyze(records)
    names = _private_names()
    device, backend, vram = _machine(ok)
    model, quant = model_and_quant(ok[-1].model_path)
    by: dict[tuple[str, Arm], list[RunRecord]] = {}
    for r in ok:
        by.setdefault((r.task, r.measured_arm), []).append(r)
    spec = [arm for arm in a.arms if arm.is_spec]
    rows = []
    mix = parse_mix(None, a.tasks)
    overall = []
    for arm in spec:
        parts = [(w, c.ratio) for t, w in mix.items() if (c := a.cell(t, arm)) and c.ratio and c.ratio.estimate]
        if len(parts) == len(mix):
            overall.append((arm, combine_ratios(parts)))
    if len(a.tasks) > 1:
        all_runs = {arm: [r for t in a.tasks for r in by.get((t, arm), [])] for arm in spec}
        rows.append(_row(ALL_TASKS, _best(overall), all_runs, [r for t in a.tasks for r in by.get((t, Arm()), [])],
                         names))
    for t in a.tasks:
        cands = [(arm, c.ratio) for arm in spec if (c := a.cell(t, arm)) and c.ratio]
        rows.append(_row(t, _best(cands), {arm: by.get((t, arm), []) for arm in spec}, by.get((t, Arm()), []),
                         names))
    cells = tuple(CardCell(c.task, scrub(c.arm.label, names), _r(c.ratio.estimate, 4), _r(c.ratio.lo, 4),
                           _r(c.ratio.hi, 4), c.ratio.verdict, _r(c.acceptance, 4), _r(c.tok_s.median, 2))
                  for c in a.cells if c.ratio is not None)
    warnings = sweep_warnings(records, a, names)
    host_os = str(ok[-1].host.get("os") or "?").split("-")[0]
    temps = {temp for r in ok if isinstance(temp := r.sampling.get("temperature"), (int, float))}
    return _cleaned(Card(device, backend, vram, scrub(model, names), quant,
                         scrub(", ".join(sorted({r.llama_build for r in ok})), names), ok[-1].engine, host_os,
                         statistics.mode(r.n_predict for r in ok), float(temps.pop()) if len(temps) == 1 else None,
                         max(r.timestamp_utc for r in ok)[:10], tuple(rows), cells, tuple(warnings),
                         watch=card_watch(watch, names), server_flags=scrub(server_flags(ok), names),
                         link=link_text(r.rpc for r in ok), threads=threads_text(ok)))


def sweep_warnings(records: Sequence[RunRecord], a: Analysis, names: Sequence[str] = ()) -> list[str]:
    """What the sweep warned about, as the card shares it (scrubbed, no program names): the runs
    missed the GPU, too few pairs, runs disturbed by other programs (withheld or not), runs that
    failed, and each of the analysis' findings (bench's and recommend's warnings)."""
    out = []
    if gpu_finding(a) is not None:
        out.append("measured on CPU, not this machine's GPU")
    if any(c.ratio.n_pairs < 3 for c in a.cells if c.ratio is not None):
        out.append("fewer than 3 paired runs in some cells: wide intervals")
    busy = disturbance(records)
    if busy is not None:
        out.append(f"{busy.runs} of {busy.of} runs disturbed by other programs"
                   + (": verdict withheld" if busy.withheld else ", left out of the verdict"))
    failed = sum(1 for r in records if r.status != "ok")
    if failed:
        out.append(f"{failed} of {len(records)} runs failed")
    seen = set(out)
    for f in a.findings:
        if f.code in (ON_CPU, FEWER_LAYERS, "disturbed"):  # said above, in the card's words (no program names)
            continue
        text = scrub(f.message.replace("tok/s", "\0"), names).replace("\0", "tok/s")  # a unit, not a path
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


_T = TypeVar("_T")


def _cleaned(value: _T) -> _T:
    """``value`` with every string in it (a dataclass's fields, tuples of them) on one line and
    without control characters (``printable``): a card shares text from the results file."""
    v: Any = value
    if isinstance(v, str):
        v = printable(v, one_line=True)
    elif isinstance(v, tuple):
        v = tuple(_cleaned(x) for x in v)
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        v = dataclasses.replace(v, **{f.name: _cleaned(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init})
    return cast(_T, v)  # each kind cleaned into a value of its own type


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def speedup_text(r: CardRow | CardCell) -> str:
    if r.speedup is None:
        return "-"
    return ratio(r.speedup) + (f" [{r.lo:.2f}, {r.hi:.2f}]" if r.lo is not None else " [no CI]")


def row_cells(card: Card, row: CardRow) -> list[str]:
    """One row's cells in COLUMNS' order."""
    mode = row.mode + (f" +{row.drafter}" if row.drafter else "")
    return [card.device, card.backend, f"{card.vram_gb:g} GB" if card.vram_gb else "-", card.model, card.quant,
            card.build, mode, _num(row.n_max, "d"), _num(row.p_min, "g"), _num(row.baseline_tok_s, ".1f"),
            _num(row.best_tok_s, ".1f"), _num(row.acceptance, ".2f"), speedup_text(row), row.task, str(card.tokens),
            str(row.reps)]


def markdown_row(card: Card, header: bool = True) -> str:
    """The card as rows of the community's table (COLUMNS): one per task, the first for all tasks."""

    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"] if header else []
    return "\n".join(lines + ["| " + " | ".join(esc(c) for c in row_cells(card, r)) + " |" for r in card.rows])


def card_json(card: Card) -> str:
    return json.dumps(dataclasses.asdict(card), indent=2, ensure_ascii=False)


def card_dict(card: Card) -> dict[str, Any]:
    """The card as plain JSON values (lists, not tuples): what card_json writes."""
    d: dict[str, Any] = json.loads(card_json(card))
    return d


def card_from_json(text: str) -> Card:
    """The card of a JSON block written by card_json; a UserError when it is not one."""
    try:
        d = jsonsafe.loads(text)
        if d.get("schema") != CARD_SCHEMA:
            raise UserError(f"not a result card (schema {d.get('schema')!r}, expected {CARD_SCHEMA})")
        d["rows"] = tuple(CardRow(**r) for r in d["rows"])
        d["cells"] = tuple(CardCell(**c) for c in d["cells"])
        d["warnings"] = tuple(d.get("warnings") or ())
        d["watch"] = tuple(WatchSeen.from_dict(w) for w in d.get("watch") or ())
        return _cleaned(Card(**d))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"not a result card: {e}") from None


def watch_text(card: Card) -> str:
    """The card's "From your own use (watch)" section ("" without watch windows)."""
    return format_seen(card.watch)


def model_text(card: Card) -> str:
    """"Qwen3.8-27B Q4_K_M", or the model alone where its file name has no quant."""
    return card.model + (f" {card.quant}" if card.quant != "-" else "")


def setup_line(card: Card) -> str:
    """The set-up in one line (the PNG's): device, backend, VRAM, OS, model, build, engine and its
    threads, tokens."""
    vram = f", {card.vram_gb:g} GB" if card.vram_gb else ""
    flags = f" {card.server_flags}" if card.server_flags else ""
    link = f" {card.link}" if card.link else ""
    threads = f", {card.threads}" if card.threads else ""
    return (f"{card.device} ({card.backend}{vram}, {card.os}) · {model_text(card)} · llama.cpp {card.build} · "
            f"{card.engine} engine{threads}{flags}{link} · {card.tokens} tokens · {card.date}")
