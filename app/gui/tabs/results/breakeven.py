"""The Results tab's break-even plot: per K, the break-even model's speedup S(alpha) from the
verdict's costs (grey, one line style and dot symbol per K, its break-even acceptance dotted), and
each task's measured speedup at its measured acceptance as a dot in the task's colour
(common.task_color: the same as in every other plot), the legend right of the data naming the K
and the tasks. The title says where the costs came from (the verdict's cost_source: the cost probe,
or fitted from the sweep's own runs), since the two give different break-even points."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyqtgraph as pg
from PySide6.QtCore import Qt

from ...common import make_plot, set_empty_message, set_nice_range, task_color

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.verdict import Verdict

TITLE = "Break-even per K"
EMPTY = ("The break-even curves appear here once the costs are known: run the cost probe (Machine tab), "
         "or a sweep with a baseline and MTP arms")
NO_COSTS = ("No break-even curves: this sweep has no costs to price them (no cost probe of this model, and no "
            "baseline and MTP runs to fit them from). Run the cost probe on the Machine tab")
CURVE = "#808080"  # the model's curves: grey, the colours are the tasks'
SYMBOLS = ("o", "t", "s", "d", "star", "p", "h", "+")  # one per K, curve and dots alike
STYLES = (Qt.PenStyle.SolidLine, Qt.PenStyle.DashLine, Qt.PenStyle.DotLine, Qt.PenStyle.DashDotLine)
SOURCES = {"probe": "cost probe", "fitted from the runs": "fitted from the runs"}


def title_for(cost_source: str | None) -> str:
    """The plot's title, naming where its costs came from."""
    return f"{TITLE}, costs: {SOURCES.get(cost_source or '', cost_source)}" if cost_source else TITLE


def break_even_plot() -> pg.PlotWidget:
    return make_plot(TITLE, "per-token acceptance alpha", "speedup over baseline", left_units="x",
                     tip="Curves: the break-even model's speedup S(alpha) per K from measured costs (the cost probe, or fitted from the "
                         "runs themselves: the title says which). Dots: each task's measured speedup at its "
                         "measured acceptance, in the task's colour, its symbol the K of the curve it belongs to. "
                         "Above the dashed line MTP pays; a curve's crossing is its break-even acceptance",
                     empty=EMPTY)


def draw_break_even(pw: pg.PlotWidget, v: Verdict) -> list[Any]:
    """Draw the verdict ``v`` on ``pw``; returns the curves' items (one per K)."""
    pw.clear()
    legend = pw.getPlotItem().legend
    if legend is not None:
        legend.clear()
    pw.setTitle(title_for(v.cost_source))
    if v.costs is None:
        set_empty_message(pw, NO_COSTS)
        return []
    set_empty_message(pw, EMPTY)
    pw.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#888", style=Qt.PenStyle.DashLine)))
    curves, ys, tasks = [], [1.0], []
    for i, cv in enumerate(v.curves):
        style, symbol = STYLES[i % len(STYLES)], SYMBOLS[i % len(SYMBOLS)]
        be = " never pays" if cv.break_even is None else f" pays at >= {cv.break_even:.2f}"
        item = pw.plot(cv.alpha, cv.speedup, pen=pg.mkPen(CURVE, width=2, style=style))
        curves.append(item)
        ys += list(cv.speedup)
        if legend is not None:  # the K's line and its dots' symbol, in one entry
            legend.addItem(pg.PlotDataItem([0.0], [0.0], pen=pg.mkPen(CURVE, width=2, style=style), symbol=symbol,
                                           symbolBrush=CURVE, symbolPen=CURVE, symbolSize=8), f"K={cv.k}:{be}")
        if cv.break_even is not None:
            pw.addItem(pg.InfiniteLine(pos=cv.break_even, angle=90, pen=pg.mkPen(CURVE, style=Qt.PenStyle.DotLine)))
        pts = [(c.task, c.alpha, c.ratio.estimate) for c in v.analysis.cells
               if c.arm.is_mtp and c.arm.k == cv.k and c.alpha is not None and c.ratio and c.ratio.estimate]
        for task, alpha, speedup in pts:
            col = task_color(task)
            pw.addItem(pg.ScatterPlotItem(
                [alpha], [speedup], symbol=symbol, size=11, brush=pg.mkBrush(col), pen=pg.mkPen(col),
                hoverable=True, data=[task],
                tip=lambda x, y, data, k=cv.k: f"{data}, K={k}: alpha {x:.2f}, measured {y:.2f}x"))
            ys.append(speedup)
            if task not in tasks:
                tasks.append(task)
    if legend is not None:
        for task in tasks:  # each task's colour, once
            col = task_color(task)
            legend.addItem(pg.PlotDataItem([0.0], [0.0], pen=None, symbol="o", symbolBrush=col, symbolPen=col,
                                           symbolSize=9), task)
    pw.setXRange(-0.04, 1.04, padding=0)  # alpha's whole range, its 0 and 1 labelled
    pw.getAxis("bottom").setTickSpacing(0.2, 0.1)
    set_nice_range(pw, min(ys), max(ys))
    return curves
