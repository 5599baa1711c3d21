"""The adaptive sweep's phases one at a time (app.core.session.adaptive.AdaptiveSweep): costs,
pilot, candidates, measure, decide, the step and the loop, each on its own, with recorded
costs, recorded records or the calibrated model."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import app.core.session.adaptive as adaptive_mod
from app.core.analysis.decide import NO_GAIN, PAYS, SLOWER, TaskDecision
from app.core.engines.base import EngineKind
from app.core.engines.inprocess import InProcessEngine
from app.core.machine import gguf_info, hardware
from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.session.adaptive import MIX, AdaptiveSweep, adaptive_sweep
from app.core.session.budget import stated_cap
from app.core.session.events import AdaptiveResult, AdaptiveStage, Decisions, RunFinished, RunStarted
from tests.helpers import drained, fake_costs, make_record

COSTS = {1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0, 5: 60.0, 6: 70.0, 7: 80.0, 8: 90.0, 9: 100.0}
K1, K2, K3 = Arm(1, 0.0), Arm(2, 0.0), Arm(3, 0.0)
NO_ENGINE = SimpleNamespace(kind=EngineKind.INPROCESS, threads=1)  # for the phases that run nothing


@pytest.fixture(scope="module")
def snapshot():
    return hardware.snapshot()


def _plan(model, n_predict=24):
    return Plan(model=str(model), arms=(Arm(),), prompts=(Prompt("a", "code", "hello world"),
                                                          Prompt("b", "story", "the cat")),
                engine="inprocess", n_predict=n_predict, reps=1, warmup=0)


def _sweep(make_model, snapshot, engine=NO_ENGINE, **kw):
    kw.setdefault("cost", fake_costs(COSTS, 0.5))
    return AdaptiveSweep(_plan(make_model(0.0)), engine, hardware=snapshot, **kw)


def _predicting(sweep, speedups):
    """The pilot's findings, recorded: each task's predicted speedup by K."""
    sweep.predict = {t: s.__getitem__ for t, s in speedups.items()}


def _ran(sweep, task, arms, ratios, reps=3):
    """``reps`` recorded repetitions of ``task`` (baseline at about 40 tok/s, each arm at its
    ratio), back to back, as measure would have appended them."""
    for rep in range(reps):
        base = 40.0 * (1 + 0.002 * rep)
        for arm, tok_s in [(Arm(), base)] + [(a, base * r * (1 + 0.003 * (-1) ** rep)) for a, r in zip(arms, ratios)]:
            sec = len(sweep.records)
            sweep.records.append(make_record(arm, run_id=f"{task}{arm.label}{rep}", task=task, prompt_id=f"{task}-p",
                                             rep=rep, tok_s=tok_s, timestamp_utc=f"2026-01-01T00:{sec // 60:02d}:"
                                                                                  f"{sec % 60:02d}Z"))


# ---- costs -------------------------------------------------------------------------------------------

def test_costs_keeps_the_k_whose_best_case_beats_baseline(make_model, snapshot):
    sweep = _sweep(make_model, snapshot)
    events = list(sweep.costs())
    assert sweep.viable == [1, 2, 3] and sweep.step_costs is not None  # K=4 verifies 5 tokens: too dear
    assert [e.message for e in events] == ["K that can pay on this machine at all: [1, 2, 3]"]


def test_a_machine_where_no_k_can_pay_is_decided_off_without_a_run(make_model, snapshot):
    dear = {n: 10.0 * n for n in range(1, 10)}  # a verify of n tokens costs n baseline steps
    events = list(_sweep(make_model, snapshot, cost=fake_costs(dear, 0.5)).run())
    assert "none" in events[0].message
    off, result = events[-2:]
    assert isinstance(off, Decisions) and off.final and off.decided and off.runs == 0
    assert all(d.reason == "no draft width can pay on this machine" for d in off.tasks)
    assert isinstance(result, AdaptiveResult) and result.pick is None and result.decisions is off


# ---- pilot -------------------------------------------------------------------------------------------

def test_the_pilot_predicts_each_task_from_one_short_run_and_records_none(make_model, snapshot):
    with InProcessEngine(ctx_size=1024) as eng:
        sweep = _sweep(make_model, snapshot, eng)
        list(sweep.costs())
        events = list(sweep.pilot())
    said = [e.message for e in events if isinstance(e, AdaptiveStage)]
    assert sorted(m.split(":")[0] for m in said) == ["code", "story"] and all("at K=3" in m for m in said)
    assert not [e for e in events if isinstance(e, RunFinished)]  # reported as stages, not passed on
    assert set(sweep.predict) == {"code", "story"} and sweep.records == []
    assert all(sweep.pred(t, 1) > 1.0 for t in sweep.predict)  # drafts all accepted, cheap verifies: K=1 pays
    assert sweep.budget.spent_tokens > 0 and sweep.budget.runs == 0  # its tokens count; it is no measured run
    assert sweep.model is not None and sweep.model.path == sweep.plan.model


# ---- candidates --------------------------------------------------------------------------------------

def test_candidates_without_a_mix_that_pays_are_each_tasks_own(make_model, snapshot):
    sweep = _sweep(make_model, snapshot)
    sweep.viable = [1, 2, 3]
    _predicting(sweep, {"code": {1: 1.3, 2: 1.6, 3: 1.55}, "story": {1: 0.6, 2: 0.5, 3: 0.4}})
    stage = sweep.candidates()
    assert sweep.mix_arms == []  # the mix (0.88x at best) pays at no K
    assert sweep.own == {"code": [K2, K3], "story": [K1]} and sweep.per_task == sweep.own
    assert stage.candidates == (K2, K3, K1) and "off at every K" in stage.message


def test_a_mix_that_may_pay_is_measured_on_every_task_at_its_own_k(make_model, snapshot):
    sweep = _sweep(make_model, snapshot, max_candidates=1, p_mins=(0.0, 0.5))
    sweep.viable = [1, 2, 3]
    _predicting(sweep, {"code": {1: 1.3, 2: 1.6, 3: 1.9}, "story": {1: 1.2, 2: 1.1, 3: 1.0}})
    stage = sweep.candidates()
    assert sweep.mix_arms == [K3, Arm(3, 0.5)]  # the mix's best K (1.38x), with the p_min asked
    assert sweep.own == {"code": [K3], "story": [K1]}
    assert sweep.per_task == {"code": [K3, Arm(3, 0.5)], "story": [K1, K3, Arm(3, 0.5)]}
    assert "the mix is decided at K=3 on its own" in stage.message


# ---- measure -----------------------------------------------------------------------------------------

def test_measure_runs_a_tasks_arms_beside_baseline_and_counts_them(make_model, snapshot):
    with InProcessEngine(ctx_size=1024) as eng:
        sweep = _sweep(make_model, snapshot, eng)
        list(sweep.measure("story", (K1, K2), 2))
        list(sweep.measure("story", (K2,), 1))
    runs = [(r.task, r.k, r.rep) for r in sweep.records]
    assert runs == [("story", k, rep) for rep in (0, 1) for k in (None, 1, 2)] + [("story", None, 2), ("story", 2, 2)]
    assert sweep.next_rep == {"code": 0, "story": 3}
    assert sweep.reps == {("story", K1): 2, ("story", K2): 3}
    assert sweep.budget.runs == 8 and sweep.budget.spent_tokens == sum(r.n_generated for r in sweep.records)
    assert len({r.sweep_id for r in sweep.records}) == 1  # every step is part of one sweep


# ---- decide ------------------------------------------------------------------------------------------

def test_decide_reads_each_task_among_its_own_arms_and_the_mix_on_its_line(make_model, snapshot):
    sweep = _sweep(make_model, snapshot)
    sweep.own = {"code": [K2], "story": [K1]}
    sweep.mix_arms = [K2]
    _ran(sweep, "code", [K2], [1.5], reps=5)
    _ran(sweep, "story", [K1, K2], [0.8, 0.9], reps=5)
    state = sweep.decide()
    assert [d.task for d in state.tasks] == ["code", "story", MIX] and not state.final
    code, story, mix = state.tasks
    assert code.decided and code.pick == K2 and story.decided and story.pick is None  # story: leave it off
    assert code.outcome == PAYS and story.outcome == SLOWER
    # it looks every round: it decides on the anytime intervals (the task's and the mix's)
    assert code.ratio.anytime and story.ratio.anytime and mix.ratio.anytime
    fixed = sweep.latest["code"][K2]
    assert not fixed.anytime and code.ratio.lo < fixed.lo and code.ratio.hi > fixed.hi
    assert 1.1 < mix.ratio.estimate < 1.2  # the weighted geometric mean of 1.5 and 0.9
    assert set(sweep.latest) == {"code", "story"} and K1 in sweep.latest["story"]
    assert sweep.decide(True, "budget").stopped == "budget"


def test_a_mix_repetition_goes_to_its_fewest_paired_cell(make_model, snapshot):
    sweep = _sweep(make_model, snapshot)
    _ran(sweep, "code", [K2], [1.5], reps=4)
    _ran(sweep, "story", [K2], [0.9], reps=3)
    sweep.decide()
    assert sweep.mix_step(K2) == ("story", K2)


# ---- step and the loop -------------------------------------------------------------------------------

def _recorded_measure(sweep, seen):
    """measure, recorded: the step asked for, counted as measure counts it, no engine."""

    def measure(task, arms, n):
        seen.append((task, tuple(arms), n))
        for a in arms:
            sweep.reps[(task, a)] = sweep.reps.get((task, a), 0) + n
        return iter(())

    return measure


def _result(gen):
    """A phase's return value (what its generator returns once it is done)."""
    return drained(gen)[1]


def test_a_step_runs_one_pair_and_the_next_contender_past_max_reps(make_model, snapshot):
    sweep = _sweep(make_model, snapshot, max_reps=3)
    seen: list = []
    sweep.measure = _recorded_measure(sweep, seen)
    sweep.reps = {("code", K2): 3}  # K=2 has had its repetitions on code
    # 5 more repetitions would decide it: more than the cap's grace (GRACE_REPS)
    state = Decisions((TaskDecision("code", False, None, None, (K2, None, K1), K2, 5),
                       TaskDecision("story", True, K1, None, more_reps=0)), 0, 0, 0.0)
    assert _result(sweep.step(state)) is True and seen == [("code", (K1,), 1)]
    sweep.reps[("code", K1)] = 3  # every contender has had its repetitions: nothing may run
    assert _result(sweep.step(state)) is False and len(seen) == 1 and sweep.stopped == "max_reps"


def _ran_each(sweep, task, arms, series):
    """Recorded repetitions of ``task``: baseline at about 40 tok/s, each arm at its own ratio in
    each repetition (``series``: per arm, a ratio per repetition)."""
    for rep, ratios in enumerate(zip(*series)):
        base = 40.0 * (1 + 0.002 * rep)
        for arm, tok_s in [(Arm(), base)] + [(a, base * r) for a, r in zip(arms, ratios)]:
            sec = len(sweep.records)
            sweep.records.append(make_record(arm, run_id=f"{task}{arm.label}{rep}", task=task, prompt_id=f"{task}-p",
                                             rep=rep, tok_s=tok_s, timestamp_utc=f"2026-01-01T00:{sec // 60:02d}:"
                                                                                  f"{sec % 60:02d}Z"))


def test_a_step_gives_its_pair_to_the_line_whose_decision_is_nearest(make_model, snapshot):
    """Recorded: code K=2 at 1.11x with a ±20 % spread (pays at the earliest after about 15 more
    pairs), story at 0.83x and 0.99x (one more pair of K=1 brings every upper bound under 1 + δ:
    no gain worth having). The step gives one pair, to story's K=1, not one to every undecided
    line in turn (the old rounds: code first)."""
    sweep = _sweep(make_model, snapshot)
    sweep.own = sweep.per_task = {"code": [K2], "story": [K1, K2]}
    _ran_each(sweep, "code", [K2], [[1.10, 1.35, 0.92, 1.25, 1.00, 1.12]])
    _ran_each(sweep, "story", [K1, K2], [[0.80, 0.95, 0.70, 0.92, 0.78, 0.85], [0.99, 1.00, 0.98, 0.985, 0.995, 0.99]])
    state = sweep.decide()
    assert not any(d.decided for d in state.tasks)
    seen: list = []
    sweep.measure = _recorded_measure(sweep, seen)
    assert _result(sweep.step(state)) is True and seen == [("story", (K1,), 1)]
    from app.core.analysis import schedule

    ranked = schedule.order([(d, sweep.seq[d.task], 1) for d in state.tasks])
    assert [(n.task, n.arm, n.outcome) for n in ranked] == [("story", K1, NO_GAIN), ("code", K2, PAYS)]
    assert ranked[0].pairs == 1 and ranked[1].pairs >= 10


def test_a_line_about_to_decide_runs_past_the_cap_within_its_grace(make_model, snapshot):
    """Every contender has run max_reps, but 2 more repetitions would decide it: they run (the cap
    stated before the start is max_reps + GRACE_REPS), never a stop that says "about 2 more
    seconds would decide it"; past the grace nothing runs."""
    sweep = _sweep(make_model, snapshot, max_reps=3)
    seen: list = []
    sweep.measure = _recorded_measure(sweep, seen)
    sweep.reps = {("code", K2): 3, ("code", K1): 3}
    state = Decisions((TaskDecision("code", False, None, None, (K2, None, K1), K2, 2),), 0, 0, 0.0)
    assert _result(sweep.step(state)) is True and seen == [("code", (K2,), 1)]  # the arm it needs first
    sweep.reps = {("code", K2): 5, ("code", K1): 5}  # the grace is spent too
    assert _result(sweep.step(state)) is False and len(seen) == 1 and sweep.stopped == "max_reps"
    assert stated_cap(3) == ("it runs until every task is decided, at most 3 repetitions of each "
                                          "candidate (5 where they are estimated to decide it)")


def test_a_time_budget_stretches_into_its_grace_only_for_a_line_about_to_decide(make_model, snapshot):
    """A recorded clock at 101 s of a 100 s budget, runs of 1 s: a line estimated to be decided in
    4 s runs (the grace is 10 s); one estimated at 60 s stops at the budget."""
    sweep = _sweep(make_model, snapshot, budget_s=100.0, clock=lambda: 101.0)
    sweep.budget.t0, sweep.budget.runs, sweep.budget.run_s = 0.0, 10, 10.0
    seen: list = []
    sweep.measure = _recorded_measure(sweep, seen)
    near = Decisions((TaskDecision("code", False, None, None, (K1, None), K1, 1, eta_s=4.0),), 10, 0, 101.0, 4.0)
    assert _result(sweep.step(near)) is True and seen == [("code", (K1,), 1)]
    far = dataclasses.replace(near, eta_s=60.0)
    assert _result(sweep.step(far)) is False and len(seen) == 1 and sweep.stopped == "budget"


def test_a_step_stops_at_the_budget(make_model, snapshot):
    sweep = _sweep(make_model, snapshot, budget_tokens=10)  # not one more run of 24 tokens
    seen: list = []
    sweep.measure = _recorded_measure(sweep, seen)
    state = Decisions((TaskDecision("code", False, None, None, (K1,), K1, 1),), 0, 0, 0.0)
    assert _result(sweep.step(state)) is False and sweep.stopped == "budget" and seen == []


def test_the_loop_measures_a_first_round_then_steps_until_decided(make_model, snapshot, monkeypatch):
    """A recorded rule: a line is decided once its arm has 3 repetitions; each step gives one pair
    to the line it needs (a look after every pair)."""
    sweep = _sweep(make_model, snapshot, min_reps=2, max_reps=6)
    seen: list = []
    sweep.measure = _recorded_measure(sweep, seen)
    sweep.per_task = sweep.own = {"code": [K2], "story": [K1]}

    def rule(task, ratios, precision=0.05, **_):
        (arm,) = ratios
        done = sweep.reps.get((task, arm), 0) >= 3
        return TaskDecision(task, done, arm if done else None, None, () if done else (arm,), None if done else arm, 1)

    monkeypatch.setattr(adaptive_mod, "decide_task", rule)
    states = [e for e in sweep.rounds() if isinstance(e, Decisions)]
    # the first round one repetition of every task at a time (a budget cut leaves none unmeasured)
    assert seen == [("code", (K2,), 1), ("story", (K1,), 1)] * 3
    assert len(states) == 3 and states[-1].decided and sweep.stopped == "decided"


def test_the_model_is_read_once_for_every_step(make_model, snapshot, monkeypatch):
    """The pilot reads the model's header; every step after it reuses what it read."""
    reads: list[str] = []
    real = gguf_info.check_gguf_file
    monkeypatch.setattr(gguf_info, "check_gguf_file", lambda path: reads.append(str(path)) or real(path))
    with InProcessEngine(ctx_size=1024) as eng:
        events = list(adaptive_sweep(_plan(make_model(0.0)), eng, cost=fake_costs(COSTS, 0.5), min_reps=1,
                                     max_reps=2, hardware=snapshot))
    steps = [e for e in events if isinstance(e, Decisions)]
    assert len(steps) >= 2 and reads == [str(make_model(0.0))]


def test_the_public_function_is_the_object_run(make_model, snapshot):
    """adaptive_sweep builds an AdaptiveSweep and runs it: the same events, to the result."""
    plan = _plan(make_model(0.0))
    dear = {n: 10.0 * n for n in range(1, 10)}
    a = list(adaptive_sweep(plan, NO_ENGINE, cost=fake_costs(dear, 0.5), hardware=snapshot, clock=lambda: 0.0))
    b = list(AdaptiveSweep(plan, NO_ENGINE, cost=fake_costs(dear, 0.5), hardware=snapshot, clock=lambda: 0.0).run())
    assert a == b and isinstance(a[-1], AdaptiveResult)



# ---- which K -------------------------------------------------------------------------------------------

def test_which_k_the_leaders_neighbours_are_measured_until_one_is_worse():
    from app.core.session.widths import next_width

    viable = [1, 2, 3, 4]
    assert next_width({3: 1.40}, viable) == 2  # the narrower neighbour first
    assert next_width({2: 1.30, 3: 1.40}, viable) == 4
    assert next_width({2: 1.30, 3: 1.40, 4: 1.35}, viable) is None  # worse on each side: K=3 it is
    assert next_width({2: 1.50, 3: 1.40}, viable) == 1  # a better neighbour leads; its own neighbour next
    assert next_width({3: 1.40}, [3]) is None  # the only width that can pay here
    assert next_width({4: 1.40, 3: 1.2}, viable) is None  # K=5 cannot pay on this machine
    assert next_width({1: 0.80}, viable) is None  # leave it off: no width to tell apart
    assert next_width({3: 1.40, 2: None}, viable) is None  # a width still without an estimate: first that


def test_widen_measures_the_unmeasured_neighbour_of_a_task_that_pays(make_model, snapshot):
    """Recorded runs: code measured only at its predicted best K=3 (1.4x), story at K=1 (0.6x, off):
    code's K=2 is measured next (min_reps repetitions), story gets no neighbour."""
    sweep = _sweep(make_model, snapshot)
    sweep.viable = [1, 2, 3]
    sweep.own = {"code": [K3], "story": [K1]}
    sweep.per_task = {"code": [K3], "story": [K1]}
    sweep.cands = [K3, K1]
    _ran(sweep, "code", [K3], [1.4])
    _ran(sweep, "story", [K1], [0.6])
    sweep.decide()
    seen: list = []
    sweep.measure = _recorded_measure(sweep, seen)
    events = []
    gen = sweep.widen()
    try:
        while True:
            events.append(next(gen))
    except StopIteration as stop:
        assert stop.value is True
    assert seen == [("code", (K2,), sweep.min_reps)]
    assert sweep.own["code"] == [K3, K2] and sweep.per_task["code"] == [K3, K2] and K2 in sweep.cands
    assert "K=2 too" in events[0].message


def test_a_round_is_cut_before_a_run_that_would_end_past_the_budgets_grace(make_model, snapshot, monkeypatch):
    """A recorded clock and recorded runs of 10 s: at 70 s of a 100 s budget a round of six runs
    starts; the runs ending at 80, 90, 100 and 110 s (the 10 % grace) run, the one that would end
    at 120 s is not started (re-runs or waits inside a round cannot take the flow past its time)."""
    now = [70.0]
    sweep = _sweep(make_model, snapshot, budget_s=100.0, clock=lambda: now[0])
    sweep.budget.t0, sweep.budget.runs, sweep.budget.run_s = 0.0, 4, 40.0

    def recorded_runs(plan, engine, writer, cancel, **kw):
        for i in range(6):
            yield RunStarted(i, 6, Arm(), "a", "code", 0)
            now[0] += 10.0
            yield RunFinished(make_record(Arm(), run_id=f"r{i}", task="code"))

    monkeypatch.setattr(adaptive_mod, "run_sweep", recorded_runs)
    events = list(sweep.measure("code", (K1,), 3))
    assert len([e for e in events if isinstance(e, RunFinished)]) == 4 and now[0] == 110.0
    assert len([e for e in events if isinstance(e, RunStarted)]) == 4 and sweep.stopped == "budget"


def test_a_probe_measured_while_the_machine_was_busy_rules_no_width_out(make_model, snapshot, monkeypatch):
    """Its steps are priced under other programs' load (here: every K priced too dear to pay), so
    every width stays a candidate and its record is not written for later sweeps to reuse."""
    from app.core.measure import busy as busy_mod

    dear = fake_costs({1: 10.0, 2: 30.0, 3: 40.0}, 9.0)  # no K can pay at these prices
    monkeypatch.setattr(adaptive_mod, "probe_where", lambda *a, **kw: iter([dear]))
    written: list[str] = []
    writer = SimpleNamespace(append_line=written.append)

    def costs_with(stop: busy_mod.Busy) -> AdaptiveSweep:
        monkeypatch.setattr(busy_mod, "make_monitor", lambda: SimpleNamespace(start=lambda: None, stop=lambda: stop))
        sweep = _sweep(make_model, snapshot, cost=None, ks=(1, 2, 3), writer=writer)
        stages = [e.message for e in sweep.costs() if isinstance(e, AdaptiveStage)]
        assert stages[-1].startswith("K that can pay")
        return sweep

    quiet = costs_with(busy_mod.Busy(cpu=0.02, cores=2))
    assert quiet.viable == [] and len(written) == 1  # a quiet probe decides, and is kept
    busy = costs_with(busy_mod.Busy(cpu=0.84, top="cc1plus", top_cpu=0.84, cores=2))
    assert busy.busy_probe and busy.viable == [1, 2, 3] and len(written) == 1
