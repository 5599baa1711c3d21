"""Statistics on synthetic samples with known answers."""

from __future__ import annotations

import math
import random

import pytest

from app.core import breakeven as B
from app.core.stats import Summary, bimodal, combine_ratios, outliers, paired_ratio


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
    from app.core.plan import BASELINE_EVERY, Plan, make_arms
    from app.core.prompts import Prompt

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


def test_costs_fitted_from_runs_reproduce_the_measured_speedup(make_model):
    """Costs fitted from the runs themselves predict those runs back (consistency of the fit)."""
    from app.core.analysis import ArmKey, analyze
    from app.core.inprocess import InProcessEngine
    from app.core.plan import Plan, make_arms
    from app.core.prompts import Prompt
    from app.core.runner import RunFinished, run_sweep

    plan = Plan(model=str(make_model(0.3)), arms=make_arms([1, 3]), prompts=(Prompt("a", "t", "hello world"),),
                engine="inprocess", n_predict=200, reps=2, warmup=1, raw=True)
    recs = [e.record for e in run_sweep(plan, InProcessEngine(ctx_size=1024, threads=2)) if isinstance(e, RunFinished)]
    c = B.costs_from_runs(recs)
    a = analyze(recs)
    for k in (1, 3):
        cell = a.cell("t", ArmKey(k, 0.0))
        pred = B.predicted_speedup(cell.alpha, k, c)
        assert pred == pytest.approx(cell.ratio.estimate, rel=0.25)
    assert B.costs_from_runs([]) is None
