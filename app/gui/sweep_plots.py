"""The Sweep tab's live plots: the running arm's tok/s over time (a light LivePlot), acceptance and
speedup per K (pyqtgraph, from items made once per sweep), repainted on a timer; and the worker-side
analysis of the runs so far that feeds them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, QTimer

from app.core.measure import runner as R

from .common import COLORS, make_plot
from .liveplot import LivePlot


class LivePlots(QObject):
    def __init__(self, parent: QObject):
        super().__init__(parent)
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
        self.widgets = (self.speed_plot, self.acc_plot, self.speedup_plot)
        self.acc_items: dict[str, object] = {}
        self.speedup_items: dict[str, tuple] = {}
        self.tasks: list[str] = []
        self.timer = QTimer(self)
        self.timer.setInterval(100)  # 10 Hz, from pre-created items
        self.timer.timeout.connect(self.repaint)
        self.speed: list[tuple[float, float]] = []
        self.first: tuple[float, int] | None = None
        self.speed_dirty = self.runs_dirty = False
        self.analysis = None
        self.range_hint: tuple[float, float] | None = None  # (longest run s, fastest tok/s) so far

    def prepare(self, tasks: list[str]) -> None:
        """Fresh items for a sweep over ``tasks``."""
        self.tasks = list(tasks)
        self.speed, self.first, self.analysis, self.range_hint = [], None, None, None
        for item in self.acc_items.values():
            self.acc_plot.removeItem(item)
        for items in self.speedup_items.values():
            for item in items:
                self.speedup_plot.removeItem(item)
        for p in (self.acc_plot, self.speedup_plot):
            if p.getPlotItem().legend is not None:
                p.getPlotItem().legend.clear()
        self.acc_items, self.speedup_items = {}, {}
        for i, task in enumerate(self.tasks):
            col = COLORS[i % len(COLORS)]
            self.acc_items[task] = self.acc_plot.plot([], [], pen=pg.mkPen(col, width=2), symbol="o",
                                                      symbolBrush=col, name=task)
            pts = self.speedup_plot.plot([], [], pen=None, symbol="o", symbolBrush=col, name=task)
            bars = pg.ErrorBarItem(x=np.array([]), y=np.array([]), pen=pg.mkPen(col), beam=0.08)
            self.speedup_plot.addItem(bars)
            self.speedup_items[task] = (pts, bars)
        self.speed_curve.setData([], [])

    def token_progress(self, ev) -> None:
        # decode speed so far: tokens after the first over the time since the first (the record's
        # tok/s is the same figure at the end of the run)
        if self.first is None:
            self.first = (ev.elapsed_s, ev.n_tokens)
        elif ev.n_tokens > self.first[1] and ev.elapsed_s > self.first[0]:
            self.speed.append((ev.elapsed_s, (ev.n_tokens - self.first[1]) / (ev.elapsed_s - self.first[0])))
            self.speed_dirty = True

    def run_done(self, record) -> None:
        self.speed = _speed_curve(record.token_times)
        self.speed_dirty = True

    def run_started(self, title: str, tip: str) -> None:
        self.speed_plot.setTitle(title)
        self.speed_plot.setToolTip(tip)
        self.fix_speed_range()
        self.speed, self.first = [], None
        self.speed_dirty = True

    def set_analysis(self, analysis) -> None:
        self.analysis = analysis
        self.runs_dirty = True

    def fix_speed_range(self) -> None:
        """Axes fixed from the runs so far, warmups included (longest run, fastest tok/s), so the
        curve of a run does not rescale while it grows."""
        if self.speed:
            t, v = max(s[0] for s in self.speed), max(s[1] for s in self.speed)
            old = self.range_hint or (0.0, 0.0)
            self.range_hint = (max(old[0], t), max(old[1], v))
        if self.range_hint is not None:
            self.speed_plot.setRange(1.15 * self.range_hint[0], 1.3 * self.range_hint[1])

    def repaint(self, force: bool = False) -> None:
        # Every redraw takes CPU (and the GIL) from the measurement running beside it, so: the
        # timer fires at 10 Hz; items are only touched when something new arrived and their tab is
        # on screen (a hidden tab catches up when shown); the analysis behind the acceptance and
        # speedup plots was computed on the worker thread between two runs (LiveAnalysis).
        if self.speed_dirty and (force or self.speed_plot.isVisible()):
            self.speed_dirty = False
            self.speed_curve.setData([s[0] for s in self.speed], [s[1] for s in self.speed])
        if not self.runs_dirty or self.analysis is None or not (force or self.acc_plot.isVisible()):
            return
        self.runs_dirty = False
        a = self.analysis
        for task in self.tasks:
            cells = sorted((c for c in a.cells if c.task == task and c.arm.k), key=lambda c: c.arm.k)
            acc = [c for c in cells if c.acceptance is not None]
            if task in self.acc_items:
                self.acc_items[task].setData([c.arm.k for c in acc], [100 * c.acceptance for c in acc])
            sp = [c for c in cells if c.ratio and c.ratio.estimate]
            if task in self.speedup_items:
                pts, bars = self.speedup_items[task]
                # tasks side by side around each K, so their intervals do not hide each other
                shift = 0.12 * (self.tasks.index(task) - (len(self.tasks) - 1) / 2)
                xs = np.array([c.arm.k + shift for c in sp], dtype=float)
                ys = np.array([c.ratio.estimate for c in sp], dtype=float)
                pts.setData(xs, ys)
                lo = np.array([c.ratio.estimate - (c.ratio.lo if c.ratio.lo is not None else c.ratio.estimate)
                               for c in sp], dtype=float)
                hi = np.array([(c.ratio.hi if c.ratio.hi is not None else c.ratio.estimate) - c.ratio.estimate
                               for c in sp], dtype=float)
                bars.setData(x=xs, y=ys, top=hi, bottom=lo)

    def finish(self, analysis, last_run: str | None) -> None:
        """The sweep ended: the final analysis and the last run's curve, drawn now."""
        self.timer.stop()
        if analysis is not None:
            self.analysis = analysis
        self.speed_dirty = self.runs_dirty = True
        self.repaint(force=True)
        if last_run:
            self.speed_plot.setTitle(f"Last run: {last_run}")


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


def with_live_analysis(gen):
    """Pass the sweep's events through; after each finished run, analyse the runs so far here, on
    the worker thread, before the next run starts: never while a run is being timed."""
    from app.core.analysis.analysis import analyze  # not needed to show the window: loaded by a sweep

    recs = []
    for ev in gen:
        yield ev
        if isinstance(ev, (R.RunFinished, R.RunFailed)):
            recs.append(ev.record)
            if any(r.status == "ok" for r in recs):
                yield LiveAnalysis(analyze(recs))
