"""The window's sweep job, one at a time: the Start page ("Tune for me") and the Sweep tab (its form,
or a plan run again) start it here, and both render it.

``start`` checks the model and the request (the core's ``prepare``: one line, nothing started) and
runs the core session on a worker through the job registry. The service keeps what the window needs
of the sweep (its records, results file, run count) and tells the AppState what every tab shares:
the sweep started and finished, its results, the cost probe it made, its errors and warnings, the
status line. Its signals are what the pages render: ``started`` (the prepared request), ``events``
(each session event, and the live analysis of the runs so far), ``progress`` (the status line of
the sweep), ``finished`` (a SweepEnd)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from PySide6.QtCore import QObject, QTimer, Signal

from app.core.common.errors import UserError
from app.core.records.schema import RunRecord
from app.core.session.clock import FlowClock, flow_clock, flow_estimate
from app.core.session.events import (AdaptiveResult, Decisions, QuietWait, RunFailed, RunFinished, RunStarted,
                                     SessionFinished, SweepError, SweepWarning, dispatch)
from app.core.session.request import SweepRequest

from ..adapter import CoreJob
from ..jobs import Jobs
from ..model_check import check_model
from ..state import AppState


@dataclasses.dataclass(frozen=True)
class LiveAnalysis:
    """The analysis of the runs so far, for the live plots."""

    analysis: object


def with_live_analysis(gen: Iterator[Any]) -> Iterator[Any]:
    """Pass the sweep's events through; after each finished run, analyse the runs so far here, on
    the worker thread, before the next run starts: never while a run is being timed."""
    from app.core.analysis.analysis import analyze  # not needed to show the window: loaded by a sweep

    recs = []
    for ev in gen:
        yield ev
        if isinstance(ev, (RunFinished, RunFailed)):
            recs.append(ev.record)
            if any(r.status == "ok" for r in recs):
                yield LiveAnalysis(analyze(recs))


@dataclasses.dataclass(frozen=True)
class SweepEnd:
    """How a sweep ended, for the pages that render it."""

    cancelled: bool
    shown: bool  # its records (or the file it completed) are now the AppState's sweep shown
    session: SessionFinished | None  # None: the session failed before it finished
    status: str  # the status line that says it
    stopped: str = ""  # what stopped a sweep run until decided: "decided", "budget", ... (its final Decisions)


class Sweeps(QObject):
    started = Signal(object)  # the session's Prepared: the request as it runs, and its notes
    events = Signal(object)  # each session event (or LiveAnalysis), after the service's own bookkeeping
    progress = Signal(str)  # the sweep's status line: where it writes, the run in progress, its errors
    finished = Signal(object)  # SweepEnd
    tick = Signal(str)  # every second while a sweep runs: the one clock's line, for every page that shows it

    def __init__(self, state: AppState, jobs: Jobs, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self.job: CoreJob | None = None
        self.request: SweepRequest | None = None  # the sweep running, or the last one
        self.records: list[RunRecord] = []  # its records so far
        self.results_path: Path | None = None
        self.done, self.total = 0, 0  # runs finished, runs planned (0: adaptive, unknown)
        self.t0 = 0.0
        self.clock = FlowClock(None, None)  # one run counter over every stage, and the time left
        self._failure: str | None = None  # what the worker failed with (the sweep's own error)
        self._ticker = QTimer(self, interval=1000)
        self._ticker.timeout.connect(lambda: self.tick.emit(self.clock.line()))
        self._session: SessionFinished | None = None
        self._stopped = ""  # the sweep's final Decisions' reason
        self._handlers: dict[type, Callable[[Any], None]] = {
            RunFinished: self._run_done, RunFailed: self._run_done, RunStarted: self._run_started,
            SweepError: lambda ev: self._say(ev.message, error=True),
            SweepWarning: lambda ev: self.state.sweep_warning.emit(ev.message),
            QuietWait: lambda ev: self._say(ev.text()),  # "waiting for a quiet moment: cc1plus 84 %", live
            AdaptiveResult: self._adaptive_result,
            SessionFinished: self._session_finished,
        }

    @property
    def running(self) -> bool:
        return self.job is not None

    def start(self, request: SweepRequest, estimate_s: float | None = None) -> bool:
        """Check and start ``request``; False (the reason shown as the state's error) when it
        cannot start: a sweep runs, the model cannot be swept, or the request fails a check.
        ``estimate_s``: the time the flow was estimated to take before it started (the clock's
        countdown until the sweep has its own estimate)."""
        if self.job is not None:
            self.state.show_error("a sweep is running: cancel it or let it finish first")
            return False
        from app.core.session.sweep import prepare, run  # the analysis layer: loaded by a sweep

        problem = check_model(request.plan.model).problem  # read again: the file may have changed
        try:
            if problem:
                raise UserError(problem)
            prepared = prepare(request)  # every check: one line, nothing started
        except UserError as e:
            self.state.show_error(str(e))
            return False
        request = self.request = prepared.request
        self.results_path = request.out
        # the shown sweep stays until this one has its first record; a resumed one starts from its quiet runs
        self.records = list(request.resume.earlier) if request.resume is not None else []
        self._failure, self._stopped = None, ""
        self.done, self.total = 0, (0 if request.adaptive is not None else request.plan.total_runs)
        self.t0 = time.monotonic()
        if estimate_s is None:  # the core's estimate before the start, as the Start page and the Sweep tab's form say it
            estimate_s = flow_estimate(request, self.state.probe_record, self.state.records)
        self.clock = flow_clock(request, estimate_s)  # the one clock every page and the status bar read
        self.state.sweep_running = True
        self.job = self.jobs.run(lambda cancel: with_live_analysis(run(request, cancel)), self, event=self._event,
                                 failed=self._failed, finished=self._finished)
        self._ticker.start()
        self.started.emit(prepared)  # before any event: the worker's are queued to this thread
        self.state.sweep_started.emit(request.plan)
        self._say(f"Sweeping: results go to {self.results_path}")
        return True

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self._say("Cancelling…")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _say(self, message: str, *, error: bool = False) -> None:
        """A line of the sweep: on the status bar (an error also as the state's error), and to the pages."""
        if error:
            self.state.show_error(message)
        else:
            self.state.status.emit(message)
        self.progress.emit(message)

    # -- the worker's events ------------------------------------------------------------------
    def _event(self, ev: Any) -> None:
        self.clock.observe(ev)
        if isinstance(ev, Decisions) and ev.final:
            self._stopped = ev.stopped
        dispatch(ev, self._handlers)
        self.events.emit(ev)

    def _failed(self, message: str) -> None:
        self._failure = message
        self._say(message, error=True)

    def _run_done(self, ev: RunFinished | RunFailed) -> None:
        self.records.append(ev.record)
        self.done += 1

    def _run_started(self, ev: RunStarted) -> None:
        """One counter over the whole sweep (its stages each count from 1), of the runs planned when known."""
        what = "warmup" if ev.warmup else self.clock.line()  # the clock saw it first (_event)
        self._say(f"{what}: {ev.arm.label}, {ev.task}/{ev.prompt_id}")

    def _adaptive_result(self, ev: AdaptiveResult) -> None:
        if ev.cost is not None:
            self.state.add_probe(ev.cost)

    def _session_finished(self, ev: SessionFinished) -> None:
        self._session = ev

    def _finished(self) -> None:
        session, self._session = self._session, None
        cancelled = bool(self.job and self.job.cancel_token.cancelled) or bool(session and session.cancelled)
        self.job = None
        self._ticker.stop()
        self.state.sweep_running = False
        # a sweep with no record leaves the shown sweep as it was, unless it completed and wrote its file
        # (the cost probe decided it: the file holds the probe). A cancelled or failed one goes to the
        # state too: the Results tab puts the last complete verdict back and offers this one
        complete = session is not None and not cancelled
        shown = bool(self.records) or bool(complete and session is not None and session.written)
        if shown:  # a sweep that stopped once decided is judged on its anytime intervals: its records say so
            self.state.set_results(self.records, self.results_path)
        end = SweepEnd(cancelled, shown, session, self.outcome(session, cancelled, shown), self._stopped)
        self._say(end.status)
        self.finished.emit(end)
        self.state.sweep_finished.emit(cancelled)

    def outcome(self, done: SessionFinished | None, cancelled: bool, shown: bool) -> str:
        """The status line of a sweep that ended: never "Finished" for one that did not run."""
        reason = self._failure or (done.errors[0] if done is not None and done.errors else None)
        saved = done.results_path if done is not None else (self.results_path if self.records else None)
        where = f"; results in {saved}" if saved else "; nothing saved"
        if not shown and saved:
            where += " (not shown: open it on the Results tab)"
        if cancelled:
            return (f"Cancelled after {self.done} runs" if self.done else "Cancelled before the first run") + where
        if done is None:  # the session failed: before its first run, or on the way
            why = f": {reason}" if reason else ""
            return (f"The sweep stopped after {self.done} runs{why}{where}" if self.done
                    else f"The sweep did not start{why}")
        stopped = done.adaptive.decisions.stopped if done.adaptive and done.adaptive.decisions else ""
        if not done.n_ok and done.adaptive is not None and done.adaptive.runs == 0 and not reason:
            if stopped == "budget":  # the probe and the pilot's first runs took the budget: nothing decided
                return "Stopped at the budget before a measured run finished: nothing decided" + where
            if stopped == "decided":  # the probe decided every task before any run
                return "Finished: the cost probe says no draft width can pay on this machine, so no run was needed" + where
        if not done.n_ok:
            return f"Nothing was measured: {reason or 'every run failed'}{where}"
        return "Finished" + where
