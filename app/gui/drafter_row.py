"""The Model tab's Drafter row: the separate drafter GGUF (-md) for the chosen model. It suggests
the catalog's pair and the GGUFs on this machine whose vocabulary matches, checks the pair
(app.core.machine.drafter: kind, vocabulary, width) off the GUI thread, and shows the check's
problem in the row, one line, never a dialog."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Callable, Iterator, Sequence

from PySide6.QtCore import QSettings, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from app.core.common.cancel import CancelToken
from app.core.common.paths import cache_dir
from app.core.common.text import printable
from app.core.machine import hub
from app.core.machine.drafter import DrafterInfo, check_pair, inspect_drafter
from app.core.machine.drafter_search import find_drafter
from app.core.machine.modelinfo import ModelInfo

from .adapter import CoreJob
from .jobs import Jobs
from .state import AppState

NO_SUGGESTION = "suggested drafters"


def library_dirs(settings: QSettings) -> list[Path]:
    """The folders the user added to the library (the Model tab's "Add folder"), saved in ``settings``."""
    dirs = settings.value("library_dirs", []) or []  # a one-item list comes back as its item
    return [Path(d) for d in ([dirs] if isinstance(dirs, str) else dirs if isinstance(dirs, list) else [])]


def drafter_dirs(settings: QSettings) -> list[str]:
    """Where the window looks for drafters beyond the models folder and the model's own folder: the
    library's folders (the user's, and the app's own cache of made models)."""
    return [str(d) for d in library_dirs(settings) + [cache_dir() / "models"]]


class DrafterRow(QWidget):
    checked = Signal(object)  # the DrafterInfo that passed the check for the current model, or None

    def __init__(self, state: AppState, jobs: Jobs, library: Callable[[], list[str]], parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self._library = library
        self.info: DrafterInfo | None = None  # the drafter that passed, for the current model
        self.check_job: CoreJob | None = None
        self.find_job: CoreJob | None = None
        self._gen = 0  # the latest choice: an older check's answer is dropped
        self._setting = False
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("none: the model's own MTP heads (or a drafter GGUF: a Gemma 4 assistant, "
                                     "an mtp- head, a small model with the same vocabulary)")
        self.edit.setToolTip("A separate drafter GGUF (llama-server -md FILE), checked against the model: "
                             "its kind, vocabulary and width")
        self.edit.editingFinished.connect(lambda: self.choose(self.edit.text()))
        self.suggestions = QComboBox()
        self.suggestions.setToolTip("The catalog's pair for this model and the GGUFs on this machine whose "
                                    "vocabulary matches; pick one to use it")
        self.suggestions.activated.connect(self._suggestion_picked)
        self.find_btn = QPushButton("Find")
        self.find_btn.setToolTip("Look through the GGUFs on this machine (the library) for drafters of this model")
        self.find_btn.clicked.connect(self.find_drafters)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self.browse)
        clear = QPushButton("Clear")
        clear.setToolTip("No separate drafter: draft-mtp uses the model's own MTP heads")
        clear.clicked.connect(self.clear)
        row.addWidget(QLabel("Drafter"))
        row.addWidget(self.edit, 1)
        for w in (self.suggestions, self.find_btn, browse, clear):
            row.addWidget(w)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        outer.addLayout(row)
        outer.addWidget(self.message)
        self._set_suggestions([], "")
        state.model_changed.connect(self._model_changed)
        state.model_info_changed.connect(self._model_info_changed)
        state.drafter_changed.connect(self._state_drafter)

    # -- suggestions ----------------------------------------------------------------------
    def _candidates(self) -> list[str]:
        """The library's GGUFs (the Model tab's list) other than the model: the search adds the
        models folder and the model's own folder (app.core.machine.drafter_search)."""
        target = self.state.model
        return [p for p in self._library() if target and Path(p) != Path(target)]

    def _set_suggestions(self, paths: Sequence[str | Path], note: str) -> None:
        self.suggestions.clear()
        self.suggestions.addItem(note or NO_SUGGESTION, None)
        entry = hub.catalog_pair(self.state.model) if self.state.model else None
        ref = entry.drafter if entry is not None else None  # catalog_pair's entries all have one
        pair = [p for p in paths if ref and fnmatch.fnmatch(Path(p).name, ref.file)]
        for p in pair + [p for p in paths if p not in pair]:
            self.suggestions.addItem(printable(("catalog pair: " if p in pair else "") + Path(p).name, one_line=True), str(p))
        if ref and not pair:
            self.suggestions.addItem(f"catalog pair: {ref.repo} {ref.file} (not on this "
                                     "machine: Find and download)", None)

    def find_drafters(self) -> None:
        """The library's GGUFs that pass the pair check with the model, on a worker."""
        target = self.state.model
        if self.find_job is not None:
            self.find_job.cancel()
        if not target:
            self._set_suggestions([], "")
            return
        candidates = self._candidates()
        dirs = drafter_dirs(self.state.settings)
        self._set_suggestions([], "looking for drafters…")

        def factory(cancel: CancelToken) -> Iterator[tuple[str, ...]]:
            # the library, the models folder and the model's own folder, ranked by the core's rule
            yield find_drafter(target, dirs, candidates, cancel).found

        def found(paths: tuple[str, ...]) -> None:
            if job is self.find_job and target == self.state.model:
                self._set_suggestions(paths, f"{len(paths)} drafter(s) found" if paths else
                                      "no matching drafter found (models folder, the model's folder, the library)")

        def done() -> None:
            if job is self.find_job:
                self.find_job = None

        job = self.find_job = self.jobs.run(factory, self, event=found, failed=lambda m: self._set_suggestions([], m),
                                            finished=done)

    def _suggestion_picked(self, index: int) -> None:
        path = self.suggestions.itemData(index)
        if path:
            self.choose(path)

    def _model_changed(self, _path: str) -> None:
        self.info = None  # checked against the model before: not yet against this one

    def _model_info_changed(self, info: ModelInfo | None) -> None:
        """A new model: re-check the chosen drafter against it, and look for drafters by itself
        when the model has no MTP heads of its own (a Gemma 4 target drafts only with a drafter)."""
        self.info = None
        self._set_suggestions([], "")
        if info is not None and not info.has_mtp:
            self.find_drafters()
        if self.edit.text().strip():
            self.choose(self.edit.text())
        else:
            self.checked.emit(None)

    # -- the choice -----------------------------------------------------------------------
    def browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Drafter GGUF", "", "GGUF models (*.gguf)")
        if path:
            self.choose(path)

    def clear(self) -> None:
        self._gen += 1
        self.edit.clear()
        self._result(None, "")

    def choose(self, path: str) -> None:
        """Check ``path`` as the model's drafter (in its own mode) on a worker; the answer lands in
        the row: the drafter's summary, or the one-line problem."""
        path = str(path).strip()
        if self.edit.text() != path:
            self.edit.setText(path)
        if not path:
            self.clear()
            return
        target = self.state.model
        if not target:
            self._result(None, "choose a model first: a drafter is checked against its target")
            return
        self._gen += 1
        gen = self._gen
        self.info = None
        self.message.setText(f"checking {Path(path).name} against {Path(target).name}…")

        def factory(cancel: CancelToken) -> Iterator[DrafterInfo | None]:
            yield check_pair(target, path, inspect_drafter(path).modes[0])

        def passed(d: DrafterInfo) -> None:  # check_pair in a drafter's own mode: its summary, never None
            if gen == self._gen:
                self._result(d, f"{Path(d.path).name}: {d.describe()}; pair checked (vocabulary, width, kind)")

        def failed(message: str) -> None:
            if gen == self._gen:
                self._result(None, message, error=True)

        self.check_job = self.jobs.run(factory, self, event=passed, failed=failed)

    def _result(self, info: DrafterInfo | None, text: str, error: bool = False) -> None:
        self.info = info
        self.message.setText(printable(text))
        self.message.setStyleSheet("color: #c0392b" if error else "")
        self._setting = True
        try:
            self.state.set_drafter(info.path if info is not None else "")
        finally:
            self._setting = False
        self.checked.emit(info)

    def _state_drafter(self, path: str) -> None:
        if not self._setting and path.strip() != self.edit.text().strip():
            self.choose(path)
