"""A deliberately light live plot for the run in progress: one polyline, fixed axes, colours from the
palette. It is repainted ~10 times a second while a run is being timed, so one repaint is a few
QPainter calls (a pyqtgraph repaint costs ~10x more CPU, which a machine whose every core runs
llama.cpp takes straight from the measurement). Until it has a range or a curve it shows, instead
of placeholder axes, what will appear there (``empty``)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette, QPen, QPixmap, QPolygonF
from PySide6.QtWidgets import QSizePolicy, QWidget


def _nice(v: float) -> float:
    """A round axis maximum at or above v: a whole number of round steps (_step)."""
    if v <= 0:
        return 1.0
    step = _step(v)
    return math.ceil(v / step - 1e-9) * step


def _step(v: float) -> float:
    """A round tick step (1, 2 or 5 x 10^n) giving 3 to 5 ticks from 0 to v: never 62.5."""
    raw = v / 4
    e = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * e * 1.0001:
            return m * e
    return 10 * e


def _ticks(top: float) -> list[float]:
    step = _step(top)
    return [i * step for i in range(int(round(top / step)) + 1)]


class LivePlot(QWidget):
    def __init__(self, title: str, x_label: str, y_label: str, color: str = "#1f77b4",
                 parent: QWidget | None = None, empty: str = "") -> None:
        super().__init__(parent)
        self.title, self.x_label, self.y_label, self.empty = title, x_label, y_label, empty
        self.ranged = False  # no range and no curve yet: the empty message instead of axes
        self.color = QColor(color)
        self._xs: list[float] = []
        self._ys: list[float] = []
        self.x_max, self.y_max = 1.0, 1.0
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMinimumSize(160, 120)  # the window fits 1280x720 with the Sweep tab's form above
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)
        # (key, pixmap, plot area): axes, grid, labels, drawn once per size/range/title
        self._frame: tuple[tuple[object, ...], QPixmap, QRectF] | None = None

    # -- data ---------------------------------------------------------------------------
    def setData(self, xs: Iterable[float], ys: Iterable[float]) -> None:  # noqa: N802 (Qt naming, like pyqtgraph)
        self._xs, self._ys = [float(x) for x in xs], [float(y) for y in ys]
        if self._xs and (max(self._xs) > self.x_max or max(self._ys) > self.y_max):
            self.setRange(max(self.x_max, max(self._xs) * 1.1), max(self.y_max, max(self._ys) * 1.1))
        self.update()

    def getData(self) -> tuple[list[float], list[float]]:  # noqa: N802
        return list(self._xs), list(self._ys)

    def setRange(self, x_max: float, y_max: float) -> None:  # noqa: N802
        self.x_max, self.y_max = _nice(x_max), _nice(y_max)
        self.ranged = True
        self.update()

    def reset(self) -> None:
        """No curve and no range: the empty message again (a new sweep)."""
        self._xs, self._ys = [], []
        self.x_max, self.y_max, self.ranged = 1.0, 1.0, False
        self.update()

    @property
    def shows_empty(self) -> bool:
        return bool(self.empty) and not self.ranged and len(self._xs) < 2

    def setTitle(self, title: str) -> None:  # noqa: N802
        self.title = title
        self.update()

    # -- painting ------------------------------------------------------------------------
    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802
        pal = self.palette()
        key = (self.width(), self.height(), self.x_max, self.y_max, self.title,
               pal.color(QPalette.ColorRole.Base).rgba(), pal.color(QPalette.ColorRole.Text).rgba(),
               self.devicePixelRatioF(), self.shows_empty)
        if self._frame is None or self._frame[0] != key:
            self._frame = (key, *self._draw_frame(pal))
        _, pix, area = self._frame
        p = QPainter(self)
        p.drawPixmap(0, 0, pix)
        if len(self._xs) > 1:
            sx, sy = area.width() / self.x_max, area.height() / self.y_max
            poly = QPolygonF([QPointF(area.left() + x * sx, area.bottom() - min(y, self.y_max) * sy)
                              for x, y in zip(self._xs, self._ys)])
            p.setClipRect(area)
            p.setPen(QPen(self.color, 1.5))
            p.drawPolyline(poly)
        p.end()

    def _draw_frame(self, pal: QPalette) -> tuple[QPixmap, QRectF]:
        dpr = self.devicePixelRatioF()
        pix = QPixmap(int(self.width() * dpr), int(self.height() * dpr))
        pix.setDevicePixelRatio(dpr)
        p = QPainter(pix)
        p.setFont(self.font())
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        fg = pal.color(QPalette.ColorRole.Text)
        fm = p.fontMetrics()
        lh = fm.height()
        left, right, top, bottom = fm.horizontalAdvance("0000.0") + 8, 12, lh + 10, 2 * lh + 10
        area = QRectF(left, top, max(10, self.width() - left - right), max(10, self.height() - top - bottom))
        p.setPen(fg)
        p.drawText(QRectF(0, 2, self.width(), lh + 4), Qt.AlignmentFlag.AlignHCenter,
                   fm.elidedText(self.title, Qt.TextElideMode.ElideRight, self.width() - 8))
        if self.shows_empty:  # what will appear here, not axes of nothing
            p.drawText(QRectF(12, top, self.width() - 24, self.height() - top - 10),
                       Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, self.empty)
            p.end()
            return pix, area
        grid = QColor(fg)
        grid.setAlpha(50)
        for v in _ticks(self.y_max):  # y ticks and grid, at round values
            y = area.bottom() - v / self.y_max * area.height()
            p.setPen(grid)
            p.drawLine(QPointF(area.left(), y), QPointF(area.right(), y))
            p.setPen(fg)
            p.drawText(QRectF(0, y - lh / 2, left - 4, lh), Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                       f"{v:.4g}")
        for v in _ticks(self.x_max):  # x ticks
            x = area.left() + v / self.x_max * area.width()
            p.drawText(QRectF(x - 40, area.bottom() + 2, 80, lh), Qt.AlignmentFlag.AlignHCenter, f"{v:.3g}")
        p.drawText(QRectF(0, self.height() - lh - 2, self.width(), lh), Qt.AlignmentFlag.AlignHCenter, self.x_label)
        p.save()
        p.translate(2, area.center().y())
        p.rotate(-90)
        p.drawText(QRectF(-area.height() / 2, 0, area.height(), lh), Qt.AlignmentFlag.AlignHCenter, self.y_label)
        p.restore()
        p.drawRect(area)
        p.end()
        return pix, area
