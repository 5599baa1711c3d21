"""The sweep runner's phases one at a time (app.core.measure.runner.Sweep) and its pre-flight
(app.core.measure.preflight), on the calibrated model's file with an engine that replays
recorded generations: start, prepare, warm, measure, after."""

from __future__ import annotations

import pytest

from app.core.common.errors import EngineError, EngineStartError
from app.core.engines.base import EngineKind, EngineSettings, Generation, Progress
from app.core.machine import gguf_info, hardware
from app.core.measure.busy import Busy, NoMonitor
from app.core.measure.plan import Plan
from app.core.measure.preflight import preflight, read_model
from app.core.measure.runner import Sweep
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.session.events import RunFailed, RunFinished, RunStarted, SweepError, SweepStarted, SweepWarning
from tests.helpers import drained, make_record

K1 = Arm(1, 0.0)


class ReplayEngine:
    """An engine that runs nothing: every generation is three tokens at 10 tok/s (K=1 drafts one,
    accepted), ``failing`` raises for its arms, ``refused`` is why it cannot run MTP arms."""

    kind = EngineKind.INPROCESS
    ctx_size = 0
    threads = 1
    build = "replay"
    placement = None
    settings = EngineSettings(ctx_size=0, threads=1)  # what it exposes of itself (Engine.settings)

    def __init__(self, failing: dict | None = None, refused: str | None = None, limit: int | None = None) -> None:
        self.failing, self.refused, self.limit = failing or {}, refused, limit
        self.shape = None

    def check_mtp(self) -> None:
        pass

    def mode_problem(self, arm):
        return self.refused

    def prepare(self, shape) -> None:
        self.shape = shape

    def ready_limit(self, model, n_configs):
        return self.limit

    def count_tokens(self, model, text):
        return len(text.split())

    def generate(self, model, arm, text, *, raw, n_predict, sampler, cancel, ignore_eos=False, thinking=None):
        if arm in self.failing:
            raise self.failing[arm]
        yield Progress(1, 0.1)
        drafted = 1 if arm.k else None
        return Generation((1, 2, 3), (0.0, 0.1, 0.2), (7,), "abc", 10.0, 3, drafted, drafted, 1, 1.0, 100.0, None)


@pytest.fixture(scope="module")
def snapshot():
    return hardware.snapshot()


def _plan(make_model, arms=(Arm(), K1), reps=1, **kw):
    return Plan(model=str(make_model(0.0)), arms=arms, prompts=(Prompt("a", "code", "hello world"),),
                engine="inprocess", n_predict=3, reps=reps, warmup=kw.pop("warmup", 0), **kw)


def _sweep(plan, engine, snapshot, model=None):
    return Sweep(plan, engine, None, None, False, None, snapshot, NoMonitor(), model)


_drained = drained  # a phase's events and what it returned


# ---- the pre-flight ----------------------------------------------------------------------------------

def test_preflight_drops_the_arms_that_cannot_run_and_settles_thinking(make_model):
    """The calibrated model's template has no thinking switch: one setting is measured, not the
    same runs twice; the MTP arms the engine refuses are dropped with one error for the cause."""
    plan = _plan(make_model, arms=(Arm(), K1, Arm(2, 0.0)), thinking=(True, False))
    pre = preflight(plan, ReplayEngine(refused="not on this engine"))
    assert pre.plan.arms == (Arm(),) and pre.plan.thinking == (None,)
    assert pre.errors == ("MTP unavailable, MTP arms skipped: not on this engine",)
    assert len(pre.warnings) == 1 and "no thinking switch" in pre.warnings[0]
    assert preflight(_plan(make_model), ReplayEngine()).plan == _plan(make_model)  # nothing to settle


def test_a_sweep_reuses_the_model_its_session_read(make_model, snapshot, monkeypatch):
    facts = read_model(str(make_model(0.0)))
    reads: list[str] = []
    real = gguf_info.check_gguf_file
    monkeypatch.setattr(gguf_info, "check_gguf_file", lambda path: reads.append(str(path)) or real(path))
    _drained(_sweep(_plan(make_model), ReplayEngine(), snapshot, facts).start())
    assert reads == []
    other = read_model(str(make_model(0.3)))  # another model's: not this plan's, so read again
    reads.clear()
    _drained(_sweep(_plan(make_model), ReplayEngine(), snapshot, other).start())
    assert reads == [str(make_model(0.0))]


# ---- start, prepare ----------------------------------------------------------------------------------

def test_start_announces_the_plan_as_it_will_run(make_model, snapshot):
    sweep = _sweep(_plan(make_model), ReplayEngine(refused="not here"), snapshot)
    events = list(sweep.start())
    assert isinstance(events[0], SweepStarted) and events[0].plan.arms == (Arm(),) and events[0].total_runs == 1
    assert [type(e) for e in events[1:]] == [SweepError] and sweep.errors == [events[1].message]
    assert sweep.model is not None and sweep.model.size == make_model(0.0).stat().st_size


def test_prepare_runs_arm_by_arm_when_few_configurations_fit(make_model, snapshot):
    engine = ReplayEngine(limit=1)
    sweep = _sweep(_plan(make_model, reps=2), engine, snapshot)
    _drained(sweep.start())
    events, _ = _drained(sweep.prepare())
    assert [type(e) for e in events] == [SweepWarning] and "only 1 of 2 configurations" in events[0].message
    assert sweep.arm_major and [r.arm for r in sweep.runs] == [Arm(), Arm(), K1, K1] and sweep.total == 4
    assert engine.shape is not None and "os" in sweep.host


# ---- warm, measure, after ----------------------------------------------------------------------------

def _prepared(make_model, snapshot, engine, **kw):
    sweep = _sweep(_plan(make_model, **kw), engine, snapshot)
    _drained(sweep.start())
    _drained(sweep.prepare())
    return sweep


def test_measure_records_a_run(make_model, snapshot):
    sweep = _prepared(make_model, snapshot, ReplayEngine())
    events, _ = _drained(sweep.measure(sweep.runs[1], 2))
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    rec = events[-1].record
    assert (rec.k, rec.draft_n, rec.acceptance, rec.n_generated, rec.tok_s) == (1, 1, 1.0, 3, 10.0)
    assert rec.model_size == sweep.model.size and rec.sweep_id == sweep.sweep_id and sweep.n_ok == 1


def test_an_arm_whose_runs_fail_stops_after_three(make_model, snapshot):
    sweep = _prepared(make_model, snapshot, ReplayEngine(failing={K1: EngineError("boom")}))
    told = []
    for _ in range(3):
        events, _ = _drained(sweep.measure(sweep.runs[1], 2))
        told += [type(e) for e in events if not isinstance(e, RunStarted)]
    assert told == [RunFailed, SweepWarning, RunFailed, SweepWarning, RunFailed, SweepError]
    assert sweep.n_failed == 3 and K1 in sweep.dead and sweep.errors == [sweep.dead[K1]]


def test_warm_stops_an_arm_that_cannot_start(make_model, snapshot):
    sweep = _prepared(make_model, snapshot, ReplayEngine(failing={K1: EngineStartError("no start")}), warmup=1)
    events, ran = _drained(sweep.warm(sweep.runs[0]))
    assert ran and Arm() in sweep.warmed and all(getattr(e, "warmup", True) for e in events)
    events, ran = _drained(sweep.warm(sweep.runs[1]))
    assert not ran and isinstance(events[-1], SweepError) and "cannot run (no start)" in sweep.dead[K1]


def test_after_queues_a_disturbed_run_again_beside_a_baseline(make_model, snapshot):
    sweep = _prepared(make_model, snapshot, ReplayEngine())
    spec = sweep.runs[1]
    said = list(sweep.after(spec, make_record(K1), Busy(cpu=0.9), 2))
    assert len(said) == 1 and "measured again later (2 of 2 re-runs)" in said[0].message
    assert [r.arm for r in sweep.runs] == [Arm(), K1, Arm(), K1] and sweep.total == 4
    said = list(sweep.after(sweep.runs[3], make_record(K1), Busy(cpu=0.9), 4))  # the limit is reached: said once
    assert len(said) == 1 and "re-run limit" in said[0].message and len(sweep.runs) == 4
    assert list(sweep.after(sweep.runs[3], make_record(K1), Busy(cpu=0.9), 4)) == []
