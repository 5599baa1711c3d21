"""The Results tab's Advanced section (collapsed until opened): the per-cell statistics table (with
the alpha and len columns, said in words under it), the break-even plot, and the warnings, output equivalence, acceptance
by position, acceptance vs temperature and comparison views."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QLabel, QPlainTextEdit, QSplitter, QTableWidget, QTabWidget, QToolButton, QVBoxLayout,
                               QWidget)

from app.core.common.text import printable
from app.core.records.schema import RunRecord

from ...common import fill, table, whole_pane_toggle
from ...words import finding_words
from .breakeven import break_even_plot, draw_break_even
from .positions import PositionPlot
from .temperature import TemperaturePlot

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.verdict import Verdict

TIPS = {"tok/s": "median decode speed over the measured runs",
        "speedup [95% CI]": "Geometric mean of paired (interleaved) MTP/baseline ratios, with its 95 % t interval",
        "verdict": "faster / slower when the whole interval is above / below 1, else within noise",
        "accept": "drafted tokens the model accepted (pooled over runs)",
        "alpha": "alpha: the chance that each drafted token is accepted, the acceptance the break-even model uses "
                 "(from the mean accepted length at this K)",
        "len": "len: how many drafted tokens were accepted per draft, on average (at most K)",
        "B/A [95% CI]": "B over A with a 95 % Welch interval from both sweeps' paired runs: of the speedups "
                        "(of tok/s for the baseline); changed only when the interval excludes 1",
        "detect": "the smallest change these two sweeps could tell from noise (xF: a factor F either way)"}

TABLE_LEGEND = ("accept: the share of drafted tokens accepted · alpha: the chance that each drafted token is "
                "accepted (what the break-even model uses) · len: drafted tokens accepted per draft, on average · "
                "speedup: tok/s over the baseline's, from paired runs")


def set_headers(t: QTableWidget, headers: list[str]) -> None:
    if [item.text() if (item := t.horizontalHeaderItem(i)) else None for i in range(t.columnCount())] == headers:
        return
    t.setColumnCount(len(headers))
    t.setHorizontalHeaderLabels(headers)
    for i, h in enumerate(headers):
        item = t.horizontalHeaderItem(i)  # made by setHorizontalHeaderLabels
        if item is not None and h.strip() in TIPS:
            item.setToolTip(TIPS[h.strip()])


class AdvancedSection(QWidget):
    """A header button that opens and closes the statistics below it."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.toggle = QToolButton()
        self.toggle.setText("Advanced: statistics per task and setting, break-even, warnings, comparison")
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setCheckable(True)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setAutoRaise(True)
        self.toggle.toggled.connect(self.set_open)
        self.body = QWidget()
        body = QVBoxLayout(self.body)
        body.setContentsMargins(0, 0, 0, 0)
        self.table = table([])  # columns: the core's per-cell field list (app.core.analysis.fields)
        self.be_plot = break_even_plot()
        self.be_curves: list[Any] = []  # pyqtgraph's curve items, one per K
        # which costs priced the curves: the probe (where it ran) or the runs themselves (and why)
        self.cost_label = QLabel("")
        self.cost_label.setWordWrap(True)
        self.cost_label.setToolTip("A probe prices the curves only where it ran where the runs ran: the same model, "
                                   "engine, backend, devices and llama.cpp build")
        be_box = QWidget()
        be_lay = QVBoxLayout(be_box)
        be_lay.setContentsMargins(0, 0, 0, 0)
        be_lay.addWidget(self.be_plot, 1)
        be_lay.addWidget(self.cost_label)
        # what the table's short column names mean, in words (each header's tooltip says it too)
        self.table_legend = QLabel(TABLE_LEGEND)
        self.table_legend.setWordWrap(True)
        self.table_legend.setStyleSheet("color: palette(mid)")
        table_box = QWidget()
        table_lay = QVBoxLayout(table_box)
        table_lay.setContentsMargins(0, 0, 0, 0)
        table_lay.addWidget(self.table, 1)
        table_lay.addWidget(self.table_legend)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(table_box)
        top.addWidget(be_box)
        top.setSizes([650, 450])
        bottom = QTabWidget()
        self.findings = QPlainTextEdit(readOnly=True)
        self.findings.setToolTip("Confounders and measurement problems, each with what to do about it")
        bottom.addTab(self.findings, "Warnings")
        self.equiv_table = table(["task", "prompt", "arm", "rep", "same tokens as baseline", "first difference"],
                                 {4: "Under greedy decoding MTP must produce exactly the baseline's tokens"})
        bottom.addTab(self.equiv_table, "Output equivalence")
        self.positions = PositionPlot()
        bottom.addTab(self.positions, "Acceptance by position")
        self.temperature = TemperaturePlot()
        bottom.addTab(self.temperature, "Acceptance vs temperature")
        self.compare_table = table([])
        self.compare_label = QLabel("Choose another sweep above and press Compare: e.g. the same sweep before "
                                    "and after a llama.cpp update")
        self.compare_label.setWordWrap(True)
        self.compare_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        cmp_page = QWidget()
        cl = QVBoxLayout(cmp_page)
        cl.setContentsMargins(0, 0, 0, 0)
        cmp_split = QSplitter(Qt.Orientation.Vertical)  # the table gets the room; the label can be dragged taller
        cmp_split.addWidget(self.compare_label)
        cmp_split.addWidget(self.compare_table)
        cmp_split.setStretchFactor(1, 1)
        cl.addWidget(cmp_split)
        bottom.addTab(cmp_page, "Comparison")
        self.compare_page = cmp_page
        self.results_tabs = bottom
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(top)
        split.addWidget(bottom)
        split.setSizes([420, 260])
        body.addWidget(split, 1)
        self.whole_pane = whole_pane_toggle(split, bottom, "Whole pane")  # e.g. a comparison: the tabs alone
        bottom.setCornerWidget(self.whole_pane)
        lay.addWidget(self.toggle)
        lay.addWidget(self.body, 1)
        self.body.setVisible(False)

    def set_open(self, opened: bool) -> None:
        if self.toggle.isChecked() != opened:
            self.toggle.setChecked(opened)  # comes back here through toggled
            return
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if opened else Qt.ArrowType.RightArrow)
        self.body.setVisible(opened)

    def is_open(self) -> bool:
        return self.toggle.isChecked()

    def show_verdict(self, v: Verdict, notes: list[str], records: Iterable[RunRecord]) -> None:
        from app.core.analysis.fields import EQUIVALENCE_FIELDS, table as field_table  # with the first results

        a = v.analysis
        headers, rows = field_table(a.cells)
        set_headers(self.table, headers)
        fill(self.table, rows)
        fill(self.equiv_table, field_table(a.equivalence, EQUIVALENCE_FIELDS)[1])
        notes = notes + [finding_words(f) for f in a.findings]
        self.findings.setPlainText(printable("\n".join(notes)) or "No warnings.")
        self.plot_break_even(v)
        self.positions.show_verdict(v)
        self.temperature.show_records(records)  # every setting's runs: temperature is the x axis

    def plot_break_even(self, v: Verdict) -> None:
        self.cost_label.setText(f"Costs: {v.cost_label}." if v.cost_label else "")
        self.be_curves = draw_break_even(self.be_plot, v)
