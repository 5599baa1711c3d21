"""analyze() on large results files: each timestamp is parsed once, and the result equals the
simple pairing it replaced (the baseline run of the same prompt measured closest in time, the same
repetition first, then the earliest in the file) on record sets full of ties."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import random
import statistics

import pytest

from app.core.analysis import analysis

from app.core.analysis import breakeven
from app.core.analysis import findings as findings_mod
from app.core.analysis import compare as compare_mod
from app.core.analysis.analysis import Analysis, CellStats, Equivalence, analyze, arm_of, first_divergence
from app.core.analysis.findings import Finding
from app.core.analysis.compare import compare
from app.core.analysis.recommend import parse_mix, recommend
from app.core.machine.modelinfo import size_text
from app.core.records.arm import Arm
from app.core.records.schema import RunRecord
from app.core.analysis.stats import MAX_PAIR_GAP_S, MIN_PAIRS, Summary, bimodal, outliers, paired_ratio
from tests.helpers import make_record

# ---- the reference: analyze() as it was before it scaled to large files, O(n^2), copied verbatim ----


def _ref_ts(r: RunRecord) -> float:
    try:
        return _dt.datetime.fromisoformat(r.timestamp_utc).timestamp()
    except ValueError:
        return 0.0


def ref_nearest_baseline(r: RunRecord, candidates: list[RunRecord]) -> RunRecord | None:
    if not candidates:
        return None
    t = _ref_ts(r)
    return min(candidates, key=lambda b: (abs(_ref_ts(b) - t), b.rep != r.rep))


def ref_analyze(records) -> Analysis:
    recs = list(records)
    ok = [r for r in recs if r.status == "ok"]
    tasks = tuple(dict.fromkeys(r.task for r in recs))
    arms = tuple(sorted({arm_of(r) for r in recs},
                        key=lambda a: (-1, 0.0) if a.k is None else (a.k, a.p_min or 0.0)))
    findings: list[Finding] = []
    cells: list[CellStats] = []
    eq: list[Equivalence] = []
    far_pairs = 0
    length_mismatch = 0
    for task in tasks:
        base_runs: dict[str, list[RunRecord]] = {}
        for r in ok:
            if r.task == task and r.k is None:
                base_runs.setdefault((r.prompt_id, r.sampling.get("temperature")), []).append(r)
        for arm in arms:
            rs = [r for r in recs if r.task == task and arm_of(r) == arm]
            if not rs:
                continue
            good = [r for r in rs if r.status == "ok"]
            speeds = [r.tok_s for r in good if r.tok_s]
            out_idx = outliers(speeds)
            ratio = whole = None
            acc = alpha = mal = None
            if arm.k is not None:
                pairs, wholes = [], []
                for r in good:
                    b = ref_nearest_baseline(r, base_runs.get((r.prompt_id, r.sampling.get("temperature")), []))
                    if b is None or not r.tok_s or not b.tok_s:
                        continue
                    if abs(_ref_ts(r) - _ref_ts(b)) > MAX_PAIR_GAP_S:
                        far_pairs += 1
                    pairs.append((r.tok_s, b.tok_s))
                    if r.whole_tok_s and b.whole_tok_s:  # the whole answer's, over the same pairs
                        wholes.append((r.whole_tok_s, b.whole_tok_s))
                    if r.n_generated != b.n_generated:
                        length_mismatch += 1
                    if r.sampling.get("temperature", 0) == 0:
                        d = first_divergence(r.output_tokens, b.output_tokens)
                        eq.append(Equivalence(task, r.prompt_id, arm, r.rep, d is None, d))
                ratio, whole = paired_ratio(pairs), paired_ratio(wholes)
                drafted = sum(r.draft_n or 0 for r in good)
                accepted = sum(r.draft_accepted or 0 for r in good)
                if drafted:
                    acc = accepted / drafted
                    alpha = breakeven.infer_alpha(acc, arm.k)
                    mal = breakeven.mean_accepted_length(alpha, arm.k)
            cells.append(CellStats(
                task, arm, Summary.of(speeds), ratio, acc, alpha, mal,
                tuple(r.run_id for i, r in enumerate(r2 for r2 in good if r2.tok_s) if i in out_idx),
                len(rs) - len(good), sum(1 for r in good if "mtp_not_engaged" in r.flags), whole=whole))
    findings.extend(_ref_warnings(recs, ok, cells, far_pairs, length_mismatch))
    findings.extend(findings_mod.divergence_findings(eq) + findings_mod.sampled_findings(ok))
    return Analysis(tuple(cells), tuple(eq), tuple(findings), tasks, arms)


def _ref_warnings(recs, ok, cells, far_pairs, length_mismatch) -> list[Finding]:
    """The old _warnings, reduced to what depended on the pairing and the per-cell scans (the rest
    is the same code in both, checked through the equal findings). Only the codes count (see
    same_findings): the wording is the app's to change."""
    out: list[str] = []
    mtp_cells = [c for c in cells if c.ratio is not None]
    if [c for c in mtp_cells if c.ratio.n_pairs < MIN_PAIRS]:
        out.append("too_few_reps")
    if [c for c in cells if c.tok_s.cv is not None and c.tok_s.cv > 0.10]:
        out.append("wide_spread")
    slow_first = 0
    for c in cells:
        rs = sorted((r for r in ok if r.task == c.task and arm_of(r) == c.arm and r.tok_s), key=_ref_ts)
        if len(rs) >= 4:
            rest = statistics.median(r.tok_s for r in rs[1:])
            if rs[0].tok_s < 0.8 * rest:
                slow_first += 1
    if slow_first:
        out.append("slow_first_run")
    gaps: list[float] = []
    for r in ok:
        if r.k is None and len(r.token_times) > 8:
            t = r.token_times
            gaps.extend(b - a for a, b in zip(t[1:], t[2:]))
    bm = bimodal(gaps) if len(gaps) >= 40 else None
    if bm is not None or bimodal([r.tok_s for r in ok if r.k is None and r.tok_s]):
        out.append("bimodal_baseline")
    if far_pairs:
        out.append("far_pairs")
    if sum(c.not_engaged for c in cells):
        out.append("mtp_not_engaged")
    if length_mismatch:
        out.append("length_differs")
    if [r for r in ok if r.k is not None and r.n_predict < analysis.SHORT_GENERATION]:
        out.append("short_generation")
    flags = {f for r in ok for f in r.flags}
    out += [f for f in ("multiple_slots", "partial_offload", "metal_quant_kv") if f in flags]
    return [Finding(code, "", "") for code in out]


def same_findings(a: Analysis) -> Analysis:
    """The analysis with each finding reduced to its code: what the reference and the app found,
    not how the app words it."""
    return dataclasses.replace(a, findings=tuple(Finding(f.code, "", "") for f in a.findings))


# ---- record sets full of ties ---------------------------------------------------------------------

BASE = _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)


def stamp(sec: float, style: int = 0) -> str:
    """The same instant written in different ways (UTC, +01:00, naive local), or no time at all."""
    t = BASE + _dt.timedelta(seconds=sec)
    if style == 1:
        return t.astimezone(_dt.timezone(_dt.timedelta(hours=1))).isoformat(timespec="milliseconds")
    if style == 2:
        return t.astimezone().replace(tzinfo=None).isoformat()
    if style == 3:
        return "not a time"  # parses to 0.0: all such runs tie
    return t.isoformat(timespec="milliseconds")


def make(i, task, k, prompt, rep, ts, *, ok=True, tok_s=40.0, out=(1, 2, 3, 4), temp=0.0, times=None,
         p_min=0.0, flags=(), n_predict=128, draft=(10, 7)):
    return make_record(
        run_id=f"r{i % 50}", sweep_id="s", status="ok" if ok else "failed", engine="inprocess",
        arm_kind="baseline" if k is None else "mtp", k=k, p_min=None if k is None else p_min, task=task,
        prompt_id=prompt, rep=rep, n_predict=n_predict, n_generated=len(out), tok_s=tok_s, tok_s_engine=None,
        draft_n=draft[0] if k else None, draft_accepted=draft[1] if k else None, acceptance=None, mtp_engaged=None,
        output_sha256=None, output_tokens=tuple(out), prompt_n=3, prompt_tokens=(1, 2, 3), prompt_tok_s=None,
        llama_build="b", sampling={"temperature": temp}, token_times=tuple(times or (0.0, 0.1, 0.2, 0.3)),
        timestamp_utc=ts, flags=tuple(flags))


def tied_records(seed: int, n: int) -> list[RunRecord]:
    """Runs on a coarse clock (whole and half seconds, in four spellings) so that many baselines
    are equally far from an MTP run, with repeated repetitions, failures, missing speeds, sampled
    runs, diverging outputs and p_min arms."""
    rng = random.Random(seed)
    outs = [(1, 2, 3, 4), (1, 2, 9, 4), (1, 2, 3), (1, 2, 3, 4, 5)]
    recs = []
    for i in range(n):
        k = rng.choice([None, None, 1, 2, 3])
        recs.append(make(
            i, rng.choice(["code", "story"]), k, rng.choice(["p", "q", "r"]), rng.randrange(4),
            stamp(rng.randrange(0, 60) / 2 * rng.choice([1, 1, 1, 10]), rng.choice([0, 0, 0, 1, 2, 3])),
            ok=rng.random() > 0.1, tok_s=rng.choice([None, 0.0, 20.0, 40.0, 60.0, rng.uniform(20, 60)]),
            out=rng.choice(outs), temp=rng.choice([0.0, 0.0, 0.7]), p_min=rng.choice([0.0, 0.0, 0.5]),
            times=[0.0] + [0.02 * j + (0.01 if rng.random() < 0.3 else 0.0) for j in range(1, rng.randrange(3, 30))],
            flags=("mtp_not_engaged",) if rng.random() < 0.05 else (), n_predict=rng.choice([128, 32])))
    return recs


def test_each_timestamp_is_parsed_once(monkeypatch):
    """Pairing used to parse both timestamps for every baseline candidate of every MTP run: tens of
    thousands of parses here, millions on a real file. Now each record's at most once."""
    calls = 0
    parse = analysis._ts

    def counting(r):
        nonlocal calls
        calls += 1
        return parse(r)

    monkeypatch.setattr(analysis, "_ts", counting)
    recs = [make(i, task, k, f"p{p}", rep, stamp(i * 3.0), tok_s=40.0 + (k or 0))
            for i, (task, p, rep, k) in enumerate(
                (task, p, rep, k) for rep in range(20) for task in ("code", "story") for p in range(3)
                for k in (None, 1, 2, 3, 4))]
    a = analyze(recs)
    assert len(a.equivalence) == 4 * 20 * 2 * 3
    assert calls <= len(recs), f"{calls} timestamp parses for {len(recs)} records"


@pytest.mark.parametrize("seed", range(40))
def test_same_analysis_as_the_simple_pairing_on_ties(seed):
    recs = tied_records(seed, random.Random(seed).randrange(0, 250))
    new, ref = analyze(recs), ref_analyze(recs)
    assert same_findings(new) == same_findings(ref)
    for t in new.tasks + ("none",):
        for arm in new.arms + (Arm(9, 0.0),):
            assert new.cell(t, arm) == next((c for c in ref.cells if c.task == t and c.arm == arm), None)
    mix = parse_mix(None, new.tasks)
    assert recommend(new, mix) == recommend(ref, mix)
    assert compare(new, ref) == compare(ref, ref)


def test_the_tie_breaks():
    """Equally far before and after: the same repetition wins; among those, the earlier in the file;
    a nearer baseline of another repetition beats a farther one of the same repetition."""
    def pair(recs):
        return [(e.rep, e.equal) for e in analyze(recs).equivalence]

    def b(i, rep, sec, out):
        return make(i, "t", None, "p", rep, stamp(sec), out=out)

    same, other = (1, 2, 3, 4), (7, 7, 7, 7)
    mtp = make(0, "t", 2, "p", 1, stamp(10))
    assert pair([b(1, 0, 9, other), b(2, 1, 11, same), mtp]) == [(1, True)]  # same rep, after
    assert pair([b(1, 1, 9, same), b(2, 0, 11, other), mtp]) == [(1, True)]  # same rep, before
    assert pair([b(1, 0, 9, same), b(2, 2, 11, other), mtp]) == [(1, True)]  # no same rep: the first in the file
    assert pair([b(2, 2, 11, same), b(1, 0, 9, other), mtp]) == [(1, True)]
    assert pair([b(1, 1, 12, other), b(2, 0, 10.5, same), mtp]) == [(1, True)]  # nearer beats same rep
    assert pair([b(1, 1, 10, other), b(2, 1, 10, same), mtp]) == [(1, False)]  # exact tie: the first
    # the same instant spelled differently is the same time
    assert pair([b(1, 0, 9, other), make(2, "t", None, "p", 1, stamp(11, 1), out=same), mtp]) == [(1, True)]
    recs = [b(1, 0, 9, other), b(2, 1, 11, same), mtp]
    assert same_findings(analyze(recs)) == same_findings(ref_analyze(recs))


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # the property test needs hypothesis (the test extra installs it)
    given = None

if given is not None:
    run = st.tuples(st.sampled_from(["code", "story"]), st.sampled_from([None, None, 1, 2]),
                    st.sampled_from(["p", "q"]), st.integers(0, 2), st.integers(0, 12), st.integers(0, 3),
                    st.booleans(), st.sampled_from([None, 0.0, 30.0, 45.0, 60.0]),
                    st.sampled_from([(1, 2, 3), (1, 5, 3), (1, 2)]), st.sampled_from([0.0, 0.5]))

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(run, max_size=60))
    def test_property_same_analysis_as_the_simple_pairing(runs):
        recs = [make(i, task, k, p, rep, stamp(sec, style), ok=ok or k is None, tok_s=tok_s, out=out,
                     p_min=pm, times=[0.0] + [0.01 * j * (1 + sec % 3) for j in range(1, 12)])
                for i, (task, k, p, rep, sec, style, ok, tok_s, out, pm) in enumerate(runs)]
        assert same_findings(analyze(recs)) == same_findings(ref_analyze(recs))


# ---- the numpy path of bimodal (millions of gaps in a large file) against the plain loop ----------

def ref_bimodal(xs, min_share=0.15, min_sep=4.0):
    """stats.bimodal before its numpy path for large files, copied verbatim."""
    import math

    from app.core.analysis.stats import Bimodal

    v = sorted(x for x in xs if math.isfinite(x))
    n = len(v)
    if n < 8:
        return None
    best, best_i = -1.0, 0
    total = sum(v)
    left = 0.0
    for i in range(1, n):
        left += v[i - 1]
        w0, w1 = i / n, (n - i) / n
        m0, m1 = left / i, (total - left) / (n - i)
        between = w0 * w1 * (m0 - m1) ** 2
        if between > best:
            best, best_i = between, i
    a, b = v[:best_i], v[best_i:]
    if len(a) < min_share * n or len(b) < min_share * n:
        return None
    ma, mb = statistics.median(a), statistics.median(b)

    def mad(c, m):
        return statistics.median(abs(x - m) for x in c) * 1.4826

    spread = max(math.sqrt((mad(a, ma) ** 2 + mad(b, mb) ** 2) / 2), 1e-12 * abs(mb))
    if (mb - ma) / spread < min_sep:
        return None
    return Bimodal(ma, mb, len(b) / n)


def gap_sets(seed: int, n: int) -> list[list[float]]:
    rng = random.Random(seed)
    two = [rng.gauss(0.019, 3e-4) if rng.random() < 0.6 else rng.gauss(0.026, 3e-4) for _ in range(n)]
    return [
        two,  # two levels
        [rng.gauss(0.02, 0.001) for _ in range(n)],  # one level
        [round(x, 3) for x in two],  # many ties
        [rng.choice([1.0, 2.0, 2.0, 3.0, float("nan"), float("inf"), -float("inf")]) for _ in range(n)],
        [0.02] * n,  # all equal: no split scores above zero
        [0.0 if rng.random() < 0.5 else -0.0 for _ in range(n // 2)] + [0.03] * (n - n // 2),  # signed zeros
        [rng.expovariate(50.0) for _ in range(n)],  # skewed
        [1e308 * rng.random() for _ in range(n)],  # sums overflow
    ]


@pytest.mark.parametrize("case", range(8))
def test_bimodal_on_an_array_is_the_loop(case):
    """Above stats.VECTOR_FROM a numpy array takes the vectorised path: the same Bimodal, to the
    last bit, as the loop gives for the same values in a list."""
    import numpy as np

    from app.core.analysis import stats

    xs = gap_sets(case, stats.VECTOR_FROM + 1234)[case]
    got = stats.bimodal(np.array(xs))
    assert got == ref_bimodal(xs) == stats.bimodal(xs)
    assert repr(got) == repr(ref_bimodal(xs))  # -0.0 and 0.0 are equal, but print differently


def test_bimodal_vector_path_on_small_arrays(monkeypatch):
    """The vectorised path forced on small arrays (where ties and near-equal split scores are
    common): the same answer as the loop, every time."""
    import numpy as np

    from app.core.analysis import stats

    monkeypatch.setattr(stats, "VECTOR_FROM", 8)
    rng = random.Random(7)
    found = 0
    for n in list(range(8, 60)) * 6:
        xs = [rng.choice([0.01, 0.02, 0.03]) + rng.choice([0, 0, 1e-4, rng.gauss(0, 1e-3)]) for _ in range(n)]
        got = stats.bimodal(np.array(xs))
        assert got == ref_bimodal(xs), xs
        found += got is not None
    assert found > 20  # both answers were exercised


def test_bimodal_vector_scores_only_shortlist(monkeypatch):
    """The vectorised split scores are near the loop's, not equal (C's pow against numpy's square):
    they only shortlist, and the loop's own arithmetic picks. Scores jittered within the shortlist's
    margin change nothing, also on symmetric data, whose two best splits score the same but for
    rounding."""
    import numpy as np

    from app.core.analysis import stats

    rng = random.Random(11)
    real = stats._split_scores

    def jittered(*a):
        sc = real(*a)
        return sc * (1 + np.array([rng.uniform(-1e-13, 1e-13) for _ in range(len(sc))]))

    monkeypatch.setattr(stats, "VECTOR_FROM", 8)
    monkeypatch.setattr(stats, "_split_scores", jittered)
    for _ in range(300):
        half = [rng.choice([0.1, 0.2, 0.3, 0.7, 1.1, 0.01]) for _ in range(rng.randrange(4, 30))]
        c = rng.choice([0.5, 1.0, 0.37, 2.0])
        k, a = rng.randrange(3, 12), rng.choice([0.1, 0.3, 1.0])
        three = [c - a] * k + [c] * k + [c + a] * k  # splits k and 2k score the same but for rounding
        for xs in (sorted(half + [2 * c - x for x in half]), half * 3, three):
            assert stats.bimodal(np.array(xs), min_share=0.1, min_sep=0.5) == ref_bimodal(xs, 0.1, 0.5), xs


def test_first_divergence_is_the_loop():
    def ref(a, b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return i
        if len(a) != len(b):
            return min(len(a), len(b))
        return None

    rng = random.Random(3)
    for _ in range(2000):
        a = [rng.randrange(3) for _ in range(rng.randrange(6))]
        b = a[:rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(3))]
        assert first_divergence(a, b) == ref(a, b) == first_divergence(tuple(a), tuple(b))


@pytest.mark.parametrize("seed", range(10))
def test_same_analysis_with_the_gaps_in_numpy(monkeypatch, seed):
    """The baseline's inter-token gaps gathered into a numpy array (as for a large file) give the
    same analysis as the list the loop used."""
    from app.core.analysis import stats

    monkeypatch.setattr(stats, "VECTOR_FROM", 40)
    monkeypatch.setattr(analysis, "VECTOR_FROM", 40)
    monkeypatch.setattr(analysis, "_GAP_BATCH", 1 + seed % 4)
    recs = tied_records(seed, 300)
    ok = [r for r in recs if r.status == "ok"]
    gaps = analysis._baseline_gaps(ok)
    assert not isinstance(gaps, list) and len(gaps) >= 40
    ref = []
    for r in ok:
        if r.k is None and len(r.token_times) > 8:
            t = r.token_times
            ref.extend(b - a for a, b in zip(t[1:], t[2:]))
    assert gaps.tolist() == ref
    assert same_findings(analyze(recs)) == same_findings(ref_analyze(recs))


def ref_setup(records):
    """compare._setup before it scaled to large files (each record's values formatted anew)."""
    import json
    from pathlib import PurePath

    ok = [r for r in records if r.status == "ok"] or list(records)

    def values(f):
        return ", ".join(sorted({str(f(r)) for r in ok})) or "-"

    return {
        "llama.cpp build": values(lambda r: r.llama_build),
        "backend": values(lambda r: r.backend or "not recorded"),  # added later: compare names the builds' backends
        "engine": values(lambda r: r.engine),
        # added later: the threads llama.cpp ran with (None in older records: nothing said)
        "threads": ", ".join(sorted({str(r.threads) for r in ok if r.threads is not None})) or "-",
        "model": values(lambda r: f"{PurePath(r.model_path).name} ({size_text(r.model_size)})"),  # not "0.00 GiB"
        # added later: the speculative runs' drafter file
        "drafter": ", ".join(sorted({(f"{PurePath(r.drafter['path']).name} (sha256 {r.drafter['sha256'][:12]})"
                                      if r.drafter else "none") for r in ok if r.arm_kind != "baseline"})) or "-",
        "tokens per run": values(lambda r: r.n_predict),
        "sampling": values(lambda r: json.dumps(r.sampling, sort_keys=True)),
        "prompts": values(lambda r: f"{r.task}/{r.prompt_id}"),
        "machine": values(lambda r: f"{r.host.get('os', '?')}, {r.host.get('cpu_count', '?')} CPUs"),
    }


def test_setup_formats_each_distinct_value_once_and_says_the_same():
    """Values equal in Python but written differently (0, 0.0, -0.0, False; 1 and 1.0 GiB) stay
    apart, as they did when every record was formatted."""
    import dataclasses

    rng = random.Random(5)
    base = make(0, "t", None, "p", 0, stamp(0))
    recs = []
    for i in range(400):
        recs.append(dataclasses.replace(
            base, run_id=f"r{i}", model_path=rng.choice(["/m/a.gguf", "/n/a.gguf", "/m/b.gguf"]),
            model_size=rng.choice([2**30, 2**31, float(2**30), -0.0, 0.0]),
            sampling=rng.choice([{"temperature": 0}, {"temperature": 0.0}, {"temperature": -0.0},
                                 {"temperature": False}, {"temperature": float("nan")},
                                 {"seed": 1, "temperature": 0.0}, {"temperature": 0.0, "seed": 1},
                                 {"temperature": [0.0]}, {"t": None, "s": "x"}])))
    assert compare_mod._setup(recs) == ref_setup(recs)
    assert compare_mod._setup(recs[:7]) == ref_setup(recs[:7])


def test_a_large_file_reads_back_equal_with_repeats_shared(tmp_path):
    """The reader shares equal token lists and names between the records of a file (the memory of
    a 200k-run file halves); the records are equal to what was written, field for field, and a
    list of the wrong type is refused as before."""
    import dataclasses
    import json

    from app.core.common.errors import UserError
    from app.core.records.reader import load_records
    from app.core.records.writer import ResultsWriter

    recs = [dataclasses.replace(r, output_tokens=(1000 + len(r.prompt_id), 7, 7), prompt_tokens=(5, 6))
            for r in tied_records(1, 60)]
    recs = [dataclasses.replace(r, token_times=(0.1, 0.25, 0.5), tok_s=r.tok_s or None) for r in recs]
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        for r in recs:
            w.append(r)
    got = load_records(path)
    assert got == recs
    assert all(type(x) is type(y) for a, b in zip(got, recs) for x, y in
               zip(dataclasses.astuple(a), dataclasses.astuple(b)))
    by_out = {}
    for r in got:
        by_out.setdefault(r.output_tokens, r.output_tokens)
        assert r.output_tokens is by_out[r.output_tokens] and r.prompt_tokens is got[0].prompt_tokens
    line = json.loads(recs[0].to_json())
    bad = tmp_path / "bad.jsonl"
    first = list(line["output_tokens"])
    bad.write_text(recs[0].to_json() + "\n" + json.dumps({**line, "output_tokens": [first[0], 7.0, 7]}) + "\n")
    with pytest.raises(UserError, match=rf"line 2: not a valid run record \('output_tokens' is \({first[0]}, 7.0, 7\)"):
        load_records(bad)  # equal in value to line 1's tokens, but not ints


def _old_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _old_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


OLD_CHECKS = {"int": _old_int, "float": _old_num, "str": lambda x: isinstance(x, str),
              "bool": lambda x: isinstance(x, bool), "None": lambda x: x is None,
              "dict[str, Any]": lambda x: isinstance(x, dict),
              "tuple[int, ...]": lambda x: all(_old_int(v) for v in x),
              "tuple[float, ...]": lambda x: all(_old_num(v) for v in x),
              "tuple[str, ...]": lambda x: all(isinstance(v, str) for v in x)}


def ref_from_dict(d):
    """RunRecord.from_dict before it scaled to large files, copied (with the checks it had)."""
    import dataclasses

    def type_ok(value, annotation):
        checks = [OLD_CHECKS.get(a.strip()) for a in annotation.split("|")]
        if value is None:  # a field that may be None (server_args) is checked as None, not as its tuple
            return any(c is None or c is OLD_CHECKS["None"] for c in checks)
        return any(c is None or c(value) for c in checks)

    from app.core.records.schema import FIELD_NAMES, JSON_KEYS  # added later: arm_kind is "arm" in a file

    names = {JSON_KEYS.get(f.name, f.name) for f in dataclasses.fields(RunRecord)}
    kw = {FIELD_NAMES.get(k, k): v for k, v in d.items() if k in names}
    for key in ("output_tokens", "prompt_tokens", "token_times", "flags", "devices", "accepted_per_pos"):  # the last: added later
        if not isinstance(kw.get(key) or (), (list, tuple)):
            raise ValueError(f"{key} is not a list")
        kw[key] = tuple(kw.get(key) or ())
    kw.setdefault("error", None)
    if kw.get("server_args") is not None:  # added later (schema 7): a list of strings, or None
        if not isinstance(kw["server_args"], (list, tuple)):
            raise ValueError("server_args is not a list")
        kw["server_args"] = tuple(kw["server_args"])
    for f in dataclasses.fields(RunRecord):
        if f.name not in kw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"no {JSON_KEYS.get(f.name, f.name)!r}")
            continue
        if not type_ok(kw[f.name], str(f.type)):
            raise ValueError(f"{JSON_KEYS.get(f.name, f.name)!r} is {kw[f.name]!r}, expected {f.type}")
    return RunRecord(**kw)


class _Str(str):
    pass


class _Int(int):
    pass


def test_from_dict_accepts_and_refuses_as_before():
    """The faster checks (exact types first, item types as a set) accept and refuse the same
    values, with the same message, as the field-by-field checks did."""
    import json

    good = json.loads(make(0, "t", 2, "p", 0, stamp(0)).to_json())
    values = [0, 1, -3, True, False, 0.5, float("nan"), "x", _Str("y"), _Int(4), None, {}, {"a": 1}, [], [1, 2],
              [1, True], [1, 2.5], ["a", 1], ["a", _Str("b")], [_Int(3)], (1,), [0.1, 0.2], [None]]
    rng = random.Random(2)
    seen = set()
    for _ in range(3000):
        d = dict(good)
        for key in rng.sample(sorted(good), rng.choice([1, 1, 2])):
            if rng.random() < 0.1:
                del d[key]
            else:
                d[key] = rng.choice(values)
        try:
            want = ref_from_dict(d)
        except ValueError as e:
            with pytest.raises(ValueError) as got:
                RunRecord.from_dict(d)
            assert str(got.value) == str(e)
            seen.add("refused")
        else:
            assert RunRecord.from_dict(d) == want
            seen.add("accepted")
    assert seen == {"accepted", "refused"}


def test_a_shared_output_tuple_is_compared_as_before():
    """The reader gives greedy runs of a prompt the same tuple object: equal without a scan when it
    holds ints, but a NaN in it still differs from itself, as the element-wise loop said."""
    shared = (1, 2, 3, 4)
    odd = (1, float("nan"), 3)
    for out, want in ((shared, [(0, True, None)]), (odd, [(0, False, 1)])):
        recs = [make(1, "t", None, "p", 0, stamp(0), out=out), make(2, "t", 2, "p", 0, stamp(1), out=out)]
        a = analyze(recs)
        assert [(e.rep, e.equal, e.first_divergence) for e in a.equivalence] == want
        assert same_findings(a) == same_findings(ref_analyze(recs))
