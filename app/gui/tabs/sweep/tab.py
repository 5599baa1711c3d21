"""Sweep tab: the form in two levels (form.py: the model, tasks and preset with the run count and
time estimate before Start; Advanced: engine, modes and drafter, K, p_min, tokens, repetitions,
context, GPU layers, thinking and depth, the sampler, exhaustive or adaptive), Start (disabled, with
the reason beside it, for a model that cannot be swept) / Cancel with progress and ETA, the device
the engine will measure on, live plots (plots.py: the previous sweep's stay until the new one has
its first run). A plan asked for through the AppState (Run again) is shown in the form and started."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.core.engines.base import EngineKind
from app.core.common.spec_modes import MTP
from app.core.common.errors import UserError
from app.core.common.text import printable
from app.core.measure.plan import Plan, make_arms, parse_float_list, parse_int_list
from app.core.measure.prompts import select_prompts
from app.core.session.events import RunFailed, RunFinished, RunStarted, SweepError, SweepWarning, TokenProgress
from app.core.session.events import AdaptiveResult, AdaptiveStage, Decisions, SessionFinished, dispatch
from app.core.session.request import AdaptiveOptions, SweepRequest

from ...jobs import Jobs
from ...services.capabilities import CapabilityReader
from ...services.engines import Engines
from ...state import AppState
from .busy import BusyIndicator
from .basic import ModelCheck, check_model, estimate_text, no_mtp_note, tok_s_known
from .decisions import BUDGETS, DecisionPanel
from .form import NOTE_STYLE, PROBLEM_STYLE, SweepForm
from .plots import LiveAnalysis, LivePlots, with_live_analysis

START_TIP = "Results are appended to a JSONL file after every run: nothing is lost if the app stops"


class SweepTab(SweepForm, QWidget):
    def __init__(self, state: AppState, jobs: Jobs, capabilities: CapabilityReader, engines: Engines,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self.engines = engines
        lay = QVBoxLayout(self)
        top = self._build_form(state, capabilities)
        buttons = QHBoxLayout()
        self.start_btn = QPushButton("Start sweep")
        self.start_btn.setToolTip(START_TIP)
        self.start_btn.clicked.connect(lambda: self.start_sweep())
        self.cancel_btn = QPushButton("Cancel", enabled=False)
        self.cancel_btn.clicked.connect(self.cancel_sweep)
        buttons.addWidget(self.start_btn)
        buttons.addWidget(self.cancel_btn)
        buttons.addStretch(1)
        buttons.addWidget(self.advanced_btn)
        self.device_label = QLabel("")
        self.device_label.setWordWrap(True)
        self.device_label.setToolTip("The device the chosen engine will really run the model on (its backends "
                                     "and devices, asked before Start; the Machine tab shows them all)")
        self._engine_picked = False  # the user chose the engine: the GPU default does not override it
        self._auto_server = False  # the modes switched the engine box to llama-server
        self.engine_box.activated.connect(self._engine_activated)
        self.engine_box.currentIndexChanged.connect(lambda *_: self.show_device())
        self.engine_box.currentIndexChanged.connect(lambda *_: setattr(self.state, "sweep_engine", self.engine_kind()))
        self.progress, self.progress_label = QProgressBar(), QLabel("")
        self.decisions = DecisionPanel(self)  # per task: decided or not, and about how long to decide
        self.plots = LivePlots(self)
        plots = QHBoxLayout()
        for p in self.plots.widgets:
            plots.addWidget(p, 1)
        lay.addLayout(top)
        lay.addLayout(buttons)
        lay.addWidget(self.advanced_area)
        lay.addWidget(self.device_label)
        lay.addWidget(self.modes.note)
        self.busy = BusyIndicator(self)  # what other programs take now, and the runs they disturbed
        lay.addWidget(self.busy)
        lay.addWidget(self.progress)
        lay.addWidget(self.progress_label)
        lay.addWidget(self.decisions)
        lay.addLayout(plots, 1)
        self.job, self.records, self.results_path = None, [], None
        self._finished: SessionFinished | None = None
        self.handlers = self._handlers()
        self._t0, self._done, self._total = 0.0, 0, 0
        self._last_run: str | None = None
        self._failure: str | None = None  # what the worker failed with (the sweep's own error)
        self._pending_plots: tuple | None = None  # (tasks, arms): drawn at the sweep's first record
        self._engine_options_changed()
        state.prompts_changed.connect(self.update_task_boxes)
        state.demo_chosen.connect(self.use_demo_settings)
        state.sweep_requested.connect(self.run_plan)
        state.model_changed.connect(self.check_model)
        state.probe_changed.connect(lambda *_: self._form_changed())
        state.records_changed.connect(self._form_changed)
        engines.choice_changed.connect(self.use_engine_choice)
        self.modes.changed.connect(self._modes_changed)
        self.mode_box.currentTextChanged.connect(lambda text: self.modes.set_adaptive(text == "adaptive"))
        self.mode_box.currentTextChanged.connect(lambda text: self.budget_box.setEnabled(text == "adaptive"))
        self.mode_box.currentTextChanged.connect(lambda text: self.reprobe_box.setEnabled(text == "adaptive"))
        self._modes_asked = False
        self._modes_changed()
        self.show_device()
        self.check_model(state.model)

    # -- the engine that matches the GPU (chosen by the engine check; shown here) ------------
    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if self.engines.choice is None and self.engines.job is None:
            self.engines.check()  # which device each engine will use: asked before Start
        if not self._modes_asked:  # the modes the llama-server lists (read on a worker)
            self._modes_asked = True
            self.modes.refresh()

    def engine_kind(self) -> EngineKind:
        return EngineKind.INPROCESS if self.engine_box.currentIndex() == 0 else EngineKind.SERVER

    def _engine_activated(self, _index: int) -> None:
        self._engine_picked, self._auto_server = True, False
        self._modes_changed()
        self.show_device()

    def use_engine_choice(self, choice) -> None:
        """The engine check's choice: the default engine (unless the user chose one, or a sweep runs)."""
        if choice is not None and not self._engine_picked and self.job is None:
            self.engine_box.setCurrentIndex(0 if choice.kind == EngineKind.INPROCESS else 1)
            self._auto_server = False
            self._modes_changed()
        self.show_device()

    def _modes_changed(self) -> None:
        """A mode only llama-server runs: the sweep runs there (and says so); back to in-process
        when none is left, if that switch was the modes'."""
        if self.job is not None:
            return
        needs = self.modes.server_only()
        if needs and self.engine_kind() == EngineKind.INPROCESS:
            self.engine_box.setCurrentIndex(1)
            self._auto_server = True
        elif not needs and self._auto_server:
            self.engine_box.setCurrentIndex(0)
            self._auto_server = False
        self.modes.show_note(needs)
        self.update_start()
        self._form_changed()

    def show_device(self) -> None:
        """Which device the engine in the form will measure on, in the engine check's words."""
        choice = self.engines.choice
        if choice is None:
            self.device_label.setText("will measure on: asking the engines for their devices…"
                                      if self.engines.job is not None else "")
            return
        text = choice.sentence(self.engine_kind())
        if self.engine_kind() != choice.kind:
            text += f"\n(the engine for this machine would be {'in-process' if choice.kind == 'inprocess' else 'llama-server'}: {choice.reason})"
        elif not choice.on_gpu:
            text += f"\n{choice.reason}"
        self.device_label.setText(text)

    # -- the model about to be swept: can it be, and what cannot run on it ---------------
    def check_model(self, path: str | None = None) -> ModelCheck:
        """Read the chosen model's header again: its name in the form, Start enabled or not, and
        the reason beside it."""
        path = self.state.model if path is None else path
        self.model_check = check_model(path)
        name = Path(path).name if path else "none: choose one on the Model tab"
        self.model_label.setText(name + (" (the demo model: synthetic, its drafts are wrong on purpose, per task)"
                                         if self.model_check.demo else ""))
        self.model_label.setToolTip(path or "")
        self.update_start()
        self._form_changed()
        return self.model_check

    def update_start(self) -> None:
        """Start is enabled when no sweep runs and the model can be swept; the reason beside it
        otherwise (and, for a model without MTP heads, what still runs on it), kept on the tab."""
        check = self.model_check
        modes = self.modes.modes()
        note = no_mtp_note(check, modes, bool(self.modes.drafters()))
        only_mtp = bool(note) and all(m == MTP for m in modes)
        blocked = check.problem or (note if only_mtp else "")
        self.start_btn.setEnabled(self.job is None and not blocked)
        self.start_btn.setToolTip(("Start is disabled: " + blocked) if blocked else START_TIP)
        text = printable(check.problem or note)
        # the file's name, not its whole path (in the tooltip, and on the Model tab): a long path
        # never widens the window (the label also ignores its own width: a long name is clipped)
        self.model_note.setText(text.replace(check.path, Path(check.path).name) if check.path else text)
        self.model_note.setToolTip(text)
        self.model_note.setStyleSheet(PROBLEM_STYLE if blocked else NOTE_STYLE)
        self.model_note.setVisible(bool(text))

    # -- the plan and its estimate --------------------------------------------------------
    def _form_changed(self) -> None:
        """A setting changed: the preset it matches now, and the estimate soon (coalesced)."""
        self._sync_preset()
        self._estimate_timer.start()

    def update_estimate(self) -> None:
        """The run count and a time estimate, before Start: runs x tokens per run over the
        model's decode speed (the probe's, else the last sweep's); unknown until the first runs."""
        if not self.state.model:  # the line under it says to choose one
            self.plan_label.setText("")
            return
        if self.mode_box.currentText() == "adaptive":
            budget = BUDGETS.get(self.budget_box.currentText())
            self.plan_label.setText("adaptive: a cost probe, then runs until every task is decided"
                                    + (f", at most {budget / 60:.0f} min" if budget else " (no time limit)"))
            return
        try:
            plan = self._plan()
        except UserError as e:
            self.plan_label.setText(printable(str(e)))
            return
        speed = tok_s_known(plan.model, self.state.probe_record, [*self.state.records, *self.records])
        self.plan_label.setText(estimate_text(plan.total_runs, plan.n_predict, speed))

    def _plan(self) -> Plan:
        model = self.state.model
        if not model:
            raise UserError("choose a model first (Model tab)")
        check = self.model_check if self.model_check.path == model else check_model(model)
        tasks = [t for t, cb in self.task_boxes.items() if cb.isChecked()]
        if not tasks:
            raise UserError("choose at least one task type")
        modes, drafters = self.modes.chosen()
        arms = make_arms(parse_int_list(self.k_edit.text(), "Draft widths K"),
                         parse_float_list(self.pmin_edit.text(), "p_min"), modes=modes, drafters=drafters,
                         draft_samplings=self.sampler.draft_samplings())
        # the demo model's own prompts lead into each task's region; other tasks use the suites
        demo = [p for p in check.demo if p.task in tasks]
        rest = [t for t in tasks if t not in {p.task for p in demo}]
        prompts = demo + (select_prompts(rest, self.state.user_prompt_file(), per_task=self.per_task.value())
                          if rest else [])
        return Plan(model=model, arms=arms, prompts=tuple(prompts), n_predict=self.npredict.value(),
                    reps=self.reps.value(), warmup=1, thinking=self.context.thinking(), depths=self.context.depths(),
                    samplers=self.sampler.samplers(model),
                    engine="server" if self.modes.server_only() or any(a.probabilistic for a in arms)
                    else self.engine_kind())

    # -- running --------------------------------------------------------------------------
    def run_plan(self, plan: Plan) -> None:
        """A plan asked for through the state (Run again): shown in the form, then started."""
        if plan.model != self.state.model:
            self.state.set_model(plan.model)
        self.show_plan(plan)
        self.start_sweep(plan)

    def start_sweep(self, plan: Plan | None = None, request: SweepRequest | None = None) -> None:
        """Start the sweep of the form (or ``plan``, e.g. an earlier sweep's, run again; or a whole
        ``request``, e.g. the Start page's Tune for me)."""
        if self.job is not None:
            self.state.show_error("a sweep is running: cancel it or let it finish first")
            return
        from app.core.session.sweep import prepare, run  # the analysis layer: loaded by a sweep

        check = self.check_model()  # read again: the file may have changed since it was chosen
        if check.problem:
            self.state.show_error(check.problem)
            return
        try:
            prepared = prepare(request or self.request(plan))  # every check: one line, nothing started
        except UserError as e:
            self.state.show_error(str(e))
            return
        request = prepared.request
        self.busy.reset(prepared.notes)
        self.results_path = request.out
        self.records = []  # the shown sweep and the plots stay until this one has its first record
        self._failure = None
        self._begin(request)
        self.job = self.jobs.run(lambda cancel: with_live_analysis(run(request, cancel)), self, event=self.on_event,
                                 failed=[self._failed, self.state.show_error], finished=self.on_finished)
        self.state.sweep_started.emit(request.plan)
        self.state.show_status(f"Sweeping: results go to {self.results_path}")

    def request(self, plan: Plan | None = None) -> SweepRequest:
        """The sweep of the form, or ``plan`` run as it is, as a session request."""
        adaptive = None
        if plan is None:
            plan = self._plan()
            if self.mode_box.currentText() == "adaptive":
                drafts = [a for a in plan.arms if a.k]
                adaptive = AdaptiveOptions(ks=tuple(sorted({a.k for a in drafts if a.k})),
                                           p_mins=tuple(sorted({a.p_min for a in drafts})), max_reps=plan.reps,
                                           budget_s=BUDGETS.get(self.budget_box.currentText()),
                                           reprobe=self.reprobe_box.isChecked())
        return SweepRequest(plan, self.state.engine_settings(plan.engine), adaptive,
                            mix=(self.state.task_mix or None) if adaptive else None)

    def _begin(self, request: SweepRequest) -> None:
        """The progress, plots and buttons of a sweep that starts."""
        plan = request.plan
        adaptive = request.adaptive is not None
        self._done, self._total = 0, (0 if adaptive else plan.total_runs)
        self._t0 = time.monotonic()
        self._last_run = None
        self._pending_plots = (list(dict.fromkeys(p.task for p in plan.prompts)), plan.arms)
        self.decisions.clear()
        self.progress.setMaximum(max(1, self._total))
        self.progress.setValue(0)
        self.progress.setFormat("%v runs" if adaptive else "%v / %m runs")
        self.start_btn.setEnabled(False)
        self.cancel_btn.setEnabled(True)
        self.plots.timer.start()
        self.state.sweep_running = True

    def cancel_sweep(self) -> None:
        if self.job:
            self.job.cancel()
            self.state.show_status("Cancelling…")

    def _handlers(self) -> dict:
        """The session's events, each to what shows it."""
        return {
            TokenProgress: self.plots.token_progress,
            LiveAnalysis: lambda ev: self.plots.set_analysis(ev.analysis),
            RunFinished: self._run_done,
            RunFailed: self._run_done,
            RunStarted: self._run_started,
            SweepError: lambda ev: self.state.show_error(ev.message),
            SweepWarning: lambda ev: self.state.sweep_warning.emit(ev.message),
            AdaptiveStage: lambda ev: self.progress_label.setText(f"adaptive: {ev.message}"),
            AdaptiveResult: self._adaptive_result,
            Decisions: self.decisions.show_decisions,
            SessionFinished: self._session_finished,
        }

    def on_event(self, ev) -> None:
        dispatch(ev, self.handlers)

    def _failed(self, message: str) -> None:
        self._failure = message

    def _run_done(self, ev) -> None:
        if self._pending_plots is not None:  # the first record: the previous sweep's plots go now
            tasks, arms = self._pending_plots
            self._pending_plots = None
            self.plots.prepare(tasks, arms)
        self.records.append(ev.record)
        self.plots.run_done(ev.record)
        self.busy.run_done(ev.record)
        self._done += 1
        self.progress.setMaximum(max(self._total, self._done, 1))
        self.progress.setValue(self._done)
        el = time.monotonic() - self._t0
        if self._total:
            eta = el / self._done * (self._total - self._done)
            self.progress_label.setText(f"{self._done}/{self._total} runs, {el:.0f} s, about {eta:.0f} s left")
        else:
            self.progress_label.setText(f"{self._done} runs, {el:.0f} s")

    def _run_started(self, ev: RunStarted) -> None:
        what = "warmup" if ev.warmup else f"run {ev.index + 1}/{ev.total}"
        self.state.show_status(f"{what}: {ev.arm.label}, {ev.task}/{ev.prompt_id}")
        self._last_run = f"{ev.arm.label}, {ev.task}" + (" (warmup)" if ev.warmup else "")
        self.plots.run_started(f"Running: {self._last_run}",
                               f"Decode speed of {ev.task}/{ev.prompt_id}, {ev.arm.label}, so far (tokens "
                               "after the first over the time since the first)")

    def _adaptive_result(self, ev: AdaptiveResult) -> None:
        pick = "leave MTP off" if ev.pick is None else ev.pick.label
        why = " (the cost probe says no draft width can pay on this machine)" if ev.runs == 0 else ""
        self.progress_label.setText(f"adaptive: done after {ev.runs} runs; best for the mix: {pick}{why}")
        if ev.cost is not None:
            self.state.add_probe(ev.cost)

    def _session_finished(self, ev: SessionFinished) -> None:
        self._finished = ev

    def on_finished(self) -> None:
        self.cancel_btn.setEnabled(False)
        done, self._finished = self._finished, None
        cancelled = bool(self.job and self.job.cancel_token.cancelled) or bool(done and done.cancelled)
        self.job = None
        self.update_start()
        self.state.sweep_running = False
        self._pending_plots = None
        # a sweep with no record leaves the shown sweep as it was, unless it completed and wrote its file
        # (the cost probe decided it: the file holds the probe). A cancelled or failed one goes to the
        # state too: the Results tab puts the last complete verdict back and offers this one
        complete = done is not None and not cancelled
        shown = bool(self.records) or bool(complete and done.written)
        if shown:
            self.state.set_results(self.records, self.results_path)
        v = self.state.verdict
        self.plots.finish(v.analysis if shown and v is not None else None, self._last_run if self.records else None)
        if self._done and not self.progress_label.text().startswith("adaptive"):
            self.progress_label.setText(f"{self._done} runs in {time.monotonic() - self._t0:.0f} s"
                                        + (", cancelled" if cancelled else ", done"))
        self.state.show_status(self.outcome(done, cancelled, shown))
        self.state.sweep_finished.emit(cancelled)

    def outcome(self, done: SessionFinished | None, cancelled: bool, shown: bool) -> str:
        """The status line of a sweep that ended: never "Finished" for one that did not run."""
        reason = self._failure or (done.errors[0] if done is not None and done.errors else None)
        saved = done.results_path if done is not None else (self.results_path if self.records else None)
        where = f"; results in {saved}" if saved else "; nothing saved"
        if not shown and saved:
            where += " (not shown: open it on the Results tab)"
        if cancelled:
            return (f"Cancelled after {self._done} runs" if self._done else "Cancelled before the first run") + where
        if done is None:  # the session failed: before its first run, or on the way
            why = f": {reason}" if reason else ""
            return (f"The sweep stopped after {self._done} runs{why}{where}" if self._done
                    else f"The sweep did not start{why}")
        if not done.n_ok and done.adaptive is not None and done.adaptive.runs == 0 and not reason:
            return "Finished: the cost probe says no draft width can pay on this machine, so no run was needed" + where
        if not done.n_ok:
            return f"Nothing was measured: {reason or 'every run failed'}{where}"
        return "Finished" + where
