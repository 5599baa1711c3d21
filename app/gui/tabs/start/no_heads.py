"""The Start page's "what it measures" for a model without MTP heads: the core's choice
(app.core.session.tune_arms, the one `mtp-tuner tune` prints): the n-gram modes, the drafter it
picked (the Model tab's checked drafter, else one found in the models folder, the model's own folder
and the library) and why, and their combination. Worked out on a worker when the model changes;
shown before the run and kept after it beside the answer."""

from __future__ import annotations

import html
from typing import Callable, Iterator

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QWidget

from app.core.common.cancel import CancelToken
from app.core.common.text import printable
from app.core.session.tune_arms import TuneArms, tune_arms

from ...adapter import CoreJob
from ...jobs import Jobs


class NoHeadsPlan(QLabel):
    """One label: what Tune for me measures on a model without MTP heads, and which drafter."""

    ready = Signal()  # the choice for the current model is known (or failed)

    def __init__(self, jobs: Jobs, dirs: Callable[[], list[str]], quick: Callable[[], bool],
                 parent: QWidget | None = None):
        super().__init__("", parent)
        self.jobs = jobs
        self._dirs = dirs
        self._quick = quick  # Quick chosen: it measures fewer settings (tune_arms)
        self.arms: TuneArms | None = None  # the core's choice for ``model``
        self.model = ""
        self.problem: str | None = None  # why the choice failed (a drafter that cannot pair), in words
        self.job: CoreJob | None = None
        self.setWordWrap(True)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setVisible(False)

    @property
    def looking(self) -> bool:
        return self.job is not None

    def show_for(self, model: str, has_mtp: bool | None, drafter: str) -> None:
        """Work out what is measured on ``model`` (no MTP heads: ``has_mtp`` False) with the
        window's checked ``drafter`` ("" for none); hidden for any other model."""
        if self.job is not None:
            self.job.cancel()
            self.job = None
        self.arms, self.problem, self.model = None, None, model
        if not model or has_mtp is not False:
            self.setVisible(False)
            self.setText("")
            return
        self.setVisible(True)
        self.setText("Looking for a drafter that pairs with this model (models folder, its own folder, the "
                     "library)…")
        dirs = self._dirs()

        def factory(cancel: CancelToken) -> Iterator[TuneArms]:
            yield tune_arms(model, drafter or None, dirs, cancel=cancel)

        def found(arms: TuneArms) -> None:
            if job is self.job:
                self.arms = arms
                self.refresh()

        def failed(message: str) -> None:
            if job is self.job:
                self.problem = message
                self.setText(f'<span style="color:#c62828">{html.escape(printable(message))}</span>')

        def done() -> None:
            if job is self.job:
                self.job = None
                self.ready.emit()

        job = self.job = self.jobs.run(factory, self, event=found, failed=failed, finished=done)

    def refresh(self) -> None:
        """The core's choice in words for the length chosen (Quick measures fewer settings), less
        the "no MTP heads" the model's line above says; nothing until the choice is known."""
        arms = self.arms
        if arms is None:
            return
        quick = self._quick()
        what = html.escape(arms.settings(quick))
        if quick and arms.settings(True) != arms.settings():
            what += f" <i>(Quick; Thorough measures {html.escape(arms.settings())})</i>"
        pick = arms.pick
        why = html.escape(printable(pick.sentence(), one_line=True)) if pick is not None else ""
        head = "The drafter" if pick is not None and pick.path else "No drafter"
        self.setText("<b>What Tune for me measures here:</b> " + what + (f"<br><b>{head}:</b> {why}" if why else ""))
