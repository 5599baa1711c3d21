"""The layout of the Sweep form's Advanced level: the toggle that opens it, and its groups in three
columns of two, in a scroll area of bounded height (opened, it never makes the window wider or
taller than a 1280x720 screen, and the plots keep their room) that shows at least ADVANCED_ROWS
rows of its form (with the command box open too, the part above the plots scrolls instead). The
form says which widgets go in which group.

Its table of server flags as axes (``AxesTable``, in "Engine and threads"): a llama-server flag and
its values per row, e.g. ``-ub`` and ``256,512``, the same axes as ``bench --axis``
(app.core.measure.axes): the whole sweep once per value, each judged on its own and the best
joint setting picked. Read and checked against the llama-server that will run them when the sweep
starts (``checked``)."""

from __future__ import annotations

from typing import Callable, Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QFormLayout, QFrame, QGridLayout, QGroupBox, QHeaderView,
                               QLayout, QLineEdit, QScrollArea, QSpinBox, QStyle, QTableWidget, QTableWidgetItem,
                               QToolButton, QVBoxLayout, QWidget)

from app.core.engines.base import EngineSettings
from app.core.measure.axes import Axis, check_axes, parse_axis

ADVANCED_MAX_H = 300  # px: the Advanced groups scroll beyond this
ADVANCED_ROWS = 4  # the form rows Advanced shows at least, however little room the tab has (then the tab scrolls)
COLUMN_OF = {"Modes and drafter": 0, "Draft widths": 0, "Runs": 1, "Engine and threads": 1,
             "Sampler and thinking": 2, "Context": 2}  # two groups a column, of like heights

Groups = Sequence[tuple[str, Sequence[tuple[str, QWidget | QLayout]]]]


def toggle_button() -> QToolButton:
    """The "Advanced settings" toggle, closed."""
    b = QToolButton()
    b.setText("Advanced settings")
    b.setCheckable(True)
    b.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    b.setArrowType(Qt.ArrowType.RightArrow)
    b.setToolTip("Modes and drafter, draft widths, runs, sampler and thinking, context, engine and threads")
    return b


def scroll_area(groups: Groups) -> tuple[QScrollArea, dict[str, QGroupBox]]:
    """The groups (title, its rows of label and widget), each in its column, in a hidden scroll
    area; with the group boxes by title."""
    inner = QWidget()
    grid = QGridLayout(inner)
    grid.setContentsMargins(0, 0, 0, 0)
    boxes: dict[str, QGroupBox] = {}
    columns = [QVBoxLayout() for _ in range(3)]
    for title, rows in groups:
        box = QGroupBox(title)
        form = QFormLayout(box)
        for label, w in rows:
            form.addRow(label, w)
        boxes[title] = box
        columns[COLUMN_OF[title]].addWidget(box)
    for i, col in enumerate(columns):
        col.addStretch(1)
        grid.addLayout(col, 0, i)
    area = QScrollArea()
    area.setWidget(inner)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setMaximumHeight(ADVANCED_MAX_H)
    # at least ADVANCED_ROWS rows of its form (a field's height and the form's spacing each): with
    # the command box open too, the tab above the plots scrolls rather than squeeze Advanced to a strip
    area.setMinimumHeight(min(ADVANCED_MAX_H, rows_height(inner, ADVANCED_ROWS)))
    area.setVisible(False)
    return area, boxes


def rows_height(inner: QWidget, rows: int) -> int:
    """The height of a group showing its title and ``rows`` rows of its form: a row is its
    tallest field (a spin box or a choice) and the style's spacing between rows."""
    field = max(w.sizeHint().height() for w in (QSpinBox(), QComboBox(), QLineEdit()))  # never shown
    box = QGroupBox("Runs")
    QFormLayout(box)
    title = box.sizeHint().height()  # its title and margins, no row
    spacing = max(inner.style().pixelMetric(QStyle.PixelMetric.PM_LayoutVerticalSpacing), 0)
    return title + rows * field + (rows - 1) * spacing


AXIS_ROWS = 2  # two axes fit the row; more come from the CLI
AXES_TIP = ("A llama-server flag measured at several values, e.g. -ub with 256,512 or --n-cpu-moe with 20,24,28: "
       "the whole sweep, its baseline included, once per value on llama-server (with your command's flags, if "
       "given); the verdict judges each value and picks the best flag value and K together, against your "
       "command as it is (your own value of the flag, else the first)")


class AxesTable(QTableWidget):
    """Rows of (flag, values); ``changed`` is called on every edit."""

    def __init__(self, changed: Callable[[], None]) -> None:
        super().__init__(AXIS_ROWS, 2)
        self.setHorizontalHeaderLabels(["Flag", "Values"])
        header = self.horizontalHeader()
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.setColumnWidth(0, 88)  # room for --n-cpu-moe
        self.setMinimumWidth(150)
        self.verticalHeader().setVisible(False)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        for r in range(AXIS_ROWS):
            for c in range(2):
                self.setItem(r, c, QTableWidgetItem(""))
        self.setFixedHeight(header.sizeHint().height() + AXIS_ROWS * self.rowHeight(0) + 2 * self.frameWidth())
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setToolTip(AXES_TIP)
        self.itemChanged.connect(lambda *_: changed())

    def texts(self) -> list[str]:
        """Each filled row as ``--axis`` text, ``-ub=256,512``."""
        out = []
        for r in range(AXIS_ROWS):
            flag, values = ((it.text().strip() if (it := self.item(r, c)) else "") for c in range(2))
            if flag or values:
                out.append(f"{flag}={values}")
        return out

    def set_texts(self, texts: list[str]) -> None:
        for r in range(AXIS_ROWS):
            flag, _, values = (texts[r] if r < len(texts) else "").partition("=")
            for c, text in enumerate((flag, values)):
                item = self.item(r, c)
                if item is not None:
                    item.setText(text)

    def checked(self, settings: EngineSettings) -> tuple[Axis, ...]:
        """The rows' axes, checked against the llama-server of ``settings`` (its binary, the
        user's flags); a UserError naming the first problem. No rows: ()."""
        texts = self.texts()
        if not texts:
            return ()
        from app.core.engines.server.binary import find_server_binary, probe_capabilities  # runs --help once

        axes = [parse_axis(t) for t in texts]
        return check_axes(axes, probe_capabilities(find_server_binary(settings.server_bin)), settings.user_args or ())
