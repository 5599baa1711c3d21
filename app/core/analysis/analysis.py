"""Turn a sweep's records into a verdict the user can trust.

Per task and arm: tok/s summary, the paired speedup over baseline with its 95 % interval and
verdict, acceptance (pooled) with the inferred per-token alpha and mean accepted length, outliers,
output equivalence; per sweep: warnings with the fix (too few repetitions, slow first runs, wide
spread, a bimodal baseline, arms measured far apart) and confounder checks.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as _dt
import functools
import itertools
import statistics
from typing import Any, Callable, Iterable, Sequence, cast

from app.core.analysis import breakeven
from app.core.analysis.advice import GPU_LAYERS, N_PREDICT, REPS, SELFTEST, WARMUP, Advice, Setting
from app.core.analysis.disturbed import disturbed_findings, is_disturbed, mode_shift_findings
from app.core.analysis.findings import (Finding, clock_findings, untimed, divergence_findings, divergence_margin,
                                         left_out_findings, sampled_findings)
from app.core.analysis.settings import setting_of
from app.core.analysis.placement import placement_findings
from app.core.analysis.repetition import repetition_finding
from app.core.analysis.positions import PositionCounts, pool as pool_positions
from app.core.records.reader import gc_paused
from app.core.records.schema import RunRecord, first_divergence
from app.core.common.spec_modes import is_combined
from app.core.records.arm import Arm, arm_from_fields
from app.core.analysis.stats import (MAX_PAIR_GAP_S, MIN_PAIRS, VECTOR_FROM, Ratio, Summary, bimodal, outliers, paired_ratio)

SHORT_GENERATION = 64
_INT = frozenset({int})
_GAP_BATCH = 4096


def arm_of(r: RunRecord) -> Arm:
    return r.measured_arm


def arm_order(a: Arm) -> tuple[int, str, int, float, str, bool]:
    """Tables' order of arms: the baseline, then draft-mtp by K and p_min, then the other modes
    (each by K, p_min and drafter)."""
    if a.is_baseline:
        return (0, "", 0, 0.0, "", False)
    return (1 if a.is_mtp else 2, a.mode, a.k or 0, a.p_min, a.drafter or "", a.probabilistic)


@dataclasses.dataclass(frozen=True)
class CellStats:
    task: str
    arm: Arm
    tok_s: Summary
    ratio: Ratio | None  # None for the baseline
    acceptance: float | None
    alpha: float | None
    mean_accepted_len: float | None
    outlier_run_ids: tuple[str, ...]
    n_failed: int
    not_engaged: int
    positions: PositionCounts | None = None  # accepted per draft position, pooled (None: not counted)
    # the paired speedup of the whole answer (RunRecord.whole_tok_s: prompt processing, a drafter's
    # own prefill and the first token counted) over the same pairs as ``ratio`` (None: the baseline)
    whole: Ratio | None = None

    @property
    def verdict(self) -> str:
        return "baseline" if self.ratio is None else self.ratio.verdict


@dataclasses.dataclass(frozen=True)
class Equivalence:
    task: str
    prompt_id: str
    arm: Arm
    rep: int
    equal: bool
    first_divergence: int | None  # token index of the first difference
    margin: float | None = None  # the baseline's top-2 probability margin there (None: not read)


@dataclasses.dataclass(frozen=True)
class Analysis:
    cells: tuple[CellStats, ...]
    equivalence: tuple[Equivalence, ...]
    findings: tuple[Finding, ...]
    tasks: tuple[str, ...]
    arms: tuple[Arm, ...]

    def cell(self, task: str, arm: Arm) -> CellStats | None:
        return self._cells.get((task, arm))

    @functools.cached_property
    def _cells(self) -> dict[tuple[str, Arm], CellStats]:
        out: dict[tuple[str, Arm], CellStats] = {}
        for c in self.cells:
            out.setdefault((c.task, c.arm), c)  # the first, as a scan would find
        return out


def _ts(r: RunRecord) -> float:
    try:
        return _dt.datetime.fromisoformat(r.timestamp_utc).timestamp()
    except ValueError:
        return 0.0


def _times() -> Callable[[RunRecord], float]:
    """_ts that parses each record's timestamp once (by identity: run_ids need not be unique)."""
    cache: dict[int, float] = {}
    get = cache.get

    def ts(r: RunRecord) -> float:
        t = get(id(r))
        if t is None:
            t = cache[id(r)] = _ts(r)
        return t
    return ts


class _Baselines:
    """The baseline run of the same prompt measured closest in time, for many runs against one
    prompt's baseline runs, in O(log n) each.

    The candidates' distinct times are sorted; for each time, the first candidate in file order and
    the first of each repetition. |tb - t| (as floats) does not grow towards t from either side, so
    the times at the smallest distance are the neighbours of t's place in the sorted times and any
    equally far times next to them; among those, the key (distance, other repetition)
    then file order picks the first of the run's repetition if any, else the first of all."""

    def __init__(self, candidates: list[RunRecord], ts: Callable[[RunRecord], float]):
        first: dict[float, int] = {}
        by_rep: dict[float, dict[int, int]] = {}
        for i, b in enumerate(candidates):
            t = ts(b)
            first.setdefault(t, i)
            by_rep.setdefault(t, {}).setdefault(b.rep, i)
        self.candidates = candidates
        self.times = sorted(first)
        self.first = [first[t] for t in self.times]
        self.by_rep = [by_rep[t] for t in self.times]

    def nearest(self, t: float, rep: int) -> RunRecord | None:
        times = self.times
        n = len(times)
        if not n:
            return None
        i = bisect.bisect_left(times, t)  # times[i - 1] < t <= times[i]
        best = abs(times[i] - t) if i < n else abs(times[i - 1] - t)
        if 0 < i < n:
            best = min(best, abs(times[i - 1] - t))
        tied = []
        j = i - 1
        while j >= 0 and abs(times[j] - t) == best:
            tied.append(j)
            j -= 1
        j = i
        while j < n and abs(times[j] - t) == best:
            tied.append(j)
            j += 1
        if len(tied) == 1:
            j = tied[0]
            same = self.by_rep[j].get(rep)
            return self.candidates[self.first[j] if same is None else same]
        same_rep = [k for k in (self.by_rep[j].get(rep) for j in tied) if k is not None]
        return self.candidates[min(same_rep) if same_rep else min(self.first[j] for j in tied)]


def analyze(records: Iterable[RunRecord]) -> Analysis:
    with gc_paused():  # what it builds holds no cycles: no collection goes through a large file's records
        return _analyze(records)


def _analyze(records: Iterable[RunRecord]) -> Analysis:
    """The steps: the runs by cell, each cell's statistics (its speculative runs paired with their
    baselines), then the findings over the whole file."""
    read = list(records)
    every = [untimed(r) for r in read]  # a speed that timed the reading of a burst is no speed
    # runs disturbed by other programs are left out, and so is a speculative run whose nearest
    # baseline was disturbed (the sweep measured both again); the baselines are kept for the pairing
    recs = [r for r in every if not is_disturbed(r)]
    some_disturbed = len(recs) < len(every)
    tasks = tuple(dict.fromkeys(r.task for r in every))
    by_cell = _by_cell(recs)
    arms = tuple(sorted(dict.fromkeys(arm for _, arm in by_cell), key=arm_order))
    pairing = _Pairing(every if some_disturbed else recs, _times())
    cells = [_cell(task, arm, rs, pairing, some_disturbed)
             for task in tasks for arm in arms if (rs := by_cell.get((task, arm)))]
    ok = [r for r in recs if r.status == "ok"]
    findings = _warnings(ok, cells, by_cell, pairing.ts, pairing.far_pairs, pairing.length_mismatch)
    findings.extend(divergence_findings(pairing.eq) + sampled_findings(ok))
    findings.extend(clock_findings(r for r in read if r.status == "ok" and not is_disturbed(r)))
    if (loop := repetition_finding(ok)) is not None:  # a loop drafts well: the speedups say little
        findings.append(loop)
    if some_disturbed:
        findings.extend(disturbed_findings(every, pairing.busy_pairs))
    findings.extend(mode_shift_findings(every))
    return Analysis(tuple(cells), tuple(pairing.eq), tuple(findings), tasks, arms)


def _by_cell(recs: list[RunRecord]) -> dict[tuple[str, Arm], list[RunRecord]]:
    """Each cell's runs (task and arm) in file order, in one pass: grouped by the task and the
    fields arm_of reads, then the groups of one arm merged."""
    groups: dict[tuple[Any, ...], list[RunRecord]] = {}
    for r in recs:
        k = r.k
        key = (r.task, k, (r.p_min or 0.0) if k is not None else None, r.spec_type, r.drafter.get("path") if r.drafter else None,
               r.draft_sampling)
        g = groups.get(key)
        if g is None:
            g = groups[key] = []
        g.append(r)
    by_cell: dict[tuple[str, Arm], list[RunRecord]] = {}
    for (task, k, p, mode, drafter, sampling), g in groups.items():  # an old file's draft-mtp and a new one's meet here
        by_cell.setdefault((task, arm_from_fields(k, p, mode, drafter, sampling)), []).extend(g)
    if len(by_cell) < len(groups):  # merged groups: back in file order
        order = {id(r): i for i, r in enumerate(recs)}
        for g in by_cell.values():
            g.sort(key=lambda r: order[id(r)])
    return by_cell


def _cell(task: str, arm: Arm, rs: list[RunRecord], pairing: _Pairing, some_disturbed: bool) -> CellStats:
    """One cell's statistics: tok/s and its outliers, failed and not-engaged runs; for a
    speculative arm the paired speedup over the baseline, acceptance and the positions."""
    good = [r for r in rs if r.status == "ok"]
    n_failed = len(rs) - len(good)
    if some_disturbed and arm.is_spec:
        good = pairing.clean(task, good)
    speeds = [r.tok_s for r in good if r.tok_s]
    out_idx = set(outliers(speeds))
    ratio = whole = None
    acc = alpha = mal = None
    if arm.is_spec:
        ratio, whole = pairing.ratio(task, arm, good)
        acc, alpha, mal = _acceptance(arm, good)
    return CellStats(
        task, arm, Summary.of(speeds), ratio, acc, alpha, mal,
        tuple(r.run_id for i, r in enumerate(r2 for r2 in good if r2.tok_s) if i in out_idx),
        n_failed, sum(1 for r in good if "mtp_not_engaged" in r.flags),
        pool_positions(good) if arm.is_spec else None, whole)


def _acceptance(arm: Arm, good: list[RunRecord]) -> tuple[float | None, float | None, float | None]:
    """The pooled acceptance of a speculative cell's runs, and for a drafting width the per-token
    alpha it implies and the mean accepted length; None where nothing was drafted."""
    drafted = sum(r.draft_n or 0 for r in good)
    if not drafted:
        return None, None, None
    acc = sum(r.draft_accepted or 0 for r in good) / drafted
    # the i.i.d. model needs the draft width (n-gram modes have none; a combination's drafts run past it)
    if not arm.k or is_combined(arm.mode):
        return acc, None, None
    alpha = breakeven.infer_alpha(acc, arm.k)
    return acc, alpha, breakeven.mean_accepted_length(alpha, arm.k)


_Key = tuple[str, str, tuple[Any, ...]]  # a task, a prompt and a setting (setting_of)


class _Pairing:
    """The speculative runs paired with their prompt's baseline run measured closest in time, at
    the same setting, and what the pairs showed across the file: output equivalence under greedy
    decoding, pairs measured far apart, outputs of different lengths, and the runs left out for
    a disturbed baseline."""

    def __init__(self, runs: list[RunRecord], ts: Callable[[RunRecord], float]) -> None:
        self.ts = ts
        self.base_runs: dict[_Key, list[RunRecord]] = {}  # each task's and prompt's good baselines, in file order
        for r in runs:
            if r.arm_kind == "baseline" and r.status == "ok":
                self.base_runs.setdefault((r.task, r.prompt_id, setting_of(r)), []).append(r)
        self._baselines: dict[_Key, _Baselines] = {}
        self._int_tokens: dict[int, bool] = {}  # shared output-token tuples (the reader shares equal ones): ints only?
        self.eq: list[Equivalence] = []
        self.far_pairs = 0
        self.length_mismatch = 0
        self.busy_pairs = 0

    def _nearest(self, key: _Key, r: RunRecord) -> RunRecord | None:
        b = self._baselines.get(key)
        if b is None:
            b = self._baselines[key] = _Baselines(self.base_runs[key], self.ts)
        return b.nearest(self.ts(r), r.rep)

    def clean(self, task: str, good: list[RunRecord]) -> list[RunRecord]:
        """The speculative runs whose nearest baseline (disturbed ones included) was not disturbed;
        the others are counted in ``busy_pairs``."""
        out = []
        for r in good:
            key = (task, r.prompt_id, setting_of(r))
            if key in self.base_runs:
                b = self._nearest(key, r)
                if b is not None and is_disturbed(b):
                    continue
            out.append(r)
        self.busy_pairs += len(good) - len(out)
        return out

    def ratio(self, task: str, arm: Arm, good: list[RunRecord]) -> tuple[Ratio, Ratio]:
        """The paired speedup of a speculative cell's runs over their baselines: decode alone
        (``tok_s``), and the whole answer's over the same pairs (``whole_tok_s``)."""
        pairs, wholes = [], []
        seen: dict[tuple[Any, ...], Equivalence] = {}  # one object for equal findings (frozen): a large file repeats them
        for r in good:
            key = (task, r.prompt_id, setting_of(r))  # a baseline of the same sampler and seed
            if key not in self.base_runs:
                continue
            b = self._nearest(key, r)
            if b is None or not r.tok_s or not b.tok_s:
                continue
            if abs(self.ts(r) - self.ts(b)) > MAX_PAIR_GAP_S:
                self.far_pairs += 1
            pairs.append((r.tok_s, b.tok_s))
            rw, bw = r.whole_tok_s, b.whole_tok_s
            if rw and bw:
                wholes.append((rw, bw))
            if r.n_generated != b.n_generated:
                self.length_mismatch += 1
            if r.sampling.get("temperature", 0) == 0:
                self.eq.append(self._equivalence(task, arm, r, b, seen))
        return paired_ratio(pairs), paired_ratio(wholes)

    def _equivalence(self, task: str, arm: Arm, r: RunRecord, b: RunRecord,
                     seen: dict[tuple[Any, ...], Equivalence]) -> Equivalence:
        """Whether a greedy run's output equals its baseline's, and where it first differs."""
        out = r.output_tokens
        if out is b.output_tokens and type(out) is tuple:
            # the very same tuple: no token differs from itself unless one is not an
            # int (a NaN does), which first_divergence would then report
            same = self._int_tokens.get(id(out))
            if same is None:
                same = self._int_tokens[id(out)] = _INT.issuperset(map(type, out))
            d = None if same else first_divergence(out, out)
        else:
            d = first_divergence(out, b.output_tokens)
        m = divergence_margin(r, d) if r.divergence is not None else None
        ek = (r.prompt_id, type(r.prompt_id), r.rep, type(r.rep), d, m)
        e = seen.get(ek)
        if e is None:
            e = seen[ek] = Equivalence(task, r.prompt_id, arm, r.rep, d is None, d, m)
        return e


def _warnings(ok: list[RunRecord], cells: list[CellStats], by_cell: dict[tuple[str, Arm], list[RunRecord]],
              ts: Callable[[RunRecord], float], far_pairs: int, length_mismatch: int) -> list[Finding]:
    out: list[Finding] = []
    few = [c for c in cells if c.ratio is not None and c.ratio.n_pairs < MIN_PAIRS]
    if few:
        out.append(Finding("too_few_reps", f"{len(few)} cell(s) have fewer than {MIN_PAIRS} paired runs, "
                           "so their interval is missing or wide",
                           Advice(("run more repetitions (", Setting(REPS, str(MIN_PAIRS)), ")"))))
    wide = [c for c in cells if c.tok_s.cv is not None and c.tok_s.cv > 0.10]
    if wide:
        worst = max(wide, key=lambda c: c.tok_s.cv or 0)
        out.append(Finding("wide_spread", f"tok/s varies by more than 10 % within {len(wide)} cell(s) "
                           f"(worst: {worst.task} {worst.arm.label}, {100 * (worst.tok_s.cv or 0):.0f} %)",
                           "close other programs, keep the machine on power, and add repetitions"))
    # first run of each arm slower than the rest (warmup missing or too short)
    slow_first = 0
    for c in cells:
        timed = sorted((r for r in by_cell[(c.task, c.arm)] if r.status == "ok" and r.tok_s), key=ts)
        speeds = [r.tok_s for r in timed if r.tok_s is not None]
        if len(speeds) >= 4 and speeds[0] < 0.8 * statistics.median(speeds[1:]):
            slow_first += 1
    if slow_first:
        out.append(Finding("slow_first_run", f"the first run was much slower than the rest in {slow_first} "
                           "cell(s)", Advice(("use a warmup run (", Setting(WARMUP, "1"), ")"))))
    # bimodal single-token decode (baseline inter-token intervals)
    gaps = _baseline_gaps(ok)
    bm = bimodal(gaps) if len(gaps) >= 40 else None
    if bm is None:
        speeds = [r.tok_s for r in ok if r.arm_kind == "baseline" and r.tok_s]
        bm_runs = bimodal(speeds)
        if bm_runs:
            out.append(Finding("bimodal_baseline", f"baseline speed switches between two levels "
                               f"({bm_runs.low:.1f} and {bm_runs.high:.1f} tok/s)",
                               "pair and interleave finely (the default), add repetitions, and compare "
                               "only paired ratios, never arms measured minutes apart"))
    else:
        out.append(Finding("bimodal_baseline", f"single-token decode switches between two levels "
                           f"({1000 * bm.low:.1f} and {1000 * bm.high:.1f} ms per token, "
                           f"{100 * bm.share_high:.0f} % slow)",
                           "speedups against one level or the other differ; trust only the paired "
                           "intervals and add repetitions"))
    if far_pairs:
        out.append(Finding("far_pairs", f"{far_pairs} MTP/baseline pair(s) were measured more than "
                           f"{MAX_PAIR_GAP_S:.0f} s apart, so drift may bias their ratio",
                           "use the in-process engine, or enough memory for all llama-server "
                           "configurations at once, so arms interleave"))
    not_engaged = sum(c.not_engaged for c in cells)
    if not_engaged and not any(c.arm.is_spec and not c.arm.is_mtp for c in cells if c.not_engaged):
        out.append(Finding("mtp_not_engaged", f"MTP did not engage in {not_engaged} MTP run(s): they "
                           "measured plain decoding", Advice(("check that the model has MTP heads and that "
                           "llama.cpp was started with --spec-type draft-mtp; ", Setting(SELFTEST)))))
    elif not_engaged:
        out.append(Finding("mtp_not_engaged", f"speculation did not engage in {not_engaged} speculative run(s): they "
                           "measured plain decoding", Advice(("check that the model has MTP heads (or the drafter pairs "
                           "with it) and that llama.cpp was started with its --spec-type; ", Setting(SELFTEST)))))
    if length_mismatch:
        out.append(Finding("length_differs", f"output length differed between MTP and baseline in "
                           f"{length_mismatch} pair(s), so tok/s compares different work",
                           "use greedy decoding (temperature 0) and a fixed n_predict"))
    short = [r for r in ok if r.arm_kind != "baseline" and r.n_predict < SHORT_GENERATION]
    if short:
        out.append(Finding("short_generation", f"generations of fewer than {SHORT_GENERATION} tokens: "
                           "MTP's start-up cost weighs heavily", Advice((Setting(N_PREDICT, "128"),))))
    out.extend(left_out_findings(ok))
    flags = {f for r in ok for f in r.flags}
    if "multiple_slots" in flags:
        out.append(Finding("multiple_slots", "llama-server ran with more than one slot",
                           "start llama-server with -np 1 for single-stream speed"))
    if "partial_offload" in flags:
        out.append(Finding("partial_offload", "not all weights were on the GPU",
                           Advice((Setting(GPU_LAYERS), "; compare only like with like"))))
    if "metal_quant_kv" in flags:
        out.append(Finding("metal_quant_kv", "Metal with a quantized KV cache is known to slow MTP",
                           "use an f16 KV cache on Apple GPUs"))
    out.extend(placement_findings(ok))
    return out


def _baseline_gaps(ok: list[RunRecord]) -> Sequence[float]:
    """The good baseline runs' inter-token gaps, the first token's left out, in file order: a list,
    or where there are many (every run's token times floats), the same values in a numpy array
    (millions of gaps in a large file: a fraction of the memory and time)."""
    runs = [r.token_times for r in ok if r.arm_kind == "baseline" and len(r.token_times) > 8]
    n_gaps = sum(len(t) - 2 for t in runs)
    if n_gaps >= VECTOR_FROM and set(map(type, itertools.chain.from_iterable(runs))) == {float}:
        import numpy as np  # numpy only for a large file's millions of gaps

        out = np.empty(n_gaps)
        at = 0
        for k in range(0, len(runs), _GAP_BATCH):  # a batch of runs at a time (memory)
            batch = runs[k:k + _GAP_BATCH]
            lengths = np.fromiter(map(len, batch), np.int64, count=len(batch))
            flat = np.fromiter(itertools.chain.from_iterable(batch), np.float64, count=int(lengths.sum()))
            d = np.diff(flat)  # d[j] = flat[j + 1] - flat[j]: b - a as floats
            starts = np.cumsum(lengths) - lengths
            keep = np.ones(len(d), bool)
            keep[starts] = False  # each run's second token minus its first
            keep[starts[1:] - 1] = False  # one run's first token minus the run before's last
            g = d[keep]
            out[at:at + len(g)] = g
            at += len(g)
        return cast("Sequence[float]", out)  # a float64 array, as bimodal takes it
    gaps: list[float] = []
    for t in runs:
        gaps.extend(b - a for a, b in zip(t[1:], t[2:]))
    return gaps
