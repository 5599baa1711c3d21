"""Sweep tab: engine, modes and drafter (sweep_modes), K, p_min, tokens, repetitions, tasks, context, GPU
layers, thinking and depth (sweep_context), the sampler (sampler_box), exhaustive or adaptive; Start /
Cancel with progress and ETA; live plots (sweep_plots). A plan asked for through the AppState (Run
again) is shown in the form and started."""

from __future__ import annotations

import time
from collections import Counter

from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QProgressBar, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from app.core.common.errors import UserError
from app.core.measure.plan import Plan, make_arms, parse_float_list, parse_int_list
from app.core.measure.prompts import select_prompts
from app.core.measure.runner import RunFailed, RunFinished, RunStarted, SweepError, SweepWarning, TokenProgress
from app.core.session.events import AdaptiveResult, AdaptiveStage, SessionFinished, dispatch
from app.core.session.request import AdaptiveOptions, SweepRequest

from ..adapter import CoreJob
from ..sampler_box import SamplerBox
from ..state import AppState
from ..sweep_context import ContextChooser
from ..sweep_modes import TIPS, ModeChooser
from ..sweep_plots import LiveAnalysis, LivePlots, with_live_analysis

class SweepTab(QWidget):
    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        settings = state.settings
        lay = QVBoxLayout(self)
        form = QFormLayout()
        self.engine_box = QComboBox()
        self.engine_box.addItems(["in-process", "llama-server"])
        self.engine_box.setToolTip(TIPS["engine"])
        self.mode_box = QComboBox()
        self.mode_box.addItems(["exhaustive", "adaptive"])
        self.mode_box.setToolTip(TIPS["mode"])
        self.modes = ModeChooser(state, self)
        self.context = ContextChooser(self)  # thinking switch and context depth
        self.sampler = SamplerBox(state, self)  # greedy, the model's recommended, custom; a temperature axis
        self.k_edit = QLineEdit("1,2,3,4")
        self.k_edit.setToolTip(TIPS["k"])
        self.pmin_edit = QLineEdit("0")
        self.pmin_edit.setToolTip(TIPS["p_min"])
        self.npredict = QSpinBox(minimum=8, maximum=8192, value=128)
        self.npredict.setToolTip(TIPS["n_predict"])
        self.reps = QSpinBox(minimum=1, maximum=50, value=3)
        self.reps.setToolTip(TIPS["reps"])
        self.task_row = QHBoxLayout()
        self.task_boxes: dict[str, QCheckBox] = {}
        self.update_task_boxes()
        self.threads = QSpinBox(minimum=0, maximum=256, value=0)
        self.threads.setSpecialValueText("all cores")
        self.threads.setToolTip("CPU threads for llama.cpp (-t). All cores is the usual choice; fewer leaves a "
                                "core to the rest of the machine (and to this window's live plots)")
        self.ctx_size = QSpinBox(minimum=0, maximum=1048576, singleStep=1024,
                                 value=int(settings.value("ctx_size", 4096)))
        self.ctx_size.setSpecialValueText("model's own")
        self.ctx_size.setToolTip(TIPS["ctx"])
        self.gpu_layers = QComboBox(editable=True)
        self.gpu_layers.addItems(["", "auto", "all"])
        self.gpu_layers.lineEdit().setPlaceholderText("engine default")
        self.gpu_layers.setCurrentText(str(settings.value("gpu_layers", "")))
        self.gpu_layers.setToolTip(TIPS["ngl"])
        self.per_task = QSpinBox(minimum=1, maximum=50, value=2)
        self.per_task.setToolTip("Prompts per task type (the first N of each suite)")
        self.mix_edit = QLineEdit(state.task_mix)
        self.mix_edit.setPlaceholderText("equal weights")
        self.mix_edit.setToolTip(TIPS["mix"])
        self.mix_edit.editingFinished.connect(self._mix_changed)
        for w in (self.ctx_size, self.threads):
            w.valueChanged.connect(lambda *_: self._engine_options_changed())
        self.gpu_layers.currentTextChanged.connect(lambda *_: self._engine_options_changed())
        form2 = QFormLayout()
        top = QHBoxLayout()
        top.addLayout(form)
        top.addLayout(form2)
        for label, w in (("Engine", self.engine_box), ("Mode", self.mode_box), ("Speculative modes", self.modes.button),
                         ("Draft widths K", self.k_edit), ("p_min", self.pmin_edit), ("CPU threads", self.threads),
                         ("Context size", self.ctx_size)):
            form.addRow(label, w)
        for label, w in (("Drafter", self.modes.drafter_row), ("Tokens per run", self.npredict),
                         ("Repetitions", self.reps), ("Tasks", self.task_row), ("Prompts per task", self.per_task),
                         ("Task mix", self.mix_edit), ("GPU layers", self.gpu_layers), *self.context.rows(),
                         *self.sampler.rows()):
            form2.addRow(label, w)
        buttons = QHBoxLayout()
        self.start_btn = QPushButton("Start sweep")
        self.start_btn.setToolTip("Results are appended to a JSONL file after every run: nothing is lost "
                                  "if the app stops")
        self.start_btn.clicked.connect(lambda: self.start_sweep())
        self.cancel_btn = QPushButton("Cancel", enabled=False)
        self.cancel_btn.clicked.connect(self.cancel_sweep)
        buttons.addWidget(self.start_btn)
        buttons.addWidget(self.cancel_btn)
        self.device_label = QLabel("")
        self.device_label.setWordWrap(True)
        self.device_label.setToolTip("The device the chosen engine will really run the model on (its backends "
                                     "and devices, asked before Start; the Machine tab shows them all)")
        self._engine_picked = False  # the user chose the engine: the GPU default does not override it
        self._auto_server = False  # the modes switched the engine box to llama-server
        self.engine_box.activated.connect(self._engine_activated)
        self.engine_box.currentIndexChanged.connect(lambda *_: self.show_device())
        self.progress, self.progress_label = QProgressBar(), QLabel("")
        self.plots = LivePlots(self)
        plots = QHBoxLayout()
        for p in self.plots.widgets:
            plots.addWidget(p, 1)
        lay.addLayout(top)
        lay.addWidget(self.device_label)
        lay.addWidget(self.modes.note)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.progress_label)
        lay.addLayout(plots, 1)
        self.job, self.records, self.results_path = None, [], None
        self._finished: SessionFinished | None = None
        self.handlers = self._handlers()
        self._t0, self._done, self._total = 0.0, 0, 0
        self._last_run: str | None = None
        self._engine_options_changed()
        state.prompts_changed.connect(self.update_task_boxes)
        state.demo_chosen.connect(self.use_demo_settings)
        state.sweep_requested.connect(self.run_plan)
        state.engine_choice_changed.connect(self.use_engine_choice)
        self.modes.changed.connect(self._modes_changed)
        self.mode_box.currentTextChanged.connect(lambda text: self.modes.set_adaptive(text == "adaptive"))
        self._modes_asked = False
        self._modes_changed()
        self.show_device()

    # -- the engine that matches the GPU (chosen by the state; shown here) -------------------
    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if self.state.engine_choice is None and self.state.engines_job is None:
            self.state.check_engines()  # which device each engine will use: asked before Start
        if not self._modes_asked:  # the modes the llama-server lists (read on a worker)
            self._modes_asked = True
            self.modes.refresh()

    def engine_kind(self) -> str:
        return "inprocess" if self.engine_box.currentIndex() == 0 else "server"

    def _engine_activated(self, _index: int) -> None:
        self._engine_picked, self._auto_server = True, False
        self._modes_changed()
        self.show_device()

    def use_engine_choice(self, choice) -> None:
        """The state's choice: the default engine (unless the user chose one, or a sweep runs)."""
        if choice is not None and not self._engine_picked and self.job is None:
            self.engine_box.setCurrentIndex(0 if choice.kind == "inprocess" else 1)
            self._auto_server = False
            self._modes_changed()
        self.show_device()

    def _modes_changed(self) -> None:
        """A mode only llama-server runs: the sweep runs there (and says so); back to in-process
        when none is left, if that switch was the modes'."""
        if self.job is not None:
            return
        needs = self.modes.server_only()
        if needs and self.engine_kind() == "inprocess":
            self.engine_box.setCurrentIndex(1)
            self._auto_server = True
        elif not needs and self._auto_server:
            self.engine_box.setCurrentIndex(0)
            self._auto_server = False
        self.modes.show_note(needs)

    def show_device(self) -> None:
        """Which device the engine in the form will measure on, in the state's words."""
        choice = self.state.engine_choice
        if choice is None:
            self.device_label.setText("will measure on: asking the engines for their devices…"
                                      if self.state.engines_job is not None else "")
            return
        text = choice.sentence(self.engine_kind())
        if self.engine_kind() != choice.kind:
            text += f"\n(the engine for this machine would be {'in-process' if choice.kind == 'inprocess' else 'llama-server'}: {choice.reason})"
        elif not choice.on_gpu:
            text += f"\n{choice.reason}"
        self.device_label.setText(text)

    # -- the form -------------------------------------------------------------------------
    def update_task_boxes(self) -> None:
        checked = {t: cb.isChecked() for t, cb in self.task_boxes.items()}
        for cb in self.task_boxes.values():
            self.task_row.removeWidget(cb)
            cb.deleteLater()
        self.task_boxes = {}
        for t in self.state.prompt_tasks():
            cb = QCheckBox(t, checked=checked.get(t, True))
            cb.setToolTip(TIPS["tasks"])
            self.task_boxes[t] = cb
            self.task_row.addWidget(cb)

    def _mix_changed(self) -> None:
        self.state.set_task_mix(self.mix_edit.text())

    def gpu_layers_text(self) -> str | None:
        return self.gpu_layers.currentText().strip() or None

    def _engine_options_changed(self) -> None:
        self.state.settings.setValue("ctx_size", self.ctx_size.value())
        self.state.settings.setValue("gpu_layers", self.gpu_layers.currentText().strip())
        self.state.set_engine_options(ctx_size=self.ctx_size.value(), n_gpu_layers=self.gpu_layers_text(),
                                      threads=self.threads.value() or None)

    def use_demo_settings(self) -> None:
        """The demo sweep, as `mtp-tuner bench --demo` runs it: K=1..3, every task, within a minute."""
        from app.core.calibrated.demo import DEMO_KS, DEMO_REPS, DEMO_TASK_P, DEMO_TOKENS  # numpy: demo only

        self.k_edit.setText(DEMO_KS)
        self.npredict.setValue(DEMO_TOKENS)
        self.reps.setValue(DEMO_REPS)
        self.per_task.setValue(1)  # the demo model carries one prompt per task
        for task, cb in self.task_boxes.items():
            cb.setChecked(task in DEMO_TASK_P)

    def show_plan(self, plan: Plan) -> None:
        """A plan's settings in the form (to be seen; the plan itself runs as it is)."""
        self.mode_box.setCurrentText("exhaustive")
        self.modes.show_arms(plan.arms)
        self.engine_box.setCurrentIndex(0 if plan.engine == "inprocess" else 1)  # after the modes: as it runs
        self._auto_server = False
        drafts = [a for a in plan.arms if a.k]
        self.k_edit.setText(",".join(str(k) for k in sorted({a.k for a in drafts})) or "1")
        self.pmin_edit.setText(",".join(f"{p:g}" for p in sorted({a.p_min for a in drafts})) or "0")
        self.npredict.setValue(plan.n_predict)
        self.reps.setValue(plan.reps)
        tasks = Counter(p.task for p in plan.prompts)
        for t, cb in self.task_boxes.items():
            cb.setChecked(t in tasks)
        self.per_task.setValue(max(tasks.values()))
        self.context.show(plan.thinking, plan.depths)
        self.sampler.show(plan.samplers)

    def _plan(self) -> Plan:
        from app.core.calibrated.demo import demo_prompts  # numpy: see use_demo_settings

        model = self.state.model
        if not model:
            raise UserError("choose a model first (Model tab)")
        tasks = [t for t, cb in self.task_boxes.items() if cb.isChecked()]
        if not tasks:
            raise UserError("choose at least one task type")
        modes, drafters = self.modes.chosen()
        arms = make_arms(parse_int_list(self.k_edit.text(), "Draft widths K"),
                         parse_float_list(self.pmin_edit.text(), "p_min"), modes=modes, drafters=drafters)
        # the demo model's own prompts lead into each task's region; other tasks use the suites
        demo = [p for p in demo_prompts(model) or () if p.task in tasks]
        rest = [t for t in tasks if t not in {p.task for p in demo}]
        prompts = demo + (select_prompts(rest, self.state.user_prompt_file(), per_task=self.per_task.value())
                          if rest else [])
        return Plan(model=model, arms=arms, prompts=tuple(prompts), n_predict=self.npredict.value(),
                    reps=self.reps.value(), warmup=1, thinking=self.context.thinking(), depths=self.context.depths(),
                    samplers=self.sampler.samplers(model),
                    engine="server" if self.modes.server_only() else self.engine_kind())

    # -- running --------------------------------------------------------------------------
    def run_plan(self, plan: Plan) -> None:
        """A plan asked for through the state (Run again): shown in the form, then started."""
        if plan.model != self.state.model:
            self.state.set_model(plan.model)
        self.show_plan(plan)
        self.start_sweep(plan)

    def start_sweep(self, plan: Plan | None = None) -> None:
        """Start the sweep of the form (or ``plan``, e.g. an earlier sweep's, run again)."""
        if self.job is not None:
            self.state.show_error("a sweep is running: cancel it or let it finish first")
            return
        from app.core.session.sweep import prepare, run  # the analysis layer: loaded by a sweep

        try:
            request = prepare(self.request(plan)).request  # every check: one line, nothing started
        except UserError as e:
            self.state.show_error(str(e))
            return
        self.results_path = request.out
        self.records = []
        self.state.set_results([], self.results_path)
        self._begin(request)
        self.job = self.state.track(CoreJob(lambda cancel: with_live_analysis(run(request, cancel)), self))
        self.job.event.connect(self.on_event)
        self.job.failed.connect(self.state.show_error)
        self.job.finished.connect(self.on_finished)
        self.job.start()
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
                                           p_mins=tuple(sorted({a.p_min for a in drafts})), max_reps=plan.reps)
        return SweepRequest(plan, self.state.engine_settings(plan.engine), adaptive,
                            mix=(self.state.task_mix or None) if adaptive else None)

    def _begin(self, request: SweepRequest) -> None:
        """The progress, plots and buttons of a sweep that starts."""
        plan = request.plan
        adaptive = request.adaptive is not None
        self._done, self._total = 0, (0 if adaptive else plan.total_runs)
        self._t0 = time.monotonic()
        self._last_run = None
        self.plots.prepare(list(dict.fromkeys(p.task for p in plan.prompts)), plan.arms)
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
            SessionFinished: self._session_finished,
        }

    def on_event(self, ev) -> None:
        dispatch(ev, self.handlers)

    def _run_done(self, ev) -> None:
        self.records.append(ev.record)
        self.plots.run_done(ev.record)
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
        self.start_btn.setEnabled(True)
        self.cancel_btn.setEnabled(False)
        done, self._finished = self._finished, None
        cancelled = bool(self.job and self.job.cancel_token.cancelled) or bool(done and done.cancelled)
        self.job = None
        self.state.sweep_running = False
        self.state.set_results(self.records, self.results_path)
        v = self.state.verdict
        self.plots.finish(v.analysis if v is not None else None, self._last_run)
        if self._done and not self.progress_label.text().startswith("adaptive"):
            self.progress_label.setText(f"{self._done} runs in {time.monotonic() - self._t0:.0f} s"
                                        + (", cancelled" if cancelled else ", done"))
        if done is None:  # the session never started (its engine or results file could not be made)
            self.state.show_status("The sweep did not start")
        else:
            saved = f"; results in {done.results_path}" if done.results_path else "; no run finished, nothing saved"
            self.state.show_status(("Cancelled" if cancelled else "Finished") + saved)
        self.state.sweep_finished.emit(cancelled)
