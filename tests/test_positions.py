"""Acceptance per draft position: counted by the in-process loop, read from
llama-server's /metrics around each run, and replayed by the exact simulator, all three equal; the
position model that predicts a draft width it did not measure; the model check's held-out K; the
Results tab's plot. Timings here are generated from a known cost model, never measured."""

from __future__ import annotations

import dataclasses
import random

import pytest

from app.core.analysis import breakeven as B
from app.core.analysis import positions as P
from app.core.analysis.analysis import analyze
from app.core.calibrated import design as calibrated
from app.core.engines.server.engine import spec_deltas
from app.core.engines.server.process import SpecCounters, parse_spec_counters
from app.core.measure.plan import Plan, make_arms
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.records.schema import RunRecord
from tests.helpers import make_record

PROMPTS = (Prompt("hello", "code", "hello world"),
           Prompt("cats", "story", "Write a story about 101 cats."))
N_PREDICT = 80


def _sweep(engine, path) -> list[RunRecord]:
    plan = Plan(model=str(path), arms=make_arms([1, 2, 3, 4]), prompts=PROMPTS, engine=engine.name,
                n_predict=N_PREDICT, reps=1, warmup=0)
    return [e.record for e in run_sweep(plan, engine) if isinstance(e, RunFinished)]


# -- counting: in-process loop == llama-server /metrics deltas == simulator ----------------------
@pytest.mark.server
@pytest.mark.parametrize("variant,p", [("embedding", 0.3), ("embedding", 1.0), ("hidden", 0.0), ("hidden", 0.5)])
def test_per_position_counts_equal_across_engines_and_the_simulator(server_bin, make_model, variant, p):
    from app.core.engines.inprocess import InProcessEngine
    from app.core.engines.server.engine import ServerEngine

    path = make_model(p, variant)
    tables = calibrated.load_tables(path)
    with InProcessEngine(ctx_size=2048) as eng:
        local = _sweep(eng, path)
    with ServerEngine(server_bin, ctx_size=2048) as eng:
        served = _sweep(eng, path)
    assert len(local) == len(served) == 10
    server_runs = {(r.prompt_id, r.k): r for r in served}
    for r in local:
        s = server_runs[(r.prompt_id, r.k)]
        if r.k is None:  # the baseline counts nothing
            assert (r.accepted_per_pos, r.draft_steps) == (s.accepted_per_pos, s.draft_steps) == ((), None)
            continue
        sim = calibrated.simulate(tables, r.prompt_tokens, r.k, N_PREDICT)
        assert s.prompt_tokens == r.prompt_tokens
        want = (sim.accepted_per_pos, sim.steps)
        assert (r.accepted_per_pos, r.draft_steps) == want, ("in-process", r.k, r.prompt_id)
        assert (s.accepted_per_pos, s.draft_steps) == want, ("llama-server", r.k, r.prompt_id)
        assert len(want[0]) == r.k and sum(want[0]) == r.draft_accepted == sim.draft_accepted
    if variant == "hidden":  # its drafts after the first are always wrong: nothing past position 1
        assert all(not any(r.accepted_per_pos[1:]) for r in local if r.k)
    if p == 1.0:  # every draft wrong: the counters are there, all zero
        assert all(r.accepted_per_pos == (0,) * r.k and r.draft_steps for r in served if r.k)


def test_simulator_counts_per_position():
    t = calibrated.design_tables(0.0, "embedding", seed=3)[0]
    r = calibrated.simulate(t, [104], 3, 50)
    # every draft right: each position counts in every step whose draft reached it (the last steps
    # draft fewer, n_predict's budget)
    assert r.accepted_per_pos[0] == r.steps and sum(r.accepted_per_pos) == r.draft_accepted == r.draft_n
    assert r.accepted_per_pos[0] >= r.accepted_per_pos[1] >= r.accepted_per_pos[2]
    th = calibrated.design_tables(0.3, "hidden", seed=3)[0]
    r = calibrated.simulate(th, [104], 4, 200)
    assert len(r.accepted_per_pos) == 4 and r.accepted_per_pos[1:] == (0, 0, 0)
    assert r.accepted_per_pos[0] == r.draft_accepted
    assert calibrated.simulate(t, [104], 0, 20).accepted_per_pos == ()


# -- reading /metrics -------------------------------------------------------------------------
PAGE = """# HELP llamacpp:spec_decode_num_drafts_total Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 34
llamacpp:spec_decode_num_accepted_tokens_total 45
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 21
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 14
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 10
"""


def test_metrics_page_is_parsed_and_odd_pages_give_nothing():
    assert parse_spec_counters(PAGE) == SpecCounters(34, {0: 21, 1: 14, 2: 10})
    assert parse_spec_counters("llamacpp:prompt_tokens_total 3\n") is None  # no speculative counters
    # llama.cpp prints its non-labelled counters as doubles: past 999999 they are not exact
    assert parse_spec_counters("llamacpp:spec_decode_num_drafts_total 1.23457e+06\n").drafts is None


def test_run_deltas_are_exact_or_left_out():
    before, after = SpecCounters(30, {0: 20, 1: 12, 2: 9}), SpecCounters(34, {0: 21, 1: 14, 2: 10})
    assert spec_deltas(before, after, 3) == ((1, 2, 1), 4)
    # the series appears with the first request that verified a draft
    assert spec_deltas(SpecCounters(0, {}), SpecCounters(5, {0: 3, 1: 1}), 2) == ((3, 1), 5)
    assert spec_deltas(SpecCounters(0, {}), SpecCounters(0, {}), 3) == ((0, 0, 0), 0)  # nothing drafted
    # a build without the per-position series: the steps, no positions
    assert spec_deltas(SpecCounters(0, {}), SpecCounters(5, {}), 2) == ((), 5)
    # no /metrics, a counter not exact, or counters that went back: nothing, and no error
    for b, a in ((None, after), (before, None), (SpecCounters(None, {}), after), (after, before)):
        assert spec_deltas(b, a, 3) == ((), None)


# -- the position model and the held-out K ------------------------------------------------------
COSTS = B.Costs({n: 20.0 + 4.0 * (n - 1) for n in range(1, 9)}, 1.0, {n: 1.5 for n in range(1, 9)}, "probe")
FALLING = (0.9, 0.6, 0.6, 0.6, 0.6, 0.6)  # a head that degrades after its first position, then flat


def _run(task, k, rep, cond, rng, clock, n_predict=2000):
    """A run as the runner records it, timed by COSTS: an MTP step drafts K, accepts position i
    with the conditional probability cond[i], and emits 1 + the accepted; the tail (fewer than K + 1
    tokens left) is decoded plainly."""
    t = 0.05
    times, drafted, per_pos, steps = [t], 0, [0] * (k or 0), 0
    while len(times) < n_predict:
        if k and n_predict - len(times) - 1 >= k:
            acc = 0
            while acc < k and rng.random() < cond[acc]:
                per_pos[acc] += 1
                acc += 1
            t += COSTS.step(k) / 1000.0
            times += [t] * (1 + acc)
            drafted, steps = drafted + k, steps + 1
        else:
            t += COSTS.verify(1) / 1000.0
            times.append(t)
    n = len(times)
    accepted = sum(per_pos)
    return make_record(
        run_id=f"{task}-{k}-{rep}", sweep_id="s", engine="inprocess",
        arm_kind="baseline" if k is None else "mtp", k=k, p_min=None if k is None else 0.0, task=task,
        prompt_id=task, rep=rep, n_predict=n_predict, n_generated=n, tok_s=(n - 1) / (times[-1] - times[0]),
        tok_s_engine=None, draft_n=drafted if k else None, draft_accepted=accepted if k else None,
        acceptance=accepted / drafted if k else None, mtp_engaged=True if k else None, output_sha256="x",
        output_tokens=tuple(range(n)), prompt_n=3, prompt_tokens=(1, 2, 3), prompt_tok_s=None, llama_build="b",
        token_times=tuple(times),
        timestamp_utc=f"2026-01-01T{int(clock // 3600):02d}:{int(clock % 3600 // 60):02d}:{clock % 60:06.3f}+00:00",
        spec_type=None if k is None else "draft-mtp",
        accepted_per_pos=tuple(per_pos) if k else (), draft_steps=steps if k else None)


def _records(ks=(1, 2, 3, 4, 6), tasks=(("code", FALLING),), reps=4, seed=5):
    rng, out, clock = random.Random(seed), [], 0.0
    for rep in range(reps):
        for task, cond in tasks:
            for k in (None, *ks):
                out.append(_run(task, k, rep, cond, rng, clock))
                clock += 5.0
    return out


def test_position_model_from_counts():
    # i.i.d. counts: the position model is the alpha model
    m = P.fit({3: P.PositionCounts((800, 640, 512), 1000, 1)})
    assert m.conditional == pytest.approx((0.8, 0.8, 0.8))
    assert m.expected_accepted(3) == pytest.approx(B.expected_accepted(0.8, 3))
    # position i pools the widths that drafted that far; past them, the last one (flat tail)
    m = P.fit({1: P.PositionCounts((90,), 100, 1), 2: P.PositionCounts((45, 27), 50, 1)})
    assert m.conditional == pytest.approx((0.9, 0.6)) and m.ks == (1, 2)
    assert not m.extrapolates(2) and m.extrapolates(3)
    assert m.rates(4) == pytest.approx((0.9, 0.54, 0.324, 0.1944))
    assert m.speedup(2, COSTS) == pytest.approx(B.speedup_at_length(1 + 0.9 + 0.54, 2, COSTS))
    # a position no step reached ends the measured ones
    assert P.fit({3: P.PositionCounts((5, 0, 0), 10, 1)}).conditional == (0.5, 0.0)
    assert P.fit({2: P.PositionCounts((0, 0), 0, 1)}) is None


def test_held_out_widths_are_predicted_from_k1_and_k2_and_the_iid_alpha_is_not():
    a = analyze(_records())
    cell = a.cell("code", Arm(3, 0.0))
    assert cell.positions.runs == 4 and len(cell.positions.accepted) == 3
    assert cell.positions.mean_accepted == pytest.approx(cell.positions.accepted[0] / cell.positions.steps
                                                         + sum(cell.positions.accepted[1:]) / cell.positions.steps)
    checks = P.held_out_checks(a.cells, COSTS, fit_ks=(1, 2))
    assert [c.k for c in checks] == [3, 4, 6] and all(c.extrapolated and c.fit_ks == (1, 2) for c in checks)
    iid_alpha = a.cell("code", Arm(2, 0.0)).alpha
    for c in checks:
        assert abs(c.error) < 0.05, (c.k, c.predicted, c.measured)
        assert c.predicted_accepted == pytest.approx(c.measured_accepted, rel=0.05)
        iid = B.predicted_speedup(iid_alpha, c.k, COSTS) / c.measured - 1
        if c.k == 6:  # the i.i.d. alpha from K=2 over-predicts a head that degrades
            assert iid > 0.15 > abs(c.error), (iid, c.error)
    rates = P.task_rates(a.cells)["code"]
    assert len(rates) == 6 and rates[0] == pytest.approx(0.9, abs=0.02) and rates[1] == pytest.approx(0.54, abs=0.03)


def test_model_check_reports_held_out_k_and_old_records_keep_the_alpha_path():
    from app.core.verdict.verdict import build_verdict

    recs = _records(ks=(1, 2, 3), reps=3)
    v = build_verdict(recs)  # costs fitted from the runs
    held = v.model_check.held_out
    assert sorted(c.k for c in held) == [1, 2, 3]
    by_k = {c.k: c for c in held}
    assert by_k[3].extrapolated and by_k[3].fit_ks == (1, 2)  # the widest K needs a position not measured
    assert not by_k[1].extrapolated and not by_k[2].extrapolated
    assert all(abs(c.error) < 0.06 for c in held), [(c.k, c.error) for c in held]
    assert v.model_check.max_abs_held_out_error == max(abs(c.error) for c in held)
    # recommend --verbose's text and the JSON show them (the K=3 line says it extrapolated); the
    # plain text leaves them out, after the verdict
    from app.core.verdict.report import verdict_dict, verdict_text

    assert "held-out widths" not in verdict_text(v) and "model check" not in verdict_text(v)
    text = verdict_text(v, verbose=True)
    assert "held-out widths" in text and any("K=3 from K=1,2" in ln and "extrapolated" in ln for ln in text.splitlines())
    assert sorted(h["k"] for h in verdict_dict(v)["held_out"]) == [1, 2, 3]
    # records without per-position counts (schema 1-2 files): no positions, the i.i.d. checks stay
    old = [dataclasses.replace(r, accepted_per_pos=(), draft_steps=None) for r in recs]
    v = build_verdict(old)
    assert v.model_check.held_out == () and len(v.model_check.checks) == 3
    assert all(c.positions is None for c in v.analysis.cells)
    assert P.task_rates(v.analysis.cells) == {}


# -- the Results tab's plot ---------------------------------------------------------------------
def test_results_tab_plots_acceptance_by_position_per_task(window, tmp_path):
    recs = _records(ks=(1, 2, 3), tasks=(("code", FALLING), ("story", (0.5, 0.3, 0.3))), reps=2)
    path = tmp_path / "positions.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in recs))
    window.results_tab.open_results(str(path))
    plot = window.results_tab.positions
    rates = P.task_rates(analyze(recs).cells)
    assert set(rates) == {"code", "story"}
    for task in ("code", "story"):
        xs, ys = plot.lines[task].getData()
        assert list(xs) == [1, 2, 3] and list(ys) == pytest.approx([100 * r for r in rates[task]])
        assert plot.lines[task].isVisible()
    assert "Held-out K" in plot.notes.toPlainText() and "story K=3" in plot.notes.toPlainText()
    # a sweep without counts: the lines go, the note says why
    old = tmp_path / "old.jsonl"
    old.write_text("".join(dataclasses.replace(r, accepted_per_pos=(), draft_steps=None).to_json() + "\n"
                           for r in recs))
    window.results_tab.open_results(str(old))
    assert not plot.lines["code"].isVisible() and "No acceptance per draft position" in plot.notes.toPlainText()


def _chain(p_after_miss: float, p_follow: float, n: int, seed: int) -> list[int]:
    """Match (1) or miss (0) at each text position: a two-state Markov chain."""
    import random

    rng = random.Random(seed)
    out, prev = [], 0
    for _ in range(n):
        prev = int(rng.random() < (p_follow if prev else p_after_miss))
        out.append(prev)
    return out


def _steps(matches: list[int], k: int) -> P.PositionCounts:
    """A greedy drafter's steps over the text at width k: accept while the drafts match (at most
    k), then the target's own token; the next step starts after it."""
    acc, steps, t = [0] * k, 0, 0
    while t + k < len(matches):
        a = 0
        while a < k and matches[t + a]:
            acc[a] += 1
            a += 1
        steps += 1
        t += a + 1
    return P.PositionCounts(tuple(acc), steps, 1)


@pytest.mark.parametrize("after_miss, follow", [(0.45, 0.9), (0.6, 0.75), (0.7, 0.7)])
def test_the_run_model_predicts_narrow_widths_from_a_wide_one_where_truncation_reads_them_low(after_miss, follow):
    # matches in runs (easy and hard stretches of text): a wide K starts more of its steps in hard
    # stretches, so its first position under-reads a narrow K's; the run model prices where steps start
    text = _chain(after_miss, follow, 300_000, seed=7)
    wide = _steps(text, 6)
    runs = P.fit_runs(wide, 6)
    trunc = P.fit({6: wide})
    assert runs is not None and trunc is not None
    assert runs.follow == pytest.approx(follow, abs=0.01) and runs.after_miss == pytest.approx(after_miss, abs=0.02)
    for k in range(1, 6):
        measured = 1 + _steps(text, k).mean_accepted
        assert 1 + runs.expected_accepted(k) == pytest.approx(measured, rel=0.015), k
        if after_miss < follow - 0.2 and k == 1:  # clustered: truncating K=6's rates reads K=1 low
            assert (1 + trunc.expected_accepted(k)) / measured - 1 < -0.03
    assert runs.rates(6) == pytest.approx(wide.rates, abs=0.01)  # it reproduces the width it was fitted on


def test_the_run_model_needs_a_continuation_to_count():
    assert P.fit_runs(P.PositionCounts((5,), 10, 1), 1) is None
    assert P.fit_runs(P.PositionCounts((0, 0), 10, 1), 2) is None
    always = P.fit_runs(P.PositionCounts((10, 10, 10), 10, 1), 3)  # every draft accepted
    assert always is not None and always.follow < 1.0 and always.expected_accepted(2) == pytest.approx(2.0, abs=0.2)
