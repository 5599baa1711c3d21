"""The layout of the Sweep form's Advanced level: the toggle that opens it, and its groups in three
columns of two, in a scroll area of bounded height (opened, it never makes the window wider or
taller than a 1280x720 screen, and the plots keep their room). The form says which widgets go in
which group."""

from __future__ import annotations

from typing import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFormLayout, QFrame, QGridLayout, QGroupBox, QLayout, QScrollArea, QToolButton, QVBoxLayout, QWidget

ADVANCED_MAX_H = 300  # px: the Advanced groups scroll beyond this
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
    area.setVisible(False)
    return area, boxes
