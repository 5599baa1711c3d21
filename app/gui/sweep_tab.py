"""Sweep tab: engine, K range, p_min, tokens, repetitions, tasks, exhaustive or adaptive; Start /
Cancel with progress and ETA; live plots repainted on a timer from pre-created items."""

from __future__ import annotations

import dataclasses
import time

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QProgressBar, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from app.core.common.errors import UserError

from .adapter import CoreJob
from .common import COLORS, make_plot

TIPS = {
    "k": "Draft widths K to compare (llama-server --spec-draft-n-max): how many tokens the MTP head "
         "drafts per step. e.g. 1,2,3,4 or 1-6",
    "p_min": "Draft p_min values (--spec-draft-p-min): drafting stops early when the draft's top "
             "probability is below this. 0 = always draft K tokens. e.g. 0,0.5",
    "n_predict": "Tokens generated per run. MTP needs a longer generation to pay off (128 or more)",
    "reps": "Measured repetitions per prompt and arm (the adaptive mode's most); speedup intervals need at "
            "least 3",
    "engine": "in-process: llama-cpp-python, one model load for all arms (default). "
              "llama-server: a real server per configuration, to confirm",
    "tasks": "Prompt suites by task type; code and repetitive text accept drafts well, stories poorly",
    "mode": "exhaustive: every K and p_min, every prompt, every repetition. adaptive: a cost probe and a "
            "pilot first, then repetitions only for the best candidates (far fewer runs)",
    "mix": "How your work divides between task types, e.g. code=0.7,story=0.3 (empty: equal). The "
           "recommendation and the adaptive mode optimise this mix",
}


class SweepTab:
    def _build_sweep(self) -> QWidget:
        import pyqtgraph as pg

        w = QWidget()
        lay = QVBoxLayout(w)
        form = QFormLayout()
        self.engine_box = QComboBox()
        self.engine_box.addItems(["in-process", "llama-server"])
        self.engine_box.setToolTip(TIPS["engine"])
        self.mode_box = QComboBox()
        self.mode_box.addItems(["exhaustive", "adaptive"])
        self.mode_box.setToolTip(TIPS["mode"])
        self.k_edit = QLineEdit("1,2,3,4")
        self.k_edit.setToolTip(TIPS["k"])
        self.pmin_edit = QLineEdit("0")
        self.pmin_edit.setToolTip(TIPS["p_min"])
        self.npredict = QSpinBox(minimum=8, maximum=8192, value=128)
        self.npredict.setToolTip(TIPS["n_predict"])
        self.reps = QSpinBox(minimum=1, maximum=50, value=3)
        self.reps.setToolTip(TIPS["reps"])
        self.task_row = QHBoxLayout()
        self.task_boxes: dict[str, QCheckBox] = {}
        self.update_task_boxes()
        self.threads = QSpinBox(minimum=0, maximum=256, value=0)
        self.threads.setSpecialValueText("all cores")
        self.threads.setToolTip("CPU threads for llama.cpp (-t). All cores is the usual choice; fewer leaves a "
                                "core to the rest of the machine (and to this window's live plots)")
        self.per_task = QSpinBox(minimum=1, maximum=50, value=2)
        self.per_task.setToolTip("Prompts per task type (the first N of each suite)")
        self.mix_edit = QLineEdit(str(self.settings.value("task_mix", "")))
        self.mix_edit.setPlaceholderText("equal weights")
        self.mix_edit.setToolTip(TIPS["mix"])
        self.mix_edit.editingFinished.connect(self._mix_changed)
        form2 = QFormLayout()
        top = QHBoxLayout()
        top.addLayout(form)
        top.addLayout(form2)
        form.addRow("Engine", self.engine_box)
        form.addRow("Mode", self.mode_box)
        form.addRow("Draft widths K", self.k_edit)
        form.addRow("p_min", self.pmin_edit)
        form.addRow("CPU threads", self.threads)
        form2.addRow("Tokens per run", self.npredict)
        form2.addRow("Repetitions", self.reps)
        form2.addRow("Tasks", self.task_row)
        form2.addRow("Prompts per task", self.per_task)
        form2.addRow("Task mix", self.mix_edit)
        buttons = QHBoxLayout()
        self.start_btn = QPushButton("Start sweep")
        self.start_btn.setToolTip("Results are appended to a JSONL file after every run: nothing is lost "
                                  "if the app stops")
        self.start_btn.clicked.connect(lambda: self.start_sweep())
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setEnabled(False)
        self.cancel_btn.clicked.connect(self.cancel_sweep)
        buttons.addWidget(self.start_btn)
        buttons.addWidget(self.cancel_btn)
        self.progress = QProgressBar()
        self.progress_label = QLabel("")
        plots = QHBoxLayout()
        from .liveplot import LivePlot

        # repainted ~10x a second while runs are timed: a light widget, not a pyqtgraph scene
        self.speed_plot = LivePlot("Running arm: tok/s over time", "time in run (s)", "decode speed (tok/s)",
                                   COLORS[0])
        self.speed_plot.setToolTip("Decode speed of the run in progress so far (tokens after the first over the "
                                   "time since the first); the whole run once it finished")
        self.speed_curve = self.speed_plot  # the item the repaint updates
        self.acc_plot = make_plot("Acceptance per K", "draft width K", "accepted drafts", left_units="%",
                                  tip="Share of drafted tokens the model accepted, per task type")
        self.speedup_plot = make_plot("Speedup per K (95 % interval)", "draft width K", "speedup over baseline",
                                      left_units="x",
                                      tip="Geometric mean of paired MTP/baseline ratios with its 95 % interval. "
                                          "Above the dashed line MTP is faster")
        self.speedup_plot.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#888", style=Qt.DashLine)))
        for p in (self.acc_plot, self.speedup_plot):
            p.getAxis("bottom").setTickSpacing(1, 1)  # K is a whole number
        for p in (self.speed_plot, self.acc_plot, self.speedup_plot):
            plots.addWidget(p, 1)
        self._acc_items: dict[str, object] = {}
        self._speedup_items: dict[str, tuple] = {}
        self._pg = pg
        lay.addLayout(top)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.progress_label)
        lay.addLayout(plots, 1)
        self.repaint_timer = QTimer(self)
        self.repaint_timer.setInterval(100)  # 10 Hz, from pre-created items
        self.repaint_timer.timeout.connect(self._repaint)
        self._speed: list[tuple[float, float]] = []
        self._first: tuple[float, int] | None = None
        self._speed_dirty = self._runs_dirty = False
        self._live_analysis = None
        self._range_hint: tuple[float, float] | None = None  # (longest run s, fastest tok/s) so far
        return w

    def update_task_boxes(self) -> None:
        checked = {t: cb.isChecked() for t, cb in self.task_boxes.items()}
        for cb in self.task_boxes.values():
            self.task_row.removeWidget(cb)
            cb.deleteLater()
        self.task_boxes = {}
        for t in self.prompt_tasks():
            cb = QCheckBox(t, checked=checked.get(t, True))
            cb.setToolTip(TIPS["tasks"])
            self.task_boxes[t] = cb
            self.task_row.addWidget(cb)

    def _mix_changed(self) -> None:
        self.settings.setValue("task_mix", self.mix_edit.text().strip())
        self.update_export()

    def _plan(self):
        from app.core.measure.plan import Plan, make_arms, parse_float_list, parse_int_list
        from app.core.measure.prompts import select_prompts

        model = self.model_edit.text().strip()
        if not model:
            raise UserError("choose a model first (Model tab)")
        tasks = [t for t, cb in self.task_boxes.items() if cb.isChecked()]
        if not tasks:
            raise UserError("choose at least one task type")
        arms = make_arms(parse_int_list(self.k_edit.text(), "Draft widths K"),
                         parse_float_list(self.pmin_edit.text(), "p_min"))
        from app.core.engines.calibrated import demo_prompts

        # the demo model's own prompts lead into each task's region; other tasks use the suites
        demo = [p for p in demo_prompts(model) or () if p.task in tasks]
        rest = [t for t in tasks if t not in {p.task for p in demo}]
        prompts = demo + (select_prompts(rest, self.user_prompt_file(), per_task=self.per_task.value())
                          if rest else [])
        return Plan(model=model, arms=arms, prompts=tuple(prompts), n_predict=self.npredict.value(),
                    reps=self.reps.value(), warmup=1,
                    engine="inprocess" if self.engine_box.currentIndex() == 0 else "server")

    def make_engine(self, plan):
        from app.core.engines.base import EngineKind, EngineSettings
        from app.core.engines.factory import make_engine

        return make_engine(EngineSettings(kind=EngineKind.parse(plan.engine), threads=self.threads.value() or None,
                                          server_bin=self.server_binary() if plan.engine == "server" else None))

    def start_sweep(self, plan=None) -> None:
        """Start the sweep of the form (or ``plan``, e.g. an earlier sweep's, run again)."""
        from app.core.measure import runner as R
        from app.core.records.writer import ResultsWriter

        if plan is None:  # the form's own sweep: nothing to compare with afterwards
            self._compare_after = None
        adaptive = plan is None and self.mode_box.currentText() == "adaptive"
        try:
            plan = plan or self._plan()
            mix = self.mix_edit.text().strip() or None
            if adaptive:
                from app.core.analysis.recommend import parse_mix

                parse_mix(mix, tuple(dict.fromkeys(p.task for p in plan.prompts)))  # bad mix: error now
            engine = self.make_engine(plan)
            self.results_path = R.default_results_path(plan.model)
            writer = ResultsWriter(self.results_path)
        except UserError as e:
            self.show_error(str(e))
            return
        self.records = []
        self.file_notes = []  # notes about an opened results file do not apply to a new sweep
        self.file_sweep_box.setVisible(False)
        self._arms = list(plan.arms)
        self._tasks = list(dict.fromkeys(p.task for p in plan.prompts))
        self._done, self._total = 0, (0 if adaptive else plan.total_runs)
        self._t0 = time.monotonic()
        self._last_run = None
        self._speed = []
        self._live_analysis = self._range_hint = None
        self._prepare_live_items()
        self.progress.setMaximum(max(1, self._total))
        self.progress.setValue(0)
        self.progress.setFormat("%v runs" if adaptive else "%v / %m runs")
        # read the widgets here, on the GUI thread; the factory runs on the worker
        ks = sorted({a.k for a in plan.arms if a.k})
        p_mins = sorted({a.p_min for a in plan.arms if a.k})

        def factory(cancel):
            try:
                if adaptive:
                    from app.core.analysis.adaptive import adaptive_sweep

                    gen = adaptive_sweep(dataclasses.replace(plan, arms=(plan.arms[0],)), engine, ks=ks,
                                         p_mins=p_mins, mix=mix, max_reps=max(plan.reps, 2), writer=writer,
                                         cancel=cancel)
                else:
                    gen = R.run_sweep(plan, engine, writer, cancel)
                yield from _with_live_analysis(gen)
            finally:
                writer.close()
                engine.close()

        self.job = CoreJob(factory, self)
        self.job.event.connect(self.on_event)
        self.job.failed.connect(self.show_error)
        self.job.finished.connect(self.on_finished)
        self.start_btn.setEnabled(False)
        self.cancel_btn.setEnabled(True)
        self.repaint_timer.start()
        self.job.start()
        self.statusBar().showMessage(f"Sweeping: results go to {self.results_path}")

    def _prepare_live_items(self) -> None:
        pg = self._pg
        for item in self._acc_items.values():
            self.acc_plot.removeItem(item)
        for items in self._speedup_items.values():
            for item in items:
                self.speedup_plot.removeItem(item)
        self.acc_plot.getPlotItem().legend.clear() if self.acc_plot.getPlotItem().legend else None
        self.speedup_plot.getPlotItem().legend.clear() if self.speedup_plot.getPlotItem().legend else None
        self._acc_items, self._speedup_items = {}, {}
        for i, task in enumerate(self._tasks):
            col = COLORS[i % len(COLORS)]
            self._acc_items[task] = self.acc_plot.plot([], [], pen=pg.mkPen(col, width=2), symbol="o",
                                                      symbolBrush=col, name=task)
            pts = self.speedup_plot.plot([], [], pen=None, symbol="o", symbolBrush=col, name=task)
            bars = pg.ErrorBarItem(x=self._np().array([]), y=self._np().array([]), pen=pg.mkPen(col), beam=0.08)
            self.speedup_plot.addItem(bars)
            self._speedup_items[task] = (pts, bars)
        self.speed_curve.setData([], [])

    @staticmethod
    def _np():
        import numpy

        return numpy

    def cancel_sweep(self) -> None:
        if self.job:
            self.job.cancel()
            self.statusBar().showMessage("Cancelling…")

    def on_event(self, ev) -> None:
        from app.core.measure import runner as R

        if isinstance(ev, R.TokenProgress):
            # decode speed so far: tokens after the first over the time since the first (the
            # record's tok/s is the same figure at the end of the run)
            if self._first is None:
                self._first = (ev.elapsed_s, ev.n_tokens)
            elif ev.n_tokens > self._first[1] and ev.elapsed_s > self._first[0]:
                self._speed.append((ev.elapsed_s, (ev.n_tokens - self._first[1]) / (ev.elapsed_s - self._first[0])))
                self._speed_dirty = True
        elif isinstance(ev, LiveAnalysis):
            self._live_analysis = ev.analysis
            self._runs_dirty = True
        elif isinstance(ev, (R.RunFinished, R.RunFailed)):
            self.records.append(ev.record)
            self._speed = _speed_curve(ev.record.token_times)
            self._speed_dirty = True
            self._done += 1
            self.progress.setMaximum(max(self._total, self._done, 1))
            self.progress.setValue(self._done)
            el = time.monotonic() - self._t0
            if self._total:
                eta = el / self._done * (self._total - self._done)
                self.progress_label.setText(f"{self._done}/{self._total} runs, {el:.0f} s, about {eta:.0f} s left")
            else:
                self.progress_label.setText(f"{self._done} runs, {el:.0f} s")
        elif isinstance(ev, R.RunStarted):
            what = "warmup" if ev.warmup else f"run {ev.index + 1}/{ev.total}"
            self.statusBar().showMessage(f"{what}: {ev.arm.label}, {ev.task}/{ev.prompt_id}")
            self._last_run = f"{ev.arm.label}, {ev.task}" + (" (warmup)" if ev.warmup else "")
            self.speed_plot.setTitle(f"Running: {self._last_run}")
            self.speed_plot.setToolTip(f"Decode speed of {ev.task}/{ev.prompt_id}, {ev.arm.label}, so far (tokens "
                                       "after the first over the time since the first)")
            self._fix_speed_range()
            self._speed, self._first = [], None
            self._speed_dirty = True
        elif isinstance(ev, R.SweepError):
            self.show_error(ev.message)
        elif isinstance(ev, R.SweepWarning):
            self.findings.appendPlainText("warning: " + ev.message)
        else:
            self._adaptive_event(ev)

    def _fix_speed_range(self) -> None:
        """Axes fixed from the runs so far, warmups included (longest run, fastest tok/s), so the
        curve of a run does not rescale while it grows."""
        if self._speed:
            t, v = max(s[0] for s in self._speed), max(s[1] for s in self._speed)
            old = self._range_hint or (0.0, 0.0)
            self._range_hint = (max(old[0], t), max(old[1], v))
        if self._range_hint is not None:
            self.speed_plot.setRange(1.15 * self._range_hint[0], 1.3 * self._range_hint[1])

    def _adaptive_event(self, ev) -> None:
        from app.core.analysis.adaptive import AdaptiveResult, AdaptiveStage

        if isinstance(ev, AdaptiveStage):
            self.progress_label.setText(f"adaptive: {ev.message}")
        elif isinstance(ev, AdaptiveResult):
            pick = "leave MTP off" if ev.pick is None else ev.pick.label
            why = " (the cost probe says no draft width can pay on this machine)" if ev.runs == 0 else ""
            self.progress_label.setText(f"adaptive: done after {ev.runs} runs; best for the mix: {pick}{why}")
            if ev.cost is not None:
                self.show_probe(ev.cost)

    def _repaint(self, force: bool = False) -> None:
        # Every redraw takes CPU (and the GIL) from the measurement running beside it, so: the
        # timer fires at 10 Hz; items are only touched when something new arrived and their tab is
        # on screen (a hidden tab catches up when shown); the analysis behind the acceptance and
        # speedup plots was computed on the worker thread between two runs (LiveAnalysis).
        if self._speed_dirty and (force or self.speed_plot.isVisible()):
            self._speed_dirty = False
            self.speed_curve.setData([s[0] for s in self._speed], [s[1] for s in self._speed])
        if not self._runs_dirty or self._live_analysis is None or not (force or self.acc_plot.isVisible()):
            return
        self._runs_dirty = False
        a = self._live_analysis
        np = self._np()
        for task in self._tasks:
            cells = sorted((c for c in a.cells if c.task == task and c.arm.k), key=lambda c: c.arm.k)
            acc = [c for c in cells if c.acceptance is not None]
            if task in self._acc_items:
                self._acc_items[task].setData([c.arm.k for c in acc], [100 * c.acceptance for c in acc])
            sp = [c for c in cells if c.ratio and c.ratio.estimate]
            if task in self._speedup_items:
                pts, bars = self._speedup_items[task]
                # tasks side by side around each K, so their intervals do not hide each other
                shift = 0.12 * (self._tasks.index(task) - (len(self._tasks) - 1) / 2)
                xs = np.array([c.arm.k + shift for c in sp], dtype=float)
                ys = np.array([c.ratio.estimate for c in sp], dtype=float)
                pts.setData(xs, ys)
                lo = np.array([c.ratio.estimate - (c.ratio.lo if c.ratio.lo is not None else c.ratio.estimate)
                               for c in sp], dtype=float)
                hi = np.array([(c.ratio.hi if c.ratio.hi is not None else c.ratio.estimate) - c.ratio.estimate
                               for c in sp], dtype=float)
                bars.setData(x=xs, y=ys, top=hi, bottom=lo)

    def on_finished(self) -> None:
        self.repaint_timer.stop()
        self.start_btn.setEnabled(True)
        self.cancel_btn.setEnabled(False)
        cancelled = bool(self.job and self.job.cancel_token.cancelled)
        self.job = None
        self.show_results()
        if self.analysis is not None:
            self._live_analysis = self.analysis
        self._speed_dirty = self._runs_dirty = True
        self._repaint(force=True)
        if getattr(self, "_last_run", None):
            self.speed_plot.setTitle(f"Last run: {self._last_run}")
        if self._done and not self.progress_label.text().startswith("adaptive"):
            self.progress_label.setText(f"{self._done} runs in {time.monotonic() - self._t0:.0f} s"
                                        + (", cancelled" if cancelled else ", done"))
        if self.results_path:
            self.refresh_history()
        again_of, self._compare_after = getattr(self, "_compare_after", None), None
        if again_of and not cancelled and self.records:
            self.compare_results(again_of, shown_is_b=True)  # "Run again": the earlier sweep (A) against this one
        self.statusBar().showMessage(("Cancelled" if cancelled else "Finished")
                                     + (f"; results in {self.results_path}" if self.results_path else ""))
        self.sweep_finished.emit()


def _speed_curve(token_times) -> list[tuple[float, float]]:
    """(time, decode tok/s so far) along a finished run, at most ~200 points."""
    t = list(token_times or ())
    if len(t) < 3:
        return []
    step = max(1, len(t) // 200)
    return [(t[i], i / (t[i] - t[0])) for i in range(2, len(t), step) if t[i] > t[0]]


@dataclasses.dataclass(frozen=True)
class LiveAnalysis:
    """The analysis of the runs so far, for the live plots."""

    analysis: object


def _with_live_analysis(gen):
    """Pass the sweep's events through; after each finished run, analyse the runs so far here, on
    the worker thread, before the next run starts: never while a run is being timed."""
    from app.core.measure import runner as R
    from app.core.analysis.analysis import analyze

    recs = []
    for ev in gen:
        yield ev
        if isinstance(ev, (R.RunFinished, R.RunFailed)):
            recs.append(ev.record)
            if any(r.status == "ok" for r in recs):
                yield LiveAnalysis(analyze(recs))
