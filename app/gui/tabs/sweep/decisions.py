"""The Sweep tab's decision panel: per task, live, where the sweep stands toward a decision
("code: decided, K=2 1.38x ±4 %", "story: undecided, off vs K=1, about 1 min"), from the
session's Decisions events; the ETA counts down to *decided*. And the budget choice of an
adaptive sweep (Quick: about 2 minutes; Thorough: until decided)."""

from __future__ import annotations

import html

from PySide6.QtWidgets import QComboBox, QLabel, QVBoxLayout, QWidget

from app.core.analysis.decide import about, describe
from app.core.session.adaptive import MIX
from app.core.session.events import Decisions

QUICK_S = 120.0  # "Quick (about 2 min)"
BUDGETS = {"Thorough (until decided)": None, "Quick (about 2 min)": QUICK_S}
STOPPED = {"decided": "every task is decided", "budget": "the time budget ran out",
           "max_reps": "the repetitions ran out", "cancelled": "cancelled"}
DECIDED, UNDECIDED = "#2e7d32", "#b26a00"  # green, amber


def budget_box() -> QComboBox:
    box = QComboBox()
    box.addItems(list(BUDGETS))
    box.setToolTip("Adaptive sweep: Thorough runs until every task is decided (its pick's interval within ±5 % "
                   "and clear of the others, or every setting below baseline); Quick stops after about 2 "
                   "minutes and says what is decided and what is not")
    return box


class DecisionPanel(QWidget):
    """One line per task, green when decided, amber while not, under a headline with the ETA."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.head = QLabel("")
        self.lines = QLabel("")
        self.lines.setTextFormat(self.lines.textFormat().RichText)
        self.lines.setWordWrap(True)
        lay.addWidget(self.head)
        lay.addWidget(self.lines)
        self.last: Decisions | None = None
        self.setVisible(False)

    def clear(self) -> None:
        self.last = None
        self.head.setText("")
        self.lines.setText("")
        self.setVisible(False)

    def show_decisions(self, ev: Decisions) -> None:
        self.last = ev
        done = sum(1 for d in ev.tasks if d.decided)
        what = "tasks" if all(d.task != MIX for d in ev.tasks) else "lines (the tasks and the mix)"
        if ev.final:
            head = (f"Decisions ({STOPPED.get(ev.stopped, ev.stopped)}): {done} of {len(ev.tasks)} {what} decided "
                    f"after {ev.runs} runs, {ev.elapsed_s:.0f} s")
        else:
            eta = f"; {about(ev.eta_s)} to decide all" if ev.eta_s else ""
            head = f"Toward a decision: {done} of {len(ev.tasks)} {what} decided after {ev.runs} runs{eta}"
        self.head.setText(head)
        rows = []
        for d in ev.tasks:
            color = DECIDED if d.decided else UNDECIDED
            mark = "&#10003;" if d.decided else "&#8230;"
            rows.append(f'<span style="color:{color}">{mark} {html.escape(describe(d, final=ev.final))}</span>')
        self.lines.setText("<br>".join(rows))
        self.setVisible(True)
