"""The Sweep tab's form, in two levels. Basic: the model about to be swept (its name, and why
Start is disabled or what cannot run), the tasks, the preset (Quick, Normal, Thorough; basic.py)
with the run count and time estimate before Start. Advanced (collapsed): the modes and drafter
(modes.py), the draft widths, the runs, the sampler and thinking (sampler.py, context.py), the
context, the engine and threads, each group with plain labels and the jargon in tooltips. The
engine settings it gives the state, the demo's settings, and a plan's settings shown in it. A part
of SweepTab (its base class): the tab builds the form, plans from it and runs."""

from __future__ import annotations

from collections import Counter

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QFrame, QGridLayout, QGroupBox, QHBoxLayout,
                               QLabel, QLineEdit, QScrollArea, QSizePolicy, QSpinBox, QToolButton, QVBoxLayout, QWidget)

from app.core.engines.base import EngineKind
from app.core.measure.plan import Plan

from ...services.capabilities import CapabilityReader
from ...state import AppState
from .basic import CUSTOM, DEFAULT_PRESET, PRESETS, ElidedLabel, ModelCheck, preset_of
from .context import ContextChooser
from .decisions import budget_box
from .modes import TIPS, ModeChooser
from .sampler import SamplerBox

PROBLEM_STYLE = "color: #b00020"  # Start is disabled: why
NOTE_STYLE = "color: #b26a00"  # something of the sweep cannot run: why, and what can
ADVANCED_MAX_H = 300  # px: the Advanced groups scroll beyond this


class SweepForm:
    """The form's widgets and what only they need, on the SweepTab (``self`` is the tab)."""

    state: AppState

    def _build_form(self, state: AppState, capabilities: CapabilityReader) -> QVBoxLayout:
        """The form's widgets: the basic rows, then the Advanced toggle and its groups (hidden)."""
        settings = state.settings
        self._estimate_timer = QTimer(self, singleShot=True, interval=150)  # the estimate, coalesced
        self._estimate_timer.timeout.connect(self.update_estimate)
        self.engine_box = QComboBox()
        self.engine_box.addItems(["in-process", "llama-server"])
        self.engine_box.setToolTip(TIPS["engine"])
        self.mode_box = QComboBox()
        self.mode_box.addItems(["exhaustive", "adaptive"])
        self.mode_box.setToolTip(TIPS["mode"])
        self.modes = ModeChooser(state, capabilities, self)
        self.context = ContextChooser(self)  # thinking switch and context depth
        self.sampler = SamplerBox(state, self)  # greedy, the model's recommended, custom; a temperature axis
        self.k_edit = QLineEdit(PRESETS[DEFAULT_PRESET].ks)
        self.k_edit.setToolTip(TIPS["k"])
        self.pmin_edit = QLineEdit("0")
        self.pmin_edit.setToolTip(TIPS["p_min"])
        self.npredict = QSpinBox(minimum=8, maximum=8192, value=PRESETS[DEFAULT_PRESET].tokens)
        self.npredict.setToolTip(TIPS["n_predict"])
        self.reps = QSpinBox(minimum=1, maximum=50, value=PRESETS[DEFAULT_PRESET].reps)
        self.reps.setToolTip(TIPS["reps"])
        self.task_row = QHBoxLayout()
        self.task_row.addStretch(1)  # the boxes go before it
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
        self.per_task = QSpinBox(minimum=1, maximum=50, value=PRESETS[DEFAULT_PRESET].per_task)
        self.per_task.setToolTip("Prompts per task type (the first N of each suite)")
        self.mix_edit = QLineEdit(state.task_mix)
        self.mix_edit.setPlaceholderText("equal weights")
        self.mix_edit.setToolTip(TIPS["mix"])
        self.mix_edit.editingFinished.connect(self._mix_changed)
        self.budget_box = budget_box()  # adaptive: Quick (about 2 min) or Thorough (until decided)
        self.budget_box.setEnabled(False)
        self.reprobe_box = QCheckBox("Probe the costs again")
        self.reprobe_box.setToolTip("Adaptive sweep in process: measure what a speculative step costs anew, even "
                                    "when a probe of the same model, build, threads and depth was made on this "
                                    "machine in the last 24 hours (that probe is used otherwise: it takes minutes "
                                    "on a CPU)")
        self.reprobe_box.setEnabled(False)
        for w in (self.ctx_size, self.threads):
            w.valueChanged.connect(lambda *_: self._engine_options_changed())
        self.gpu_layers.currentTextChanged.connect(lambda *_: self._engine_options_changed())
        # -- basic: the model, the tasks, the preset and what it will take --------------------
        self.model_label = ElidedLabel("")
        self.model_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.model_note = QLabel("")  # why Start is disabled, or what of the sweep cannot run
        self.model_note.setWordWrap(True)
        self.model_note.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Minimum)
        self.model_note.setVisible(False)
        self.model_check = ModelCheck("")
        self.preset_box = QComboBox()
        self.preset_box.addItems([*PRESETS, CUSTOM])
        self.preset_box.setToolTip("How long to measure. " + " ".join(f"{n}: {p.tip}." for n, p in PRESETS.items())
                                   + " Custom: your settings under Advanced")
        for i, (name, p) in enumerate(PRESETS.items()):
            self.preset_box.setItemData(i, p.tip, Qt.ToolTipRole)
        self.preset_box.setCurrentText(DEFAULT_PRESET)
        self.preset_box.activated.connect(lambda _i: self.apply_preset(self.preset_box.currentText()))
        self.plan_label = QLabel("")  # the run count and time estimate, before Start
        self.plan_label.setWordWrap(True)
        self.plan_label.setToolTip("From the plan: runs x tokens per run over a decode speed of this model "
                                   "(the cost probe's, else the last sweep's baseline); speculative runs are "
                                   "usually faster, loading and warmups add a little")
        for w in (self.k_edit, self.pmin_edit, self.mix_edit):
            w.textChanged.connect(lambda *_: self._form_changed())
        for w in (self.npredict, self.reps, self.per_task):
            w.valueChanged.connect(lambda *_: self._form_changed())
        self.mode_box.currentTextChanged.connect(lambda *_: self._form_changed())
        self.budget_box.currentTextChanged.connect(lambda *_: self._form_changed())
        self.context.depth_edit.textChanged.connect(lambda *_: self._form_changed())
        self.context.thinking_box.currentTextChanged.connect(lambda *_: self._form_changed())
        self.sampler.axis.textChanged.connect(lambda *_: self._form_changed())
        basic = QFormLayout()
        basic.addRow("Model", self.model_label)
        basic.addRow("Tasks", self.task_row)
        length = QHBoxLayout()
        length.addWidget(self.preset_box)
        length.addWidget(self.plan_label, 1)
        basic.addRow("How long", length)
        # -- advanced: today's controls, grouped --------------------------------------------
        self.advanced_btn = QToolButton()
        self.advanced_btn.setText("Advanced settings")
        self.advanced_btn.setCheckable(True)
        self.advanced_btn.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.advanced_btn.setArrowType(Qt.RightArrow)
        self.advanced_btn.setToolTip("Modes and drafter, draft widths, runs, sampler and thinking, context, engine "
                                     "and threads")
        self.advanced_btn.toggled.connect(self.show_advanced)
        self.advanced = QWidget()
        grid = QGridLayout(self.advanced)  # three columns of two groups
        grid.setContentsMargins(0, 0, 0, 0)
        kind = QHBoxLayout()
        kind.addWidget(self.mode_box)
        kind.addWidget(self.budget_box, 1)
        kind.addWidget(self.reprobe_box)
        groups = (
            ("Modes and drafter", [("Speculative modes", self.modes.button), ("Drafter", self.modes.drafter_row),
                                   ("Sweep kind", kind)]),
            ("Draft widths", [("Tokens drafted per step (K)", self.k_edit),
                              ("Stop drafting below (p_min)", self.pmin_edit)]),
            ("Runs", [("Tokens per run", self.npredict), ("Repetitions", self.reps),
                      ("Prompts per task", self.per_task), ("Task mix", self.mix_edit)]),
            ("Sampler and thinking", [*self.sampler.rows(), self.context.rows()[0]]),
            ("Context", [("Context size", self.ctx_size), self.context.rows()[1]]),
            ("Engine and threads", [("Engine", self.engine_box), ("CPU threads", self.threads),
                                    ("GPU layers", self.gpu_layers)]),
        )
        self.advanced_groups: dict[str, QGroupBox] = {}
        columns = [QVBoxLayout() for _ in range(3)]
        column_of = {"Modes and drafter": 0, "Draft widths": 0, "Runs": 1, "Engine and threads": 1,
                     "Sampler and thinking": 2, "Context": 2}  # two groups a column, of like heights
        for title, rows in groups:
            box = QGroupBox(title)
            form = QFormLayout(box)
            for label, w in rows:
                form.addRow(label, w)
            self.advanced_groups[title] = box
            columns[column_of[title]].addWidget(box)
        for i, col in enumerate(columns):
            col.addStretch(1)
            grid.addLayout(col, 0, i)
        # in a scroll area of bounded height: opened, it never makes the window wider or taller
        # than the screen (1280x720), and the plots keep their room
        self.advanced_area = QScrollArea()
        self.advanced_area.setWidget(self.advanced)
        self.advanced_area.setWidgetResizable(True)
        self.advanced_area.setFrameShape(QFrame.NoFrame)
        self.advanced_area.setMaximumHeight(ADVANCED_MAX_H)
        self.advanced_area.setVisible(False)
        top = QVBoxLayout()
        top.addLayout(basic)
        top.addWidget(self.model_note)
        self._basic_rows = basic
        return top

    def show_advanced(self, on: bool) -> None:
        """Open or close the Advanced groups."""
        if self.advanced_btn.isChecked() != on:
            self.advanced_btn.setChecked(on)
            return
        self.advanced_area.setVisible(on)
        self.advanced_btn.setArrowType(Qt.DownArrow if on else Qt.RightArrow)

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
            cb = QCheckBox(t, checked=checked.get(t, True))
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
        self.k_edit.setText(",".join(str(k) for k in sorted({a.k for a in drafts})) or "1")
        self.pmin_edit.setText(",".join(f"{p:g}" for p in sorted({a.p_min for a in drafts})) or "0")
        self.npredict.setValue(plan.n_predict)
        self.reps.setValue(plan.reps)
        tasks = Counter(p.task for p in plan.prompts)
        for t, cb in self.task_boxes.items():
            cb.setChecked(t in tasks)
        self.per_task.setValue(max(tasks.values()))
        self.context.show(plan.thinking, plan.depths)
        self.sampler.show(plan.samplers, any(a.probabilistic for a in plan.arms))
