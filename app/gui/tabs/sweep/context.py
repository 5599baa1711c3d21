"""The Sweep tab's thinking and context-depth settings: the chat template's
thinking switch (the template's default, on, off, or both as an axis) and the depths (tokens of
neutral context before each prompt) the sweep measures at."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QLineEdit, QWidget

from app.core.common.errors import UserError
from app.core.measure.depth import ctx_for, parse_depths

# label -> the thinking settings a sweep measures (None: the template's own default)
THINKING_CHOICES: dict[str, tuple[bool | None, ...]] = {
    "template default": (None,),
    "on": (True,),
    "off": (False,),
    "on and off": (True, False),
}

TIPS = {
    "thinking": "The chat template's thinking switch (enable_thinking), for models whose template has one "
                "(Qwen3, Qwen3.5/3.6 ...): on, the model reasons first and that text is measured too; off, "
                "it answers directly. 'on and off' measures both, with a verdict for each. The export "
                "keeps your choice (--reasoning off, or what your llama-server lists)",
    "depth": "Context depth: tokens of neutral text put before each prompt, as in a long chat or a coding "
             "tool's context, e.g. 0,4096,16k (one verdict per depth). Verify cost and acceptance both "
             "change with depth; the context size grows to fit",
}


class ContextChooser:
    """The two fields; the tab puts them in its form."""

    def __init__(self, parent: QWidget | None = None):
        self.thinking_box = QComboBox(parent)
        self.thinking_box.addItems(list(THINKING_CHOICES))
        self.thinking_box.setToolTip(TIPS["thinking"])
        self.depth_edit = QLineEdit("0", parent)
        self.depth_edit.setPlaceholderText("0 (no added context)")
        self.depth_edit.setToolTip(TIPS["depth"])

    def rows(self) -> list[tuple[str, QWidget]]:
        """(label, field) for the tab's form."""
        return [("Thinking", self.thinking_box), ("Context depth", self.depth_edit)]

    def thinking(self) -> tuple[bool | None, ...]:
        return THINKING_CHOICES[self.thinking_box.currentText()]

    def depths(self) -> tuple[int, ...]:
        """The depths in the field; a UserError naming the field when it does not read."""
        return parse_depths(self.depth_edit.text() or "0", "Context depth")

    def show(self, thinking: tuple[bool | None, ...], depths: tuple[int, ...]) -> None:
        """A plan's settings in the fields (Run again)."""
        label = next((k for k, v in THINKING_CHOICES.items() if set(v) == set(thinking)), "template default")
        self.thinking_box.setCurrentText(label)
        self.depth_edit.setText(",".join(str(d) for d in depths) or "0")

    def ctx_needed(self, ctx_size: int, n_predict: int) -> int:
        """``ctx_size`` grown to fit the deepest depth in the field (see depth.ctx_for)."""
        try:
            return ctx_for(ctx_size, self.depths(), n_predict)
        except UserError:
            return ctx_size

