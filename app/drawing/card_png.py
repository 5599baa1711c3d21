"""The result card and its place among the community's results as PNG pictures, drawn with Qt's
QPainter on an image: no window (offscreen where no Qt application runs yet). Beside the CLI and
the window, which both use it (``mtp-tuner card --png``, the Results tab's card dialog), so the
picture shown is the picture saved.

    img = render_card(card)                 # app.core.verdict.card.Card
    img = render_placement(standing)        # app.core.analysis.community.Standing
    save_png(img, "card.png"); png_bytes(img)
"""

from __future__ import annotations

import math
import os
from typing import Callable, TypeVar

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QGuiApplication, QImage, QPainter, QPen

from app.core.analysis.community import Standing
from app.core.analysis.community_cells import plottable
from app.core.common.atomic import atomic_path
from app.core.common.units import ratio
from app.core.verdict.card import ALL_TASKS, METHOD, Card, model_text, setup_line, speedup_text

W = 1000
_APP: list[QGuiApplication] = []  # the offscreen application this module made, kept alive
COLOR = {"faster": QColor("#2e7d32"), "slower": QColor("#c62828"), "within noise": QColor("#757575")}
INK, GREY, USER = QColor("#212121"), QColor("#9e9e9e"), QColor("#ef6c00")


def ensure_qt() -> None:
    """A Qt application for fonts and painting: the window's, else one made offscreen (a widgets
    one: a window or pytest-qt may come after it in the same process, and need one)."""
    if QGuiApplication.instance() is None:
        from PySide6.QtWidgets import QApplication  # only where no application runs yet

        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # a picture needs no display
        _APP.append(QApplication(["mtp-tuner"]))


def _font(size: int, bold: bool = False) -> QFont:
    f = QFont("DejaVu Sans")
    f.setPixelSize(size)
    f.setBold(bold)
    return f


def _image(h: int) -> tuple[QImage, QPainter]:
    ensure_qt()
    img = QImage(W, h, QImage.Format.Format_ARGB32)
    img.fill(QColor("white"))
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    return img, p


T = TypeVar("T")  # what a drawing returns


def _painted(h: int, draw: Callable[[QPainter], T]) -> tuple[QImage, T]:
    """An image ``h`` high with ``draw(painter)`` on it, and what draw returned. The painter ends
    also when drawing fails: one left active on an image that is freed crashes Qt."""
    img, p = _image(h)
    try:
        return img, draw(p)
    finally:
        p.end()


def _text(p: QPainter, x: float, y: float, w: float, text: str, size: int = 13, color: QColor = INK,
          bold: bool = False, align: Qt.AlignmentFlag = Qt.AlignmentFlag.AlignLeft) -> float:
    """Wrapped text from (x, y) in width w; returns the height it took."""
    p.setFont(_font(size, bold))
    p.setPen(color)
    r = p.boundingRect(QRectF(x, y, w, 2000), int(align) | int(Qt.TextFlag.TextWordWrap), text)
    p.drawText(QRectF(x, y, w, r.height()), int(align) | int(Qt.TextFlag.TextWordWrap), text)
    return r.height()


def ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick values from lo to hi, about n of them."""
    if not (hi > lo):
        return [lo]
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if step * m >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


# -- the card ---------------------------------------------------------------------------------
LO, HI = 0.25, 4.0  # the speedup axis (log); intervals beyond it end in an arrow


def render_card(card: Card) -> QImage:
    """Speedup per mode/K per task with 95 % intervals and acceptance, the set-up line, the method."""
    tasks = list(dict.fromkeys(c.task for c in card.cells))
    h = 150 + sum(34 + 26 * sum(1 for c in card.cells if c.task == t) for t in tasks) + 110 + 20 * len(card.warnings)
    img, y = _painted(h, lambda p: _draw_card(p, card, tasks))
    return img.copy(0, 0, W, min(h, int(y) + 16))  # the height used, not the estimate


def render_intervals(card: Card) -> QImage:
    """The card's middle: each task's speedup per mode/K with its 95 % interval, on one log axis
    (the Results tab shows it under the verdict)."""
    tasks = list(dict.fromkeys(c.task for c in card.cells))
    h = 20 + sum(34 + 26 * sum(1 for c in card.cells if c.task == t) for t in tasks) + 40
    img, y = _painted(h, lambda p: _draw_intervals(p, card, tasks, 10.0))
    return img.copy(0, 0, W, min(h, int(y) + 8))


def _draw_card(p: QPainter, card: Card, tasks: list[str]) -> float:
    """render_card's drawing; the height it used."""
    y = 20.0
    y += _text(p, 24, y, W - 48, f"MTP speedup · {model_text(card)}", 22, bold=True) + 4
    y += _text(p, 24, y, W - 48, setup_line(card), 13, QColor("#424242")) + 14
    y = _draw_intervals(p, card, tasks, y)
    best = next((r for r in card.rows if r.task == ALL_TASKS), card.rows[0] if card.rows else None)
    if best is not None and best.speedup is not None:
        k = f" K={best.n_max}" if best.n_max else ""
        y += _text(p, 24, y, W - 48, f"best over {best.task}: {best.mode}{k} at {speedup_text(best)} "
                   f"({best.verdict}), {best.reps} repetitions", 13, bold=True) + 4
    for w in card.warnings:
        y += _text(p, 24, y, W - 48, f"warning: {w}", 12, QColor("#e65100"))
    return y + 4 + _text(p, 24, y + 4, W - 48, f"MTP Tuner · {METHOD}", 11, QColor("#757575"))


def _draw_intervals(p: QPainter, card: Card, tasks: list[str], y: float) -> float:
    """Each task's arms with their intervals from ``y`` down, and the axis; where it ended."""
    x0, x1 = 250.0, W - 330.0
    top = y

    def sx(v: float) -> float:
        v = min(max(v, LO), HI)
        return x0 + (x1 - x0) * (math.log(v) - math.log(LO)) / (math.log(HI) - math.log(LO))

    for t in tasks:
        row = next((r for r in card.rows if r.task == t), None)
        base = f" · baseline {row.baseline_tok_s:.1f} tok/s" if row and row.baseline_tok_s else ""
        _text(p, 24, y + 6, W - 48, f"{t}{base}", 15, bold=True)
        y += 34
        for c in (c for c in card.cells if c.task == t):
            col = COLOR.get(c.verdict, GREY)
            _text(p, 40, y + 3, x0 - 50, c.arm, 13)
            if c.speedup is not None:
                if c.lo is not None and c.hi is not None:
                    p.setPen(QPen(col, 2))
                    p.drawLine(QPointF(sx(c.lo), y + 12), QPointF(sx(c.hi), y + 12))
                    for v, end in ((c.lo, sx(c.lo)), (c.hi, sx(c.hi))):
                        if LO < v < HI:
                            p.drawLine(QPointF(end, y + 7), QPointF(end, y + 17))
                        else:  # beyond the axis: an arrow head
                            d = -6 if v <= LO else 6
                            p.drawLine(QPointF(end, y + 12), QPointF(end - d, y + 7))
                            p.drawLine(QPointF(end, y + 12), QPointF(end - d, y + 17))
                p.setPen(Qt.PenStyle.NoPen)
                p.setBrush(col)
                p.drawEllipse(QPointF(sx(c.speedup), y + 12), 6, 6)
            acc = f" · acc {100 * c.acceptance:.0f} %" if c.acceptance is not None else ""
            _text(p, x1 + 16, y + 3, W - x1 - 30, f"{speedup_text(c)}{acc} · {c.verdict}", 12, col)
            y += 26
    p.setPen(QPen(GREY, 1, Qt.PenStyle.DashLine))
    p.drawLine(QPointF(sx(1.0), top), QPointF(sx(1.0), y))
    p.setPen(QPen(GREY, 1))
    p.drawLine(QPointF(x0, y + 4), QPointF(x1, y + 4))
    for v in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0):
        p.drawLine(QPointF(sx(v), y + 4), QPointF(sx(v), y + 9))
        _text(p, sx(v) - 30, y + 10, 60, f"{v:g}x", 11, QColor("#616161"), align=Qt.AlignmentFlag.AlignHCenter)
    return y + 34


# -- the placement ----------------------------------------------------------------------------
def render_placement(s: Standing, title: str = "Your result among the community's") -> QImage:
    """Speedup against ``s.axis``: the table's rows (hollow: flagged), yours highlighted. Only
    points within the plausible ranges are drawn (community_cells.plottable), whatever made
    ``s``; the parser refuses other rows already."""
    points = [q for q in s.points if plottable(q[0], q[1])]
    user = s.user if s.user and plottable(s.user[0], s.user[1]) else None
    return _painted(560 + 18 * (s.text.count("\n") + 1), lambda p: _draw_placement(p, s, points, user, title))[0]


def _draw_placement(p: QPainter, s: Standing, points: list[tuple[float, float, bool, str]],
                    user: tuple[float, float, str] | None, title: str) -> None:
    _text(p, 24, 16, W - 48, title, 20, bold=True)
    x0, x1, y0, y1 = 80.0, W - 40.0, 60.0, 470.0
    xs = [q[0] for q in points] + ([user[0]] if user else [])
    ys = [q[1] for q in points] + ([user[1]] if user else []) + [1.0]
    if not xs:
        xs = [0.0, 1.0]
    xlo, xhi = 0.0, max(xs) * 1.08
    ylo, yhi = min(min(ys) * 0.92, 0.9), max(ys) * 1.06

    def px(v: float) -> float:
        return x0 + (x1 - x0) * (v - xlo) / (xhi - xlo or 1)

    def py(v: float) -> float:
        return y1 - (y1 - y0) * (v - ylo) / (yhi - ylo or 1)

    p.setPen(QPen(QColor("#eeeeee"), 1))
    for v in ticks(xlo, xhi):
        p.drawLine(QPointF(px(v), y0), QPointF(px(v), y1))
        _text(p, px(v) - 40, y1 + 6, 80, f"{v:g}", 11, QColor("#616161"), align=Qt.AlignmentFlag.AlignHCenter)
        p.setPen(QPen(QColor("#eeeeee"), 1))
    for v in ticks(ylo, yhi):
        p.drawLine(QPointF(x0, py(v)), QPointF(x1, py(v)))
        _text(p, 10, py(v) - 8, 62, f"{v:g}x", 11, QColor("#616161"), align=Qt.AlignmentFlag.AlignRight)
        p.setPen(QPen(QColor("#eeeeee"), 1))
    p.setPen(QPen(GREY, 1, Qt.PenStyle.DashLine))
    p.drawLine(QPointF(x0, py(1.0)), QPointF(x1, py(1.0)))
    p.setPen(QPen(INK, 1))
    p.drawRect(QRectF(x0, y0, x1 - x0, y1 - y0))
    _text(p, x0, y1 + 24, x1 - x0, s.axis, 13, align=Qt.AlignmentFlag.AlignHCenter)
    for x, y, ok, _name in points:
        p.setPen(QPen(QColor("#1565c0"), 1.5))
        p.setBrush(QColor("#64b5f6") if ok else Qt.BrushStyle.NoBrush)
        p.drawEllipse(QPointF(px(x), py(y)), 5, 5)
    if user:
        ux, uy, label = user
        p.setPen(QPen(INK, 1.5))
        p.setBrush(USER)
        p.drawEllipse(QPointF(px(ux), py(uy)), 10, 10)
        left = px(ux) > x1 - 300  # near the right edge: the label goes left of the point
        _text(p, px(ux) - 314 if left else px(ux) + 14, py(uy) - 10, 300, f"{label}: {ratio(uy)}", 14, USER,
              bold=True, align=Qt.AlignmentFlag.AlignRight if left else Qt.AlignmentFlag.AlignLeft)
    y = y1 + 50
    _text(p, 24, y, W - 48, "speedup over baseline (y) · filled: rows measured as this tool trusts · hollow: "
          "flagged (no repetitions, -np > 1, no build) · orange: yours", 12, QColor("#424242"))
    _text(p, 24, y + 24, W - 48, s.text, 12)


def png_bytes(img: QImage) -> bytes:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    img.save(buf, "PNG")  # type: ignore[call-overload]  # the stub says bytes; PySide6 takes only a str
    buf.close()
    return bytes(data.data())


def save_png(img: QImage, path: str) -> None:
    """Written atomically; an OSError when it cannot be (the caller names the file)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(png_bytes(img))
