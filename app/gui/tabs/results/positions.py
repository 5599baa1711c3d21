"""The Results tab's acceptance by draft position: one line per task (x: the draft position, 1 =
a step's first draft; y: the share of verification steps that accepted it, pooled over the task's
draft-mtp arms), from items made once per task and reused; beside it, the model check's held-out K
(each K predicted from the task's other K by these positions)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyqtgraph as pg
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QWidget

from ...common import make_plot, percent_axis, show_task_lines

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.verdict import Verdict

EMPTY = ("No acceptance per draft position in these runs (recorded from schema 3 on, by both engines; "
         "llama-server needs --metrics, which MTP Tuner always sets).")


class PositionPlot(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.plot = make_plot("Acceptance by draft position", "draft position", "accepted",
                              left_units="%",
                              tip="Per task: the share of verification steps whose drafts were accepted up to "
                                  "this position (llama.cpp's 'acc per pos'), pooled over the MTP arms that "
                                  "drafted that far (lowest p_min). Real MTP heads accept less at later "
                                  "positions; the break-even model uses these to predict widths not measured",
                              empty="The acceptance at each draft position appears here, one line per task, for "
                                    "runs that counted it (MTP runs recorded with schema 3 on)")
        self.plot.getAxis("bottom").setTickSpacing(1, 1)  # positions are whole numbers
        percent_axis(self.plot)
        self.notes = QPlainTextEdit(EMPTY, readOnly=True)
        self.notes.setToolTip("The model check: each measured K predicted from the task's other K by acceptance "
                              "per position, against its measured speedup")
        lay.addWidget(self.plot, 3)
        lay.addWidget(self.notes, 2)
        self.lines: dict[str, pg.PlotDataItem] = {}  # per task, made once and reused

    def show_verdict(self, v: Verdict) -> None:
        from app.core.analysis.positions import task_rates  # the analysis layer: with the first results

        rates = task_rates(v.analysis.cells)
        show_task_lines(self.plot, self.lines, {task: (list(range(1, len(ys) + 1)), [100 * y for y in ys])
                                                for task, ys in rates.items()})
        if rates:
            self.plot.setXRange(0.5, max(len(ys) for ys in rates.values()) + 0.5, padding=0)
        self.notes.setPlainText(held_out_text(v) if rates else EMPTY)


def held_out_text(v: Verdict) -> str:
    """The model check's held-out widths, one line each (or why there are none)."""
    check = v.model_check
    rows = check.held_out if check is not None else ()
    if not rows:
        return ("Held-out K: needs at least two measured K per task and the costs to price them."
                if check is not None else "Held-out K: no costs (run the cost probe, or measure a baseline).")
    lines = [f"{c.task} K={c.k}{f' p_min={c.p_min:g}' if c.p_min else ''}: predicted {c.predicted:.2f}x from "
             f"K={','.join(map(str, c.fit_ks))}, measured {c.measured:.2f}x ({100 * c.error:+.1f} %"
             f"{', positions extrapolated' if c.extrapolated else ''})" for c in rows]
    return "Held-out K (each predicted from the task's other K by acceptance per position):\n" + "\n".join(lines)
