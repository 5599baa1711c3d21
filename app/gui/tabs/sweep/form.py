"""The Sweep tab's form: engine, mode, speculative modes and drafter (modes.py), K, p_min, threads,
context size, tokens, repetitions, tasks, prompts per task, task mix, GPU layers, thinking and depth
(context.py), the sampler (sampler.py); the engine settings it gives the state, the demo's
settings, and a plan's settings shown in it. A part of SweepTab (its base class): the tab builds
the form, plans from it and runs."""

from __future__ import annotations

from collections import Counter

from PySide6.QtWidgets import QCheckBox, QComboBox, QFormLayout, QHBoxLayout, QLineEdit, QSpinBox

from app.core.measure.plan import Plan

from ...services.capabilities import CapabilityReader
from ...state import AppState
from .context import ContextChooser
from .modes import TIPS, ModeChooser
from .sampler import SamplerBox


class SweepForm:
    """The form's widgets and what only they need, on the SweepTab (``self`` is the tab)."""

    state: AppState

    def _build_form(self, state: AppState, capabilities: CapabilityReader) -> QHBoxLayout:
        """The form's widgets, in two columns (the layout returned)."""
        settings = state.settings
        form = QFormLayout()
        self.engine_box = QComboBox()
        self.engine_box.addItems(["in-process", "llama-server"])
        self.engine_box.setToolTip(TIPS["engine"])
        self.mode_box = QComboBox()
        self.mode_box.addItems(["exhaustive", "adaptive"])
        self.mode_box.setToolTip(TIPS["mode"])
        self.modes = ModeChooser(state, capabilities, self)
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
        return top

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
        self.sampler.show(plan.samplers, any(a.probabilistic for a in plan.arms))
