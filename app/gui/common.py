"""Small shared pieces of the window: read-only tables, plots that follow the light/dark palette."""

from __future__ import annotations

from typing import Sequence

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import QAbstractItemView, QGraphicsItem, QHeaderView, QTableWidget, QTableWidgetItem

from app.core.common.text import printable
from app.core.machine.modelinfo import size_text

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
BASELINE_COLOR = "#888888"

_plots: list = []  # every plot made by make_plot, re-coloured when the OS palette changes


def table(headers: Sequence[str], tips: dict[int, str] | None = None) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(list(headers))
    t.setEditTriggers(QAbstractItemView.NoEditTriggers)
    t.setSelectionBehavior(QAbstractItemView.SelectRows)
    t.setSelectionMode(QAbstractItemView.SingleSelection)
    t.verticalHeader().setVisible(False)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
    t.horizontalHeader().setStretchLastSection(True)
    for col, tip in (tips or {}).items():
        t.horizontalHeaderItem(col).setToolTip(tip)
    return t


def fill(t: QTableWidget, rows: Sequence[Sequence[object]], tips: Sequence[str | None] | None = None) -> None:
    t.setRowCount(len(rows))
    for r, row in enumerate(rows):
        for c, v in enumerate(row):
            item = QTableWidgetItem("" if v is None else printable(v, one_line=True))
            item.setFlags(item.flags() & ~Qt.ItemIsEditable)
            if tips and tips[r]:
                item.setToolTip(printable(tips[r]))
            t.setItem(r, c, item)


def is_dark() -> bool:
    app = QGuiApplication.instance()
    if app is None:
        return False
    try:
        scheme = app.styleHints().colorScheme()
        if scheme == Qt.ColorScheme.Dark:
            return True
        if scheme == Qt.ColorScheme.Light:
            return False
    except AttributeError:  # Qt < 6.5
        pass
    return app.palette().color(QPalette.Window).lightness() < 128


def _style(pw) -> None:
    pal = QGuiApplication.palette()
    bg = pal.color(QPalette.Base)
    fg = pal.color(QPalette.Text)
    if is_dark() and bg.lightness() >= 128:  # the OS says dark, the Qt style has no dark palette
        bg, fg = bg.fromRgb(30, 30, 30), fg.fromRgb(220, 220, 220)
    pw.setBackground(bg)
    for name in ("left", "bottom"):
        ax = pw.getAxis(name)
        ax.setPen(fg)
        ax.setTextPen(fg)
    pw.getPlotItem().titleLabel.setAttr("color", fg.name())
    pw.getPlotItem().titleLabel.setText(pw.getPlotItem().titleLabel.text)
    legend = pw.getPlotItem().legend
    if legend is not None:
        legend.setLabelTextColor(fg)
        for _, label in legend.items:
            label.setAttr("color", fg.name())
            label.setText(label.text)


def make_plot(title: str, bottom: str, left: str, *, bottom_units: str | None = None,
              left_units: str | None = None, legend: bool = True, tip: str | None = None):
    pw = pg.PlotWidget(title=title)
    pw.setLabel("bottom", bottom, units=bottom_units)
    pw.setLabel("left", left, units=left_units)
    pw.showGrid(x=True, y=True, alpha=0.2)
    # axes and title change only with the range: repaint them from a pixmap, not through Python
    for name in ("left", "bottom"):
        pw.getAxis(name).setCacheMode(QGraphicsItem.DeviceCoordinateCache)
    if legend:
        pw.addLegend(offset=(-10, 10))
    if tip:
        pw.setToolTip(tip)
    _style(pw)
    _plots.append(pw)
    pw.destroyed.connect(lambda *_: _plots.remove(pw) if pw in _plots else None)
    return pw


def restyle_plots() -> None:
    for pw in list(_plots):
        try:
            _style(pw)
        except RuntimeError:  # deleted
            _plots.remove(pw)


def follow_os_palette(app) -> None:
    """Re-colour plots when the OS switches between light and dark."""
    try:
        app.styleHints().colorSchemeChanged.connect(lambda *_: restyle_plots())
    except AttributeError:  # Qt < 6.5
        pass


def gib(b: int | float | None) -> str:
    return "?" if b is None else size_text(b)


def show_task_lines(plot, lines: dict, series: dict[str, tuple[list, list]]) -> None:
    """One line per task on ``plot`` (x, y per task in ``series``), from ``lines``: items made once
    per task and reused (hidden when a task has none now), the legend rebuilt."""
    legend = plot.getPlotItem().legend
    if legend is not None:
        legend.clear()
    for item in lines.values():
        item.setData([], [])
        item.setVisible(False)
    for task, (xs, ys) in series.items():
        item = lines.get(task)
        if item is None:
            col = COLORS[len(lines) % len(COLORS)]
            item = lines[task] = plot.plot([], [], pen=pg.mkPen(col, width=2), symbol="o", symbolBrush=col)
        item.setData(xs, ys)
        item.setVisible(True)
        if legend is not None:
            legend.addItem(item, task)
