"""Two sweeps side by side (mtp-tuner compare, e.g. before and after a llama.cpp update): the
per-cell comparison with its statistics, and which settings differ between them.

A cell is *changed* only when the difference is significant: B over A as a ratio (of the paired
speedups for a speculative arm, of tok/s for the baseline), with a 95 % Welch t interval from both
sweeps' per-pair data (``difference``); when that interval holds 1 the cell is *same within
noise*, even where its verdict crossed a boundary (faster -> within noise): a crossing is only
noise then, and is shown as such."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import PurePath
from typing import Callable, Hashable, Iterable, Sequence, TypedDict

from app.core.analysis.settings import Setting, setting_of
from app.core.analysis.analysis import Analysis, CellStats, _Baselines, _times  # analyze's own pairing
from app.core.analysis.stats import t95
from app.core.machine.modelinfo import size_text
from app.core.measure.placements import recorded_flags
from app.core.records.arm import Arm
from app.core.records.schema import RunRecord

CHANGED, SAME, TOO_FEW = "changed", "same within noise", "too few runs"
_NO_CHANGE = 1e-9  # |log B/A| below this is rounding (the same runs paired another way), never a change


@dataclasses.dataclass(frozen=True)
class Difference:
    """B over A in one cell: ``estimate`` = exp(mean log B - mean log A) with a 95 % Welch t
    interval; ``detectable`` the smallest change these two sweeps could call changed (the
    interval's half-width, as a share: 0.05 = 5 %). ``what``: "speedup" (a speculative arm's
    paired ratios) or "tok/s" (the baseline's runs)."""

    what: str
    n_a: int
    n_b: int
    estimate: float | None
    lo: float | None
    hi: float | None
    detectable: float | None

    @property
    def status(self) -> str:
        if self.lo is None or self.hi is None or self.estimate is None:
            return TOO_FEW
        if (self.lo > 1.0 or self.hi < 1.0) and abs(math.log(self.estimate)) > _NO_CHANGE:
            return CHANGED
        return SAME


def difference(logs_a: Sequence[float], logs_b: Sequence[float], what: str) -> Difference:
    """B over A from each sweep's logs (log speedup of each pair, or log tok/s of each run): the
    means' difference d = mean(b) - mean(a), se = sqrt(s_a^2/n_a + s_b^2/n_b), and the interval
    exp(d -+ t95(df) se) with Welch-Satterthwaite's df (rounded down). The two sweeps are
    independent measurements; each needs 2 values or more for an interval."""
    na, nb = len(logs_a), len(logs_b)
    if not na or not nb:
        return Difference(what, na, nb, None, None, None, None)
    d = statistics.fmean(logs_b) - statistics.fmean(logs_a)
    if na < 2 or nb < 2:
        return Difference(what, na, nb, math.exp(d), None, None, None)
    va, vb = statistics.variance(logs_a) / na, statistics.variance(logs_b) / nb
    se = math.sqrt(va + vb)
    h = 0.0 if se == 0 else t95(int((va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)))) * se
    return Difference(what, na, nb, math.exp(d), math.exp(d - h), math.exp(d + h), math.exp(h) - 1)


def cell_logs(records: Iterable[RunRecord]) -> dict[tuple[str, Arm], list[float]]:
    """Each cell's logs as analyze pairs its runs: a speculative arm's log(run / baseline) for each
    good run and the nearest baseline run of its prompt in time (the same repetition on ties);
    the baseline's log tok/s of each good run."""
    ts = _times()
    ok = [r for r in records if r.status == "ok"]
    base_runs: dict[tuple[str, str, Setting], list[RunRecord]] = {}  # as analyze pairs: the same prompt and setting
    for r in ok:
        if r.arm_kind == "baseline":
            base_runs.setdefault((r.task, r.prompt_id, setting_of(r)), []).append(r)
    near = {key: _Baselines(runs, ts) for key, runs in base_runs.items()}
    out: dict[tuple[str, Arm], list[float]] = {}
    for r in ok:
        arm = r.measured_arm
        logs = out.setdefault((r.task, arm), [])
        if not r.tok_s or r.tok_s <= 0:
            continue
        if arm.is_baseline:
            logs.append(math.log(r.tok_s))
        elif (key := (r.task, r.prompt_id, setting_of(r))) in near:
            b = near[key].nearest(ts(r), r.rep)
            if b is not None and b.tok_s and b.tok_s > 0:
                logs.append(math.log(r.tok_s / b.tok_s))
    return out


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One task and arm in two sweeps (e.g. before and after a llama.cpp update); ``change``: the
    statistics of B over A (None when compare had no records, or the cell is in one sweep only)."""

    task: str
    arm: Arm
    a: CellStats | None
    b: CellStats | None
    change: Difference | None = None

    @property
    def tok_s_change(self) -> float | None:
        """b's median tok/s over a's (1.10 = 10 % faster in b)."""
        if self.a and self.b and self.a.tok_s.median and self.b.tok_s.median:
            return self.b.tok_s.median / self.a.tok_s.median
        return None

    @property
    def verdict_changed(self) -> bool:
        """The verdict differs (faster -> within noise): by noise unless ``changed``."""
        return bool(self.a and self.b and self.a.verdict != self.b.verdict)

    @property
    def changed(self) -> bool:
        """B differs from A beyond noise: the 95 % interval of B/A excludes 1."""
        return self.change is not None and self.change.status == CHANGED

    @property
    def status(self) -> str:
        if self.a is None or self.b is None:
            return "only in B" if self.a is None else "only in A"
        return self.change.status if self.change else "-"


def _same_arm(arm: Arm) -> Arm:
    """What makes two sweeps' arms the same arm: mode, K, p_min and the drafter's file name (the
    same drafter in another folder, or on another machine, is the same arm; a changed file is a
    set-up change, which setting_changes reports by its sha256)."""
    return dataclasses.replace(arm, drafter=PurePath(arm.drafter).name) if arm.drafter else arm


def compare(a: Analysis, b: Analysis, records_a: Sequence[RunRecord] | None = None,
            records_b: Sequence[RunRecord] | None = None) -> list[Comparison]:
    """Every task/arm of either sweep, in a's order then b's new ones; with both sweeps' records
    (those ``a`` and ``b`` analysed), each cell in both gets its ``change``."""
    cells_a = {(c.task, _same_arm(c.arm)): c for c in reversed(a.cells)}  # the first of equal keys
    cells_b = {(c.task, _same_arm(c.arm)): c for c in reversed(b.cells)}
    logs = (cell_logs(records_a), cell_logs(records_b)) if records_a is not None and records_b is not None else None
    keys = list(dict.fromkeys([(c.task, c.arm) for c in a.cells] + [(c.task, c.arm) for c in b.cells]))
    out, seen = [], set()
    for t, arm in keys:
        key = (t, _same_arm(arm))
        if key in seen:
            continue
        seen.add(key)
        ca, cb = cells_a.get(key), cells_b.get(key)
        change = None
        if logs and ca and cb:
            change = difference(logs[0].get((t, ca.arm), []), logs[1].get((t, cb.arm), []),
                                "tok/s" if arm.is_baseline else "speedup")
        out.append(Comparison(t, arm, ca, cb, change))
    return out


def detect_text(v: float | None) -> str:
    """A detectable change in words: "±6 %" while small; "x1.4" (a factor either way) once it is
    large (a 2-repetition sweep), where a percentage up and down would differ."""
    if v is None:
        return "-"
    if v < 0.25:
        return f"±{100 * v:.0f} %" if v >= 0.01 else f"±{100 * v:.1f} %"
    return f"x{1 + v:.1f}" if v < 99 else "x>100"


class Summary(TypedDict):
    """summary's figures (compare --json's "summary")."""

    changed: list[str]
    crossed_by_noise: list[str]
    too_few_runs: list[str]
    detectable_speedup: list[float] | None  # [smallest, largest] over the cells
    detectable_tok_s: list[float] | None


def summary(rows: Sequence[Comparison]) -> Summary:
    """What the comparison says in a few figures (compare --json's "summary"): the changed cells,
    the verdicts that crossed a boundary by noise, and the smallest change of speedup and of
    baseline tok/s the two sweeps could have detected (the smallest and largest over the cells)."""
    def span(what: str) -> list[float] | None:
        d = [c.change.detectable for c in rows if c.change and c.change.what == what and c.change.detectable is not None]
        return [min(d), max(d)] if d else None

    return {"changed": [f"{c.task} {c.arm.label}" for c in rows if c.changed],
            "crossed_by_noise": [f"{c.task} {c.arm.label}" for c in rows if c.verdict_changed and not c.changed],
            "too_few_runs": [f"{c.task} {c.arm.label}" for c in rows if c.status == TOO_FEW],
            "detectable_speedup": span("speedup"), "detectable_tok_s": span("tok/s")}


def format_summary(rows: Sequence[Comparison]) -> str:
    """The summary in words: "changed" only where B/A's 95 % interval excludes 1."""
    s = summary(rows)
    if not any(c.change for c in rows):
        return "no statistics: the two sweeps share no cell"
    out = [f"changed (the 95 % interval of B/A excludes 1): {', '.join(s['changed']) or 'nothing'}"]
    if s["crossed_by_noise"]:
        out.append("verdicts that crossed a boundary by noise, not a change: " + ", ".join(s["crossed_by_noise"]))
    det = [f"{what} {detect_text(v[0])}" + (f" to {detect_text(v[1])}" if v[1] != v[0] else "")
           for what, v in (("speedup", s["detectable_speedup"]), ("baseline tok/s", s["detectable_tok_s"])) if v]
    if det:
        out.append("smallest change these sweeps could detect: " + "; ".join(det)
                   + " (xF: a factor F either way; smaller changes read as same within noise; more repetitions narrow it)")
    if s["too_few_runs"]:
        out.append(f"{len(s['too_few_runs'])} cell(s) with fewer than 2 runs in a sweep: no interval")
    return "\n".join(out)


_PLAIN = (str, int, bool, float, type(None))


def _plain_key(d: object) -> tuple[tuple[str, type, object, float], ...] | None:
    """A hashable stand-in for a dict that equals another's only where json.dumps(sort_keys=True)
    writes the same text (str keys; values of exactly str, int, bool, None, or float with the sign
    of zero), else None."""
    if type(d) is not dict:
        return None
    out = []
    for k, v in d.items():
        t = type(v)
        if type(k) is not str or t not in _PLAIN:
            return None
        out.append((k, t, v, math.copysign(1.0, v) if isinstance(v, float) else 0))
    return tuple(out)


def _once(fmt: Callable[[RunRecord], str | None],
          key: Callable[[RunRecord], Hashable]) -> Callable[[RunRecord], str | None]:
    """``fmt`` for each distinct ``key(r)`` once (a large file repeats the same few values);
    directly where the key is None."""
    seen: dict[Hashable, str | None] = {}

    def f(r: RunRecord) -> str | None:
        k = key(r)
        if k is None:
            return fmt(r)
        if k not in seen:
            seen[k] = fmt(r)
        return seen[k]
    return f


NOT_RECORDED = "not recorded"  # the backend of schema 1 records (written before it was recorded)
_BUILD_KEYS = ("llama.cpp build", "backend")


def _setup(records: Sequence[RunRecord], keys: Sequence[str] | None = None) -> dict[str, str]:
    """The set-up of a sweep, each line the sorted distinct values of its ok runs (all runs when
    none is ok); only ``keys`` where given."""
    ok = [r for r in records if r.status == "ok"] or list(records)

    def values(f: Callable[[RunRecord], object]) -> str:  # a field that says None for a run has nothing to say of it
        return ", ".join(sorted({str(v) for r in ok if (v := f(r)) is not None})) or "-"

    fields = _setup_fields()
    return {k: values(fields[k]) for k in (fields if keys is None else keys)}


def _setup_fields() -> dict[str, Callable[[RunRecord], object]]:
    """What each set-up line shows of a run (fresh each call: the _once caches live for one _setup)."""
    return {
        "llama.cpp build": lambda r: r.llama_build,
        "backend": lambda r: r.backend or NOT_RECORDED,  # schema 2: CPU, CUDA, Metal, Vulkan...
        "engine": lambda r: r.engine,
        "threads": lambda r: r.threads,  # None in older files: nothing to say
        "model": _once(lambda r: f"{PurePath(r.model_path).name} ({size_text(r.model_size)})",
                       lambda r: (r.model_path, r.model_size)
                       if type(r.model_path) is str and type(r.model_size) is int else None),
        # the speculative runs' drafter file (the baseline has none to say)
        "drafter": _once(lambda r: None if r.arm_kind == "baseline" else
                         f"{PurePath(str(r.drafter.get('path'))).name} (sha256 {str(r.drafter.get('sha256'))[:12]})"
                         if r.drafter else "none",
                         lambda r: (r.arm_kind == "baseline", r.drafter.get("path"), r.drafter.get("sha256"))
                         if r.drafter else r.arm_kind == "baseline"),
        "tokens per run": lambda r: r.n_predict,
        "sampling": _once(lambda r: json.dumps(r.sampling, sort_keys=True), lambda r: _plain_key(r.sampling)),
        "prompts": lambda r: f"{r.task}/{r.prompt_id}",
        "machine": lambda r: f"{r.host.get('os', '?')}, {r.host.get('cpu_count', '?')} CPUs",
    }


def server_flags(records: Sequence[RunRecord]) -> str:
    """The user's own llama-server flags the runs were measured with, as "with -fa on -ctk q8_0"
    (records.server_args; several sets joined by "; "), or "" for the tuner's own flags. A results
    file's flags are outside text: only those the rule keeps are named, redacted (placements.recorded_flags)."""
    sets = {" ".join(recorded_flags(r.server_args)) for r in records if r.server_args is not None}
    return "; ".join(f"with {s}" if s else "with your command, no flags of its own" for s in sorted(sets))


def threads_text(records: Iterable[RunRecord]) -> str:
    """The CPU threads the runs ran with, as the set-up line says them: "2 threads" ("1, 2
    threads" for several counts; "" when no run recorded them)."""
    counts = sorted({r.threads for r in records if r.threads})
    return f"{', '.join(map(str, counts))} thread{'' if counts == [1] else 's'}" if counts else ""


def setting_changes(a: Sequence[RunRecord], b: Sequence[RunRecord]) -> list[tuple[str, str, str]]:
    """What differs between the set-ups of two sweeps, as (what, in a, in b): the llama.cpp build
    first (the usual reason to compare: MTP speed changes between builds) and the backend it ran
    on, then engine, model, drafter, generation settings, prompts and machine. Empty when only the measurements differ.
    The backend and the threads only where both sweeps recorded them: an old (schema 1) file against
    a new one of the same build is no change."""
    sa, sb = _setup(a), _setup(b)
    out = []
    if server_flags(a) != server_flags(b):  # the user's own llama-server flags (schema 7)
        out.append(("llama-server flags", server_flags(a) or "the tuner's own", server_flags(b) or "the tuner's own"))
    for key in sa:
        if key == "backend" and NOT_RECORDED in (sa[key], sb[key]):
            continue
        if key == "threads" and "-" in (sa[key], sb[key]):  # an older file says nothing of its threads
            continue
        if sa[key] != sb[key]:
            if key == "prompts":  # long lists: say how they differ
                pa, pb = set(sa[key].split(", ")), set(sb[key].split(", "))
                out.append((key, f"{len(pa)} prompts", f"{len(pb)} prompts, {len(pb - pa)} not in A, "
                                                        f"{len(pa - pb)} of A's missing"))
            else:
                out.append((key, sa[key], sb[key]))
    return out


def _recorded_backends(setup: dict[str, str]) -> list[str]:
    return [x for x in setup["backend"].split(", ") if x != NOT_RECORDED]


def _build_text(setup: dict[str, str]) -> str:
    """A sweep's llama.cpp build(s), with the backend its runs ran on where the records say
    (schema 2): "b6123 (abc1234) on CUDA"."""
    backends = _recorded_backends(setup)
    build = setup["llama.cpp build"]
    return f"{build} on {', '.join(backends)}" if backends else build


def builds(a: Sequence[RunRecord], b: Sequence[RunRecord]) -> dict[str, object]:
    """The two sweeps' builds, named whether or not they differ (re-tuning after a llama.cpp
    update starts from this line): {"a": ..., "b": ..., "changed": bool}. Changed: another
    llama.cpp build, or another backend where both sweeps recorded one (the same tag on CUDA,
    then Vulkan, is another binary); an old file without backends against a new one of the same
    build is the same build."""
    sa, sb = _setup(a, _BUILD_KEYS), _setup(b, _BUILD_KEYS)
    ka, kb = _recorded_backends(sa), _recorded_backends(sb)
    changed = sa["llama.cpp build"] != sb["llama.cpp build"] or bool(ka and kb and ka != kb)
    return {"a": _build_text(sa), "b": _build_text(sb), "changed": changed}


def format_builds(b: dict[str, object]) -> str:
    return f"llama.cpp builds: A {b['a']}; B {b['b']}" + (" (changed)" if b["changed"] else " (the same)")


def format_changes(changes: list[tuple[str, str, str]]) -> str:
    if not changes:
        return "same set-up (build, backend, engine, model, drafter, settings, prompts, machine): only the measurements differ"
    return "set-up differs: " + "; ".join(f"{what}: {x} -> {y}" for what, x, y in changes)
