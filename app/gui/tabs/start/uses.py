"""The Start page's second choice, what the model is used for: one box per task type the chosen
model can be measured on (code, chat or stories, tongue-twisters; the demo's own tasks; the task
types of the user's prompts), each with its weight. The declared use is kept in the settings as
``declared_use`` (a task name, or "mix" when several are ticked) and ``declared_weights`` (the
weights as "code=2,story=1"), the Export tab's default; it is read back when the page is made."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QGroupBox, QHBoxLayout, QSpinBox, QWidget

from app.core.measure.prompts import BUILTIN_TASKS

from ...state import AppState

USE_LABELS = {"code": "Code", "story": "Chat or stories", "tongue-twister": "Tongue-twisters",
              "edit": "Editing given text"}
DEFAULT_USE = ("code", "story")  # ticked when nothing was declared yet


class UseChooser(QGroupBox):
    changed = Signal()

    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__("2. What you use it for (tick several to weigh them)", parent)
        self.state = state
        self.lay = QHBoxLayout(self)
        self.row: QWidget | None = None  # the boxes, made again when the tasks change
        self.use_boxes: dict[str, tuple[QCheckBox, QSpinBox]] = {}
        self.set_tasks(False)

    def set_tasks(self, demo: bool) -> None:
        """One box per task the chosen model can be measured on: the built-in ones (the demo's own),
        then the user's prompts' (Prompts tab). What was ticked stays ticked."""
        from app.core.calibrated.demo import DEMO_TASK_P  # the demo's tasks

        old = {t: (cb.isChecked(), sp.value()) for t, (cb, sp) in self.use_boxes.items()}
        if not old:  # the declared use, as last saved
            old = {t: (True, int(w)) for t, w in self.declared_weights().items()}
        if self.row is not None:
            self.lay.removeWidget(self.row)
            self.row.deleteLater()
        self.row = QWidget()
        row = QHBoxLayout(self.row)
        row.setContentsMargins(0, 0, 0, 0)
        self.lay.addWidget(self.row)
        self.use_boxes = {}
        own = list(DEMO_TASK_P) if demo else list(BUILTIN_TASKS)
        tasks = [t for t in USE_LABELS if t in own] + [t for t in own if t not in USE_LABELS]
        tasks += [t for t in self.state.prompt_tasks() if t not in tasks]
        declared = any(on for on, _w in old.values())
        for t in tasks:
            on, w = old.get(t, (False, 1))
            cb = QCheckBox(USE_LABELS.get(t, f"My prompts: {t}"))
            cb.setChecked(on or (not declared and t in DEFAULT_USE))
            sp = QSpinBox(minimum=1, maximum=10, value=max(1, min(10, w)))
            sp.setPrefix("weight ")  # labelled where it is: a bare number beside a box says nothing
            sp.setToolTip("Its weight in your mix (e.g. code 3, stories 1: code counts three times as much)")
            sp.setEnabled(cb.isChecked())
            cb.toggled.connect(sp.setEnabled)
            cb.toggled.connect(lambda _on: self._declared_changed())
            sp.valueChanged.connect(lambda _v: self._declared_changed())
            self.use_boxes[t] = (cb, sp)
            row.addWidget(cb)
            row.addWidget(sp)
            row.addSpacing(16)
        row.addStretch(1)
        self._declared_changed()

    def weights(self) -> dict[str, int]:
        return {t: sp.value() for t, (cb, sp) in self.use_boxes.items() if cb.isChecked()}

    def mix_text(self) -> str:
        return ",".join(f"{t}={w}" for t, w in self.weights().items())

    def declared_weights(self) -> dict[str, float]:
        out = {}
        for part in str(self.state.settings.value("declared_weights", "") or "").split(","):
            t, _, w = part.partition("=")
            try:
                out[t.strip()] = float(w)
            except ValueError:
                continue
        return {t: w for t, w in out.items() if t and w > 0}

    def _declared_changed(self) -> None:
        """The declared use, kept for Export's default: one task, or "mix" with the weights."""
        w = self.weights()
        if w:
            s = self.state.settings
            s.setValue("declared_use", next(iter(w)) if len(w) == 1 else "mix")
            s.setValue("declared_weights", self.mix_text())
        self.changed.emit()
