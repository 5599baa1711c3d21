"""Acceptance against temperature: one line per task (x: the sampler's
temperature, y: the share of drafted tokens accepted, pooled over the task's speculative arms),
for a sweep with a temperature axis; lines made once per task and reused."""

from __future__ import annotations

from collections.abc import Iterable

import pyqtgraph as pg
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.core.records.schema import RunRecord

from ...common import make_plot, percent_axis, show_task_lines

EMPTY = "One temperature in these runs: measure a temperature axis (Sweep tab: Temperatures, e.g. 0,0.7)."


class TemperaturePlot(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.plot = make_plot("Acceptance vs temperature", "temperature", "accepted", left_units="%",
                              tip="Per task: the share of drafted tokens the target kept, pooled over its "
                                  "speculative arms, at each temperature measured. llama.cpp keeps a draft only "
                                  "while the target's own sample equals it, so acceptance falls where sampling "
                                  "spreads the target's choice",
                              empty="Acceptance against temperature appears here, one line per task, for a sweep "
                                    "that measured several temperatures")
        percent_axis(self.plot)
        self.note = QLabel(EMPTY)
        self.note.setWordWrap(True)
        lay.addWidget(self.plot, 1)
        lay.addWidget(self.note)
        self.lines: dict[str, pg.PlotDataItem] = {}  # per task, made once and reused

    def show_records(self, records: Iterable[RunRecord]) -> None:
        from app.core.analysis.temperature import acceptance_by_temperature  # the analysis layer: with results

        by_task = acceptance_by_temperature(records)
        several = any(len(points) > 1 for points in by_task.values())
        show_task_lines(self.plot, self.lines, {task: ([t for t, _ in points], [100 * a for _, a in points])
                                                for task, points in by_task.items()} if several else {})
        self.note.setText("" if several else EMPTY)
