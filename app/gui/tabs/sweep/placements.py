"""The Sweep form's "Draft placement" box (Advanced, Engine and threads): where drafting runs over
RPC workers (where the layers and the draft run), each placement a setting of the sweep measured whole with its
own baseline, as ``bench --placements`` (app.core.measure.placements; the request's
``placements``). Its choices: llama.cpp's own split only (no placements: the sweep as before),
every placement that applies (``auto``), or one placement beside the own split (the reference).
Without workers (the Machine tab's, or a pasted command's --rpc) it is disabled and says why."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QWidget

from app.core.measure.placements import AUTO, DEFAULT, LABELS, NAMES

from ...state import AppState

OWN_SPLIT = "llama.cpp's own split only"
# each choice: its words, and the placements it asks for (--placements' value, parsed)
CHOICES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (OWN_SPLIT, ()),
    ("try every placement (auto)", (AUTO,)),
    *((f"{name}: {LABELS[name]}, and the own split", (DEFAULT, name)) for name in NAMES if name != DEFAULT),
)
TIP = ("Where drafting runs over RPC workers (where the layers and the draft run): each placement is a setting "
       "of the sweep, measured whole with its own baseline (moving layers changes plain decoding too). " + "; ".join(
           f"{name}: {LABELS[name]}" for name in NAMES) + ". auto: each that applies to this model and drafter. "
       "The verdict names the placement that pays over this link, and the exported command carries it "
       "(bench --placements)")
NO_WORKERS_TIP = ("Where drafting runs is measured over RPC workers only: add workers on the Machine tab (or paste "
                  "a llama-server command with --rpc) to choose")


class PlacementBox(QComboBox):
    """The choice of placements; enabled while the sweep has RPC workers."""

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        for text, _ in CHOICES:
            self.addItem(text)
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(8)  # its long choices do not widen the Advanced columns (its list shows them)
        state.rpc_workers_changed.connect(self.show_workers)
        state.own_command.changed.connect(self.show_workers)
        self.show_workers()

    def has_workers(self) -> bool:
        """Workers the sweep splits the model over: the Machine tab's, else a pasted command's --rpc."""
        command = self.state.own_command.command
        return bool(self.state.rpc_workers or (command.rpc if command is not None else None))

    def show_workers(self) -> None:
        on = self.has_workers()
        self.setEnabled(on)
        self.setToolTip(TIP if on else NO_WORKERS_TIP)

    def chosen(self) -> tuple[str, ...]:
        """The placements for the request (``SweepRequest.placements``): () without workers or for
        the own split only."""
        return CHOICES[self.currentIndex()][1] if self.has_workers() else ()
