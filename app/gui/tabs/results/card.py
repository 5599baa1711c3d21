"""The result card dialog (Results tab, "Result card…"): the card as it is shared (the PNG, the
Markdown row in the community's columns, the JSON block), each copied or saved exactly as shown;
and "Among others": a community table (loaded or pasted) with the result placed in it. And the
card's per-task interval plot on its own (IntervalPlot), shown under the Results tab's verdict."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPixmap, QResizeEvent
from PySide6.QtWidgets import (QComboBox, QDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QScrollArea,
                               QSizePolicy, QTabWidget, QVBoxLayout, QWidget)

from app.drawing import card_png
from app.core.analysis.community import Standing, parse_table, place
from app.core.analysis.community_cells import read_table_text
from app.core.common.errors import UserError
from app.core.records.schema import RunRecord
from app.core.records.watch import WatchRecord
from app.core.verdict.card import ALL_TASKS, Card, card_json, card_of, markdown_row

from ...files import save, save_path
from ...state import AppState
from ...story import State

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.analysis.analysis import Analysis


def _scrolled(label: QLabel) -> QScrollArea:
    area = QScrollArea()
    area.setWidget(label)
    area.setWidgetResizable(True)
    return area


class IntervalPlot(QLabel):
    """Each task's speedup per setting with its 95 % interval (the card's picture of them, drawn
    by app.drawing.card_png), scaled to the width it is given."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.image: QImage | None = None
        self.card: Card | None = None  # what the picture shows (None: nothing)
        self.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.setMinimumWidth(200)
        # the picture follows the width, not the reverse
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Maximum)
        self.setToolTip("Each task's speedup over baseline per setting, with its 95 % interval (log axis; the "
                        "dashed line is 1x: right of it MTP is faster). Green: reliably faster; red: reliably "
                        "slower; grey: within noise")
        self._scale()  # the empty state: what will appear

    def show_records(self, records: Sequence[RunRecord], analysis: Analysis | None = None,
                     states: Mapping[str, State] | None = None) -> None:
        """The plot of one sweep's runs (one setting); empty when they make none. ``states``: each
        task's answer (app.gui.story); a task that is not decided and not merely undecided (a
        withheld or provisional answer) has its settings in grey, with that word instead of
        "faster" or "slower", so the plot tells the banner's story."""
        self.image = None
        self.card = None
        if records:
            try:
                card = self.card = _marked(card_of(records, analysis), states or {})
                if any(c.speedup is not None for c in card.cells):
                    self.image = card_png.render_intervals(card)
            except UserError:
                self.image = None
        self._scale()

    def _scale(self) -> None:
        if self.image is None:
            self.clear()
            self.setText("The speedup of each task with its interval appears here after a sweep.")
            return
        pix = QPixmap.fromImage(self.image)
        w = max(200, min(self.width(), pix.width()))
        self.setPixmap(pix.scaledToWidth(w, Qt.TransformationMode.SmoothTransformation))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        if self.image is not None and abs(self.pixmap().width() - min(self.width(), self.image.width())) > 8:
            self._scale()


def _marked(card: Card, states: Mapping[str, State]) -> Card:
    """The card with each cell of a withheld (or provisional) task saying so instead of its own verdict."""
    word = {t: s.value for t, s in states.items() if s in (State.WITHHELD, State.PROVISIONAL)}
    if not word:
        return card
    cells = tuple(dataclasses.replace(c, verdict=word[c.task]) if c.task in word else c for c in card.cells)
    return dataclasses.replace(card, cells=cells)


class CardDialog(QDialog):
    """Raises UserError when the runs make no card (the caller shows it)."""

    def __init__(self, state: AppState, records: Sequence[RunRecord], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Result card")
        self.resize(1080, 760)
        self.state = state
        self.card = card_of(records, watch=_watch_records(state.results_path))  # the JSON carries them
        self.card_image = card_png.render_card(self.card)
        self.markdown, self.json = markdown_row(self.card), card_json(self.card)
        self.standing: Standing | None = None
        lay = QVBoxLayout(self)
        note = QLabel("This is exactly what is shared: file names but no folders, no user or host names. "
                      "Copy or save it as shown.")
        note.setWordWrap(True)
        lay.addWidget(note)
        self.pages = QTabWidget()
        self.card_label = QLabel()
        self.card_label.setPixmap(QPixmap.fromImage(self.card_image))
        self.pages.addTab(_scrolled(self.card_label), "Card (PNG)")
        self.md_text = QPlainTextEdit(self.markdown, readOnly=True)
        self.md_text.setToolTip("Rows for the community's results table: one per task, the first for all tasks")
        self.pages.addTab(self.md_text, "Markdown row")
        self.json_text = QPlainTextEdit(self.json, readOnly=True)
        self.pages.addTab(self.json_text, "JSON")
        self.pages.addTab(self._others_page(), "Among others")
        lay.addWidget(self.pages, 1)
        row = QHBoxLayout()
        for label, slot in (("Copy Markdown", lambda: self.copy("md")), ("Copy JSON", lambda: self.copy("json")),
                            ("Save PNG…", lambda: self.save_png()), ("Save JSON…", lambda: self.save_json()),
                            ("Close", self.accept)):
            b = QPushButton(label)
            b.clicked.connect(slot)
            row.addWidget(b)
        lay.addLayout(row)

    def _others_page(self) -> QWidget:
        page = QWidget()
        lay = QVBoxLayout(page)
        top = QHBoxLayout()
        self.paste = QPlainTextEdit()
        self.paste.setPlaceholderText("Paste a community results table (Markdown) here, or load one from a file")
        self.paste.setMaximumHeight(110)
        load = QPushButton("Load table…")
        load.clicked.connect(lambda: self.load_table())
        use = QPushButton("Place")
        use.setToolTip("Place your result among the pasted table's rows")
        use.clicked.connect(lambda: self.place_text(self.paste.toPlainText()))
        self.axis_box = QComboBox()
        for text, data in (("auto", "auto"), ("memory bandwidth", "bandwidth"), ("baseline tok/s", "baseline")):
            self.axis_box.addItem(text, data)
        self.axis_box.setToolTip("x axis: memory bandwidth when your GPU and most rows have one, else baseline tok/s")
        self.axis_box.currentIndexChanged.connect(
            lambda _i: self.place_text(self.paste.toPlainText()) if self.standing is not None else None)
        save_plot = QPushButton("Save plot PNG…")
        save_plot.clicked.connect(lambda: self.save_placement())
        for w in (load, use, QLabel("x axis"), self.axis_box, save_plot):
            top.addWidget(w)
        lay.addWidget(self.paste)
        lay.addLayout(top)
        self.placement_label = QLabel("No table yet.")
        lay.addWidget(_scrolled(self.placement_label), 1)
        return page

    # -- copy and save: the shown text and picture, byte for byte --------------------------------
    def copy(self, what: str) -> None:
        QGuiApplication.clipboard().setText(self.markdown if what == "md" else self.json)
        self.state.status.emit("Markdown rows copied" if what == "md" else "card JSON copied")

    def save_png(self, path: str | None = None) -> str | None:
        path = save_path(self, "Save card", "mtp-card.png", "PNG (*.png)", path)
        return save(self.state, path, card_png.png_bytes(self.card_image)) if path else None

    def save_json(self, path: str | None = None) -> str | None:
        path = save_path(self, "Save card JSON", "mtp-card.json", "JSON (*.json)", path)
        return save(self.state, path, self.json + "\n") if path else None

    # -- among others -----------------------------------------------------------------------------
    def load_table(self, path: str | None = None) -> None:
        if path is None:
            from PySide6.QtWidgets import QFileDialog  # the file dialog only when browsing

            path, _ = QFileDialog.getOpenFileName(self, "Community table", "", "Markdown (*.md *.txt);;All files (*)")
        if not path:
            return
        try:
            text = read_table_text(path)  # the CLI's reader: a regular file, bounded
        except UserError as e:
            self.state.show_error(str(e))
            return
        self.paste.setPlainText(text)
        self.place_text(text, path)

    def place_text(self, text: str, source: str = "the pasted table") -> Standing | None:
        row = next((r for r in self.card.rows if r.task == ALL_TASKS), self.card.rows[0] if self.card.rows else None)
        try:
            table = parse_table(text, source)
        except UserError as e:
            self.state.show_error(str(e))
            self.placement_label.setText(str(e))
            return None
        if row is None or row.speedup is None:
            self.state.show_error("this sweep has no speculative arm with a speedup to place")
            return None
        self.standing = place(table, row.speedup, row.baseline_tok_s, self.card.device,
                              f"you ({row.mode} K={row.n_max})" if row.n_max else f"you ({row.mode})",
                              self.axis_box.currentData())
        self.placement_image = card_png.render_placement(self.standing)
        self.placement_label.setPixmap(QPixmap.fromImage(self.placement_image))
        return self.standing

    def save_placement(self, path: str | None = None) -> str | None:
        if self.standing is None:
            self.state.show_error("load or paste a community table first")
            return None
        path = save_path(self, "Save plot", "mtp-placement.png", "PNG (*.png)", path)
        return save(self.state, path, card_png.png_bytes(self.placement_image)) if path else None


def _watch_records(path: str | os.PathLike[str] | None) -> list[WatchRecord]:
    """The watch records of the shown results file (mtp-tuner watch --out): the card's "watch"."""
    from app.core.records.reader import load_watch_records

    try:
        return load_watch_records(path) if path else []
    except UserError:
        return []
