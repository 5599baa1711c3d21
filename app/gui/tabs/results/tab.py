"""Results tab: the per-cell table, break-even curves with the measured points, output equivalence,
warnings; history of past sweeps (open one, compare two, run one again); exports of plots and data.
It renders the AppState's verdict; "Run again" asks the Sweep tab through the state."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QFileDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton,
                               QSplitter, QTabWidget, QVBoxLayout, QWidget)

from app.core.common.errors import UserError
from app.core.common.paths import results_dir
from app.core.common.text import printable
from app.core.measure.plan import plan_again
from app.core.records.sweeps import select_sweep, sweeps_of

from ...common import elide_combo, fill, table, whole_pane_toggle
from ...files import save, save_path
from ...plot_export import save_plot
from .breakeven import break_even_plot, draw_break_even
from .positions import PositionPlot
from .temperature import TemperaturePlot
from ...state import AppState

TIPS = {"tok/s": "median decode speed over the measured runs",
        "speedup [95% CI]": "Geometric mean of paired (interleaved) MTP/baseline ratios, with its 95 % t interval",
        "verdict": "faster / slower when the whole interval is above / below 1, else within noise",
        "accept": "drafted tokens the model accepted (pooled over runs)",
        "alpha": "per-token acceptance the break-even model uses",
        "len": "mean accepted draft length",
        "B/A [95% CI]": "B over A with a 95 % Welch interval from both sweeps' paired runs: of the speedups "
                        "(of tok/s for the baseline); changed only when the interval excludes 1",
        "detect": "the smallest change these two sweeps could tell from noise (xF: a factor F either way)"}


class ResultsTab(QWidget):
    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        lay = QVBoxLayout(self)
        hist = QHBoxLayout()
        self.history_box = QComboBox()
        self.history_box.setToolTip("Past sweeps: the results files in your results folder (newest first)")
        elide_combo(self.history_box, 30)  # long file names elided: the window fits a laptop's screen
        open_btn = QPushButton("Open")
        open_btn.setToolTip("Show this sweep's results")
        open_btn.clicked.connect(lambda: self.open_results(self.history_box.currentData()))
        browse = QPushButton("Open file…")
        browse.clicked.connect(self.browse_results)
        self.compare_box = elide_combo(QComboBox(), 24)
        self.compare_box.setToolTip("Another sweep to compare with the one shown, e.g. before a llama.cpp update")
        compare = QPushButton("Compare")
        compare.clicked.connect(lambda: self.compare_results(self.compare_box.currentData()))
        self.file_sweep_box = elide_combo(QComboBox(), 20)
        self.file_sweep_box.setToolTip("This results file holds several sweeps (other models or set-ups): "
                                       "choose the one to show; they are never pooled into one verdict")
        self.file_sweep_box.setVisible(False)
        self.file_sweep_box.activated.connect(lambda _i: self._show_file_sweep(self.file_sweep_box.currentData()))
        hist.addWidget(QLabel("Sweep"))
        hist.addWidget(self.history_box, 2)
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
        self.setting_box = elide_combo(QComboBox(), 20)  # a sweep of several settings: the one the verdict is of
        self.setting_box.setToolTip("This sweep measured several settings (sampler, thinking, context depth): "
                                    "runs pair and a verdict holds within one; choose the one to judge")
        self.setting_box.setVisible(False)
        self.setting_box.activated.connect(self.state.set_setting)
        hist.insertWidget(5, self.setting_box, 1)

        self.table = table([])  # columns: the core's per-cell field list (app.core.analysis.fields)
        self.be_plot = break_even_plot()
        self.be_curves: list = []
        top = QSplitter(Qt.Horizontal)
        top.addWidget(self.table)
        top.addWidget(self.be_plot)
        top.setSizes([650, 450])
        bottom = QTabWidget()
        self.findings = QPlainTextEdit(readOnly=True)
        self.findings.setToolTip("Confounders and measurement problems, each with what to do about it")
        bottom.addTab(self.findings, "Warnings")
        self.equiv_table = table(["task", "prompt", "arm", "rep", "same tokens as baseline", "first difference"],
                                 {4: "Under greedy decoding MTP must produce exactly the baseline's tokens"})
        bottom.addTab(self.equiv_table, "Output equivalence")
        self.positions = PositionPlot()
        bottom.addTab(self.positions, "Acceptance by position")
        self.temperature = TemperaturePlot()
        bottom.addTab(self.temperature, "Acceptance vs temperature")
        self.compare_table = table([])
        self.compare_label = QLabel("Choose another sweep above and press Compare: e.g. the same sweep before "
                                    "and after a llama.cpp update")
        self.compare_label.setWordWrap(True)
        self.compare_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        cmp_page = QWidget()
        cl = QVBoxLayout(cmp_page)
        cl.setContentsMargins(0, 0, 0, 0)
        cmp_split = QSplitter(Qt.Vertical)  # the table gets the room; the label can be dragged taller
        cmp_split.addWidget(self.compare_label)
        cmp_split.addWidget(self.compare_table)
        cmp_split.setStretchFactor(1, 1)
        cl.addWidget(cmp_split)
        bottom.addTab(cmp_page, "Comparison")
        self.compare_page = cmp_page
        self.results_tabs = bottom
        split = QSplitter(Qt.Vertical)
        split.addWidget(top)
        split.addWidget(bottom)
        split.setSizes([420, 200])
        lay.addWidget(split, 1)
        self.whole_pane = whole_pane_toggle(split, bottom, "Whole pane")  # e.g. a comparison: the tabs alone
        bottom.setCornerWidget(self.whole_pane)
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
        state.verdict_changed.connect(self.show_verdict)
        state.sweep_started.connect(self._sweep_started)
        state.sweep_finished.connect(self._sweep_finished)
        state.sweep_warning.connect(lambda m: self.findings.appendPlainText("warning: " + m))
        self.refresh_history()

    # -- showing the verdict --------------------------------------------------------------
    def show_verdict(self, v) -> None:
        """Render the state's verdict (None: a sweep just started, or nothing to show: keep what is shown)."""
        from app.core.analysis.fields import EQUIVALENCE_FIELDS, table as field_table  # the analysis layer: with the first results

        if v is None:
            return
        a = v.analysis
        headers, rows = field_table(a.cells)
        self._set_headers(self.table, headers)
        fill(self.table, rows)
        fill(self.equiv_table, field_table(a.equivalence, EQUIVALENCE_FIELDS)[1])
        notes = self.state.file_notes + [f"{f.message} -> {f.fix}" for f in a.findings]
        self.findings.setPlainText(printable("\n".join(notes)) or "No warnings.")
        self.plot_break_even(v)
        self.positions.show_verdict(v)
        self.temperature.show_records(self.state.records)  # every setting's runs: temperature is the x axis
        labels = self.state.setting_labels
        if [self.setting_box.itemText(i) for i in range(self.setting_box.count())] != labels:
            self.setting_box.clear()
            self.setting_box.addItems(labels)
        self.setting_box.setCurrentIndex(min(self.state.setting_index, max(len(labels) - 1, 0)))
        self.setting_box.setVisible(bool(labels))

    @staticmethod
    def _set_headers(t, headers: list[str]) -> None:
        if [t.horizontalHeaderItem(i).text() if t.horizontalHeaderItem(i) else None
                for i in range(t.columnCount())] == headers:
            return
        t.setColumnCount(len(headers))
        t.setHorizontalHeaderLabels(headers)
        for i, h in enumerate(headers):
            if h.strip() in TIPS:
                t.horizontalHeaderItem(i).setToolTip(TIPS[h.strip()])

    def plot_break_even(self, v) -> None:
        self.be_curves = draw_break_even(self.be_plot, v)

    # -- history --------------------------------------------------------------------------
    def refresh_history(self) -> None:
        d = results_dir()
        files = sorted(d.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True) if d.is_dir() else []
        for box in (self.history_box, self.compare_box):
            box.clear()
            for p in files:
                box.addItem(p.name, str(p))
        shown = str(self.state.results_path) if self.state.results_path else None
        if shown in [str(p) for p in files]:
            self.history_box.setCurrentIndex([str(p) for p in files].index(shown))

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
        self.state.set_results(runs, self._file_path, notes=list(self._file_problems) + ([note] if note else []),
                               cost_records=self._file_costs)
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
        self.whole_pane.setChecked(True)  # the comparison gets the room (press Whole pane to bring the rest back)

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

    def _sweep_finished(self, cancelled: bool) -> None:
        if self.state.results_path:
            self.refresh_history()
        again_of, self._compare_after = self._compare_after, None
        if again_of and not cancelled and self.state.records:
            self.compare_results(again_of, shown_is_b=True)  # "Run again": the earlier sweep (A) against this one

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
