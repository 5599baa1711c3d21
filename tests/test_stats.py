"""Statistics on synthetic samples with known answers."""

from __future__ import annotations

import dataclasses

import math
import random

import pytest

from app.core.analysis import breakeven as B
from app.core.analysis.stats import Summary, bimodal, combine_ratios, outliers, paired_ratio


def pairs(n, shift, noise, seed=0, base=40.0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        b = base * math.exp(rng.gauss(0, noise))
        a = base * shift * math.exp(rng.gauss(0, noise))
        out.append((a, b))
    return out


def test_identical_distributions_are_within_noise():
    r = paired_ratio(pairs(12, 1.0, 0.05, seed=1))
    assert r.verdict == "within noise"
    assert r.lo < 1.0 < r.hi


def test_ten_percent_shift_with_low_noise_is_faster_with_interval_excluding_one():
    r = paired_ratio(pairs(8, 1.10, 0.01, seed=2))
    assert r.verdict == "faster"
    assert 1.0 < r.lo < 1.10 < r.hi < 1.2
    assert r.estimate == pytest.approx(1.10, abs=0.02)
    s = paired_ratio(pairs(8, 0.9, 0.01, seed=3))
    assert s.verdict == "slower" and s.hi < 1.0


def test_too_few_pairs_has_no_interval():
    assert paired_ratio([(2.0, 1.0)]).verdict == "too few runs"
    assert paired_ratio([]).estimate is None


def test_interval_coverage_is_about_95_percent():
    hits = 0
    for seed in range(400):
        r = paired_ratio(pairs(6, 1.2, 0.08, seed=seed))
        hits += r.lo <= 1.2 <= r.hi
    assert 0.91 <= hits / 400 <= 0.99


def test_combined_mix_ratio_weights_tasks():
    fast = paired_ratio(pairs(10, 1.5, 0.01, seed=4))
    slow = paired_ratio(pairs(10, 0.8, 0.01, seed=5))
    mostly_fast = combine_ratios([(0.9, fast), (0.1, slow)])
    mostly_slow = combine_ratios([(0.1, fast), (0.9, slow)])
    assert mostly_fast.verdict == "faster" and mostly_slow.verdict == "slower"
    assert mostly_fast.estimate == pytest.approx(math.exp(0.9 * math.log(1.5) + 0.1 * math.log(0.8)), rel=0.02)


def test_outliers_by_median_and_mad():
    xs = [40.1, 39.8, 40.3, 40.0, 39.9, 28.0, 40.2]
    assert outliers(xs) == [5]
    assert outliers([1.0, 1.0, 1.0, 1.0]) == []


def test_bimodal_detects_two_levels_and_not_one():
    rng = random.Random(7)
    two = [rng.gauss(19, 0.4) for _ in range(60)] + [rng.gauss(26, 0.5) for _ in range(40)]
    rng.shuffle(two)
    bm = bimodal(two)
    assert bm is not None and bm.low == pytest.approx(19, abs=0.5) and bm.high == pytest.approx(26, abs=0.5)
    assert bimodal([rng.gauss(20, 1.0) for _ in range(100)]) is None


def test_summary():
    s = Summary.of([1, 2, 3, 4, 100])
    assert s.median == 3 and s.n == 5 and s.p10 < s.p90


def test_alpha_inversion_round_trips():
    for k in (1, 2, 4, 7):
        for alpha in (0.0, 0.3, 0.6, 0.9, 1.0):
            rate = B.acceptance_rate(alpha, k)
            assert B.infer_alpha(rate, k) == pytest.approx(alpha, abs=1e-6)
    assert B.mean_accepted_length(1.0, 3) == 4.0


def test_break_even_from_costs():
    c = B.Costs({1: 20.0, 2: 30.0, 3: 32.0, 4: 34.0, 5: 36.0}, draft_ms=1.0, catchup_ms={})
    # K=1: S(alpha) = (1+alpha)*20 / (30 + 1 + 1): pays when alpha >= 0.6
    assert B.break_even_alpha(1, c) == pytest.approx(0.6, abs=1e-6)
    curves = B.curves([1, 2, 3], c)
    assert [len(cv.speedup) for cv in curves] == [101] * 3
    assert all(cv.speedup[-1] > cv.speedup[0] for cv in curves)
    expensive = B.Costs({1: 10.0, 2: 40.0}, draft_ms=5.0)
    assert B.break_even_alpha(1, expensive) is None


def test_baseline_is_repeated_so_every_mtp_run_has_a_nearby_one():
    from app.core.measure.plan import BASELINE_EVERY, Plan, make_arms
    from app.core.records.prompt import Prompt

    plan = Plan(model="m.gguf", arms=make_arms(range(1, 9)), prompts=(Prompt("a", "t", "x"),), reps=1)
    runs = plan.runs()
    since = None
    for r in runs:
        if r.arm.k is None:
            since = 0
        else:
            since += 1
            assert since <= BASELINE_EVERY
    assert sum(1 for r in runs if r.arm.k is None) == 2 and plan.total_runs == len(runs) == 10


def test_spread_first_gives_every_prompt_its_baseline_and_the_drafter_before_the_other_arms():
    # Quick on a slow machine: the budget may end in the first round, which must have measured every task
    from app.core.measure.plan import Plan, make_arms
    from app.core.records.prompt import Prompt

    arms = make_arms([2], modes=["ngram-mod", "ngram-simple", "draft-simple"], drafters={"draft-simple": "d.gguf"})
    prompts = (Prompt("c", "code", "x"), Prompt("s", "story", "y"))
    plan = Plan(model="m.gguf", arms=arms, prompts=prompts, reps=2, spread_first=True)

    def seq(runs):
        return [(r.prompt.task, r.arm.label, r.rep) for r in runs]

    first, second = [r for r in plan.runs() if r.rep == 0], [r for r in plan.runs() if r.rep == 1]
    assert seq(first) == [("code", "baseline", 0), ("code", "draft-simple K=2", 0),
                          ("story", "baseline", 0), ("story", "draft-simple K=2", 0),
                          ("code", "baseline", 0), ("code", "ngram-mod", 0), ("code", "ngram-simple", 0),
                          ("story", "baseline", 0), ("story", "ngram-mod", 0), ("story", "ngram-simple", 0)]
    # the later repetitions as every plan's: each prompt's arms back to back
    plain = dataclasses.replace(plan, spread_first=False)
    assert seq(second) == seq(r for r in plain.runs() if r.rep == 1)
    assert len(seq(r for r in plain.runs() if r.rep == 0)) == 8 and plan.total_runs == 18
    # one prompt, or one speculative arm: nothing to spread
    for p in (dataclasses.replace(plan, prompts=prompts[:1]), dataclasses.replace(plan, arms=arms[:2])):
        assert seq(p.runs()) == seq(dataclasses.replace(p, spread_first=False).runs())


# A known cost model, in ms: target decode of n rows, one draft step, MTP catch-up of n rows.
def _t_ms(n: int) -> float:
    return 18.0 + 2.0 * n


DRAFT_MS = 1.5


def _catchup_ms(n: int) -> float:
    return 0.8 + 0.2 * n


def _step_ms(k: int) -> float:
    """One verification step at width k: verify k+1 rows, k draft steps, catch up k+1 rows."""
    return _t_ms(k + 1) + k * DRAFT_MS + _catchup_ms(k + 1)


def _recorded_run(k, rep, alpha, rng, *, n_predict=200, t0_s=0.0):
    """A run as the runner records it, generated by the cost model above: token_times from the
    model, tok_s from token_times (first token excluded), draft counts from i.i.d. acceptance.
    An MTP step drafts K tokens and emits 1 + the accepted ones; when fewer than K+1 tokens are
    left the tail is decoded plainly at T(1), as costs_from_runs assumes. Returns the record and
    the number of tail tokens."""
    from tests.helpers import make_record

    t = 0.05  # the first token, after the prompt: excluded from tok_s
    times = [t]
    drafted = accepted = tail = 0
    while len(times) < n_predict:
        if k is not None and n_predict - len(times) - 1 >= k:
            acc = 0
            while acc < k and rng.random() < alpha:
                acc += 1
            t += _step_ms(k) / 1000.0
            times += [t] * (1 + acc)
            drafted += k
            accepted += acc
        else:
            t += _t_ms(1) / 1000.0
            times.append(t)
            tail += k is not None
    n = len(times)
    out = tuple(range(n))
    return make_record(
        run_id=f"{k}-{rep}", sweep_id="s", engine="inprocess",
        arm_kind="baseline" if k is None else "mtp", k=k, p_min=None if k is None else 0.0, task="t",
        prompt_id="a", rep=rep, n_predict=n_predict, n_generated=n, tok_s=(n - 1) / (times[-1] - times[0]),
        tok_s_engine=None, draft_n=drafted if k else None, draft_accepted=accepted if k else None,
        acceptance=accepted / drafted if k else None, mtp_engaged=True if k else None, output_sha256="x",
        output_tokens=out, prompt_n=3, prompt_tokens=(1, 2, 3), prompt_tok_s=None, llama_build="b",
        token_times=tuple(times), timestamp_utc=f"2026-01-01T00:{int(t0_s // 60):02d}:{t0_s % 60:06.3f}+00:00"), tail


def test_costs_fitted_from_runs_recover_the_cost_model_and_reproduce_the_recorded_speedup():
    """Runs recorded from a known cost model (no live timing): costs_from_runs recovers T(1) and
    each K's whole step cost exactly, and the break-even model fed those costs predicts the
    speedup analyze() measures on the same runs. The live version of this check (fitted costs
    against real runs) is benchmarks/breakeven_validation.py."""
    from app.core.analysis.analysis import analyze
    from app.core.records.arm import Arm

    rng = random.Random(11)
    ks = (1, 2, 3)
    recs, tails = [], {k: 0 for k in ks}
    clock = 0.0
    for rep in range(4):
        for k in (None, *ks):
            r, tail = _recorded_run(k, rep, 0.7, rng, n_predict=200 + rep, t0_s=clock)
            recs.append(r)
            clock += 5.0
            if k:
                tails[k] += tail
    assert all(tails.values()), tails  # the data exercise the fit's plain-token (tail) term

    c = B.costs_from_runs(recs)
    assert c is not None and c.source == "runs"
    assert c.verify(1) == pytest.approx(_t_ms(1), rel=1e-9)
    for k in ks:
        assert c.step(k) == pytest.approx(_step_ms(k), rel=1e-9), k

    a = analyze(recs)
    for k in ks:
        cell = a.cell("t", Arm(k, 0.0))
        assert cell.ratio.estimate is not None
        pred = B.predicted_speedup(cell.alpha, k, c)
        # the only gap left: the few tail tokens the step model does not cover (about 1 %)
        assert pred == pytest.approx(cell.ratio.estimate, rel=0.01), (k, pred, cell.ratio.estimate)
    assert B.costs_from_runs([]) is None
    assert B.costs_from_runs([r for r in recs if r.k]) is None  # no baseline: no T(1)
