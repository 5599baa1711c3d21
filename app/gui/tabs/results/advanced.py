"""The Results tab's Advanced section (collapsed until opened): the per-cell statistics table (with
the alpha and len columns), the break-even plot, and the warnings, output equivalence, acceptance
by position, acceptance vs temperature and comparison views."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QLabel, QPlainTextEdit, QSplitter, QTabWidget, QToolButton, QVBoxLayout, QWidget)

from app.core.common.text import printable

from ...common import COLORS, fill, make_plot, table
from .positions import PositionPlot
from .temperature import TemperaturePlot

TIPS = {"tok/s": "median decode speed over the measured runs",
        "speedup [95% CI]": "Geometric mean of paired (interleaved) MTP/baseline ratios, with its 95 % t interval",
        "verdict": "faster / slower when the whole interval is above / below 1, else within noise",
        "accept": "drafted tokens the model accepted (pooled over runs)",
        "alpha": "per-token acceptance the break-even model uses",
        "len": "mean accepted draft length",
        "B/A [95% CI]": "B over A with a 95 % Welch interval from both sweeps' paired runs: of the speedups "
                        "(of tok/s for the baseline); changed only when the interval excludes 1",
        "detect": "the smallest change these two sweeps could tell from noise (xF: a factor F either way)"}


def set_headers(t, headers: list[str]) -> None:
    if [t.horizontalHeaderItem(i).text() if t.horizontalHeaderItem(i) else None
            for i in range(t.columnCount())] == headers:
        return
    t.setColumnCount(len(headers))
    t.setHorizontalHeaderLabels(headers)
    for i, h in enumerate(headers):
        if h.strip() in TIPS:
            t.horizontalHeaderItem(i).setToolTip(TIPS[h.strip()])


class AdvancedSection(QWidget):
    """A header button that opens and closes the statistics below it."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.toggle = QToolButton()
        self.toggle.setText("Advanced: statistics per task and setting, break-even, warnings, comparison")
        self.toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.toggle.setCheckable(True)
        self.toggle.setArrowType(Qt.RightArrow)
        self.toggle.setAutoRaise(True)
        self.toggle.toggled.connect(self.set_open)
        self.body = QWidget()
        body = QVBoxLayout(self.body)
        body.setContentsMargins(0, 0, 0, 0)
        self.table = table([])  # columns: the core's per-cell field list (app.core.analysis.fields)
        self.be_plot = make_plot("Break-even S(alpha) per K; dots: measured",
                                 "per-token acceptance alpha", "speedup over baseline", left_units="x",
                                 tip="Curves: the break-even model from measured costs (cost probe, or the "
                                     "runs themselves). Dots: each task's measured speedup at its measured "
                                     "acceptance. Above the dashed line MTP pays; a curve's crossing is its "
                                     "break-even acceptance")
        self.be_curves: list = []
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
        top = QSplitter(Qt.Horizontal)
        top.addWidget(self.table)
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
        self.compare_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        cmp_page = QWidget()
        cl = QVBoxLayout(cmp_page)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(self.compare_label)
        cl.addWidget(self.compare_table, 1)
        bottom.addTab(cmp_page, "Comparison")
        self.compare_page = cmp_page
        self.results_tabs = bottom
        split = QSplitter(Qt.Vertical)
        split.addWidget(top)
        split.addWidget(bottom)
        split.setSizes([420, 260])
        body.addWidget(split, 1)
        lay.addWidget(self.toggle)
        lay.addWidget(self.body, 1)
        self.body.setVisible(False)

    def set_open(self, opened: bool) -> None:
        if self.toggle.isChecked() != opened:
            self.toggle.setChecked(opened)  # comes back here through toggled
            return
        self.toggle.setArrowType(Qt.DownArrow if opened else Qt.RightArrow)
        self.body.setVisible(opened)

    def is_open(self) -> bool:
        return self.toggle.isChecked()

    def show_verdict(self, v, notes: list[str], records) -> None:
        from app.core.analysis.fields import EQUIVALENCE_FIELDS, table as field_table  # with the first results

        a = v.analysis
        headers, rows = field_table(a.cells)
        set_headers(self.table, headers)
        fill(self.table, rows)
        fill(self.equiv_table, field_table(a.equivalence, EQUIVALENCE_FIELDS)[1])
        notes = notes + [f"{f.message} -> {f.fix}" for f in a.findings]
        self.findings.setPlainText(printable("\n".join(notes)) or "No warnings.")
        self.plot_break_even(v)
        self.positions.show_verdict(v)
        self.temperature.show_records(records)  # every setting's runs: temperature is the x axis

    def plot_break_even(self, v) -> None:
        self.be_plot.clear()
        if self.be_plot.getPlotItem().legend is not None:
            self.be_plot.getPlotItem().legend.clear()
        self.be_curves = []
        self.cost_label.setText(f"Costs: {v.cost_label}." if v is not None and v.cost_label else "")
        if v.costs is None:
            self.be_plot.setTitle("Break-even: no costs (no cost probe; the runs could not be fitted)")
            return
        costs = "the cost probe" if v.cost_source == "probe" else "fitted from the runs"
        self.be_plot.setTitle(f"Break-even per K (costs: {costs}); dots: tasks measured")
        self.be_plot.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#888", style=Qt.DashLine)))
        for i, cv in enumerate(v.curves):
            col = COLORS[i % len(COLORS)]
            be = " (never pays)" if cv.break_even is None else f" (pays at >= {cv.break_even:.2f})"
            self.be_curves.append(self.be_plot.plot(cv.alpha, cv.speedup, pen=pg.mkPen(col, width=2),
                                                    name=f"K={cv.k}{be}"))
            if cv.break_even is not None:
                self.be_plot.addItem(pg.InfiniteLine(pos=cv.break_even, angle=90,
                                                     pen=pg.mkPen(col, style=Qt.DotLine)))
            pts = [c for c in v.analysis.cells if c.arm.is_mtp and c.arm.k == cv.k and c.alpha is not None and c.ratio
                   and c.ratio.estimate]
            if pts:
                self.be_plot.plot([c.alpha for c in pts], [c.ratio.estimate for c in pts], pen=None,
                                  symbol="o", symbolBrush=col, symbolSize=9)
                for c in pts:  # which task each dot is
                    label = pg.TextItem(printable(c.task, one_line=True), color=col, anchor=(0, 1))
                    label.setPos(c.alpha, c.ratio.estimate)
                    self.be_plot.addItem(label)
