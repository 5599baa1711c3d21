"""The Sweep tab's form, a widget in two levels. Basic: the model about to be swept (its name, and
why Start is disabled or what cannot run), the tasks, the preset (Quick, Normal, Thorough; basic.py)
with the run count and time estimate before Start. Advanced (collapsed; advanced.py): the modes and
drafter (modes.py), the draft widths, the runs, the sampler and thinking (sampler.py, context.py),
the context, the engine and threads, server flags as axes; plain labels, jargon in tooltips; under
them the device the engine will measure on. It gives the state the engine settings, takes the demo's settings and
shows a plan's. ``request()`` is the session's request for the sweep it describes; ``changed``
fires when that, or the model's check, changes. The tab's Start and Cancel sit on its row of the
Advanced toggle (``add_buttons``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QSizePolicy,
                               QSpinBox, QVBoxLayout, QWidget)

from app.core.common.errors import UserError
from app.core.common.spec_modes import MTP
from app.core.common.text import printable
from app.core.engines.base import EngineKind
from app.core.engines.devices import EngineChoice
from app.core.measure.plan import Plan, make_arms, parse_float_list, parse_int_list
from app.core.measure.prompts import BUILTIN_TASKS, DEFAULT_TASKS, prompts_for
from app.core.session.clock import estimate_source, flow_estimate
from app.core.session.request import ADAPTIVE_MAX_REPS, AdaptiveOptions, SweepRequest

from ...model_check import ModelCheck, check_model
from ...services.capabilities import CapabilityReader
from ...services.engines import Engines
from ...services.sweep import Sweeps
from ...state import AppState
from .advanced import AxesTable, scroll_area, toggle_button
from .basic import CUSTOM, DEFAULT_PRESET, PRESETS, ElidedLabel, estimate_text, no_mtp_note, preset_of
from .context import ContextChooser
from .decisions import BUDGETS, budget_box, min_gain_box, reprobe_box
from .modes import TIPS, ModeChooser
from .placements import PlacementBox
from .sampler import SamplerBox

PROBLEM_STYLE = "color: #b00020"  # Start is disabled: why
NOTE_STYLE = "color: #b26a00"  # something of the sweep cannot run: why, and what can


class SweepForm(QWidget):
    changed = Signal()  # a setting or the model's check changed: the request, or whether it can run

    def __init__(self, state: AppState, capabilities: CapabilityReader, engines: Engines, sweeps: Sweeps,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.engines = engines
        self.sweeps = sweeps  # read only: whether a sweep runs, and its records so far
        self._estimate_timer = QTimer(self, singleShot=True, interval=150)  # the estimate, coalesced
        self._estimate_timer.timeout.connect(self.update_estimate)
        self.model_check = ModelCheck("")
        self._engine_picked = False  # the user chose the engine: the GPU default does not override it
        self._auto_server = False  # the modes switched the engine box to llama-server
        self._modes_asked = False
        self._make_settings(state, capabilities)
        basic = self._make_basic()
        self._make_advanced()
        self.buttons = QHBoxLayout()  # the tab's buttons go before the stretch
        self.buttons.addStretch(1)
        self.buttons.addWidget(self.advanced_btn)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(basic)
        lay.addWidget(self.model_note)
        lay.addLayout(self.buttons)
        for w in (self.advanced_area, self.device_label, self.modes.note):
            lay.addWidget(w)
        self._connect(state, engines)
        self._engine_options_changed()
        self._modes_changed()
        self.show_device()
        self.check_model(state.model)

    def add_buttons(self, *buttons: QWidget) -> None:
        """The tab's buttons (Start, Cancel), on the row of the Advanced toggle."""
        for i, b in enumerate(buttons):
            self.buttons.insertWidget(i, b)

    # -- the widgets ------------------------------------------------------------------------
    def _make_settings(self, state: AppState, capabilities: CapabilityReader) -> None:
        """The settings' widgets (under Advanced), each with its tooltip."""
        self.engine_box = QComboBox()
        self.engine_box.addItems(["in-process", "llama-server"])
        self.engine_box.setToolTip(TIPS["engine"])
        self.mode_box = QComboBox()
        self.mode_box.addItems(["exhaustive", "adaptive"])
        self.mode_box.setToolTip(TIPS["mode"])
        self.modes = ModeChooser(state, capabilities, self)
        self.context = ContextChooser(self)  # thinking switch and context depth
        self.sampler = SamplerBox(state, self)  # greedy, the model's recommended, custom; a temperature axis
        self.axes = AxesTable(self._form_changed)  # llama-server flags as axes
        self.placements = PlacementBox(state, self)  # over RPC workers: where drafting runs, as settings
        self.k_edit = QLineEdit(PRESETS[DEFAULT_PRESET].ks)
        self.k_edit.setToolTip(TIPS["k"])
        self.pmin_edit = QLineEdit("0")
        self.pmin_edit.setToolTip(TIPS["p_min"])
        self.npredict = QSpinBox(minimum=8, maximum=8192, value=PRESETS[DEFAULT_PRESET].tokens)
        self.npredict.setToolTip(TIPS["n_predict"])
        self.reps = QSpinBox(minimum=1, maximum=50, value=PRESETS[DEFAULT_PRESET].reps)
        self.reps.setToolTip(TIPS["reps"])
        self.threads = QSpinBox(minimum=0, maximum=256, value=0)
        self.threads.setSpecialValueText("all cores")
        self.threads.setToolTip("CPU threads for llama.cpp (-t). All cores is the usual choice; fewer leaves a "
                                "core to the rest of the machine (and to this window's live plots)")
        self.ctx_size = QSpinBox(minimum=0, maximum=1048576, singleStep=1024,
                                 value=int(str(state.settings.value("ctx_size", 4096))))
        self.ctx_size.setSpecialValueText("model's own")
        self.ctx_size.setToolTip(TIPS["ctx"])
        self.gpu_layers = QComboBox(editable=True)
        self.gpu_layers.addItems(["", "auto", "all"])
        edit = self.gpu_layers.lineEdit()
        assert edit is not None  # an editable box has one
        edit.setPlaceholderText("engine default")
        self.gpu_layers.setCurrentText(str(state.settings.value("gpu_layers", "")))
        self.gpu_layers.setToolTip(TIPS["ngl"])
        self.per_task = QSpinBox(minimum=1, maximum=50, value=PRESETS[DEFAULT_PRESET].per_task)
        self.per_task.setToolTip("Prompts per task type (the first N of each suite)")
        self.mix_edit = QLineEdit(state.task_mix)
        self.mix_edit.setPlaceholderText("equal weights")
        self.mix_edit.setToolTip(TIPS["mix"])
        self.budget_box = budget_box()  # adaptive: Quick (about 2 min) or Thorough (until decided)
        self.budget_box.setEnabled(False)
        self.reprobe_box = reprobe_box()  # adaptive: the cost probe anew
        self.min_gain = min_gain_box()  # adaptive: δ of "no gain worth having"
        self.device_label = QLabel("")
        self.device_label.setWordWrap(True)
        self.device_label.setToolTip("The device the chosen engine will really run the model on (its backends "
                                     "and devices, asked before Start; the Machine tab shows them all)")

    def _make_basic(self) -> QFormLayout:
        """The basic rows: the model, the tasks, the preset and what it will take."""
        self.model_label = ElidedLabel("")
        self.model_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.model_note = QLabel("")  # why Start is disabled, or what of the sweep cannot run
        self.model_note.setWordWrap(True)
        self.model_note.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        self.model_note.setVisible(False)
        self.task_row = QHBoxLayout()
        self.task_row.addStretch(1)  # the boxes go before it
        self.task_boxes: dict[str, QCheckBox] = {}
        self.update_task_boxes()
        self.preset_box = QComboBox()
        self.preset_box.addItems([*PRESETS, CUSTOM])
        self.preset_box.setToolTip("How long to measure. " + " ".join(f"{n}: {p.tip}." for n, p in PRESETS.items())
                                   + " Custom: your settings under Advanced")
        for i, p in enumerate(PRESETS.values()):
            self.preset_box.setItemData(i, p.tip, Qt.ItemDataRole.ToolTipRole)
        self.preset_box.setCurrentText(DEFAULT_PRESET)
        self.plan_label = QLabel("")  # the run count and time estimate, before Start
        self.plan_label.setWordWrap(True)
        self.plan_label.setToolTip("From the plan: runs x tokens per run over a decode speed of this model "
                                   "(the cost probe's, else the last sweep's baseline); speculative runs are "
                                   "usually faster, loading and warmups add a little")
        basic = QFormLayout()
        basic.addRow("Model", self.model_label)
        basic.addRow("Tasks", self.task_row)
        length = QHBoxLayout()
        length.addWidget(self.preset_box)
        length.addWidget(self.plan_label, 1)
        basic.addRow("How long", length)
        return basic

    def _make_advanced(self) -> None:
        """The Advanced toggle and its groups (hidden until opened)."""
        self.advanced_btn = toggle_button()
        kind = QHBoxLayout()
        kind.addWidget(self.mode_box)
        kind.addWidget(self.budget_box, 1)  # the probe's box on a row of its own: the groups fit 1240 px
        self.advanced_area, self.advanced_groups = scroll_area((
            ("Modes and drafter", [("Speculative modes", self.modes.button), ("Drafter", self.modes.drafter_row),
                                   ("Sweep kind", kind), ("", self.reprobe_box)]),
            ("Draft widths", [("Tokens drafted per step (K)", self.k_edit),
                              ("Stop drafting below (p_min)", self.pmin_edit)]),
            ("Runs", [("Tokens per run", self.npredict), ("Repetitions", self.reps),
                      ("Prompts per task", self.per_task), ("Task mix", self.mix_edit),
                      ("Least gain", self.min_gain)]),
            ("Sampler and thinking", [*self.sampler.rows(), self.context.rows()[0]]),
            ("Context", [("Context size", self.ctx_size), self.context.rows()[1]]),
            ("Engine and threads", [("Engine", self.engine_box), ("CPU threads", self.threads),
                                    ("GPU layers", self.gpu_layers), ("Flag axes", self.axes),
                                    ("Draft placement", self.placements)]),  # where drafting runs
        ))

    def _connect(self, state: AppState, engines: Engines) -> None:
        """Each setting to what follows from it: the estimate, the preset it matches, the state's
        engine settings, the engine for the modes; the state's and the engine check's news."""
        self.mix_edit.editingFinished.connect(self._mix_changed)
        for w in (self.ctx_size, self.threads):
            w.valueChanged.connect(lambda *_: self._engine_options_changed())
        self.gpu_layers.currentTextChanged.connect(lambda *_: self._engine_options_changed())
        self.preset_box.activated.connect(lambda _i: self.apply_preset(self.preset_box.currentText()))
        for e in (self.k_edit, self.pmin_edit, self.mix_edit, self.context.depth_edit, self.sampler.axis):
            e.textChanged.connect(lambda *_: self._form_changed())
        for s in (self.npredict, self.reps, self.per_task):
            s.valueChanged.connect(lambda *_: self._form_changed())
        for b in (self.mode_box, self.budget_box, self.context.thinking_box, self.placements):
            b.currentTextChanged.connect(lambda *_: self._form_changed())
        self.advanced_btn.toggled.connect(self.show_advanced)
        self.engine_box.activated.connect(self._engine_activated)
        self.engine_box.currentIndexChanged.connect(lambda *_: self.show_device())
        self.engine_box.currentIndexChanged.connect(lambda *_: setattr(self.state, "sweep_engine", self.engine_kind()))
        self.modes.changed.connect(self._modes_changed)
        self.mode_box.currentTextChanged.connect(lambda text: self.modes.set_adaptive(text == "adaptive"))
        self.mode_box.currentTextChanged.connect(lambda text: self.budget_box.setEnabled(text == "adaptive"))
        self.mode_box.currentTextChanged.connect(lambda text: self.reprobe_box.setEnabled(text == "adaptive"))
        self.mode_box.currentTextChanged.connect(lambda text: self.min_gain.setEnabled(text == "adaptive"))
        state.prompts_changed.connect(self.update_task_boxes)
        state.demo_chosen.connect(self.use_demo_settings)
        state.model_changed.connect(self.check_model)
        state.probe_changed.connect(lambda *_: self._form_changed())
        state.records_changed.connect(self._form_changed)
        engines.choice_changed.connect(self.use_engine_choice)
    def show_advanced(self, on: bool) -> None:
        """Open or close the Advanced groups."""
        if self.advanced_btn.isChecked() != on:
            self.advanced_btn.setChecked(on)
            return
        self.advanced_area.setVisible(on)
        self.advanced_btn.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)

    # -- presets --------------------------------------------------------------------------
    def apply_preset(self, name: str) -> None:
        """Quick, Normal or Thorough: their widths, tokens, repetitions, prompts per task and
        adaptive budget in the form; Custom opens Advanced."""
        p = PRESETS.get(name)
        if p is None:
            self.show_advanced(True)
            return
        self.k_edit.setText(p.ks)
        self.npredict.setValue(p.tokens)
        self.reps.setValue(p.reps)
        self.per_task.setValue(p.per_task)
        self.budget_box.setCurrentText(p.budget)
        self.preset_box.setCurrentText(name)

    def _sync_preset(self) -> None:
        name = preset_of(self.k_edit.text(), self.npredict.value(), self.reps.value(), self.per_task.value())
        if self.preset_box.currentText() != name:
            self.preset_box.setCurrentText(name)

    def update_task_boxes(self) -> None:
        checked = {t: cb.isChecked() for t, cb in self.task_boxes.items()}
        for cb in self.task_boxes.values():
            self.task_row.removeWidget(cb)
            cb.deleteLater()
        self.task_boxes = {}
        for t in self.state.prompt_tasks():
            cb = QCheckBox(t)
            cb.setChecked(checked.get(t, t in DEFAULT_TASKS or t not in BUILTIN_TASKS))  # edit: when asked
            cb.setToolTip(TIPS["tasks"])
            cb.toggled.connect(lambda *_: self._form_changed())
            self.task_row.insertWidget(len(self.task_boxes), cb)
            self.task_boxes[t] = cb

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
        """The demo sweep, as `mtp-tuner bench --demo` runs it: the Quick preset (K=1..3, 64 tokens,
        3 repetitions, one prompt per task: the demo model carries one), every demo task."""
        from app.core.calibrated.demo import DEMO_KS, DEMO_REPS, DEMO_TASK_P, DEMO_TOKENS  # numpy: demo only

        self.apply_preset("Quick")
        self.k_edit.setText(DEMO_KS)  # the same as Quick's (a test holds them equal)
        self.npredict.setValue(DEMO_TOKENS)
        self.reps.setValue(DEMO_REPS)
        self.per_task.setValue(1)
        for task, cb in self.task_boxes.items():
            cb.setChecked(task in DEMO_TASK_P)

    def show_plan(self, plan: Plan) -> None:
        """A plan's settings in the form (to be seen; the plan itself runs as it is)."""
        self.mode_box.setCurrentText("exhaustive")
        self.modes.show_arms(plan.arms)
        self.engine_box.setCurrentIndex(0 if plan.engine == EngineKind.INPROCESS else 1)  # after the modes: as it runs
        self._auto_server = False
        drafts = [a for a in plan.arms if a.k]
        self.k_edit.setText(",".join(str(k) for k in sorted({a.k for a in drafts if a.k})) or "1")
        self.pmin_edit.setText(",".join(f"{p:g}" for p in sorted({a.p_min for a in drafts})) or "0")
        self.npredict.setValue(plan.n_predict)
        self.reps.setValue(plan.reps)
        tasks = Counter(p.task for p in plan.prompts)
        for t, cb in self.task_boxes.items():
            cb.setChecked(t in tasks)
        self.per_task.setValue(max(tasks.values()))
        self.context.show(plan.thinking, plan.depths)
        self.sampler.show(plan.samplers, any(a.probabilistic for a in plan.arms))

    # -- the engine that matches the GPU (chosen by the engine check; shown here) ------------
    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
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

    def use_engine_choice(self, choice: EngineChoice | None) -> None:
        """The engine check's choice: the default engine (unless the user chose one, or a sweep runs)."""
        if choice is not None and not self._engine_picked and not self.sweeps.running:
            self.engine_box.setCurrentIndex(0 if choice.kind == EngineKind.INPROCESS else 1)
            self._auto_server = False
            self._modes_changed()
        self.show_device()

    def _modes_changed(self) -> None:
        """A mode only llama-server runs: the sweep runs there (and says so); back to in-process
        when none is left, if that switch was the modes'."""
        if self.sweeps.running:
            return
        needs = self.modes.server_only()
        if needs and self.engine_kind() == EngineKind.INPROCESS:
            self.engine_box.setCurrentIndex(1)
            self._auto_server = True
        elif not needs and self._auto_server:
            self.engine_box.setCurrentIndex(0)
            self._auto_server = False
        self.modes.show_note(needs)
        self.show_problem()
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
            text += f"\n(the engine for this machine would be {'in-process' if choice.kind == EngineKind.INPROCESS else 'llama-server'}: {choice.reason})"
        elif not choice.on_gpu:
            text += f"\n{choice.reason}"
        self.device_label.setText(text)

    # -- the model about to be swept: can it be, and what cannot run on it ---------------
    def check_model(self, path: str | None = None) -> ModelCheck:
        """Read the chosen model's header again: its name in the form, whether it can be swept and
        the reason beside it."""
        path = self.state.model if path is None else path
        self.model_check = check_model(path)
        name = Path(path).name if path else "none: choose one on the Model tab"
        self.model_label.setText(name + (" (the demo model: synthetic, its drafts are wrong on purpose, per task)"
                                         if self.model_check.demo else ""))
        self.model_label.setToolTip(path or "")
        self.show_problem()
        self._form_changed()
        return self.model_check

    def show_problem(self) -> str:
        """The line beside Start, kept on the form (not only a dialog): why the sweep cannot start,
        or what of it cannot run on this model. Returns why it cannot start ("" when it can): the
        model cannot be swept, or only draft-mtp is chosen on a model without MTP heads."""
        check = self.model_check
        modes = self.modes.modes()
        note = no_mtp_note(check, modes, bool(self.modes.drafters()))
        only_mtp = bool(note) and all(m == MTP for m in modes)
        blocked = check.problem or (note if only_mtp else "")
        text = printable(check.problem or note)
        # the file's name, not its whole path (in the tooltip, and on the Model tab): a long path
        # never widens the window (the label also ignores its own width: a long name is clipped)
        self.model_note.setText(text.replace(check.path, Path(check.path).name) if check.path else text)
        self.model_note.setToolTip(text)
        self.model_note.setStyleSheet(PROBLEM_STYLE if blocked else NOTE_STYLE)
        self.model_note.setVisible(bool(text))
        return blocked

    # -- the plan, its estimate and the request ----------------------------------------------
    def _form_changed(self) -> None:
        """A setting changed: the preset it matches now, and the estimate soon (coalesced)."""
        self._sync_preset()
        self._estimate_timer.start()
        self.changed.emit()

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
            plan = self.plan()
        except UserError as e:
            self.plan_label.setText(printable(str(e)))
            return
        records = [*self.state.records, *self.sweeps.records]
        probe = self.state.probe_record
        try:
            seconds = flow_estimate(self.request(plan), probe, records)  # the core's, as the Start page's
        except UserError:
            seconds = None
        self.plan_label.setText(estimate_text(plan.total_runs, plan.n_predict, seconds,
                                              estimate_source(plan.model, probe, records)))

    def plan(self) -> Plan:
        """The plain sweep the form describes."""
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
        prompts = prompts_for(tasks, check.demo, self.state.user_prompt_file(), per_task=self.per_task.value())
        return Plan(model=model, arms=arms, prompts=tuple(prompts), n_predict=self.npredict.value(),
                    reps=self.reps.value(), warmup=1, thinking=self.context.thinking(), depths=self.context.depths(),
                    samplers=self.sampler.samplers(model),
                    engine=EngineKind.SERVER if self.modes.server_only() or any(a.probabilistic for a in arms)
                    else self.engine_kind())

    def request(self, plan: Plan | None = None) -> SweepRequest:
        """The sweep of the form, or ``plan`` run as it is, as a session request."""
        adaptive = None
        if plan is None:
            plan = self.plan()
            if self.mode_box.currentText() == "adaptive":
                drafts = [a for a in plan.arms if a.k]
                adaptive = AdaptiveOptions(ks=tuple(sorted({a.k for a in drafts if a.k})),
                                           p_mins=tuple(sorted({a.p_min for a in drafts})),
                                           max_reps=max(plan.reps, ADAPTIVE_MAX_REPS), reprobe=self.reprobe_box.isChecked(),
                                           budget_s=BUDGETS.get(self.budget_box.currentText()))  # no preset's reps cap it
        return SweepRequest(plan, settings := self.state.engine_settings(plan.engine), adaptive,
                            mix=(self.state.task_mix or None) if adaptive else None, axes=self.axes.checked(settings),
                            placements=self.placements.chosen(), min_gain=self.min_gain.value() / 100)
