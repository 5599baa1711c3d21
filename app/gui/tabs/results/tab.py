"""Results tab: the answer first. At the top the sweep shown and the history of past sweeps (listed
by what they are: model, tasks, K, time, status); under it the verdict banner (banner.py: one line
per task and for the mix, each with its command button and the warnings that weaken it) and the
per-task interval plot (card.py); then the Advanced section (advanced.py: the statistics table,
break-even, output equivalence, positions, temperature, comparison) and the exports.

A cancelled or failed sweep does not replace the last complete verdict: the tab puts that one back
and says so, with a button to open the other. It renders the AppState's verdict; "Run again" and
"Command for this" ask the other tabs through the state."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QComboBox, QFileDialog, QHBoxLayout, QLabel, QPushButton, QScrollArea, QSizePolicy,
                               QVBoxLayout, QWidget)

from app.core.common.errors import UserError
from app.core.common.paths import results_dir
from app.core.common.text import printable
from app.core.measure.plan import plan_again
from app.core.records.sweeps import select_sweep, sweeps_of

from ...common import fill
from ...files import save, save_path
from ...plot_export import save_plot
from ...state import AppState
from .advanced import AdvancedSection, set_headers
from ...words import NO_MTP_NEXT, model_facts
from .banner import VerdictBanner
from .card import IntervalPlot
from .history import describe, file_label, set_status, statuses


def _combo(tip: str) -> QComboBox:
    box = QComboBox()
    box.setToolTip(tip)
    box.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)  # long entries never widen the window
    box.setMinimumContentsLength(24)
    box.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
    return box


class ResultsTab(QWidget):
    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        lay = QVBoxLayout(self)
        hist = QHBoxLayout()
        self.history_box = _combo("Past sweeps in your results folder (newest first): model, tasks, draft widths, "
                                  "when, runs, and how the sweep ended")
        open_btn = QPushButton("Open")
        open_btn.setToolTip("Show this sweep's results")
        open_btn.clicked.connect(lambda: self.open_results(self.history_box.currentData()))
        browse = QPushButton("Open file…")
        browse.clicked.connect(self.browse_results)
        self.compare_box = _combo("Another sweep to compare with the one shown, e.g. before a llama.cpp update")
        compare = QPushButton("Compare")
        compare.clicked.connect(lambda: self.compare_results(self.compare_box.currentData()))
        self.file_sweep_box = _combo("This results file holds several sweeps (other models or set-ups): "
                                     "choose the one to show; they are never pooled into one verdict")
        self.file_sweep_box.setVisible(False)
        self.file_sweep_box.activated.connect(lambda _i: self._show_file_sweep(self.file_sweep_box.currentData()))
        hist.addWidget(QLabel("Sweep"))
        hist.addWidget(self.history_box, 3)
        hist.addWidget(open_btn)
        hist.addWidget(browse)
        hist.addWidget(self.file_sweep_box, 1)
        hist.addWidget(QLabel("compare with"))
        hist.addWidget(self.compare_box, 2)
        hist.addWidget(compare)
        again = QPushButton("Run again")
        again.setToolTip("Run the sweep shown once more with the same arms, prompts, tokens and repetitions "
                         "(e.g. after updating llama.cpp), then compare the two")
        again.clicked.connect(self.run_again)
        hist.addWidget(again)
        lay.addLayout(hist)
        self.setting_box = _combo("This sweep measured several settings (sampler, thinking, context depth): "
                                  "runs pair and a verdict holds within one; choose the one to judge")
        self.setting_box.setVisible(False)
        self.setting_box.activated.connect(self.state.set_setting)
        hist.insertWidget(5, self.setting_box, 1)
        # a sweep that was not shown (cancelled or failed): said, and offered
        stale = QHBoxLayout()
        self.stale_label = QLabel("")
        self.stale_label.setWordWrap(True)
        self.stale_label.setStyleSheet("color: #b26a00")
        self.stale_btn = QPushButton("Show it anyway")
        self.stale_btn.setToolTip("Open the sweep that was not shown (its finished runs are in its results file)")
        self.stale_btn.clicked.connect(self._open_stale)
        stale.addWidget(self.stale_label, 1)
        stale.addWidget(self.stale_btn)
        self.stale_label.setVisible(False)
        self.stale_btn.setVisible(False)
        lay.addLayout(stale)

        body = QWidget()
        bl = QVBoxLayout(body)
        bl.setContentsMargins(0, 0, 0, 0)
        self.banner = VerdictBanner()
        self.banner.command_for.connect(self.state.command_requested.emit)
        self.intervals = IntervalPlot()
        self.advanced = AdvancedSection()
        self.advanced.body.setMinimumHeight(520)
        self.advanced.toggle.toggled.connect(  # opened: scrolled into view
            lambda on: on and QTimer.singleShot(0, lambda: self.scroll.verticalScrollBar().setValue(self.advanced.y())))
        bl.addWidget(self.banner)
        bl.addWidget(self.intervals)
        bl.addWidget(self.advanced)
        bl.addStretch(1)
        self.scroll = scroll = QScrollArea()
        scroll.setWidget(body)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        lay.addWidget(scroll, 1)
        # the Advanced section's parts, by the names the tab always had
        adv = self.advanced
        self.table, self.be_plot, self.findings, self.equiv_table = adv.table, adv.be_plot, adv.findings, adv.equiv_table
        self.positions, self.temperature = adv.positions, adv.temperature
        self.compare_table, self.compare_label, self.compare_page = adv.compare_table, adv.compare_label, adv.compare_page
        self.results_tabs = adv.results_tabs
        ex = QHBoxLayout()
        for label, slot, tip in (("Save plot as PNG…", lambda: self.export_plot("png"), "The break-even plot"),
                                 ("Save plot as SVG…", lambda: self.export_plot("svg"), "The break-even plot"),
                                 ("Save table as CSV…", lambda: self.export_data("csv"), "One row per task and arm"),
                                 ("Save data as JSON…", lambda: self.export_data("json"),
                                  "Table, output equivalence and warnings"),
                                 ("Markdown report…", self.export_report,
                                  "Recommendation, command, tables, break-even model, setup"),
                                 ("Result card…", self.show_card, "The card to share (PNG, Markdown row, JSON: no "
                                  "paths, no user or host names), and your result among a community table's")):
            b = QPushButton(label)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            ex.addWidget(b)
        lay.addLayout(ex)
        self._file_records: list = []
        self._file_problems: list[str] = []
        self._file_costs: list = []
        self._file_path: Path | None = None
        self._again: tuple | None = None  # (plan, earlier results file) of a Run again in flight
        self._compare_after: str | None = None
        self._last_shown: tuple | None = None  # (records, path, costs, notes, setting) of the verdict shown
        self._before: tuple | None = None  # what was shown when a sweep started
        self._probe_before = None
        self._stale_path: str | None = None
        self.probe_answer = ""  # a sweep the cost probe decided: no draft width can pay here
        self.last_sweep_status: str | None = None  # how the last sweep of this window ended
        state.verdict_changed.connect(self.show_verdict)
        state.sweep_started.connect(self._sweep_started)
        state.sweep_finished.connect(self._sweep_finished)
        state.sweep_warning.connect(lambda m: self.findings.appendPlainText("warning: " + m))
        state.model_changed.connect(lambda _m: self._model_note())
        self.refresh_history()
        self._model_note()

    @property
    def be_curves(self) -> list:
        return self.advanced.be_curves

    # -- showing the verdict --------------------------------------------------------------
    def show_verdict(self, v) -> None:
        """Render the state's verdict (None: a sweep just started, or nothing to show: keep what is shown)."""
        if v is None:
            return
        st = self.state
        self.probe_answer = ""
        if not st.sweep_running:  # what to put back after a sweep that does not replace it
            self._last_shown = (list(st.records), st.results_path, list(st.cost_records), list(st.file_notes),
                                st.setting_index)
        self.banner.show_verdict(v, self._sweep_text())
        self.intervals.show_records(list(v.records), v.analysis)
        self.intervals.setVisible(True)
        self.advanced.show_verdict(v, list(self.state.file_notes), self.state.records)
        self._model_note()
        labels = self.state.setting_labels
        if [self.setting_box.itemText(i) for i in range(self.setting_box.count())] != labels:
            self.setting_box.clear()
            self.setting_box.addItems(labels)
        self.setting_box.setCurrentIndex(min(self.state.setting_index, max(len(labels) - 1, 0)))
        self.setting_box.setVisible(bool(labels))

    def _sweep_text(self) -> str:
        path = self.state.results_path
        status = statuses(self.state.settings).get(str(path)) if path else None
        what = describe(self.state.records, status)
        return f"Sweep shown: {what}" + (f" ({printable(path.name, one_line=True)})" if path else "")

    def _model_note(self) -> None:
        """A model without MTP heads: its reason and the next step (for the sweep shown, else the model chosen)."""
        v = self.state.verdict
        path = v.model_path if v is not None else self.state.model
        parts = []
        if self.probe_answer:
            parts.append(f"<b>Leave MTP off</b>: {self.probe_answer}")
        if path and model_facts(path)[0] is False:
            measured = v is not None and any(c.arm.is_spec for c in v.analysis.cells)
            parts.append("<b>This model has no MTP heads</b>, so MTP cannot be turned on for it"
                         + (" (the verdicts below are for the other speculative modes measured)" if measured else "")
                         + ". " + NO_MTP_NEXT)
        self.banner.set_note("<br>".join(parts))

    @staticmethod
    def _set_headers(t, headers: list[str]) -> None:
        set_headers(t, headers)

    def plot_break_even(self, v) -> None:
        self.advanced.plot_break_even(v)

    # -- history --------------------------------------------------------------------------
    def refresh_history(self) -> None:
        """The past sweeps, newest first, by what they are; the one shown selected (a file opened
        from elsewhere is listed first)."""
        d = results_dir()
        files = sorted(d.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True) if d.is_dir() else []
        shown = self.state.results_path
        if shown is not None and shown not in files and shown.is_file():
            files.insert(0, shown)
        status = statuses(self.state.settings)
        labels = [file_label(p, status.get(str(p))) for p in files]
        for box in (self.history_box, self.compare_box):
            box.clear()
            for p, text in zip(files, labels):
                box.addItem(text, str(p))
                box.setItemData(box.count() - 1, str(p), Qt.ToolTipRole)
        self._select_shown()

    def _select_shown(self) -> None:
        """The history names the file whose data is shown."""
        shown = str(self.state.results_path) if self.state.results_path else None
        i = self.history_box.findData(shown) if shown else -1
        if shown and i < 0 and Path(shown).is_file():
            self.refresh_history()
            return
        if i >= 0:
            self.history_box.setCurrentIndex(i)

    def browse_results(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open results", str(results_dir()), "Results (*.jsonl)")
        if path:
            self.open_results(path)

    def _load(self, path: str, problems: list[str] | None = None):
        """The records of a results file, or None after telling the user why not; lines left out
        (cut short, not records, impossible numbers) are added to ``problems``."""
        from app.core.records.reader import load_records  # msgspec's decoders: only when a file is read

        try:
            recs = load_records(path, problems)
            if not [r for r in recs if r.status == "ok"]:
                raise UserError(f"{path}: no finished runs in this results file")
        except UserError as e:
            self.state.show_error(str(e))
            return None
        return recs

    def open_results(self, path: str | None) -> None:
        from app.core.records.reader import load_cost_records  # see _load

        if not path:
            return
        problems: list[str] = []
        recs = self._load(path, problems)
        if recs is None:
            return
        self._file_records, self._file_problems, self._file_path = recs, problems, Path(path)
        try:
            self._file_costs = load_cost_records(path)
        except UserError as e:  # the runs are fine; only the probe record is not
            self.state.show_error(f"{e}; the break-even curves use the runs' own costs")
            self._file_costs = []
        sweeps = sweeps_of(recs)
        self.file_sweep_box.clear()
        for sw in reversed(sweeps):  # latest first
            self.file_sweep_box.addItem(printable(sw.label, one_line=True), sw.sweep_id)
        self.file_sweep_box.setVisible(len(sweeps) > 1)
        self._show_file_sweep(None)

    def _show_file_sweep(self, sweep_id: str | None) -> None:
        """Show one sweep of the opened file, the latest when ``sweep_id`` is None (a file may
        hold several; they are never pooled)."""
        runs, chosen, note = select_sweep(self._file_records, sweep_id, where=str(self._file_path))
        self._clear_stale()
        self.state.set_results(runs, self._file_path, notes=list(self._file_problems) + ([note] if note else []),
                               cost_records=self._file_costs)
        self._select_shown()
        self.state.show_status(f"{self._file_path}: {len(runs)} runs of sweep {chosen.sweep_id}")

    def compare_results(self, path: str | None, shown_is_b: bool = False) -> None:
        """The shown sweep (A) against the one in ``path`` (B); with ``shown_is_b`` the other way
        round (Run again: the earlier sweep is A, the new one B)."""
        # the analysis layer: loaded with the first results, not to show the window
        from app.core.analysis.analysis import analyze
        from app.core.analysis.settings import setting_of, split_by_setting
        from app.core.analysis.compare import (builds, compare, format_builds, format_changes, format_summary,
                                               setting_changes)
        from app.core.analysis.fields import COMPARE_FIELDS, table as field_table

        v = self.state.verdict
        if not path or v is None:
            self.state.show_error("open a sweep first, then choose another one to compare with")
            return
        other_records = self._load(path)
        if other_records is None:
            return
        other_records = select_sweep(other_records, where=str(path))[0]  # its latest sweep
        groups = split_by_setting(other_records)  # one setting of each, never pooled: the shown one's, else its first
        other_records = groups.get(setting_of(v.records[0])) or next(iter(groups.values()))
        a, b = v.analysis, analyze(other_records)
        recs_a, recs_b, path_a, path_b = list(v.records), other_records, str(self.state.results_path), str(path)
        if shown_is_b:
            a, b, recs_a, recs_b, path_a, path_b = b, a, recs_b, recs_a, path_b, path_a
        cmp = compare(a, b, recs_a, recs_b)  # with the records: each cell's B/A interval (changed or noise)
        headers, rows = field_table(cmp, COMPARE_FIELDS)
        self._set_headers(self.compare_table, headers)
        fill(self.compare_table, rows)
        self.compare_label.setText(f"A: {path_a}\nB: {path_b}\n{format_builds(builds(recs_a, recs_b))}\n"
                                   + format_changes(setting_changes(recs_a, recs_b)) + "\n" + format_summary(cmp))
        self.compare_table.setToolTip(f"A: {path_a}\nB: {path_b}")
        self.results_tabs.setCurrentWidget(self.compare_page)
        self.advanced.set_open(True)

    # -- run again ------------------------------------------------------------------------
    def run_again(self) -> None:
        """The shown sweep again: the exact same plan goes to the Sweep tab (through the state),
        which shows its settings and starts it; afterwards the new sweep is compared with it."""
        if not self.state.records or self.state.results_path is None:
            self.state.show_error("open a sweep first (Results tab), then run it again")
            return
        if self.state.sweep_running:
            self.state.show_error("a sweep is running: cancel it or let it finish first")
            return
        try:
            plan = plan_again(self.state.records, prompt_file=self.state.user_prompt_file())
        except UserError as e:
            self.state.show_error(str(e))
            return
        self._again = (plan, str(self.state.results_path))
        self.state.sweep_requested.emit(plan)

    def _sweep_started(self, plan) -> None:
        self.file_sweep_box.setVisible(False)  # notes about an opened file do not apply to a new sweep
        again, self._again = self._again, None
        self._compare_after = again[1] if again is not None and again[0] is plan else None
        self._before = self._last_shown  # the sweep start cleared the state's: what the tab showed
        self._probe_before = self.state.probe_record

    def _sweep_finished(self, cancelled: bool) -> None:
        st = self.state
        ok = [r for r in st.records if r.status == "ok"]
        probe = st.probe_record if st.probe_record is not self._probe_before else None
        probe_decided = not ok and not cancelled and probe is not None and probe.draft_ms \
            and st.probe_text.startswith("MTP cannot pay")
        status = "cancelled" if cancelled else "complete" if ok or probe_decided else "no run finished"
        self.last_sweep_status = status
        path = st.results_path
        if path is not None and path.is_file():
            set_status(st.settings, path, status)
        before, self._before = self._before, None
        if status != "complete" and before is not None:
            # the last complete verdict stays; the other sweep is offered, not shown
            n = len(ok)
            self._stale_path = str(path) if path is not None and path.is_file() else None
            what = "cancelled" if cancelled else "that finished no run"
            kept = f" ({n} finished runs in {path.name})" if n and path is not None else ""
            self.stale_label.setText(f"The sweep just {what}{kept} is not shown: the verdict below is still the "
                                     "last complete one.")
            self.stale_label.setVisible(True)
            self.stale_btn.setVisible(self._stale_path is not None)
            records, rpath, costs, notes, setting = before
            st.set_results(records, rpath, notes=notes, cost_records=costs)
            if setting:
                st.set_setting(setting)
        elif probe_decided:
            self._clear_stale()
            self.probe_answer = f"the cost probe says no draft width can pay on this machine. {st.probe_text}"
            self.banner.show_verdict(None)
            self.banner.what.setText("The cost probe decided it: no run was needed.")
            self.intervals.show_records([])
            self.intervals.setVisible(False)  # no run, so no interval to come
            self._model_note()
        else:
            self._clear_stale()
            if status != "complete":  # nothing complete to keep: the partial sweep is shown, marked
                self._last_shown = None
                self.banner.what.setText(self._sweep_text())
        if path is not None or before is not None:
            self.refresh_history()
        again_of, self._compare_after = self._compare_after, None
        if again_of and not cancelled and self.state.records:
            self.compare_results(again_of, shown_is_b=True)  # "Run again": the earlier sweep (A) against this one

    def _clear_stale(self) -> None:
        self._stale_path = None
        self.stale_label.setVisible(False)
        self.stale_btn.setVisible(False)

    def _open_stale(self) -> None:
        path = self._stale_path
        if path:
            self.open_results(path)

    # -- exports --------------------------------------------------------------------------
    def export_plot(self, fmt: str, path: str | None = None) -> str | None:
        path = save_path(self, "Save plot", f"break-even.{fmt}", f"{fmt.upper()} (*.{fmt})", path)
        if not path:
            return None
        try:
            save_plot(self.be_plot, fmt, path)
        except Exception as e:
            self.state.show_error(f"{path}: cannot save the plot ({e})")
            return None
        self.state.show_status(f"plot saved to {path}")
        return path

    def export_data(self, fmt: str, path: str | None = None) -> str | None:
        from app.core.analysis.fields import cells_csv  # the verdict layer: loaded with the first results
        from app.core.verdict import verdict_dict

        v = self.state.verdict
        if v is None:
            self.state.show_error("no results yet: run a sweep or open one")
            return None
        path = save_path(self, "Save data", f"mtp-results.{fmt}", f"{fmt.upper()} (*.{fmt})", path)
        if not path:
            return None
        text = cells_csv(v.analysis.cells) if fmt == "csv" else json.dumps(verdict_dict(v), indent=2)
        return save(self.state, path, text)

    def show_card(self) -> None:
        from .card import CardDialog  # the card's renderer: only when a card is asked for

        try:
            # the runs of the setting the verdict judged (a card holds one setting, never several pooled)
            runs = list(self.state.verdict.records) if self.state.verdict is not None else self.state.records
            self.card_dialog = CardDialog(self.state, runs, self)
        except UserError as e:
            self.state.show_error(str(e))
            return
        self.card_dialog.show()

    def export_report(self, path: str | None = None) -> str | None:
        from app.core.verdict import markdown_report  # see export_data

        v = self.state.verdict
        if v is None:
            self.state.show_error("no results yet: run a sweep or open one")
            return None
        path = save_path(self, "Save report", "mtp-report.md", "Markdown (*.md)", path)
        if not path:
            return None
        return save(self.state, path, markdown_report(v))
