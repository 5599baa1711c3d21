"""The window's sweep service, offscreen: the Start page and the Sweep tab, each built alone on one
AppState and its services, render the one sweep the service runs, whichever of them started it:
its start, its progress events, a cancel from either, its end. The session's events are made up
here (a fake ``run``, held open until the test lets it end), so the pages are seen mid-sweep."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

pytest.importorskip("PySide6")

from app.core.records.arm import Arm  # noqa: E402
from app.core.session.events import AdaptiveStage, RunFinished, RunStarted, SessionFinished  # noqa: E402
from conftest import make_tab  # noqa: E402
from tests.helpers import make_record  # noqa: E402


@pytest.fixture
def session(monkeypatch):
    """The core session's ``run`` made up: a stage line, one run started and finished, then held
    until ``release`` is set or the sweep is cancelled; the requests it was given in ``asked``."""
    from app.core.session import sweep as session_mod

    release = threading.Event()
    asked = []

    def run(request, cancel):
        asked.append(request)
        yield AdaptiveStage("probe", "reusing the cost probe")
        yield RunStarted(0, 2, Arm(), "p1", "code", 0)
        yield RunFinished(make_record(Arm(), run_id="r1", task="code", model_path=request.plan.model))
        while not release.wait(0.02) and not cancel.cancelled:
            pass
        yield SessionFinished(request.out, 1, 1, 0, cancel.cancelled)

    monkeypatch.setattr(session_mod, "run", run)
    return SimpleNamespace(release=release, asked=asked)


@pytest.fixture
def pages(state, qtbot):
    """The Start page and the Sweep tab, alone on one state (one sweep service), on the demo model."""
    from app.gui.tabs.start import StartTab
    from app.gui.tabs.sweep import SweepTab

    start, sweep = make_tab(StartTab, state), make_tab(SweepTab, state)
    qtbot.addWidget(start)
    qtbot.addWidget(sweep)
    state.use_demo_model()
    assert start.sweeps is sweep.sweeps is state.services.sweeps
    return start, sweep


def test_a_sweep_of_the_sweep_tab_is_rendered_by_the_start_page_too(state, qtbot, pages, session):
    start, sweep = pages
    sweeps = state.services.sweeps
    assert start.tune_btn.isEnabled() and sweep.start_btn.isEnabled()
    sweep.start_btn.click()
    qtbot.waitUntil(lambda: sweeps.done == 1, timeout=10000)
    assert len(session.asked) == 1 and session.asked[0].adaptive is None  # the form's plain sweep
    # the Sweep tab: its progress, its buttons
    assert sweep.progress_label.text().startswith(f"run 1 of {sweeps.total}, ")  # the one clock's line
    assert not sweep.start_btn.isEnabled() and sweep.cancel_btn.isEnabled()
    # the Start page: its button waits for the sweep, and says why
    assert not start.tune_btn.isEnabled() and "a sweep is running" in start.why_not.text()
    assert not start.running and not start.cancel_btn.isEnabled()
    with qtbot.waitSignal(sweeps.finished, timeout=10000) as ended:
        session.release.set()
    assert not ended.args[0].cancelled and ended.args[0].status.startswith("Finished")
    assert sweep.start_btn.isEnabled() and not sweep.cancel_btn.isEnabled()
    assert sweep.progress_label.text().endswith(", done")
    assert start.tune_btn.isEnabled() and start.why_not.text() == ""
    assert [r.run_id for r in state.records] == ["r1"] and not state.sweep_running


def test_a_sweep_of_the_start_page_is_rendered_by_the_sweep_tab_and_cancelled_from_the_start_page(
        state, qtbot, pages, session):
    start, sweep = pages
    sweeps = state.services.sweeps
    start.tune_btn.click()  # the device check first, then the sweep
    qtbot.waitUntil(lambda: sweeps.done == 1, timeout=120000)
    assert len(session.asked) == 1 and session.asked[0].adaptive is not None  # Tune for me: adaptive
    # the Start page: running, the sweep's line under its progress bar
    assert start.running and start.cancel_btn.isEnabled() and not start.tune_btn.isEnabled()
    # one counter over the stages (adaptive: no total), the one clock's line
    assert start.progress_label.text().startswith("run 1, ") and start.progress_label.text().endswith(
        ": baseline, code/p1")
    # the Sweep tab shows the same sweep: its runs, its buttons, its plots
    assert sweep.progress.format() == "%v runs" and sweep.progress.value() == 1
    assert sweep.progress_label.text().startswith("run 1, ")
    assert not sweep.start_btn.isEnabled() and sweep.cancel_btn.isEnabled()
    assert set(sweep.plots.series) == {"code", "story"}  # the Start page's tasks
    with qtbot.waitSignal(state.sweep_finished, timeout=10000) as finished:
        start.cancel_btn.click()
    assert finished.args == [True]
    assert start.answer.text().startswith("Cancelled") and not start.running and start.tune_btn.isEnabled()
    assert sweep.progress_label.text().endswith(", cancelled") and sweep.start_btn.isEnabled()
    assert sweeps.job is None and not sweep.cancel_btn.isEnabled()


@pytest.mark.parametrize("stopped, says, never", [
    ("budget", "Stopped at the budget before a measured run finished", "cost probe"),
    ("decided", "the cost probe says no draft width can pay", "budget"),
])
def test_the_status_line_of_a_sweep_without_runs_says_why_it_stopped(state, stopped, says, never):
    """An adaptive sweep that ended with no measured run: the status line says what its Decisions
    say. A Quick Tune for me whose probe and pilot took the whole budget (a loaded machine) read
    "the cost probe says no draft width can pay ... so no run was needed" in the status bar, while
    the Start page said no run finished within the budget (seen in a screenshot)."""
    from app.core.session.events import AdaptiveResult, Decisions, TaskDecision

    decisions = Decisions((TaskDecision("code", stopped == "decided", None, None, reason="no runs yet"),), 0, 0,
                          120.0, None, True, stopped)
    done = SessionFinished(None, 0, 0, 0, False, adaptive=AdaptiveResult(None, (), None, 0, decisions))
    line = state.services.sweeps.outcome(done, False, True)
    assert says in line and never not in line
