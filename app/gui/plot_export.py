"""A pyqtgraph plot saved as PNG (1200 px wide) or SVG (vector, through QSvgGenerator: pyqtgraph's
own SVG exporter fails on this Qt's path output), atomically."""

from __future__ import annotations

from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QRect
from PySide6.QtGui import QPainter

from app.core.common.atomic import atomic_path


def save_plot(plot: pg.PlotWidget, fmt: str, path: str) -> None:
    """Raises on failure (the caller names the file to the user)."""
    with atomic_path(path) as tmp:
        if fmt == "png":
            from pyqtgraph.exporters import ImageExporter  # the exporters: only when a plot is saved

            ex = ImageExporter(plot.getPlotItem())
            ex.parameters()["width"] = 1200
            ex.export(str(tmp) + ".png")  # the exporter picks the format from the name
            Path(str(tmp) + ".png").replace(tmp)
        else:
            from PySide6.QtSvg import QSvgGenerator  # the Qt SVG module: only when a plot is saved as SVG

            gen = QSvgGenerator()
            gen.setFileName(str(tmp))
            gen.setSize(plot.size())
            gen.setViewBox(QRect(0, 0, plot.width(), plot.height()))
            gen.setTitle("MTP Tuner break-even")
            painter = QPainter(gen)
            plot.render(painter)
            painter.end()
