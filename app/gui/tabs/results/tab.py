"""Results tab: the answer first. At the top the sweep shown and the history of past sweeps (listed
by what they are: model, tasks, K, time, status); under it the verdict banner (banner.py: one line
per task and for the mix, each with its command button and the warnings that weaken it) and the
per-task interval plot (card.py); then the Advanced section (advanced.py: the statistics table,
break-even, output equivalence, positions, temperature, comparison) and the exports.

The past sweeps, opening, comparing, running again, and what a sweep that ends does to what is
shown (a cancelled one, or one that finished no run, does not replace the last complete verdict)
are past.py, the tab's base class. It renders the AppState's verdict; "Run again" and "Command for
this" ask the other tabs through the state."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QPushButton, QScrollArea, QSizePolicy,
                               QVBoxLayout, QWidget)

from app.core.common.errors import UserError
from app.core.common.text import printable

from ...common import elide_combo
from ...files import save, save_path
from ...plot_export import save_plot
from ...state import AppState
from ...story import task_states, where_line
from ...words import measured_ngram, model_facts, no_mtp_next
from .advanced import AdvancedSection
from .banner import VerdictBanner
from .card import IntervalPlot
from .history import describe, statuses
from .past import PastSweeps

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.verdict import Verdict


def _combo(tip: str) -> QComboBox:
    box = QComboBox()
    box.setToolTip(tip)
    box.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
    return elide_combo(box, 24)  # long entries elided (full text in each entry's tooltip): the window fits a laptop


class ResultsTab(PastSweeps):
    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        lay = QVBoxLayout(self)
        hist = QHBoxLayout()
        self.history_box = _combo("Past sweeps in your results folder (newest first): model, tasks, draft widths, "
                                  "when, runs, and how the sweep ended")
        open_btn = QPushButton("Open")
        open_btn.setToolTip("Show this sweep's results")
        open_btn.clicked.connect(lambda: self.open_results(self.history_box.currentData()))
        browse = QPushButton("Open file…")
        browse.clicked.connect(self.browse_results)
        self.compare_box = _combo("Another sweep to compare with the one shown, e.g. before a llama.cpp update")
        compare = QPushButton("Compare")
        compare.clicked.connect(lambda: self.compare_results(self.compare_box.currentData()))
        self.file_sweep_box = _combo("This results file holds several sweeps (other models or set-ups): "
                                     "choose the one to show; they are never pooled into one verdict")
        self.file_sweep_box.setVisible(False)
        self.file_sweep_box.activated.connect(lambda _i: self._show_file_sweep(self.file_sweep_box.currentData()))
        hist.addWidget(QLabel("Sweep"))
        hist.addWidget(self.history_box, 3)
        hist.addWidget(open_btn)
        hist.addWidget(browse)
        hist.addWidget(self.file_sweep_box, 1)
        hist.addWidget(QLabel("compare with"))
        hist.addWidget(self.compare_box, 2)
        hist.addWidget(compare)
        again = QPushButton("Run again")
        again.setToolTip("Run the sweep shown once more with the same arms, prompts, tokens and repetitions "
                         "(e.g. after updating llama.cpp), then compare the two")
        again.clicked.connect(self.run_again)
        hist.addWidget(again)
        lay.addLayout(hist)
        self.setting_box = _combo("This sweep measured several settings (sampler, thinking, context depth): "
                                  "runs pair and a verdict holds within one; choose the one to judge")
        self.setting_box.setVisible(False)
        self.setting_box.activated.connect(self.state.set_setting)
        hist.insertWidget(5, self.setting_box, 1)
        # a sweep that was not shown (cancelled or failed): said, and offered
        stale = QHBoxLayout()
        self.stale_label = QLabel("")
        self.stale_label.setWordWrap(True)
        self.stale_label.setStyleSheet("color: #b26a00")
        self.stale_btn = QPushButton("Show it anyway")
        self.stale_btn.setToolTip("Open the sweep that was not shown (its finished runs are in its results file)")
        self.stale_btn.clicked.connect(self._open_stale)
        stale.addWidget(self.stale_label, 1)
        stale.addWidget(self.stale_btn)
        self.stale_label.setVisible(False)
        self.stale_btn.setVisible(False)
        lay.addLayout(stale)

        body = QWidget()
        bl = QVBoxLayout(body)
        bl.setContentsMargins(0, 0, 0, 0)
        self.banner = VerdictBanner()
        self.banner.command_for.connect(self.state.command_requested.emit)
        self.intervals = IntervalPlot()
        self.advanced = AdvancedSection()
        self.advanced.body.setMinimumHeight(520)
        bl.addWidget(self.banner)
        bl.addWidget(self.intervals)
        bl.addWidget(self.advanced)
        bl.addStretch(1)
        scroll = self.body_scroll = QScrollArea()
        scroll.setWidget(body)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        lay.addWidget(scroll, 1)
        self.advanced.toggle.toggled.connect(  # opened: scrolled into view
            lambda on: on and QTimer.singleShot(0, lambda: scroll.verticalScrollBar().setValue(self.advanced.y())))
        # the Advanced section's parts, by the names the tab always had
        adv = self.advanced
        self.table, self.be_plot, self.findings, self.equiv_table = adv.table, adv.be_plot, adv.findings, adv.equiv_table
        self.positions, self.temperature = adv.positions, adv.temperature
        self.compare_table, self.compare_label, self.compare_page = adv.compare_table, adv.compare_label, adv.compare_page
        self.results_tabs = adv.results_tabs
        self.whole_pane = adv.whole_pane
        self.cost_label = adv.cost_label
        ex = QHBoxLayout()
        for label, slot, tip in (("Save plot as PNG…", lambda: self.export_plot("png"), "The break-even plot"),
                                 ("Save plot as SVG…", lambda: self.export_plot("svg"), "The break-even plot"),
                                 ("Save table as CSV…", lambda: self.export_data("csv"), "One row per task and arm"),
                                 ("Save data as JSON…", lambda: self.export_data("json"),
                                  "Table, output equivalence and warnings"),
                                 ("Markdown report…", self.export_report,
                                  "Recommendation, command, tables, break-even model, setup"),
                                 ("Result card…", self.show_card, "The card to share (PNG, Markdown row, JSON: no "
                                  "paths, no user or host names), and your result among a community table's")):
            b = QPushButton(label)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            ex.addWidget(b)
        lay.addLayout(ex)
        state.verdict_changed.connect(self.show_verdict)
        state.sweep_started.connect(self._sweep_started)
        state.sweep_finished.connect(self._sweep_finished)
        state.sweep_warning.connect(lambda m: self.findings.appendPlainText("warning: " + m))
        state.model_changed.connect(lambda _m: self._model_note())
        self.refresh_history()
        self._model_note()

    @property
    def be_curves(self) -> list[Any]:
        return self.advanced.be_curves

    # -- showing the verdict --------------------------------------------------------------
    def show_verdict(self, v: Verdict | None) -> None:
        """Render the state's verdict (None: a sweep just started, or nothing to show: keep what is shown)."""
        if v is None:
            return
        st = self.state
        self.probe_answer = ""
        if not st.sweep_running:  # what to put back after a sweep that does not replace it
            self._last_shown = (list(st.records), st.results_path, list(st.cost_records), list(st.file_notes),
                                st.setting_index)
        self.banner.show_verdict(v, self._sweep_text())
        self.intervals.show_records(list(v.records), v.analysis, task_states(v))
        self.intervals.setVisible(True)
        self.advanced.show_verdict(v, list(self.state.file_notes), self.state.records)
        self._model_note()
        labels = self.state.setting_labels
        if [self.setting_box.itemText(i) for i in range(self.setting_box.count())] != labels:
            self.setting_box.clear()
            self.setting_box.addItems(labels)
        self.setting_box.setCurrentIndex(min(self.state.setting_index, max(len(labels) - 1, 0)))
        self.setting_box.setVisible(bool(labels))
        self.to_top()

    def to_top(self) -> None:
        """The answer in view: scrolled to the top, now and once the new rows are laid out (a
        second sweep's verdict must not open where the last one was scrolled to)."""
        bar = self.body_scroll.verticalScrollBar()
        bar.setValue(0)
        QTimer.singleShot(0, bar, lambda: bar.setValue(0))

    def _sweep_text(self) -> str:
        path = self.state.results_path
        status = statuses(self.state.settings).get(str(path)) if path else None
        what = describe(self.state.records, status)
        where = "\n" + where_line(self.state.where, self.state.verdict) if self.state.where else ""
        return f"Sweep shown: {what}" + (f" ({printable(path.name, one_line=True)})" if path else "") + where

    def _model_note(self) -> None:
        """A model without MTP heads: its reason and the next step (for the sweep shown, else the model chosen)."""
        v = self.state.verdict
        path = v.model_path if v is not None else self.state.model
        parts = []
        if self.probe_answer:
            parts.append(f"<b>Leave MTP off</b>: {self.probe_answer}")
        if path and model_facts(path)[0] is False:
            measured = v is not None and any(c.arm.is_spec for c in v.analysis.cells)
            parts.append("<b>This model has no MTP heads</b>, so MTP cannot be turned on for it"
                         + (" (the verdicts below are for the other speculative modes measured)" if measured else "")
                         + ". " + no_mtp_next(measured_ngram(v)))
        self.banner.set_note("<br>".join(parts))

    def plot_break_even(self, v: Verdict) -> None:
        self.advanced.plot_break_even(v)

    # -- exports --------------------------------------------------------------------------
    def export_plot(self, fmt: str, path: str | None = None) -> str | None:
        path = save_path(self, "Save plot", f"break-even.{fmt}", f"{fmt.upper()} (*.{fmt})", path)
        if not path:
            return None
        try:
            save_plot(self.be_plot, fmt, path)
        except Exception as e:
            self.state.show_error(f"{path}: cannot save the plot ({e})")
            return None
        self.state.status.emit(f"plot saved to {path}")
        return path

    def export_data(self, fmt: str, path: str | None = None) -> str | None:
        from app.core.analysis.fields import cells_csv  # the verdict layer: loaded with the first results
        from app.core.verdict import verdict_dict

        v = self.state.verdict
        if v is None:
            self.state.show_error("no results yet: run a sweep or open one")
            return None
        path = save_path(self, "Save data", f"mtp-results.{fmt}", f"{fmt.upper()} (*.{fmt})", path)
        if not path:
            return None
        text = cells_csv(v.analysis.cells) if fmt == "csv" else json.dumps(verdict_dict(v), indent=2)
        return save(self.state, path, text)

    def show_card(self) -> None:
        from .card import CardDialog  # the card's renderer: only when a card is asked for

        try:
            # the runs of the setting the verdict judged (a card holds one setting, never several pooled)
            runs = list(self.state.verdict.records) if self.state.verdict is not None else self.state.records
            self.card_dialog = CardDialog(self.state, runs, self)
        except UserError as e:
            self.state.show_error(str(e))
            return
        self.card_dialog.show()

    def export_report(self, path: str | None = None) -> str | None:
        from app.core.verdict import markdown_report  # see export_data

        v = self.state.verdict
        if v is None:
            self.state.show_error("no results yet: run a sweep or open one")
            return None
        path = save_path(self, "Save report", "mtp-report.md", "Markdown (*.md)", path)
        if not path:
            return None
        return save(self.state, path, markdown_report(v))
