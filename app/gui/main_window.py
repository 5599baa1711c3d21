"""The main window: Machine -> Model -> Sweep -> Results -> Export, over the same core as the CLI."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QMainWindow, QMessageBox, QPlainTextEdit, QProgressBar,
                               QPushButton, QSpinBox, QTableWidget, QTableWidgetItem, QTabWidget,
                               QVBoxLayout, QWidget)

from app.core.errors import UserError

from .adapter import CoreJob

TIPS = {
    "k": "Draft widths K to compare (llama-server --spec-draft-n-max): how many tokens the MTP head "
         "drafts per step. e.g. 1,2,3,4 or 1-6",
    "p_min": "Draft p_min values (--spec-draft-p-min): drafting stops early when the draft's top "
             "probability is below this. 0 = always draft K tokens",
    "n_predict": "Tokens generated per run. MTP needs a longer generation to pay off (128 or more)",
    "reps": "Measured repetitions per prompt and arm; speedup intervals need at least 3",
    "engine": "in-process: llama-cpp-python, one model load for all arms (default). "
              "llama-server: a real server per configuration, to confirm",
    "tasks": "Prompt suites by task type; code and repetitive text accept drafts well, stories poorly",
}


class MainWindow(QMainWindow):
    sweep_finished = Signal()

    def __init__(self, demo: bool = False):
        super().__init__()
        self.setWindowTitle("MTP Tuner")
        self.settings = QSettings("mtp-tuner", "mtp-tuner")
        self.job: CoreJob | None = None
        self.records: list = []
        self.analysis = None
        self.probe_costs = None
        self.results_path: Path | None = None
        self._live: list[tuple[float, float, int]] = []  # (time, tok/s, arm index)
        self._arms: list = []
        self._t0 = 0.0
        self._done = self._total = 0
        self.tabs = QTabWidget()
        self.setCentralWidget(self.tabs)
        self._build_machine()
        self._build_model()
        self._build_sweep()
        self._build_results()
        self._build_export()
        geo = self.settings.value("geometry")
        if geo is not None:
            self.restoreGeometry(geo)
        else:
            self.resize(1100, 720)
        last = self.settings.value("last_model", "")
        if demo:
            self.use_demo_model()
        elif last:
            self.model_edit.setText(str(last))
        self.statusBar().showMessage("Ready")

    # -- tabs -----------------------------------------------------------------------------
    def _build_machine(self) -> None:
        w = QWidget()
        lay = QVBoxLayout(w)
        self.hw_text = QPlainTextEdit(readOnly=True)
        self.hw_text.setToolTip("What decode speed can reach here: memory bandwidth / bytes read per token")
        refresh = QPushButton("Detect hardware")
        refresh.clicked.connect(self.refresh_hardware)
        row = QHBoxLayout()
        self.server_edit = QLineEdit(str(self.settings.value("server_bin", "")))
        self.server_edit.setPlaceholderText("llama-server binary (empty: PATH, then the bundled build)")
        self.server_edit.setToolTip("The llama-server used by the llama-server engine and checked for "
                                    "MTP support (draft-mtp in --spec-type)")
        check = QPushButton("Check llama-server")
        check.clicked.connect(self.check_server)
        row.addWidget(self.server_edit, 1)
        row.addWidget(check)
        self.server_label = QLabel("")
        import pyqtgraph as pg

        self.probe_btn = QPushButton("Can MTP pay here? Run the cost probe on the model")
        self.probe_btn.setToolTip("Measures one target decode of n tokens (n = 1..9) against one token, "
                                  "and one draft step, on the model chosen in the Model tab")
        self.probe_btn.clicked.connect(self.run_probe)
        self.probe_plot = pg.PlotWidget(title="Verify cost T(n)/T(1)")
        self.probe_plot.setLabel("bottom", "tokens verified in one pass (n)")
        self.probe_plot.setLabel("left", "T(n) / T(1)")
        self.probe_curve = self.probe_plot.plot([], [], pen=pg.mkPen("#1f77b4", width=2), symbol="o")
        self.probe_verdict = QLabel("")
        self.probe_verdict.setWordWrap(True)
        top = QHBoxLayout()
        top.addWidget(self.hw_text, 1)
        top.addWidget(self.probe_plot, 1)
        lay.addWidget(refresh)
        lay.addLayout(top, 1)
        lay.addWidget(self.probe_btn)
        lay.addWidget(self.probe_verdict)
        lay.addLayout(row)
        lay.addWidget(self.server_label)
        self.tabs.addTab(w, "Machine")
        QTimer.singleShot(0, self.refresh_hardware)

    def _build_model(self) -> None:
        w = QWidget()
        lay = QVBoxLayout(w)
        row = QHBoxLayout()
        self.model_edit = QLineEdit()
        self.model_edit.setPlaceholderText("a GGUF with MTP heads (e.g. Qwen3.6-27B-MTP-Q4_K_M.gguf)")
        browse = QPushButton("Open GGUF…")
        browse.clicked.connect(self.browse_model)
        demo = QPushButton("Use demo model")
        demo.setToolTip("A tiny calibrated MTP model whose acceptance is known exactly (no download)")
        demo.clicked.connect(self.use_demo_model)
        row.addWidget(self.model_edit, 1)
        row.addWidget(browse)
        row.addWidget(demo)
        self.model_info = QPlainTextEdit(readOnly=True)
        self.model_edit.editingFinished.connect(self.inspect_model)
        lay.addLayout(row)
        lay.addWidget(self.model_info, 1)
        self.tabs.addTab(w, "Model")

    def _build_sweep(self) -> None:
        import pyqtgraph as pg

        w = QWidget()
        lay = QVBoxLayout(w)
        form = QFormLayout()
        self.engine_box = QComboBox()
        self.engine_box.addItems(["in-process", "llama-server"])
        self.engine_box.setToolTip(TIPS["engine"])
        self.k_edit = QLineEdit("1,2,3,4")
        self.k_edit.setToolTip(TIPS["k"])
        self.pmin_edit = QLineEdit("0")
        self.pmin_edit.setToolTip(TIPS["p_min"])
        self.npredict = QSpinBox(minimum=8, maximum=8192, value=128)
        self.npredict.setToolTip(TIPS["n_predict"])
        self.reps = QSpinBox(minimum=1, maximum=50, value=3)
        self.reps.setToolTip(TIPS["reps"])
        tasks = QHBoxLayout()
        self.task_boxes = {}
        for t in ("story", "code", "tongue-twister"):
            cb = QCheckBox(t, checked=True)
            cb.setToolTip(TIPS["tasks"])
            self.task_boxes[t] = cb
            tasks.addWidget(cb)
        self.per_task = QSpinBox(minimum=1, maximum=20, value=2)
        self.per_task.setToolTip("Prompts per task type")
        form.addRow("Engine", self.engine_box)
        form.addRow("Draft widths K", self.k_edit)
        form.addRow("p_min", self.pmin_edit)
        form.addRow("Tokens per run", self.npredict)
        form.addRow("Repetitions", self.reps)
        form.addRow("Tasks", tasks)
        form.addRow("Prompts per task", self.per_task)
        buttons = QHBoxLayout()
        self.start_btn = QPushButton("Start sweep")
        self.start_btn.clicked.connect(self.start_sweep)
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setEnabled(False)
        self.cancel_btn.clicked.connect(self.cancel_sweep)
        buttons.addWidget(self.start_btn)
        buttons.addWidget(self.cancel_btn)
        self.progress = QProgressBar()
        self.progress_label = QLabel("")
        self.plot = pg.PlotWidget(title="tok/s per finished run")
        self.plot.setLabel("bottom", "time since start", units="s")
        self.plot.setLabel("left", "decode speed", units="tok/s")
        self.plot.addLegend()
        self._scatter: dict[int, object] = {}
        self._pg = pg
        lay.addLayout(form)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.progress_label)
        lay.addWidget(self.plot, 1)
        self.tabs.addTab(w, "Sweep")
        self.repaint_timer = QTimer(self)
        self.repaint_timer.setInterval(50)  # 20 Hz, from pre-created items
        self.repaint_timer.timeout.connect(self._repaint)

    def _build_results(self) -> None:
        w = QWidget()
        lay = QVBoxLayout(w)
        self.table = QTableWidget(0, 8)
        self.table.setHorizontalHeaderLabels(["task", "arm", "runs", "tok/s", "speedup", "95% CI",
                                              "verdict", "acceptance"])
        self.table.horizontalHeaderItem(4).setToolTip("Geometric mean of paired MTP/baseline ratios")
        self.table.horizontalHeaderItem(6).setToolTip("faster / slower when the whole interval is above / "
                                                      "below 1, else within noise")
        self.findings = QPlainTextEdit(readOnly=True)
        self.findings.setMaximumHeight(140)
        import pyqtgraph as pg

        self.be_plot = pg.PlotWidget(title="Break-even: predicted speedup S(alpha) per K, measured points per task")
        self.be_plot.setLabel("bottom", "per-token acceptance alpha")
        self.be_plot.setLabel("left", "speedup over baseline", units="x")
        self.be_plot.addLegend()
        self.be_plot.setToolTip("Curves: the break-even model from measured costs (cost probe, or the "
                                "runs themselves). Dots: each task's measured speedup at its measured "
                                "acceptance. Above the dashed line MTP pays.")
        self.be_curves: list = []
        row = QHBoxLayout()
        row.addWidget(self.table, 3)
        row.addWidget(self.be_plot, 2)
        lay.addLayout(row, 1)
        lay.addWidget(QLabel("Warnings"))
        lay.addWidget(self.findings)
        self.tabs.addTab(w, "Results")

    def _build_export(self) -> None:
        w = QWidget()
        lay = QVBoxLayout(w)
        self.verdict_label = QLabel("Run a sweep to get a recommendation.")
        self.verdict_label.setWordWrap(True)
        self.shell_box = QComboBox()
        self.shell_box.addItems(["bash", "powershell", "cmd"])
        self.shell_box.currentTextChanged.connect(lambda _: self.update_export())
        self.command = QPlainTextEdit(readOnly=True)
        self.command.setMaximumHeight(120)
        self.command.setToolTip("The llama-server command for the recommendation; only flags your "
                                "llama-server accepts, always -np 1")
        copy = QPushButton("Copy command")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.command.toPlainText()))
        lay.addWidget(self.verdict_label)
        row = QHBoxLayout()
        row.addWidget(QLabel("Shell"))
        row.addWidget(self.shell_box, 1)
        lay.addLayout(row)
        lay.addWidget(self.command)
        lay.addWidget(copy)
        lay.addStretch(1)
        self.tabs.addTab(w, "Export")

    # -- actions --------------------------------------------------------------------------
    def refresh_hardware(self) -> None:
        from app.core.hardware import format_snapshot, snapshot

        self.hw_text.setPlainText(format_snapshot(snapshot()))

    def run_probe(self) -> None:
        from app.core.probe import CostRecord, run_probe

        model = self.model_edit.text().strip()
        if not model:
            self.show_error("choose a model first (Model tab)")
            return
        self.probe_btn.setEnabled(False)
        self.probe_verdict.setText("Probing…")

        def on_event(ev):
            if isinstance(ev, CostRecord):
                self.show_probe(ev)
            else:
                self.probe_verdict.setText(f"Probing… {ev.message}")

        self.probe_job = CoreJob(lambda cancel: run_probe(model, max_batch=9, max_rounds=10, cancel=cancel), self)
        self.probe_job.event.connect(on_event)
        self.probe_job.failed.connect(self.show_error)
        self.probe_job.finished.connect(lambda: self.probe_btn.setEnabled(True))
        self.probe_job.start()

    def show_probe(self, rec) -> None:
        from app.core import breakeven

        ns = sorted(rec.ratio)
        self.probe_curve.setData(ns, [rec.ratio[n].median for n in ns])
        if rec.draft_ms is None:
            self.probe_verdict.setText("This model has no MTP heads: only the verify cost was measured.")
            return
        self.probe_costs = c = breakeven.Costs.from_probe(rec)
        bes = [(k, breakeven.break_even_alpha(k, c)) for k in range(1, max(ns))]
        pays = [(k, a) for k, a in bes if a is not None]
        if not pays:
            self.probe_verdict.setText("MTP cannot pay on this machine: verifying costs more than drafts "
                                       "can save, even at 100 % acceptance.")
        else:
            k, a = min(pays, key=lambda ka: ka[1])
            self.probe_verdict.setText(f"MTP can pay here at acceptance >= {100 * a:.0f} % for K = {k} "
                                       "(the easiest width); "
                                       + ", ".join(f"K={kk}: {100 * aa:.0f} %" for kk, aa in pays))

    def check_server(self) -> None:
        from app.core.server import find_server_binary, probe_capabilities

        try:
            b = find_server_binary(self.server_edit.text().strip() or None)
            caps = probe_capabilities(b)
            self.server_label.setText(f"{b}\nbuild {caps.version}; draft-mtp "
                                      f"{'supported' if caps.supports_mtp else 'NOT supported'}")
            self.settings.setValue("server_bin", self.server_edit.text().strip())
        except UserError as e:
            self.server_label.setText(str(e))

    def browse_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open GGUF", "", "GGUF models (*.gguf)")
        if path:
            self.model_edit.setText(path)
            self.inspect_model()

    def use_demo_model(self) -> None:
        from app.cli import demo_model

        self.model_edit.setText(str(demo_model()))
        self.inspect_model()

    def inspect_model(self) -> None:
        from app.core.modelinfo import format_info, inspect

        path = self.model_edit.text().strip()
        if not path:
            return
        try:
            self.model_info.setPlainText(format_info(inspect(path)))
            self.settings.setValue("last_model", path)
        except UserError as e:
            self.model_info.setPlainText(str(e))

    def _plan(self):
        from app.core.plan import Plan, make_arms, parse_float_list, parse_int_list
        from app.core.prompts import select_prompts

        model = self.model_edit.text().strip()
        if not model:
            raise UserError("choose a model first (Model tab)")
        tasks = [t for t, cb in self.task_boxes.items() if cb.isChecked()]
        if not tasks:
            raise UserError("choose at least one task type")
        arms = make_arms(parse_int_list(self.k_edit.text(), "Draft widths K"),
                         parse_float_list(self.pmin_edit.text(), "p_min"))
        prompts = select_prompts(tasks, per_task=self.per_task.value())
        return Plan(model=model, arms=arms, prompts=tuple(prompts), n_predict=self.npredict.value(),
                    reps=self.reps.value(), warmup=1,
                    engine="inprocess" if self.engine_box.currentIndex() == 0 else "server")

    def start_sweep(self) -> None:
        from app.core import runner as R
        from app.core.results import ResultsWriter

        try:
            plan = self._plan()
            if plan.engine == "server":
                from app.core.server import ServerEngine

                engine = ServerEngine(self.server_edit.text().strip() or None)
            else:
                from app.core.inprocess import InProcessEngine

                engine = InProcessEngine()
                engine.prepare(plan)
            self.results_path = R.default_results_path(plan.model)
            writer = ResultsWriter(self.results_path)
        except UserError as e:
            self.show_error(str(e))
            return
        self.records = []
        self._arms = list(plan.arms)
        self._live = []
        self._done, self._total = 0, plan.total_runs
        self._t0 = time.monotonic()
        self.plot.clear()
        self._scatter = {}
        colors = ["#888888", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                  "#17becf"]
        for i, arm in enumerate(self._arms):
            self._scatter[i] = self.plot.plot([], [], pen=None, symbol="o", symbolSize=7,
                                              symbolBrush=colors[i % len(colors)], name=arm.label)
        self.progress.setMaximum(max(1, self._total))
        self.progress.setValue(0)

        def factory(cancel):
            try:
                yield from R.run_sweep(plan, engine, writer, cancel)
            finally:
                writer.close()

        self.job = CoreJob(factory, self)
        self.job.event.connect(self.on_event)
        self.job.failed.connect(self.show_error)
        self.job.finished.connect(self.on_finished)
        self.start_btn.setEnabled(False)
        self.cancel_btn.setEnabled(True)
        self.repaint_timer.start()
        self.job.start()
        self.statusBar().showMessage(f"Sweeping: results go to {self.results_path}")

    def cancel_sweep(self) -> None:
        if self.job:
            self.job.cancel()
            self.statusBar().showMessage("Cancelling…")

    def on_event(self, ev) -> None:
        from app.core import runner as R

        if isinstance(ev, (R.RunFinished, R.RunFailed)):
            self.records.append(ev.record)
            self._done += 1
            self.progress.setValue(self._done)
            r = ev.record
            if r.tok_s:
                idx = next((i for i, a in enumerate(self._arms) if a.k == r.k and
                            (r.k is None or a.p_min == (r.p_min or 0.0))), 0)
                self._live.append((time.monotonic() - self._t0, r.tok_s, idx))
                self._dirty = True
            el = time.monotonic() - self._t0
            eta = el / self._done * (self._total - self._done) if self._done else 0
            self.progress_label.setText(f"{self._done}/{self._total} runs, {el:.0f} s, about {eta:.0f} s left")
        elif isinstance(ev, R.RunStarted):
            what = "warmup" if ev.warmup else f"run {ev.index + 1}/{ev.total}"
            self.statusBar().showMessage(f"{what}: {ev.arm.label}, {ev.task}/{ev.prompt_id}")
        elif isinstance(ev, R.SweepError):
            self.show_error(ev.message)
        elif isinstance(ev, R.SweepWarning):
            self.findings.appendPlainText("warning: " + ev.message)

    def _repaint(self) -> None:
        # the timer fires at 20 Hz, but the plot is redrawn only when a run has finished: on a
        # small machine every redraw takes CPU from the measurement
        if not getattr(self, "_dirty", False):
            return
        self._dirty = False
        for i, item in self._scatter.items():
            pts = [(t, v) for t, v, a in self._live if a == i]
            item.setData([p[0] for p in pts], [p[1] for p in pts])

    def on_finished(self) -> None:
        self.repaint_timer.stop()
        self._dirty = True
        self._repaint()
        self.start_btn.setEnabled(True)
        self.cancel_btn.setEnabled(False)
        cancelled = bool(self.job and self.job.cancel_token.cancelled)
        self.job = None
        self.show_results()
        self.statusBar().showMessage(("Cancelled" if cancelled else "Finished")
                                     + (f"; results in {self.results_path}" if self.results_path else ""))
        self.sweep_finished.emit()

    def show_results(self) -> None:
        from app.core.analysis import analyze

        ok = [r for r in self.records if r.status == "ok"]
        if not ok:
            return
        self.analysis = a = analyze(self.records)
        self.table.setRowCount(len(a.cells))
        for row, c in enumerate(a.cells):
            r = c.ratio
            vals = [c.task, c.arm.label, str(c.tok_s.n), f"{c.tok_s.median:.1f}" if c.tok_s.median else "-",
                    f"{r.estimate:.2f}x" if r and r.estimate else "",
                    f"{r.lo:.2f}-{r.hi:.2f}" if r and r.lo is not None else "",
                    c.verdict, f"{100 * c.acceptance:.1f}%" if c.acceptance is not None else ""]
            for col, v in enumerate(vals):
                item = QTableWidgetItem(v)
                item.setFlags(item.flags() & ~Qt.ItemIsEditable)
                self.table.setItem(row, col, item)
        self.findings.setPlainText("\n".join(f"{f.message} -> {f.fix}" for f in a.findings))
        self.plot_break_even()
        self.update_export()

    def plot_break_even(self) -> None:
        from app.core import breakeven

        costs = self.probe_costs or breakeven.costs_from_runs(self.records)
        self.be_plot.clear()
        self.be_curves = []
        if costs is None or self.analysis is None:
            return
        pg = self._pg
        ks = sorted({a.k for a in self.analysis.arms if a.k})
        colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
        self.be_plot.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#888", style=Qt.DashLine)))
        for i, cv in enumerate(breakeven.curves([k for k in ks if k + 1 in costs.t_ms or costs.source == "probe"],
                                                costs)):
            col = colors[i % len(colors)]
            be = "" if cv.break_even is None else f", pays at alpha >= {cv.break_even:.2f}"
            self.be_curves.append(self.be_plot.plot(cv.alpha, cv.speedup, pen=pg.mkPen(col, width=2),
                                                    name=f"K={cv.k}{be}"))
            pts = [c for c in self.analysis.cells if c.arm.k == cv.k and c.alpha is not None and c.ratio
                   and c.ratio.estimate]
            if pts:
                self.be_plot.plot([c.alpha for c in pts], [c.ratio.estimate for c in pts], pen=None,
                                  symbol="o", symbolBrush=col, symbolSize=8)

    def update_export(self) -> None:
        if self.analysis is None:
            return
        from app.core.recommend import parse_mix, recommend
        from app.core.report import export_command

        pick, per_task = recommend(self.analysis, parse_mix(None, self.analysis.tasks))
        caps = binary = None
        try:
            from app.core.server import find_server_binary, probe_capabilities

            binary = find_server_binary(self.server_edit.text().strip() or None)
            caps = probe_capabilities(binary)
        except UserError:
            pass
        exp = export_command(pick, self.records[-1].model_path, caps, binary,
                             shell=self.shell_box.currentText())
        self.verdict_label.setText(pick.reason + "\n" + "\n".join(p.reason for p in per_task))
        self.command.setPlainText(exp.command)

    def show_error(self, message: str) -> None:
        self.statusBar().showMessage(message)
        if not getattr(self, "quiet_errors", False):
            QMessageBox.warning(self, "MTP Tuner", message)
        else:
            self.last_error = message

    def closeEvent(self, event) -> None:  # noqa: N802
        self.settings.setValue("geometry", self.saveGeometry())
        for job in (self.job, getattr(self, "probe_job", None)):
            if job is not None and job.is_running():
                job.cancel()
                job.wait(10000)
        super().closeEvent(event)
