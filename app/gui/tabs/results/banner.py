"""The answer first: the Results tab's verdict banner. One line per task, then one for the user's mix
(app.gui.story's answers: the same words, colours and states as every other screen), in plain words with the interval ("Code: turn MTP on, K=2 -> 1.34x faster (1.20-1.49, sure)",
"Stories: leave it off (0.65x, 0.60-0.70: slower)"), the core's reason under each, the noise
warnings beside the verdict they weaken, and a "Command for this" button per line (it asks Export
for that task's command through the AppState). Above them: what the shown sweep is, the demo's
note (its drafts are wrong on purpose), a model without MTP heads and what to do instead.

The words are drawn from the core's verdict (``Verdict.pick`` / ``per_task``: the arm, its paired
ratio and the reason); nothing is computed here."""

from __future__ import annotations

import functools
import html
import re
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.core.common.text import printable

from ...story import State, answers
from ...words import DEMO_NOTE, finding_words, gpu_warning_words, model_facts

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.verdict import Verdict

WARN = "#e65100"
# findings that make an interval less trustworthy: shown beside the verdict they weaken
NOISE = ("too_few_reps", "wide_spread", "slow_first_run", "bimodal_baseline", "far_pairs", "disturbed",
         "clock_mismatch", "mtp_not_engaged", "short_generation", "baseline_vs_probe", "repeats")


class VerdictRow:
    """One verdict: its line, the core's reason, the warnings that weaken it, its command button."""

    def __init__(self, scope: str, line: str, color: str, reason: str, warnings: list[str], bold: bool,
                 state: State = State.UNDECIDED):
        self.scope = scope
        self.state = state  # the answer's state (app.gui.story): decided, provisional, withheld, undecided
        self.line = QLabel(f'<span style="color:{color}">{html.escape(printable(line, one_line=True))}</span>')
        self.line.setTextFormat(Qt.TextFormat.RichText)
        self.line.setWordWrap(True)
        f = self.line.font()
        f.setPointSizeF(f.pointSizeF() * (1.35 if bold else 1.15))
        f.setBold(bold)
        self.line.setFont(f)
        self.line.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.reason = QLabel(printable(reason))
        self.reason.setWordWrap(True)
        self.reason.setStyleSheet("color: palette(mid)")
        self.warnings = QLabel("<br>".join(f'<span style="color:{WARN}">&#9888; {html.escape(printable(w))}</span>'
                                           for w in warnings))
        self.warnings.setTextFormat(Qt.TextFormat.RichText)
        self.warnings.setWordWrap(True)
        self.warnings.setVisible(bool(warnings))
        self.warning_texts = list(warnings)
        self.button = QPushButton("Command for this")
        self.button.setToolTip("The llama-server command for " + ("your mix" if not scope else scope)
                               + " on the Export tab")

    def widgets(self) -> list[QWidget]:
        return [self.line, self.reason, self.warnings, self.button]


class VerdictBanner(QFrame):
    command_for = Signal(str)  # a task, "" for the user's mix

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        lay = QVBoxLayout(self)
        self.what = QLabel("No verdict yet: press Tune for me on the Start page, run a sweep, or open one above.")
        self.what.setWordWrap(True)
        self.demo = QLabel(f"<b>{DEMO_NOTE}</b>: code accepts almost every draft and stories almost none, so "
                           "these verdicts show the method, not MTP in general")
        self.demo.setTextFormat(Qt.TextFormat.RichText)
        self.demo.setWordWrap(True)
        self.demo.setStyleSheet("background: #fff3e0; color: #6d4c00; padding: 4px; border-radius: 3px")
        self.demo.setVisible(False)
        self.note = QLabel("")  # no MTP heads, a probe-only answer, a sweep not shown
        self.note.setWordWrap(True)
        self.note.setTextFormat(Qt.TextFormat.RichText)
        self.note.setVisible(False)
        self.grid = QGridLayout()
        self.grid.setColumnStretch(0, 1)
        lay.addWidget(self.what)
        lay.addWidget(self.demo)
        lay.addWidget(self.note)
        lay.addLayout(self.grid)
        self.rows: dict[str, VerdictRow] = {}

    def clear_rows(self) -> None:
        for row in self.rows.values():
            for w in row.widgets():
                self.grid.removeWidget(w)
                w.hide()  # gone now, not only once the event loop deletes it (a grab or a test may come first)
                w.deleteLater()
        self.rows = {}

    def set_note(self, text: str) -> None:
        self.note.setText(text)
        self.note.setVisible(bool(text))

    def show_verdict(self, v: Verdict | None, sweep_text: str = "") -> None:
        """Render a Verdict (None: no verdict, the rows go)."""
        self.clear_rows()
        if v is None:
            self.demo.setVisible(False)
            return
        self.demo.setVisible(model_facts(v.model_path)[1])
        self.what.setText(sweep_text)
        per_warn = self._warnings(v)
        r = 0
        for a in answers(v):  # each task first, then the mix
            mix_line = not a.scope or len(v.per_task) == 1  # the mix's line (one task: its line is the mix's)
            reason = a.pick.reason + (f"\n{v.answer_words}" if mix_line and v.answer_words else "")
            row = VerdictRow(a.scope, a.line, a.color, reason, per_warn.get(a.scope, []),
                             bold=bool(a.scope), state=a.state)  # the tasks in large type, the mix after them
            row.button.clicked.connect(functools.partial(self.command_for.emit, a.scope))
            if not a.has_command:  # e.g. a withheld verdict: Export would show an empty box
                row.button.setEnabled(False)
                row.button.setToolTip(f"No command: {a.command.problem or a.pick.reason}")
            self.grid.addWidget(row.line, r, 0)
            self.grid.addWidget(row.button, r, 1, Qt.AlignmentFlag.AlignTop)
            self.grid.addWidget(row.reason, r + 1, 0, 1, 2)
            self.grid.addWidget(row.warnings, r + 2, 0, 1, 2)
            r += 3
            self.rows[a.scope] = row
        if len(v.per_task) == 1:  # one task: its line is the mix's too
            self.rows[""] = self.rows[v.per_task[0].scope]

    @staticmethod
    def _warnings(v: Verdict) -> dict[str, list[str]]:
        """The findings that weaken a verdict, each beside it: a finding naming a task goes to that
        task, the rest to the mix (they weaken every line), with the GPU note."""
        tasks = [p.scope for p in v.per_task]
        mix = "" if len(tasks) > 1 else tasks[0] if tasks else ""  # one task: its line is the mix's
        out: dict[str, list[str]] = {}
        for f in v.analysis.findings:
            text = finding_words(f)
            named = [t for t in tasks if re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", f.message)]
            if f.code not in NOISE and not named:
                continue
            for t in named or [mix]:
                out.setdefault(t, []).append(text)
        gpu = gpu_warning_words(v)
        if gpu:  # (a withheld verdict: its line and reason say so, and the busy finding why)
            out.setdefault(mix, []).append(gpu)
        for t in [*v.provisional, *([mix] if len(tasks) > 1 and v.is_provisional() else [])]:
            out.setdefault(t, []).append(f"provisional answer: {v.provisional_why}; the Start page's "
                                         "\"Finish when quiet\" measures again what was busy")
        return out
