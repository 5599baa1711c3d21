"""One clock (issue 56 item 2): the Start page, the Sweep tab, the status bar and the CLI read one
core estimate (app.core.session.clock.FlowClock, fed the session's events); after a run it counts
that run's whole wall time, overheads included; it never says "finishing" with most runs left; and
Quick's budget ends a plain sweep (n-gram, drafter, the user's own command) as it ends the adaptive
one. Recorded clocks and events only: no live timing."""

from __future__ import annotations

import dataclasses
import datetime as _dt

import pytest

from app.core.engines.base import EngineKind, EngineSettings
from app.core.measure.plan import Plan, make_arms
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.session import clock as C
from app.core.session.events import Decisions, RunFinished, RunStarted
from app.core.session.request import SweepRequest
from app.core.session.tune import QUICK_S, tune_request
from tests.helpers import fake_costs, make_record


class Ticks:
    """A clock set by hand (recorded times)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def plain_request(model: str, runs_arms: int = 3) -> SweepRequest:
    """A plain sweep of 18 runs: baseline and two modes on 2 prompts, 3 repetitions (the own-command path)."""
    prompts = (Prompt("c1", "code", "def f(x):"), Prompt("s1", "story", "Once upon a time"))
    plan = Plan(model=model, arms=make_arms([1, 2])[:runs_arms], prompts=prompts, n_predict=128, reps=3, warmup=0,
                engine=EngineKind.SERVER)
    return SweepRequest(plan, EngineSettings(), until_decided=True)


def recorded_runs(t: Ticks, sink, walls) -> None:
    """Runs that took ``walls`` seconds each (server start, prompt, decode, all of it), as events."""
    for i, wall in enumerate(walls):
        sink(RunStarted(i, 18, Arm(), "c1", "code", 0))
        t.now += wall
        sink(RunFinished(make_record(Arm(), run_id=f"r{i}")))


def test_the_estimate_after_a_run_counts_its_whole_wall_time_not_decode_alone():
    """"about 13 s here" right after a 94 s run: the estimate before the start counted decode
    speed only; after the run it is the runs left at the wall time a run has taken here."""
    t = Ticks()
    clock = C.flow_clock(plain_request("m.gguf"), 13.0, clock=t)
    assert clock.planned == 18
    recorded_runs(t, clock.observe, [94.0])
    assert clock.left() == pytest.approx(17 * 94.0)
    assert "about 27 min left" in clock.line() and clock.line().startswith("run 1 of 18")
    # the next runs are shorter (the server is up): the mean of what every run took, overheads in
    recorded_runs(t, clock.observe, [20.0, 30.0])
    assert clock.left() == pytest.approx(15 * (94.0 + 20.0 + 30.0) / 3)


def test_the_estimate_before_the_start_is_the_recorded_wall_time_of_a_run_here():
    """The last sweep's recorded runs, 40 s apart (a server start and the prompt between them):
    18 runs take 12 minutes here, not 18 x 128 tokens at the decode speed."""
    stamps = ["2026-12-07T10:00:00.000+00:00", "2026-12-07T10:00:40.000+00:00", "2026-12-07T10:01:20.000+00:00"]
    recs = [make_record(Arm(), run_id=f"r{i}", sweep_id="s1", tok_s=100.0, model_path="m.gguf", timestamp_utc=s)
            for i, s in enumerate(stamps)]
    assert C.run_wall_s("m.gguf", recs) == 40.0
    assert C.flow_estimate(plain_request("m.gguf"), None, recs) == pytest.approx(18 * 40.0)
    quick = dataclasses.replace(plain_request("m.gguf"), budget_s=QUICK_S)
    assert C.flow_estimate(quick, None, recs) == QUICK_S  # never past Quick's budget


def test_finishing_is_never_said_with_most_runs_left():
    """Own-command path: "finishing" with 4 of 18 runs done. Four runs of 10 s, then a fifth that
    takes 5 minutes (a server start on a loaded machine): the countdown stops at the 13 runs after
    it, and the budget-less clock never says "finishing"."""
    t = Ticks()
    clock = C.flow_clock(plain_request("m.gguf"), 60.0, clock=t)  # a decode-only estimate: too short
    t.now += 70  # the engine starts: past the estimate before the first run
    assert "finishing" not in clock.line()
    recorded_runs(t, clock.observe, [10.0] * 4)
    clock.observe(RunStarted(4, 18, Arm(), "c1", "code", 0))
    t.now += 300
    assert clock.left() == pytest.approx(13 * 10.0) and "finishing" not in clock.line()
    # it counts down, never up, between runs
    seen = []
    for _ in range(5):
        seen.append(clock.left())
        t.now += 7
    assert seen == sorted(seen, reverse=True)
    # a sweep run until decided that decides: finishing is then the truth
    clock.observe(Decisions((), 5, 0, 400.0, 0.0))
    assert clock.left() == 0.0 and clock.line().endswith("finishing")


def test_quick_keeps_its_budget_on_every_path(make_model):
    """tune's request carries Quick's budget on the n-gram path, a drafter pair and the user's own
    command (a plain sweep until decided), as on the adaptive path; Thorough has none."""
    model = str(make_model(0.0, mtp=False))
    own = EngineSettings(kind=EngineKind.SERVER, user_args=("-c", "4096"))
    for kw in ({"ngram": True}, {"drafters": {"draft-simple": model}}, {"ngram": True, "settings": own}):
        quick = tune_request(model, {"code": 1.0}, quick=True, started=5.0, **kw)
        assert quick.adaptive is None and quick.until_decided
        assert (quick.budget_s, quick.started) == (QUICK_S, 5.0), kw
        assert tune_request(model, {"code": 1.0}, quick=False, **kw).budget_s is None
        assert C.flow_clock(quick, None).budget_s == QUICK_S


def test_quicks_budget_stops_a_plain_sweep_and_it_still_answers(make_model):
    """A real plain sweep until decided (in process, a calibrated model), each run taking 17 s on
    the recorded clock: with Quick's 120 s it stops before the run that would end past the budget,
    says it stopped at the budget, and its runs are judged (undecided, provisionally)."""
    from app.cli.bench_view import decisions_text
    from app.core.common.cancel import CancelToken
    from app.core.engines.factory import make_engine
    from app.core.session.until import rounds_until_decided

    prompts = (Prompt("c1", "code", "def f(x):"), Prompt("c2", "code", "class A:"),
               Prompt("s1", "story", "Once upon a time"), Prompt("s2", "story", "The old man"))
    plan = Plan(model=str(make_model(0.0)), arms=make_arms([1, 2]), prompts=prompts, n_predict=8, reps=6, warmup=0,
                engine=EngineKind.INPROCESS)
    t = Ticks()
    engine = make_engine(EngineSettings(ctx_size=512))
    events = []
    try:
        for ev in rounds_until_decided(plan, engine, None, CancelToken(), budget_s=QUICK_S, started=t.now, clock=t):
            events.append(ev)
            if isinstance(ev, RunStarted):
                t.now += 17.0  # the run's whole wall time, as recorded
    finally:
        engine.close()
    runs = [e for e in events if isinstance(e, RunFinished)]
    final = events[-1]
    assert isinstance(final, Decisions) and final.final and final.stopped == "budget"
    assert len(runs) == 7 < plan.total_runs  # 7 x 17 s; an eighth would end at 136 s
    # the round takes the tasks in turn: the cut round leaves story measured too (baseline and a width)
    assert [(r.prompt_id, r.arm_kind) for r in (e.record for e in runs)][3:5] == [("s1", "baseline"), ("s1", "mtp")]
    assert "the budget ran out" in decisions_text(final)


def test_under_a_budget_the_clock_says_when_a_plain_sweep_stops():
    """Three runs of 35 s under Quick's 120 s: no fourth run fits, so the sweep stops now; the
    clock says so instead of the 15 s the budget has left."""
    t = Ticks()
    clock = C.flow_clock(dataclasses.replace(plain_request("m.gguf"), budget_s=QUICK_S, started=t.now), None, clock=t)
    recorded_runs(t, clock.observe, [35.0] * 3)
    assert clock.left() == 0.0
    clock2 = C.flow_clock(dataclasses.replace(plain_request("m.gguf"), budget_s=QUICK_S, started=t.now), None, clock=t)
    recorded_runs(t, clock2.observe, [25.0] * 2)  # two more fit (at 100 s), then it stops: 50 s left, not 70
    assert clock2.left() == pytest.approx(50.0)


pytest.importorskip("PySide6")


def test_the_start_page_the_sweep_tab_the_status_bar_and_the_cli_show_one_estimate(window, capsys):
    """The n-gram path's "about 2.4 h left" on the Start page against "71 s" on the Sweep tab: the
    same recorded events, at the same recorded times, give every screen and `tune`'s progress the
    same line from the one clock."""
    from app.cli.bench_view import BenchView
    from app.core.session.events import TaskDecision

    request = plain_request(window.state.model)
    t = Ticks()
    sweeps = window.start_tab.sweeps
    assert sweeps is window.sweep_tab.sweeps  # one service, one clock
    sweeps.clock = C.flow_clock(request, 8640.0, clock=t)  # what the service makes at the start
    cli = BenchView(C.flow_clock(request, 8640.0, clock=t))  # what `tune` and `bench` make
    said: list[str] = []
    window.state.status.connect(said.append)
    window.sweep_tab.progress_label.setText("")

    def both(ev):
        sweeps._event(ev)
        cli.show(ev)

    recorded_runs(t, both, [40.0, 35.0, 36.0])
    both(RunStarted(3, 18, Arm(), "s1", "story", 0))
    undecided = TaskDecision("code", False, None, None, more_reps=2, eta_s=50.0)
    both(Decisions((undecided,), 3, 384, 111.0, 300.0))
    t.now += 12
    window.start_tab._tick()
    window.sweep_tab._tick()
    line = sweeps.clock.line()
    # the sweep's own 300 s to decide (under the 15 runs x 37 s left), counted down 12 s
    assert line == "run 4 of 18, 2 minutes, about 5 min left" == cli.clock.line()
    assert window.start_tab.progress.format() == line == window.sweep_tab.progress_label.text()
    assert said[-1].startswith("run 4 of 18, 111 s, about 9 min left: ")  # the status bar, as the run started
    assert "about 5 min to decide all" in window.sweep_tab.decisions.head.text()
    assert "run 4 of 18" in capsys.readouterr().err  # the CLI's decisions line says the clock's


def test_the_estimate_before_a_tune_counts_every_gap_of_the_last_one_not_the_median():
    """The window after a demo Tune for me of 45 s (36 runs, most 0.3 s apart, the pilot, warmups
    and a quiet-moment wait between a few) said "Quick (about 12 s here)": the median gap left out
    the long ones. The mean gap counts them, and the adaptive flow is expected to take at least as
    long as the last sequential sweep of the model took here."""
    from app.core.session.tune import tune_request

    base = 10 * 3600.0
    offsets = [0.0, 8.0, 8.3, 8.6, 8.9, 20.0] + [20.0 + 0.3 * i for i in range(1, 30)] + [45.0]
    stamps = [_dt.datetime.fromtimestamp(base + o, _dt.timezone.utc).isoformat(timespec="milliseconds")
              for o in offsets]
    recs = [make_record(Arm(k=3), run_id=f"r{i}", sweep_id="s1", tok_s=200.0, model_path="m.gguf", timestamp_utc=s,
                        min_gain=0.03) for i, s in enumerate(stamps)]
    assert C.run_wall_s("m.gguf", recs) == pytest.approx(45.0 / 35)  # the median gap was 0.3 s
    req = tune_request("m.gguf", {"code": 1.0, "story": 1.0}, quick=True)
    probe = dataclasses.replace(fake_costs({1: 10.0, 2: 11.0, 3: 12.0}, 0.5), model_path="m.gguf")
    est = C.flow_estimate(req, probe, recs)
    assert est is not None and 45.0 <= est <= QUICK_S
    assert C.last_sweep_s("m.gguf", recs) == pytest.approx(45.0 + 45.0 / 35)
    plain = [dataclasses.replace(r, min_gain=None) for r in recs]  # a plain sweep's span is no adaptive one's
    assert C.last_sweep_s("m.gguf", plain) is None
