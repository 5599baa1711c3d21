"""The flow's clock (app.core.session.clock): one run counter over every stage, a countdown that
never goes below zero, and the estimate before the start from this machine's measured speed.
Recorded clocks and numbers only: no live timing."""

from __future__ import annotations

import dataclasses

from app.core.records.arm import Arm
from app.core.session.clock import FlowClock, flow_estimate, runs_left_s, tok_s_known
from app.core.engines.base import EngineKind
from app.core.measure.plan import Plan, make_arms
from app.core.records.prompt import Prompt
from app.core.session.request import AdaptiveOptions, SweepRequest
from tests.helpers import fake_costs, make_record


class Ticks:
    """A clock set by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_counter_over_every_stage_and_a_countdown_that_never_goes_negative():
    t = Ticks()
    clock = FlowClock(60.0, 120.0, clock=t)
    # the pilot's two runs, then a first round's four, then a step's two: one count, not 2/2, 4/4, 2/2
    numbers = [clock.run_started() for _ in range(2 + 4 + 2)]
    assert numbers == list(range(1, 9))
    assert clock.left() == 60.0 and clock.line() == "run 8, 0 s, about 1 min left"
    t.now += 20
    assert clock.left() == 40.0  # counted down from the estimate before the start
    clock.estimate(30.0)  # the sweep's own estimate of the time to decide
    t.now += 10
    assert clock.left() == 20.0
    t.now += 500  # far past every estimate and the budget: zero, "finishing", never "-46 s left"
    assert clock.left() == 0.0 and clock.line().endswith("finishing") and "-" not in clock.line()


def test_the_budget_bounds_the_countdown_and_an_unknown_speed_says_no_time():
    t = Ticks()
    clock = FlowClock(None, 120.0, clock=t)
    clock.estimate(400.0)  # to decide it would take longer than Quick allows: Quick's time is what is left
    t.now += 30
    assert clock.left() == 90.0
    unknown = FlowClock(None, None, clock=t)
    assert unknown.left() is None and unknown.line() == "0 s"


def test_a_plain_sweeps_time_left_is_never_negative_past_the_runs_planned():
    assert runs_left_s(0, 54, 10.0) is None
    assert runs_left_s(27, 54, 60.0) == 60.0
    assert runs_left_s(62, 54, 200.0) == 0.0  # re-runs of disturbed runs: "62/54, about -46 s left" before


def test_the_estimate_before_the_start_comes_from_the_measured_speed(make_model):
    model = str(make_model(0.0))
    assert tok_s_known(model, None, []) is None
    probe = dataclasses.replace(fake_costs({1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0}, 0.5), model_path=model)
    tok_s, source = tok_s_known(model, probe, [])
    assert tok_s == 100.0 and "probe" in source  # 10 ms a token
    base = [make_record(Arm(), run_id=f"r{i}", tok_s=s, model_path=model) for i, s in enumerate((40, 50, 60))]
    assert tok_s_known(model, None, base) == (50.0, "the last sweep's baseline speed")
    # 2 tasks, 2 prompts of 64 tokens at 100 tok/s, a probe recorded: pilot 2 x 0.624 s, rounds 24 x 0.832 s
    prompts = (Prompt("c1", "code", "def f(x):"), Prompt("s1", "story", "Once upon a time"))
    plan = Plan(model=model, arms=make_arms([1, 2]), prompts=prompts, n_predict=64, reps=2, warmup=1,
                engine=EngineKind.INPROCESS)
    adaptive = SweepRequest(plan, adaptive=AdaptiveOptions())
    est = flow_estimate(adaptive, probe, [])
    assert abs(est - (2 * 48 / 100 * 1.3 + 24 * 64 / 100 * 1.3)) < 1e-9
    slow = dataclasses.replace(probe, t_ms={**probe.t_ms, 1: dataclasses.replace(probe.t_ms[1], median=1000.0)})
    quick = dataclasses.replace(adaptive, adaptive=AdaptiveOptions(budget_s=120.0))
    assert flow_estimate(quick, slow, []) == 120.0  # never past the budget
    assert flow_estimate(quick, None, []) == 120.0  # the speed unknown: the budget
    assert flow_estimate(adaptive, None, []) is None
