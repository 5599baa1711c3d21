"""Sweep tab: the form (form.py: the model, tasks and preset with the run count and time estimate
before Start; Advanced: engine, modes and drafter, K, p_min, tokens, repetitions, context, GPU
layers, thinking and depth, the sampler, exhaustive or adaptive; the device the engine will
measure on), Start (disabled, with the reason beside it, for a model that cannot be swept) /
Cancel, and the sweep as it runs: progress and ETA, what other programs take, the decisions so
far, live plots (plots.py: the previous sweep's stay until the new one has its first run). The
sweep itself is the window's sweep service (app/gui/services/sweep.py): this tab starts the form's
request there and renders every sweep the service runs, the Start page's too (its form then shows
that sweep's tasks, widths, budget and mix). A plan asked for through the AppState (Run again) is
shown in the form and started. Once a sweep's verdict is built, the final decisions follow it
(decisions.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from PySide6.QtCore import QTimer
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.core.common.errors import UserError
from app.core.measure.plan import Plan
from app.core.session.events import (AdaptiveResult, AdaptiveStage, Decisions, RunFailed, RunFinished, RunStarted,
                                     TokenProgress, dispatch)

from ...services.capabilities import CapabilityReader
from ...services.engines import Engines
from ...services.sweep import LiveAnalysis, SweepEnd, Sweeps
from ...state import AppState
from .busy import BusyIndicator
from .decisions import BUDGETS, DecisionPanel
from ...command_box import ServerCommandBox
from ...common import scroll_box
from .form import SweepForm
from .plots import LivePlots

if TYPE_CHECKING:
    from app.core.records.arm import Arm
    from app.core.session.request import Prepared, SweepRequest

PLOT_MIN_H = 200  # px: the live plots' least height while Advanced is open (readable at 1240x700, not strips)
TOP_MIN_H = 360  # px: the most the part above the plots claims; beyond it scrolls (the window fits 1280x720)
START_TIP = "Results are appended to a JSONL file after every run: nothing is lost if the app stops"


class SweepTab(QWidget):
    def __init__(self, state: AppState, capabilities: CapabilityReader, engines: Engines, sweeps: Sweeps,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.sweeps = sweeps
        self.form = SweepForm(state, capabilities, engines, sweeps)
        self.start_btn = QPushButton("Start sweep")
        self.start_btn.setToolTip(START_TIP)
        self.start_btn.clicked.connect(lambda: self.start_sweep())
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setEnabled(False)
        self.cancel_btn.clicked.connect(sweeps.cancel)
        self.form.add_buttons(self.start_btn, self.cancel_btn)
        self.busy = BusyIndicator(self)  # what other programs take now, and the runs they disturbed
        self.progress, self.progress_label = QProgressBar(), QLabel("")
        self.decisions = DecisionPanel(self, lambda: sweeps.clock.left())  # per task: decided or not, and about how long to decide
        self.plots = LivePlots(self)
        plots = QHBoxLayout()
        for p in self.plots.widgets:
            plots.addWidget(p, 1)
        self.form.advanced_btn.toggled.connect(self._keep_plots_readable)
        self.command_box = ServerCommandBox(state, folded=True)  # llama-server with the user's own flags
        self.rpc_label = QLabel("")  # the RPC workers the model is split over (the Machine tab's)
        state.rpc_workers_changed.connect(self.show_workers)
        state.own_command.changed.connect(self.show_workers)
        self.show_workers()
        self.top, top = scroll_box(to_the_view=True)  # the command box open: the form scrolls above the plots
        for w in (self.command_box, self.rpc_label, self.form, self.busy, self.progress, self.progress_label,
                  self.decisions):
            top.addWidget(w)
        top.setContentsMargins(0, 0, 0, 0)
        lay = QVBoxLayout(self)
        lay.addWidget(self.top)
        lay.addLayout(plots, 1)
        for toggle in (self.command_box.toggled, self.form.advanced_btn.toggled):  # now, and once laid out
            toggle.connect(lambda _on: self._fit_top(later=True))
        self.form.advanced_btn.toggled.connect(self._show_advanced_in_view)
        self._fit_top()
        self.handlers = self._handlers()
        self._from_form = False  # a sweep this tab's form starts (else another page's: the form follows it)
        self._last_run: str | None = None
        self._pending_plots: tuple[list[str], tuple[Arm, ...]] | None = None  # drawn at the sweep's first record
        self.form.changed.connect(self.update_start)
        state.sweep_requested.connect(self.run_plan)
        sweeps.started.connect(self._begin)
        sweeps.events.connect(self.on_event)
        sweeps.finished.connect(self._ended)
        sweeps.tick.connect(self._tick)
        self.update_start()

    def show_workers(self) -> None:
        """Over how many RPC workers the sweep splits the model: the Machine tab's, else a pasted
        command's --rpc (none: the line is hidden)."""
        command = self.state.own_command.command
        n = len(self.state.rpc_workers or (command.rpc if command is not None else None) or ())
        self.rpc_label.setText(f"The model is split over {n} RPC worker{'s' if n != 1 else ''} (llama-server "
                               "--rpc; the Machine tab lists them): each sweep runs through llama-server")
        self.rpc_label.setVisible(n > 0)

    def _fit_top(self, later: bool = False) -> None:
        """The form above the plots keeps its own height (Advanced, at least its ADVANCED_ROWS rows,
        scrolls inside itself), all but the open command box's and up to TOP_MIN_H: the rest
        scrolls, so the window need not grow past the screen and Advanced is never a strip."""
        content = self.top.widget()
        assert content is not None  # scroll_box's
        box = self.command_box.body.minimumSizeHint().height() if self.command_box.isChecked() else 0
        self.top.setMinimumHeight(min(TOP_MIN_H, max(0, content.minimumSizeHint().height() - box)))
        if later:  # again once the layout holds what was just opened or closed
            QTimer.singleShot(0, self._fit_top)

    def _show_advanced_in_view(self, advanced_open: bool) -> None:
        """Advanced, opened, is scrolled into view above the plots (the open command box above it
        scrolls up out of the way), once the layout has made room for it."""
        if advanced_open:
            area = self.form.advanced_area
            QTimer.singleShot(0, lambda: self.top.ensureWidgetVisible(area, 0, 0) if area.isVisible() else None)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        """Shown with Advanced open (opened while another tab showed): Advanced in view."""
        super().showEvent(event)
        self._show_advanced_in_view(self.form.advanced_btn.isChecked())

    def _keep_plots_readable(self, advanced_open: bool) -> None:
        """Advanced, opened, takes room from the plots only down to PLOT_MIN_H (then it scrolls
        itself); closed, the plots may shrink with the window."""
        for p in self.plots.widgets:
            p.setMinimumHeight(PLOT_MIN_H if advanced_open else 0)

    def update_start(self) -> None:
        """Start is enabled when no sweep runs and the form's can; the reason beside it otherwise."""
        blocked = self.form.show_problem()
        self.start_btn.setEnabled(not self.sweeps.running and not blocked)
        self.start_btn.setToolTip(("Start is disabled: " + blocked) if blocked else START_TIP)

    # -- starting -------------------------------------------------------------------------
    def run_plan(self, plan: Plan) -> None:
        """A plan asked for through the state (Run again): shown in the form, then started."""
        if plan.model != self.state.model:
            self.state.set_model(plan.model)
        self.form.show_plan(plan)
        self.start_sweep(plan)

    def start_sweep(self, plan: Plan | None = None) -> None:
        """Start the sweep of the form (or ``plan``, e.g. an earlier sweep's, run again)."""
        self.form.check_model()  # read again: the form says so when the file changed since it was chosen
        try:
            request = self.form.request(plan)
        except UserError as e:
            self.state.show_error(str(e))
            return
        self._from_form = True  # the form already shows it
        try:
            self.sweeps.start(request)
        finally:
            self._from_form = False

    def _follow(self, request: SweepRequest) -> None:
        """Another page's sweep (the Start page's Tune for me) shown in the form as it runs: its
        tasks, widths, tokens and engine, adaptive with its budget, the task mix."""
        self.form.show_plan(request.plan)
        if request.adaptive is not None:
            self.form.mode_box.setCurrentText("adaptive")
            budget = next((name for name, s in BUDGETS.items() if s == request.adaptive.budget_s), None)
            if budget is not None:
                self.form.budget_box.setCurrentText(budget)
        self.form.mix_edit.setText(self.state.task_mix)

    # -- rendering the service's sweep ----------------------------------------------------------
    def _begin(self, prepared: Prepared) -> None:
        """The progress, plots and buttons of a sweep that starts (this tab's or the Start page's)."""
        plan = prepared.request.plan
        adaptive = prepared.request.adaptive is not None
        if not self._from_form:
            self._follow(prepared.request)
        self.busy.reset(prepared.notes)
        self._last_run = None
        self._pending_plots = (list(dict.fromkeys(p.task for p in plan.prompts)), plan.arms)
        self.decisions.clear()
        self.progress.setMaximum(max(1, self.sweeps.total))
        self.progress.setValue(0)
        self.progress.setFormat("%v runs" if adaptive else "%v / %m runs")
        self.update_start()
        self.cancel_btn.setEnabled(True)
        self.plots.timer.start()

    def _handlers(self) -> dict[type, Callable[[Any], None]]:
        """The session's events, each to what shows it."""
        return {
            TokenProgress: self.plots.token_progress,
            LiveAnalysis: lambda ev: self.plots.set_analysis(ev.analysis),
            RunFinished: self._run_done,
            RunFailed: self._run_done,
            RunStarted: self._run_started,
            AdaptiveStage: lambda ev: self.progress_label.setText(f"adaptive: {ev.message}"),
            AdaptiveResult: self._adaptive_result,
            Decisions: self.decisions.show_decisions,
        }

    def on_event(self, ev: Any) -> None:
        dispatch(ev, self.handlers)

    def _run_done(self, ev: RunFinished | RunFailed) -> None:
        if self._pending_plots is not None:  # the first record: the previous sweep's plots go now
            tasks, arms = self._pending_plots
            self._pending_plots = None
            self.plots.prepare(tasks, arms)
        self.plots.run_done(ev.record)
        self.busy.run_done(ev.record)
        done, total = self.sweeps.done, self.sweeps.total
        self.progress.setMaximum(max(total, done, 1))
        self.progress.setValue(done)
        self.progress_label.setText(self.sweeps.clock.line())

    def _tick(self, line: str | None = None) -> None:
        """The flow's one clock (the sweep service's, as the Start page and the status bar show it),
        each second while a sweep runs; an adaptive stage's message stays until the next run ends."""
        if not self.progress_label.text().startswith("adaptive"):
            self.progress_label.setText(line or self.sweeps.clock.line())

    def _run_started(self, ev: RunStarted) -> None:
        self._last_run = f"{ev.arm.label}, {ev.task}" + (" (warmup)" if ev.warmup else "")
        self.plots.run_started(f"Running: {self._last_run}",
                               f"Decode speed of {ev.task}/{ev.prompt_id}, {ev.arm.label}, so far (tokens "
                               "after the first over the time since the first)")

    def _adaptive_result(self, ev: AdaptiveResult) -> None:
        if ev.runs == 0:  # no run, so no verdict: the probe's answer is the only one
            self.progress_label.setText(f"adaptive: done after {ev.runs} runs; leave MTP off (the cost probe says "
                                        "no draft width can pay on this machine)")
        else:  # the answer is the verdict's, under the decisions (one story on every tab)
            self.progress_label.setText(f"adaptive: done after {ev.runs} runs")

    def _ended(self, end: SweepEnd) -> None:
        self.cancel_btn.setEnabled(False)
        self.update_start()
        self._pending_plots = None
        v = self.state.verdict
        self.decisions.show_verdict(v if end.shown else None)
        self.plots.finish(v.analysis if end.shown and v is not None else None,
                          self._last_run if self.sweeps.records else None)
        done = self.sweeps.done
        if done and not self.progress_label.text().startswith("adaptive"):
            self.progress_label.setText(f"{done} runs in {self.sweeps.elapsed():.0f} s"
                                        + (", cancelled" if end.cancelled else ", done"))
