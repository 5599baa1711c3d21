"""Small shared pieces of the window: read-only tables, combo boxes that elide long entries, a
toggle that lets one part of a splitter take the whole pane, and plots that follow the light/dark
palette, keep their legend outside the data, colour a task the same in every plot and every sweep
(task_color), and say what will appear while they have nothing to show."""

from __future__ import annotations

import math
import zlib
from typing import Any, Mapping, Sequence

import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSize, QTimer, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QGraphicsItem, QGraphicsTextItem, QHeaderView,
                               QFrame, QScrollArea, QSizePolicy, QSplitter, QTableWidget, QTableWidgetItem, QToolButton,
                               QVBoxLayout, QWidget)

from app.core.common.text import printable
from app.core.machine.modelinfo import size_text

BASELINE_COLOR = "#888888"
# One colour per task name, the same in every plot and every sweep (never by the order of the
# tasks): the built-in suites and the common names first, any other name from its hash.
TASK_COLORS = {"code": "#1f77b4", "story": "#ff7f0e", "tongue-twister": "#2ca02c", "edit": "#17a589",
               "chat": "#9467bd", "my prompts": "#8c564b", "mine": "#8c564b", "custom": "#8c564b", "math": "#17becf",
               "translation": "#bcbd22", "summary": "#e377c2", "qa": "#393b79"}
OTHER_COLORS = ("#d62728", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
                "#756bb1", "#636363", "#ad494a", "#6b6ecf")
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
LEGEND_CHARS = 22  # a legend entry longer than this is elided (the plot's tooltip and tables name it whole)

_plots: list[pg.PlotWidget] = []  # every plot made by make_plot, re-coloured when the OS palette changes


def task_color(task: str) -> str:
    """The colour of a task in every plot: fixed for the known names (case and spaces ignored),
    else picked by a stable hash of the name (crc32: the same in every process, unlike hash())."""
    key = " ".join(str(task).lower().replace("_", " ").split())
    if key in TASK_COLORS:
        return TASK_COLORS[key]
    if key.replace(" ", "-") in TASK_COLORS:
        return TASK_COLORS[key.replace(" ", "-")]
    return OTHER_COLORS[zlib.crc32(key.encode()) % len(OTHER_COLORS)]


def table(headers: Sequence[str], tips: dict[int, str] | None = None) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(list(headers))
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.verticalHeader().setVisible(False)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    t.horizontalHeader().setStretchLastSection(True)
    for col, tip in (tips or {}).items():
        item = t.horizontalHeaderItem(col)
        assert item is not None  # setHorizontalHeaderLabels made one per column
        item.setToolTip(tip)
    return t


def fill(t: QTableWidget, rows: Sequence[Sequence[object]], tips: Sequence[str | None] | None = None) -> None:
    t.setRowCount(len(rows))
    for r, row in enumerate(rows):
        for c, v in enumerate(row):
            item = QTableWidgetItem("" if v is None else printable(v, one_line=True))
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
            if tips and tips[r]:
                item.setToolTip(printable(tips[r]))
            t.setItem(r, c, item)


def elide_combo(box: QComboBox, chars: int = 24) -> QComboBox:
    """A combo box whose width never follows its longest entry (a results file's name made the
    window wider than a laptop's screen): sized for ``chars`` characters, the shown entry elided by
    the style, the list's entries elided in the middle (where names that share a start and an end
    differ), each entry's whole text as its tooltip."""
    box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    box.setMinimumContentsLength(chars)
    box.view().setTextElideMode(Qt.TextElideMode.ElideMiddle)
    model = box.model()

    def tips(_parent: object, first: int, last: int) -> None:
        for row in range(first, last + 1):
            index = model.index(row, box.modelColumn())
            if not model.data(index, Qt.ItemDataRole.ToolTipRole):
                model.setData(index, model.data(index, Qt.ItemDataRole.DisplayRole), Qt.ItemDataRole.ToolTipRole)

    model.rowsInserted.connect(tips)
    if box.count():
        tips(None, 0, box.count() - 1)
    return box


def whole_pane_toggle(splitter: QSplitter, keep: QWidget, text: str = "Whole pane") -> QToolButton:
    """A checkable button: checked, ``keep`` (a widget in ``splitter``, or one inside it) takes the
    whole pane (the splitter's other parts hidden); unchecked, they come back as they were."""
    btn = QToolButton()
    btn.setText(text)
    btn.setCheckable(True)
    btn.setToolTip("Show this part alone in the window's pane (press again to bring the others back)")

    def toggled(on: bool) -> None:
        for i in range(splitter.count()):
            w = splitter.widget(i)
            if w is not None and w is not keep and not w.isAncestorOf(keep):
                w.setVisible(not on)

    btn.toggled.connect(toggled)
    return btn


def is_dark() -> bool:
    app = QGuiApplication.instance()
    if not isinstance(app, QGuiApplication):  # none yet, or one without a GUI: no palette to read
        return False
    try:
        scheme = app.styleHints().colorScheme()
        if scheme == Qt.ColorScheme.Dark:
            return True
        if scheme == Qt.ColorScheme.Light:
            return False
    except AttributeError:  # Qt < 6.5
        pass
    return app.palette().color(QPalette.ColorRole.Window).lightness() < 128


def _colors() -> tuple[QColor, QColor]:
    pal = QGuiApplication.palette()
    bg = pal.color(QPalette.ColorRole.Base)
    fg = pal.color(QPalette.ColorRole.Text)
    if is_dark() and bg.lightness() >= 128:  # the OS says dark, the Qt style has no dark palette
        bg, fg = bg.fromRgb(30, 30, 30), fg.fromRgb(220, 220, 220)
    return bg, fg


def _style(pw: pg.PlotWidget) -> None:
    bg, fg = _colors()
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
    empty = getattr(pw, "empty_item", None)
    if empty is not None:
        empty.setDefaultTextColor(fg)


class SideLegend(pg.LegendItem):
    """A legend in the plot's own layout, right of the data (never over it): it takes the width
    of its entries and the plot area what is left. Entries longer than LEGEND_CHARS are elided.
    Compact (8 pt, rows close together), and it never makes the plot taller than its widget: in a
    plot too short for every entry the entries close up instead of pushing the x axis out of view."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(offset=None, verSpacing=-6, labelTextSize="8pt", **kwargs)
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Maximum)  # its entries' size, at the top
        self.setMinimumHeight(0)

    def addItem(self, item: Any, name: object) -> None:  # noqa: N802 (pyqtgraph's name)
        name = str(name)
        super().addItem(item, name if len(name) <= LEGEND_CHARS else name[:LEGEND_CHARS - 1] + "…")

    def updateSize(self) -> None:  # noqa: N802: the plot's layout sizes it (pyqtgraph's would move it to 0,0)
        self.layout.invalidate()
        self.updateGeometry()

    def mouseDragEvent(self, ev: Any) -> None:  # noqa: N802: it stays where the layout put it
        ev.ignore()

    def hoverEvent(self, ev: Any) -> None:  # noqa: N802
        pass


class EdgeAxis(pg.AxisItem):
    """An axis whose end labels may reach a little past its ends (pyqtgraph drops a label that
    leaves the axis, e.g. an n-gram mode's name under the last column, or 100 % at the top)."""

    def boundingRect(self) -> QRectF:  # noqa: N802 (Qt's name)
        r: QRectF = super().boundingRect()
        return r.adjusted(-40, 0, 40, 0) if self.orientation in ("top", "bottom") else r.adjusted(0, -8, 0, 8)


def side_legend(pw: pg.PlotWidget) -> SideLegend:
    """The plot's legend, in the column right of its data area (made once)."""
    pi = pw.getPlotItem()
    legend = pi.legend
    if not isinstance(legend, SideLegend):
        legend = SideLegend()
        pi.layout.addItem(legend, 2, 3, 2, 1)  # beside the data and the x axis
        pi.layout.setAlignment(legend, Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        pi.legend = legend
        # the title over the data and the legend together: a long title does not push the legend
        # out of the widget (a label's minimum width is its text's)
        pi.layout.removeItem(pi.titleLabel)
        pi.layout.addItem(pi.titleLabel, 0, 1, 1, 3)
    return legend


def make_plot(title: str, bottom: str, left: str, *, bottom_units: str | None = None,
              left_units: str | None = None, legend: bool = True, tip: str | None = None,
              empty: str | None = None) -> pg.PlotWidget:
    """A plot widget: axes, grid, the legend right of the data, and while no data item has a
    point, ``empty`` (what will appear, and when) in place of the axes."""
    pw = pg.PlotWidget(title=title, axisItems={"bottom": EdgeAxis("bottom"), "left": EdgeAxis("left")})
    pw.setLabel("bottom", bottom, units=bottom_units)
    pw.setLabel("left", left, units=left_units)
    pw.showGrid(x=True, y=True, alpha=0.2)
    # axes and title change only with the range: repaint them from a pixmap, not through Python
    for name in ("left", "bottom"):
        pw.getAxis(name).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
    if legend:
        side_legend(pw)
    if tip:
        pw.setToolTip(tip)
    _empty_state(pw, empty or f"{title}: appears here once there is data to show")
    _style(pw)
    _plots.append(pw)
    pw.destroyed.connect(lambda *_: _plots.remove(pw) if pw in _plots else None)
    return pw


def _empty_state(pw: pg.PlotWidget, message: str) -> None:
    """``message`` centred on the plot, axes and items hidden, while none of its data items has a
    point; checked once per event-loop turn after any of them changed (items added later too)."""
    pi, vb = pw.getPlotItem(), pw.getPlotItem().vb
    text = QGraphicsTextItem(vb)  # a child of the view box, not of its data: not moved by the range
    text.setZValue(1000)
    pw.empty_item, pw.empty_message = text, message
    pending = [False]

    def place() -> None:
        r = vb.boundingRect()
        text.setTextWidth(max(80.0, r.width() - 24))
        br = text.boundingRect()
        text.setPos(r.center().x() - br.width() / 2, r.center().y() - br.height() / 2)

    def check() -> None:
        pending[0] = False
        try:
            empty = not has_data(pw)
        except RuntimeError:  # deleted
            return
        if empty == text.isVisible():
            return
        text.setVisible(empty)
        vb.childGroup.setOpacity(0.0 if empty else 1.0)  # hidden, their visibility left as it is
        for name in ("left", "bottom"):
            pi.showAxis(name, not empty)
        if empty:
            place()

    def changed(*_a: object) -> None:
        if not pending[0]:
            pending[0] = True
            QTimer.singleShot(0, check)

    def watch(item: Any) -> None:
        for sig in ("sigPlotChanged", "visibleChanged"):  # new points, or a task's line hidden or shown
            s = getattr(item, sig, None)
            if s is not None:
                s.connect(changed)
        changed()

    add, remove, clear = pi.addItem, pi.removeItem, pi.clear

    def add_item(item: Any, *args: Any, **kwargs: Any) -> None:
        add(item, *args, **kwargs)
        watch(item)

    def remove_item(item: Any) -> None:
        remove(item)
        changed()

    def clear_items() -> None:
        clear()
        changed()

    pi.addItem, pi.removeItem, pi.clear = add_item, remove_item, clear_items
    # the widget bound the plot item's own methods when it was made: items added through it are watched too
    pw.addItem, pw.removeItem, pw.clear = add_item, remove_item, clear_items
    vb.sigResized.connect(lambda *_: place() if text.isVisible() else None)
    set_empty_message(pw, message)
    text.setVisible(False)  # check() shows it (and hides the axes) now that it differs
    pw.check_empty = check
    check()


def set_empty_message(pw: pg.PlotWidget, message: str) -> None:
    """What an empty plot says (e.g. why this sweep has nothing for it)."""
    pw.empty_message = message
    pw.empty_item.setHtml(f"<div align='center'>{_html(message)}</div>")


def _html(s: str) -> str:
    return printable(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def has_data(pw: pg.PlotWidget) -> bool:
    """Whether any visible data item of the plot has a point."""
    for item in pw.getPlotItem().listDataItems():
        if not item.isVisible():
            continue
        xs = item.getData()[0] if hasattr(item, "getData") else None
        if xs is not None and len(xs):
            return True
    return False


def is_empty_shown(pw: pg.PlotWidget) -> bool:
    """Whether the plot shows its empty-state message (the check runs first)."""
    pw.check_empty()
    item: QGraphicsTextItem = pw.empty_item
    return item.isVisible()


def restyle_plots() -> None:
    for pw in list(_plots):
        try:
            _style(pw)
        except RuntimeError:  # deleted
            _plots.remove(pw)


def follow_os_palette(app: QGuiApplication) -> None:
    """Re-colour plots when the OS switches between light and dark."""
    try:
        app.styleHints().colorSchemeChanged.connect(lambda *_: restyle_plots())
    except AttributeError:  # Qt < 6.5
        pass


def gib(b: int | float | None) -> str:
    return "?" if b is None else size_text(b)


# -- axes with round ticks -----------------------------------------------------------------------
def nice_step(span: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 x 10^n) giving about ``ticks`` ticks over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    e: float = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * e * 1.0001:
            return m * e
    return 10 * e


def minor_step(step: float) -> float:
    """The minor ticks' step under a round ``step``, itself written with no more digits (half of
    1 or 2 x 10^n, a fifth of 5 x 10^n: never 0.25 under 0.5, which labels as 0.8 or 1.2)."""
    mantissa = round(step / 10 ** math.floor(math.log10(step)), 6)
    return step / 5 if mantissa == 5 else step / 2


def set_tick_step(pw: pg.PlotWidget, step: float, axis: str = "left") -> None:
    pw.getAxis(axis).setTickSpacing(step, minor_step(step))


def nice_range(lo: float, hi: float, ticks: int = 5) -> tuple[float, float, float]:
    """(lo, hi, step): [lo, hi] widened to whole multiples of a round step."""
    step = nice_step(hi - lo, ticks)
    return math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step, step


def percent_axis(pw: pg.PlotWidget, axis: str = "left") -> None:
    """A share axis fixed at 0-100 % with ticks every 20 % (never autoscaled: 95.5-96.5 % is no
    cliff); a margin of 7 % each side, so that a point at 0 or 100 shows whole and the 0 and 100
    labels are drawn (pyqtgraph drops a label that would leave the data area)."""
    if axis == "left":
        pw.setYRange(-7, 107, padding=0)
        pw.getPlotItem().vb.enableAutoRange(y=False)
    else:
        pw.setXRange(-7, 107, padding=0)
        pw.getPlotItem().vb.enableAutoRange(x=False)
    pw.getAxis(axis).setTickSpacing(20, 10)


def set_nice_range(pw: pg.PlotWidget, lo: float, hi: float, axis: str = "left", ticks: int = 5) -> tuple[float, float]:
    """The axis fixed at [lo, hi] widened to round ticks; returns the range set."""
    a, b, step = nice_range(lo, hi, ticks)
    if axis == "left":
        pw.setYRange(a, b, padding=0)
    else:
        pw.setXRange(a, b, padding=0)
    set_tick_step(pw, step, axis)
    return a, b


def show_task_lines(plot: pg.PlotWidget, lines: dict[str, pg.PlotDataItem],
                    series: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> None:
    """One line per task on ``plot`` (x, y per task in ``series``), from ``lines``: items made once
    per task and reused (hidden when a task has none now), the legend rebuilt; each task in its
    own colour (task_color)."""
    legend = plot.getPlotItem().legend
    if legend is not None:
        legend.clear()
    for item in lines.values():
        item.setData([], [])
        item.setVisible(False)
    for task, (xs, ys) in series.items():
        item = lines.get(task)
        if item is None:
            col = task_color(task)
            item = lines[task] = plot.plot([], [], pen=pg.mkPen(col, width=2), symbol="o", symbolBrush=col)
        item.setData(xs, ys)
        item.setVisible(True)
        if legend is not None:
            legend.addItem(item, task)



class _WholeHint(QScrollArea):
    """A scroll area that asks for its content's whole size (Qt's caps it at 24 lines): it scrolls
    only where the window has less room than that."""

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        w = self.widget()
        return w.sizeHint() if w is not None else super().sizeHint()


class _ToTheView(QVBoxLayout):
    """A layout that claims no height for its width: a scroll area then sizes its content to the
    view (down to the content's minimum), so what scrolls inside it shrinks first."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt's name)
        return False


def scroll_box(to_the_view: bool = False) -> tuple[QScrollArea, QVBoxLayout]:
    """A frameless scroll area that its content fills, and the content's layout: what it holds may
    be taller than the window (the command box and Advanced settings open on a 1280x720 screen)
    and scrolls inside it instead of making the window taller than the screen. ``to_the_view``:
    the content is as tall as the view allows (its own scroll areas shrink first), not as tall as
    its wrapped text asks."""
    content = QWidget()
    area = _WholeHint()
    area.setWidget(content)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    return area, (_ToTheView if to_the_view else QVBoxLayout)(content)


def scrolling_page(page: QWidget) -> QVBoxLayout:
    """``page``'s layout for its content, all of it in a scroll_box that fills the page."""
    area, lay = scroll_box()
    outer = QVBoxLayout(page)
    outer.setContentsMargins(0, 0, 0, 0)
    outer.addWidget(area)
    return lay
