"""Results tab: the verdict table, break-even curves with the measured points, output equivalence,
warnings; history of past sweeps (open one, compare two); exports of plots and data."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QFileDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton,
                               QSplitter, QTabWidget, QVBoxLayout, QWidget)

from app.core.common.errors import UserError

from .common import COLORS, fill, table


class ResultsTab:
    def _build_results(self) -> QWidget:
        w = QWidget()
        lay = QVBoxLayout(w)
        hist = QHBoxLayout()
        self.history_box = QComboBox()
        self.history_box.setToolTip("Past sweeps: the results files in your results folder (newest first)")
        self.history_box.setMinimumContentsLength(40)
        open_btn = QPushButton("Open")
        open_btn.setToolTip("Show this sweep's results")
        open_btn.clicked.connect(lambda: self.open_results(self.history_box.currentData()))
        browse = QPushButton("Open file…")
        browse.clicked.connect(self.browse_results)
        self.compare_box = QComboBox()
        self.compare_box.setToolTip("Another sweep to compare with the one shown, e.g. before a llama.cpp update")
        compare = QPushButton("Compare")
        compare.clicked.connect(lambda: self.compare_results(self.compare_box.currentData()))
        self.file_sweep_box = QComboBox()
        self.file_sweep_box.setToolTip("This results file holds several sweeps (other models or set-ups): "
                                       "choose the one to show; they are never pooled into one verdict")
        self.file_sweep_box.setVisible(False)
        self.file_sweep_box.activated.connect(lambda _i: self._show_file_sweep(self.file_sweep_box.currentData()))
        self.file_notes: list[str] = []
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

        self.table = table(["task", "arm", "runs", "tok/s", "speedup", "95% CI", "verdict", "acceptance"],
                           {3: "median decode speed over the measured runs",
                            4: "Geometric mean of paired (interleaved) MTP/baseline ratios",
                            5: "95 % t interval of the speedup",
                            6: "faster / slower when the whole interval is above / below 1, else within noise",
                            7: "drafted tokens the model accepted (pooled over runs)"})
        import pyqtgraph as pg

        from .common import make_plot

        self.be_plot = make_plot("Break-even S(alpha) per K; dots: measured",
                                 "per-token acceptance alpha", "speedup over baseline", left_units="x",
                                 tip="Curves: the break-even model from measured costs (cost probe, or the "
                                     "runs themselves). Dots: each task's measured speedup at its measured "
                                     "acceptance. Above the dashed line MTP pays; a curve's crossing is its "
                                     "break-even acceptance")
        self.be_curves: list = []
        self._pg = pg
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
        self.compare_table = table(["task", "arm", "tok/s A", "tok/s B", "B/A", "speedup A", "speedup B",
                                    "verdict A", "verdict B"])
        self.compare_label = QLabel("Choose another sweep above and press Compare: e.g. the same sweep before "
                                    "and after a llama.cpp update")
        self.compare_label.setWordWrap(True)
        self.compare_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        cmp_page = QWidget()
        cl = QVBoxLayout(cmp_page)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(self.compare_label)
        cl.addWidget(self.compare_table)
        bottom.addTab(cmp_page, "Comparison")
        self.compare_page = cmp_page
        self.results_tabs = bottom
        split = QSplitter(Qt.Vertical)
        split.addWidget(top)
        split.addWidget(bottom)
        split.setSizes([420, 200])
        lay.addWidget(split, 1)
        ex = QHBoxLayout()
        for label, slot, tip in (("Save plot as PNG…", lambda: self.export_plot("png"), "The break-even plot"),
                                 ("Save plot as SVG…", lambda: self.export_plot("svg"), "The break-even plot"),
                                 ("Save table as CSV…", lambda: self.export_data("csv"), "One row per task and arm"),
                                 ("Save data as JSON…", lambda: self.export_data("json"),
                                  "Table, output equivalence and warnings"),
                                 ("Markdown report…", self.export_report,
                                  "Recommendation, command, tables, break-even model, setup")):
            b = QPushButton(label)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            ex.addWidget(b)
        lay.addLayout(ex)
        self.refresh_history()
        return w

    # -- showing a sweep ------------------------------------------------------------------
    def show_results(self) -> None:
        from app.core.analysis.analysis import analyze

        ok = [r for r in self.records if r.status == "ok"]
        if not ok:
            return
        self.analysis = a = analyze(self.records)
        rows = []
        for c in a.cells:
            r = c.ratio
            rows.append((c.task, c.arm.label, c.tok_s.n, f"{c.tok_s.median:.1f}" if c.tok_s.median else "-",
                         f"{r.estimate:.2f}x" if r and r.estimate else "",
                         f"{r.lo:.2f}-{r.hi:.2f}" if r and r.lo is not None else "",
                         c.verdict, f"{100 * c.acceptance:.1f}%" if c.acceptance is not None else ""))
        fill(self.table, rows)
        fill(self.equiv_table, [(e.task, e.prompt_id, e.arm.label, e.rep + 1, "yes" if e.equal else "NO",
                                 "" if e.first_divergence is None else f"token {e.first_divergence}")
                                for e in a.equivalence])
        self.findings.setPlainText("\n".join(self.file_notes + [f"{f.message} -> {f.fix}" for f in a.findings])
                                   or "No warnings.")
        self.plot_break_even()
        self.update_export()

    def break_even_model(self):
        """(costs, curves) for the sweep shown: costs from the cost probe, else fitted from the runs."""
        from app.core.analysis import breakeven

        costs = self.probe_costs or breakeven.costs_from_runs(self.records)
        if costs is None or self.analysis is None:
            return None, []
        ks = sorted({a.k for a in self.analysis.arms if a.k})
        return costs, breakeven.curves([k for k in ks if k + 1 in costs.t_ms or costs.source == "probe"], costs)

    def plot_break_even(self) -> None:
        self.be_plot.clear()
        if self.be_plot.getPlotItem().legend is not None:
            self.be_plot.getPlotItem().legend.clear()
        self.be_curves = []
        costs, curves = self.break_even_model()
        if costs is None:
            return
        pg = self._pg
        self.be_plot.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#888", style=Qt.DashLine)))
        for i, cv in enumerate(curves):
            col = COLORS[i % len(COLORS)]
            be = " (never pays)" if cv.break_even is None else f" (pays at >= {cv.break_even:.2f})"
            self.be_curves.append(self.be_plot.plot(cv.alpha, cv.speedup, pen=pg.mkPen(col, width=2),
                                                    name=f"K={cv.k}{be}"))
            if cv.break_even is not None:
                self.be_plot.addItem(pg.InfiniteLine(pos=cv.break_even, angle=90,
                                                     pen=pg.mkPen(col, style=Qt.DotLine)))
            pts = [c for c in self.analysis.cells if c.arm.k == cv.k and c.alpha is not None and c.ratio
                   and c.ratio.estimate]
            if pts:
                self.be_plot.plot([c.alpha for c in pts], [c.ratio.estimate for c in pts], pen=None,
                                  symbol="o", symbolBrush=col, symbolSize=9)

    # -- history --------------------------------------------------------------------------
    def refresh_history(self) -> None:
        from app.core.common.paths import results_dir

        d = results_dir()
        files = sorted(d.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True) if d.is_dir() else []
        for box in (self.history_box, self.compare_box):
            box.clear()
            for p in files:
                box.addItem(p.name, str(p))
        if self.results_path and str(self.results_path) in [str(p) for p in files]:
            self.history_box.setCurrentIndex([str(p) for p in files].index(str(self.results_path)))

    def browse_results(self) -> None:
        from app.core.common.paths import results_dir

        path, _ = QFileDialog.getOpenFileName(self, "Open results", str(results_dir()), "Results (*.jsonl)")
        if path:
            self.open_results(path)

    def _load(self, path: str, problems: list[str] | None = None):
        """The records of a results file, or None after telling the user why not; lines left out
        (cut short, not records, impossible numbers) are added to ``problems``."""
        from app.core.records.reader import load_records

        try:
            recs = load_records(path, problems)
            if not [r for r in recs if r.status == "ok"]:
                raise UserError(f"{path}: no finished runs in this results file")
        except UserError as e:
            self.show_error(str(e))
            return None
        return recs

    def open_results(self, path: str | None) -> None:
        if not path:
            return
        problems: list[str] = []
        recs = self._load(path, problems)
        if recs is None:
            return
        from app.core.records.reader import load_cost_records
        from app.core.records.sweeps import sweeps_of

        self._file_records, self._file_problems, self.results_path = recs, problems, Path(path)
        try:
            self._file_costs = load_cost_records(path)
        except UserError as e:  # the runs are fine; only the probe record is not
            self.show_error(f"{e}; the break-even curves use the runs' own costs")
            self._file_costs = []
        sweeps = sweeps_of(recs)
        self.file_sweep_box.clear()
        for sw in reversed(sweeps):  # latest first
            self.file_sweep_box.addItem(sw.label, sw.sweep_id)
        self.file_sweep_box.setVisible(len(sweeps) > 1)
        self._show_file_sweep(None)

    def _show_file_sweep(self, sweep_id: str | None) -> None:
        """Show one sweep of the opened file, the latest when ``sweep_id`` is None (a file may
        hold several; they are never pooled)."""
        from app.core.records.sweeps import select_sweep

        runs, chosen, note = select_sweep(self._file_records, sweep_id, where=str(self.results_path))
        self.records = runs
        self.file_notes = list(self._file_problems) + ([note] if note else [])
        costs = [c for c in self._file_costs if c.model_path == chosen.model_path]
        if costs and costs[-1].draft_ms:
            from app.core.analysis import breakeven

            self.probe_costs = breakeven.Costs.from_probe(costs[-1])
        else:
            self.probe_costs = None  # a probe of another model would not apply
        self.show_results()
        self.statusBar().showMessage(f"{self.results_path}: {len(runs)} runs of sweep {chosen.sweep_id}")

    def compare_results(self, path: str | None, shown_is_b: bool = False) -> None:
        """The shown sweep (A) against the one in ``path`` (B); with ``shown_is_b`` the other way
        round (Run again: the earlier sweep is A, the new one B)."""
        from app.core.analysis.analysis import analyze, compare, format_changes, setting_changes

        if not path or self.analysis is None:
            self.show_error("open a sweep first, then choose another one to compare with")
            return
        other_records = self._load(path)
        if other_records is None:
            return
        from app.core.records.sweeps import select_sweep

        other_records = select_sweep(other_records, where=str(path))[0]  # its latest sweep
        a, b = (self.analysis, analyze(other_records))
        recs_a, recs_b, path_a, path_b = self.records, other_records, str(self.results_path), str(path)
        if shown_is_b:
            a, b, recs_a, recs_b, path_a, path_b = b, a, recs_b, recs_a, path_b, path_a
        f = lambda v, fmt: "" if v is None else fmt.format(v)  # noqa: E731
        rows = []
        for c in compare(a, b):
            ra = c.a.ratio.estimate if c.a and c.a.ratio else None
            rb = c.b.ratio.estimate if c.b and c.b.ratio else None
            rows.append((c.task, c.arm.label, f(c.a and c.a.tok_s.median, "{:.1f}"),
                         f(c.b and c.b.tok_s.median, "{:.1f}"), f(c.tok_s_change, "{:.3f}"),
                         f(ra, "{:.2f}x"), f(rb, "{:.2f}x"), c.a.verdict if c.a else "-",
                         (c.b.verdict if c.b else "-") + (" (changed)" if c.verdict_changed else "")))
        fill(self.compare_table, rows)
        self.compare_label.setText(f"A: {path_a}\nB: {path_b}\n" + format_changes(setting_changes(recs_a, recs_b)))
        self.compare_table.setToolTip(f"A: {path_a}\nB: {path_b}")
        self.results_tabs.setCurrentWidget(self.compare_page)

    def run_again(self) -> None:
        """The shown sweep again: its settings go to the Sweep tab (to be seen) and the exact same
        plan starts; afterwards the new sweep is compared with it."""
        from collections import Counter

        from app.core.measure.plan import plan_again

        if not self.records or self.results_path is None:
            self.show_error("open a sweep first (Results tab), then run it again")
            return
        if self.job is not None:
            self.show_error("a sweep is running: cancel it or let it finish first")
            return
        try:
            plan = plan_again(self.records, prompt_file=self.user_prompt_file())
        except UserError as e:
            self.show_error(str(e))
            return
        self.model_edit.setText(plan.model)
        self.engine_box.setCurrentIndex(0 if plan.engine == "inprocess" else 1)
        self.mode_box.setCurrentText("exhaustive")
        mtp = [a for a in plan.arms if a.is_mtp]
        self.k_edit.setText(",".join(str(k) for k in sorted({a.k for a in mtp})) or "1")
        self.pmin_edit.setText(",".join(f"{p:g}" for p in sorted({a.p_min for a in mtp})) or "0")
        self.npredict.setValue(plan.n_predict)
        self.reps.setValue(plan.reps)
        tasks = Counter(p.task for p in plan.prompts)
        for t, cb in self.task_boxes.items():
            cb.setChecked(t in tasks)
        self.per_task.setValue(max(tasks.values()))
        self._compare_after = str(self.results_path)
        self.tabs.setCurrentIndex([self.tabs.tabText(i) for i in range(self.tabs.count())].index("Sweep"))
        self.start_sweep(plan)

    # -- exports --------------------------------------------------------------------------
    def export_plot(self, fmt: str, path: str | None = None) -> str | None:
        """The break-even plot as PNG (1200 px wide) or SVG (vector, through QSvgGenerator: pyqtgraph's
        own SVG exporter fails on this Qt's path output)."""
        path = self.save_path("Save plot", f"break-even.{fmt}", f"{fmt.upper()} (*.{fmt})", path)
        if not path:
            return None
        from app.core.common.atomic import atomic_path

        try:
            with atomic_path(path) as tmp:
                if fmt == "png":
                    from pyqtgraph.exporters import ImageExporter

                    ex = ImageExporter(self.be_plot.getPlotItem())
                    ex.parameters()["width"] = 1200
                    ex.export(str(tmp) + ".png")  # the exporter picks the format from the name
                    Path(str(tmp) + ".png").replace(tmp)
                else:
                    from PySide6.QtCore import QRect
                    from PySide6.QtGui import QPainter
                    from PySide6.QtSvg import QSvgGenerator

                    gen = QSvgGenerator()
                    gen.setFileName(str(tmp))
                    gen.setSize(self.be_plot.size())
                    gen.setViewBox(QRect(0, 0, self.be_plot.width(), self.be_plot.height()))
                    gen.setTitle("MTP Tuner break-even")
                    painter = QPainter(gen)
                    self.be_plot.render(painter)
                    painter.end()
        except Exception as e:
            self.show_error(f"{path}: cannot save the plot ({e})")
            return None
        self.statusBar().showMessage(f"plot saved to {path}")
        return path

    def export_data(self, fmt: str, path: str | None = None) -> str | None:
        from app.core.verdict.report import analysis_dict, cells_csv

        if self.analysis is None:
            self.show_error("no results yet: run a sweep or open one")
            return None
        path = self.save_path("Save data", f"mtp-results.{fmt}", f"{fmt.upper()} (*.{fmt})", path)
        if not path:
            return None
        text = cells_csv(self.analysis) if fmt == "csv" else json.dumps(analysis_dict(self.analysis), indent=2)
        return self.save_text(path, text)

    def export_report(self, path: str | None = None) -> str | None:
        from app.core.verdict.report import markdown_report, validate_model

        if self.analysis is None or self.current_export is None:
            # with results but no command: the export's own reason (e.g. cmd cannot carry a path)
            self.show_error(self.export_problem if self.analysis is not None and self.export_problem
                            else "no results yet: run a sweep or open one")
            return None
        path = self.save_path("Save report", "mtp-report.md", "Markdown (*.md)", path)
        if not path:
            return None
        costs, curves = self.break_even_model()
        validation = validate_model(self.analysis, costs) if costs is not None else None
        pick, per_task, mix = self.current_pick
        return self.save_text(path, markdown_report(self.records, self.analysis, pick, per_task, self.current_export,
                                                    curves, validation, mix))
