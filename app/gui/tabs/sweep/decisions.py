"""The Sweep tab's decision panel: per task, live, where the sweep stands toward a decision
("code: decided, pays: K=2 1.38x ±4 %", "story: undecided, off vs K=1, about 1 min"), from the
session's Decisions events; the ETA counts down to *decided*. Once the sweep's verdict is built,
the final lines follow it (app.gui.story): a task whose answer is withheld (or provisional) says
so, never "decided", and only a decided answer is green. And the budget choice of an adaptive
sweep (Quick: about 2 minutes; Thorough: until decided), and its switch to probe the costs anew."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Callable

from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLabel, QVBoxLayout, QWidget

from app.core.analysis.decide import MIN_GAIN, TaskDecision, about, describe
from app.core.session.adaptive import MIX
from app.core.session.events import Decisions

from ...story import Answer, State, answers

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.verdict import Verdict

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


def reprobe_box() -> QCheckBox:
    """Adaptive in process: the cost probe anew (disabled until the sweep kind is adaptive)."""
    box = QCheckBox("Probe the costs again")
    box.setToolTip("Adaptive sweep in process: measure what a speculative step costs anew, even when a probe of the "
                   "same model, build, threads and depth was made on this machine in the last 24 hours (that probe "
                   "is used otherwise: it takes minutes on a CPU)")
    box.setEnabled(False)
    return box


def min_gain_box() -> QDoubleSpinBox:
    """A sweep that stops once decided: δ, the least gain worth turning speculation on for (the
    CLI's --min-gain; disabled until the sweep kind is adaptive)."""
    box = QDoubleSpinBox(minimum=0.0, maximum=50.0, singleStep=0.5, decimals=1, value=100 * MIN_GAIN, suffix=" %")
    box.setToolTip("Adaptive sweep: the least gain worth turning speculation on for. A task ends \"no gain worth "
                   "having: leave it off, at most +X %\" once no setting can be this much faster (anytime 95 % "
                   "intervals), instead of running to its cap")
    box.setEnabled(False)
    return box


class DecisionPanel(QWidget):
    """One line per task, green when decided, amber while not, under a headline with the ETA."""

    def __init__(self, parent: QWidget | None = None, left: Callable[[], float | None] = lambda: None):
        super().__init__(parent)
        self.left = left  # the flow's one clock's time left (app.core.session.clock, the sweep service's)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.head = QLabel("")
        self.lines = QLabel("")
        self.lines.setTextFormat(self.lines.textFormat().RichText)
        self.lines.setWordWrap(True)
        lay.addWidget(self.head)
        lay.addWidget(self.lines)
        self.last: Decisions | None = None
        self.verdict: Verdict | None = None  # the sweep's verdict, once it is built
        self.setVisible(False)

    def clear(self) -> None:
        self.last = None
        self.verdict = None
        self.head.setText("")
        self.lines.setText("")
        self.setVisible(False)

    def show_decisions(self, ev: Decisions) -> None:
        self.last = ev
        self._render()

    def show_verdict(self, v: Verdict | None) -> None:
        """The sweep's verdict (None: none was shown): the final lines follow its answers."""
        self.verdict = v
        if self.last is not None:
            self._render()

    def _render(self) -> None:
        ev = self.last
        assert ev is not None  # rendered only after a Decisions event
        v = self.verdict if ev.final else None
        told = {a.scope: a for a in answers(v)} if v is not None else {}
        if len(told) == 1:  # one task: its answer is the mix's too
            told[""] = next(iter(told.values()))
        rows = [self._row(d, told.get("" if d.task == MIX else d.task), ev.final) for d in ev.tasks]
        done = sum(1 for ok, _ in rows if ok)
        what = "tasks" if all(d.task != MIX for d in ev.tasks) else "lines (the tasks and the mix)"
        if v is not None and v.withheld:  # no decision stands: the verdict says why
            head = f"No decision after {ev.runs} runs, {ev.elapsed_s:.0f} s: {v.withheld}"
        elif ev.final:
            stopped = STOPPED.get(ev.stopped, ev.stopped)
            if done < len(rows) and ev.stopped == "decided":  # a provisional answer took back a decision
                stopped = "stopped"
            head = f"Decisions ({stopped}): {done} of {len(ev.tasks)} {what} decided after {ev.runs} runs, " \
                   f"{ev.elapsed_s:.0f} s"
        else:
            left = self.left()  # the one clock's, as every page shows it
            eta = f"; {about(left)} to decide all" if left else ""
            head = f"Toward a decision: {done} of {len(ev.tasks)} {what} decided after {ev.runs} runs{eta}"
        self.head.setText(head)
        self.lines.setText("<br>".join(line for _, line in rows))
        self.setVisible(True)

    @staticmethod
    def _row(d: TaskDecision, told: Answer | None, final: bool) -> tuple[bool, str]:
        """(decided?, the rich-text line) of one task's decision; ``told``: its answer in the
        verdict. A withheld (or provisional) answer overrules what the runs decided: its line is
        the verdict's, never "decided", never green."""
        if told is not None and told.state in (State.WITHHELD, State.PROVISIONAL):
            text = f"{d.task}: {told.line.split(': ', 1)[-1]}"
            return False, f'<span style="color:{told.color}">&#8230; {html.escape(text)}</span>'
        color, mark = (DECIDED, "&#10003;") if d.decided else (UNDECIDED, "&#8230;")
        return d.decided, f'<span style="color:{color}">{mark} {html.escape(describe(d, final=final))}</span>'
