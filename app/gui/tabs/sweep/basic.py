"""The Sweep tab's basic level: the presets (Quick, Normal, Thorough), the line that says why the
chosen model cannot run MTP and what still works (the check itself: app/gui/model_check.py), the
run count and time estimate shown before Start, and a label that elides a long name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QWidget

from app.core.common.spec_modes import MTP

from ...model_check import ModelCheck
from ...words import advanced_field

QUICK_BUDGET, UNTIL_DECIDED = "Quick (about 2 min)", "Thorough (until decided)"  # decisions.BUDGETS' keys


@dataclasses.dataclass(frozen=True)
class Preset:
    """What a preset sets: the draft widths, tokens per run, repetitions, prompts per task, and the
    budget an adaptive sweep gets (Advanced > Sweep kind)."""

    ks: str
    tokens: int
    reps: int
    per_task: int
    budget: str
    tip: str


# Quick is the demo's sweep (K 1-3, 64 tokens, 3 repetitions, one prompt per task: about a minute
# on the demo model, about 2 minutes at 20 tok/s). Normal: 128 tokens, two prompts per task, 72
# runs on the three built-in tasks. Thorough: K up to 4, 256 tokens, 5 repetitions.
PRESETS: dict[str, Preset] = {
    "Quick": Preset("1,2,3", 64, 3, 1, QUICK_BUDGET,
                    "K 1-3, 64 tokens per run, 3 repetitions, one prompt per task: a first answer in minutes "
                    "(short runs: the speedup of long answers may be a little higher)"),
    "Normal": Preset("1,2,3", 128, 3, 2, UNTIL_DECIDED,
                     "K 1-3, 128 tokens per run, 3 repetitions, two prompts per task: a verdict to act on"),
    "Thorough": Preset("1,2,3,4", 256, 5, 2, UNTIL_DECIDED,
                       "K 1-4, 256 tokens per run, 5 repetitions, two prompts per task: narrow intervals, "
                       "long runs (tens of minutes on a large model)"),
}
CUSTOM = "Custom"
NO_HEADS = "the model has no MTP heads"  # how gguf_info.GGUFHeader.mtp_problem says it
DEFAULT_PRESET = "Normal"


def preset_of(ks: str, tokens: int, reps: int, per_task: int) -> str:
    """The preset these settings are, else CUSTOM."""
    norm = ",".join(p.strip() for p in ks.split(",") if p.strip())
    return next((name for name, p in PRESETS.items()
                 if (p.ks, p.tokens, p.reps, p.per_task) == (norm, tokens, reps, per_task)), CUSTOM)


def no_mtp_note(check: ModelCheck, modes: list[str], drafter: bool) -> str:
    """The line that stays on the Sweep tab for a model without MTP heads: why, what runs anyway,
    where an MTP build is. Empty when the model has heads, or a drafter does the drafting."""
    if not check.no_mtp or drafter:
        return ""
    name = Path(check.path).name
    ngram = [m for m in modes if m.startswith("ngram")]
    mtp_left = MTP in modes
    why = check.no_mtp
    if why.startswith(NO_HEADS + " (") and why.endswith(")"):  # "the model has no MTP heads (x.nextn... is 0)"
        head = f"{name} has no MTP heads ({why[len(NO_HEADS) + 2:-1]})"
    else:
        head = f"{name} cannot draft with MTP heads: {why}"
    head += (", so its draft-mtp arms are skipped" if mtp_left and ngram
             else ", so draft-mtp cannot run on it" if mtp_left else "")
    where = (f"the catalog's MTP build {check.mtp_build}" if check.mtp_build
             else "a build of this model with MTP heads (the catalog's -MTP- repos)")
    ngram_line = ("the n-gram modes you chose run on any GGUF" if ngram else
                  "the n-gram modes (ngram-simple, ngram-mod...) work on any GGUF: tick them in "
                  + advanced_field("Modes and drafter", "Speculative modes"))
    return f"{head}. {ngram_line[0].upper() + ngram_line[1:]}; or get {where} on the Model tab (Find and download)."


# -- the estimate before Start ----------------------------------------------------------------

def estimate_text(runs: int, tokens: int, seconds: float | None, how: str | None) -> str:
    """"36 runs of 64 tokens: about 2 min here (at 20 tok/s, the cost probe's speed, ...)": the
    core's estimate before the start (app.core.session.clock.flow_estimate), with what it is from."""
    from app.core.analysis.decide import about

    head = f"{runs} runs of {tokens} tokens"
    if seconds is None or how is None:
        return f"{head}: time unknown until the first runs"
    return f"{head}: {about(seconds)} here ({how})"


class ElidedLabel(QLabel):
    """A label that shows a long text elided in the middle to its width (the full text in its
    tooltip), so a long model path never widens the window."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setMinimumWidth(80)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self._full = text
        self.setToolTip(text)
        self._elide()

    def full_text(self) -> str:
        return self._full

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        super().setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideMiddle, max(40, self.width())))

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        hint = super().minimumSizeHint()
        hint.setWidth(80)
        return hint

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        hint = super().sizeHint()
        hint.setWidth(min(hint.width(), 400))
        return hint
