"""The Sweep tab's live plots: the running arm's tok/s over time (a light LivePlot), acceptance and
speedup per K (pyqtgraph, from items made once per sweep: one series per task and speculative mode,
the n-gram modes, which have no K, each in a column of its own right of the widest K), repainted on
a timer, from the worker-side analysis of the runs so far (app/gui/services/sweep.py).

Each task has its colour in every sweep (common.task_color). Acceptance is on a fixed 0-100 %
axis. The speedup axis follows the point estimates (and 1.0) with a margin, widened by the
intervals only so far and never beyond CLAMP (speedup_view): an interval of a few early runs may
span 0-40x, which would flatten every point onto 1.0; an interval that leaves the view is cut at
its edge and marked there with a caret pointing on (its whole extent in the caret's tooltip)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, QTimer

from app.core.analysis.analysis import Analysis, CellStats
from app.core.measure.events import TokenProgress
from app.core.records.arm import MTP, Arm, takes_k
from app.core.records.schema import RunRecord

from ...common import COLORS, make_plot, nice_range, percent_axis, set_tick_step, task_color
from .liveplot import LivePlot

_Floats = npt.NDArray[np.float64]
_Points = tuple[str, _Floats, _Floats, _Floats, _Floats]  # key, x, estimate, interval's low and high end


class LivePlots(QObject):
    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        # repainted ~10x a second while runs are timed: a light widget, not a pyqtgraph scene
        self.speed_plot = LivePlot("Running arm: tok/s over time", "time in run (s)", "decode speed (tok/s)",
                                   COLORS[0], empty="The decode speed of the run in progress appears here once "
                                                    "a sweep starts")
        self.speed_plot.setToolTip("Decode speed of the run in progress so far (tokens after the first over the "
                                   "time since the first); the whole run once it finished")
        self.speed_curve = self.speed_plot  # the item the repaint updates
        self.acc_plot = make_plot("Acceptance per K", "draft width K", "accepted", left_units="%",
                                  tip="Share of drafted tokens the model accepted, per task type and speculative "
                                      "mode (an n-gram mode that drafted nothing has no point)",
                                  empty="The share of drafts accepted per K appears here once the first runs "
                                        "finish")
        self.speedup_plot = make_plot("Speedup per K (95 % interval)", "draft width K", "speedup",
                                      left_units="x",
                                      tip="Geometric mean of paired MTP/baseline ratios with its 95 % interval. "
                                          "Above the dashed line MTP is faster. The axis follows the points: an "
                                          "interval that goes beyond it is cut at the edge and marked with a caret",
                                      empty="The speedup per K, with its 95 % interval, appears here once the "
                                            "first runs finish")
        self.speedup_plot.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#888", style=Qt.PenStyle.DashLine)))
        for p in (self.acc_plot, self.speedup_plot):
            p.getAxis("bottom").setTickSpacing(1, 1)  # K is a whole number
        percent_axis(self.acc_plot)
        self.speedup_range = (1.0, 1.0)
        self._set_speedup_range(*speedup_view([], []))
        self.widgets = (self.speed_plot, self.acc_plot, self.speedup_plot)
        # keyed by series_key(task, mode): the task alone for draft-mtp on the model's own heads
        self.acc_items: dict[str, pg.PlotDataItem] = {}
        self.speedup_items: dict[str, tuple[pg.PlotDataItem, pg.ErrorBarItem]] = {}
        self.clip_items: dict[str, pg.ScatterPlotItem] = {}  # per series: the carets of cut intervals
        self.series: dict[str, tuple[str, str]] = {}  # key -> (task, mode label)
        self.columns: dict[str, int] = {}  # n-gram mode -> its x position
        self.tasks: list[str] = []
        # the legend's entries of a sweep of several modes (drawn nowhere else)
        self.samples: list[pg.PlotDataItem] = []
        self.timer = QTimer(self)
        self.timer.setInterval(100)  # 10 Hz, from pre-created items
        self.timer.timeout.connect(self.repaint)
        self.speed: list[tuple[float, float]] = []
        self.first: tuple[float, int] | None = None
        self.speed_dirty = self.runs_dirty = False
        self.analysis: Analysis | None = None
        self.range_hint: tuple[float, float] | None = None  # (longest run s, fastest tok/s) so far

    def prepare(self, tasks: list[str], arms: Iterable[Arm] = ()) -> None:
        """Fresh items for a sweep over ``tasks`` and the speculative ``arms`` (draft-mtp when none
        given): one acceptance line and one set of speedup points per task and mode."""
        self.tasks = list(tasks)
        self.speed, self.first, self.analysis, self.range_hint = [], None, None, None
        for item in self.acc_items.values():
            self.acc_plot.removeItem(item)
        for items in self.speedup_items.values():
            for item in items:
                self.speedup_plot.removeItem(item)
        for item in self.clip_items.values():
            self.speedup_plot.removeItem(item)
        for p in (self.acc_plot, self.speedup_plot):
            if p.getPlotItem().legend is not None:
                p.getPlotItem().legend.clear()
        spec = [a for a in arms if a.is_spec] or [Arm(1)]
        modes = list(dict.fromkeys(a.mode_label for a in spec))
        widest = max((a.k for a in spec if a.k), default=0)
        self.columns = {m: widest + 1 + i for i, m in enumerate(m for m in modes if not _takes_k(m))}
        self._axes(widest)
        self.acc_items, self.speedup_items, self.clip_items, self.series = {}, {}, {}, {}
        for j, mode in enumerate(modes):
            symbol, style = SYMBOLS[j % len(SYMBOLS)], STYLES[j % len(STYLES)]
            for task in self.tasks:
                key = series_key(task, mode)
                name = task if modes == [MTP] else None  # several modes: colour = task, symbol = mode
                col = task_color(task)  # the task's colour in every sweep, whatever the order of tasks
                # an n-gram mode is one point per task: no line
                pen = pg.mkPen(col, width=2, style=style) if _takes_k(mode) else None
                self.acc_items[key] = self.acc_plot.plot([], [], pen=pen, symbol=symbol, symbolBrush=col,
                                                         symbolSize=9, name=name)
                pts = self.speedup_plot.plot([], [], pen=None, symbol=symbol, symbolBrush=col, symbolSize=9,
                                             name=name)
                bars = pg.ErrorBarItem(x=np.array([]), y=np.array([]), pen=pg.mkPen(col), beam=0.08)
                self.speedup_plot.addItem(bars)
                self.speedup_items[key] = (pts, bars)
                clip = pg.ScatterPlotItem(pen=pg.mkPen(col), brush=pg.mkBrush(col), size=10, hoverable=True,
                                          tip=_clip_tip)
                self.speedup_plot.addItem(clip)
                self.clip_items[key] = clip
                self.series[key] = (task, mode)
        if modes != [MTP]:
            self._legend(modes)
        self.speed_plot.reset()

    def _legend(self, modes: list[str]) -> None:
        """The legend of a sweep of several modes: each task's colour, and beside it each mode's
        symbol (and line), instead of one entry per task and mode."""
        self.samples = []
        for p, lines in ((self.acc_plot, True), (self.speedup_plot, False)):
            legend = p.getPlotItem().legend
            if legend is None:
                continue
            entries = [(task, dict(pen=pg.mkPen(task_color(task), width=3), symbol=None)) for task in self.tasks]
            marks = [(mode, dict(pen=pg.mkPen(GREY, width=2, style=STYLES[j % len(STYLES)])
                                 if lines and _takes_k(mode) else None,
                                 symbol=SYMBOLS[j % len(SYMBOLS)], symbolBrush=GREY, symbolPen=GREY, symbolSize=9))
                     for j, mode in enumerate(modes)]
            for name, opts in entries + marks:  # one column right of the data: the tasks, then the modes
                self._sample(legend, name, **opts)

    def _sample(self, legend: pg.LegendItem, name: str, **opts: Any) -> None:
        item = pg.PlotDataItem([0.0], [0.0], **opts)  # one point: the legend draws its symbol's colours
        self.samples.append(item)
        legend.addItem(item, name)

    def show_analysis(self, analysis: Analysis) -> None:
        """A finished (or recorded) sweep's analysis, drawn now with items made for its arms."""
        self.prepare(list(dict.fromkeys(c.task for c in analysis.cells)), [c.arm for c in analysis.cells])
        self.finish(analysis, None)

    def _axes(self, widest: int) -> None:
        """K's whole numbers on the x axis, then each n-gram mode's name under its column."""
        right = max([widest, *self.columns.values()])
        for p in (self.acc_plot, self.speedup_plot):
            axis = p.getAxis("bottom")
            p.getPlotItem().legend.setColumnCount(1)
            if right:  # the sweep's K and columns from the start: the axis does not move as runs come
                p.setXRange(0.5, right + 0.5, padding=0)
            if self.columns:
                axis.setTicks([[(k, str(k)) for k in range(1, widest + 1)]
                               + [(x, m) for m, x in self.columns.items()], []])
                p.setLabel("bottom", "draft width K | n-gram modes")
            else:
                axis.setTicks(None)
                p.setLabel("bottom", "draft width K")

    def token_progress(self, ev: TokenProgress) -> None:
        # decode speed so far: tokens after the first over the time since the first (the record's
        # tok/s is the same figure at the end of the run)
        if self.first is None:
            self.first = (ev.elapsed_s, ev.n_tokens)
        elif ev.n_tokens > self.first[1] and ev.elapsed_s > self.first[0]:
            self.speed.append((ev.elapsed_s, (ev.n_tokens - self.first[1]) / (ev.elapsed_s - self.first[0])))
            self.speed_dirty = True

    def run_done(self, record: RunRecord) -> None:
        self.speed = _speed_curve(record.token_times)
        self.speed_dirty = True

    def run_started(self, title: str, tip: str) -> None:
        self.speed_plot.setTitle(title)
        self.speed_plot.setToolTip(tip)
        self.fix_speed_range()
        self.speed, self.first = [], None
        self.speed_dirty = True

    def set_analysis(self, analysis: Analysis) -> None:
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
        points: list[_Points] = []
        drafting = [key for key, (_, mode) in self.series.items() if _takes_k(mode)]
        for key, (task, mode) in self.series.items():
            cells = sorted((c for c in a.cells if c.task == task and c.arm.is_spec and c.arm.mode_label == mode),
                           key=lambda c: c.arm.k or 0)
            # points side by side around each K or mode column, so that they (and their intervals)
            # do not hide each other: around K every task and draft mode, in a column every task
            if key in drafting:
                step, i, n = min(0.12, 0.45 / len(drafting)), drafting.index(key), len(drafting)
            else:
                step, i, n = 0.12, self.tasks.index(task), len(self.tasks)
            shift = step * (i - (n - 1) / 2)
            acc = [(c.arm, c.acceptance) for c in cells if c.acceptance is not None]
            nudge = 0.0 if key in drafting else shift  # a draft mode's acceptance is a line through each K
            self.acc_items[key].setData([self._x(arm) + nudge for arm, _ in acc], [100 * v for _, v in acc])
            sp = [(c.arm, s) for c in cells if (s := _speedup(c)) is not None]
            pts, bars = self.speedup_items[key]
            xs = np.array([self._x(arm) + shift for arm, _ in sp], dtype=np.float64)
            ys = np.array([s[0] for _, s in sp], dtype=np.float64)
            pts.setData(xs, ys)
            lo = np.array([s[1] for _, s in sp], dtype=np.float64)
            hi = np.array([s[2] for _, s in sp], dtype=np.float64)
            bars.setData(x=xs, y=ys, top=hi, bottom=lo)
            points.append((key, xs, ys, ys - lo, ys + hi))
        self._show_speedup_range(points)

    def _show_speedup_range(self, points: list[_Points]) -> None:
        """The speedup axis from the estimates (speedup_view), then a caret at the edge for each
        interval it cuts: pointing up at the top, down at the bottom."""
        ests = [float(y) for _, _, ys, _, _ in points for y in ys]
        ends = [(float(lo), float(hi)) for _, _, _, los, his in points for lo, hi in zip(los, his)]
        a, b = speedup_view(ests, ends)
        self._set_speedup_range(a, b)
        inset = 0.03 * (b - a)  # the caret inside the view, its tip at the edge: 5 px once laid out
        px = self.speedup_plot.getViewBox().viewPixelSize()[1]
        if self.speedup_plot.isVisible() and 0 < 5 * px < inset:
            inset = 5 * px
        for key, xs, _, los, his in points:
            spots = [dict(pos=(x, b - inset), symbol="t1", data=(lo, hi)) for x, lo, hi in zip(xs, los, his) if hi > b]
            spots += [dict(pos=(x, a + inset), symbol="t", data=(lo, hi)) for x, lo, hi in zip(xs, los, his) if lo < a]
            self.clip_items[key].setData(spots)

    def _set_speedup_range(self, a: float, b: float) -> None:
        if (a, b) != self.speedup_range:
            self.speedup_range = (a, b)
            self.speedup_plot.setYRange(a, b, padding=0)
            set_tick_step(self.speedup_plot, nice_range(a, b)[2])

    def _x(self, arm: Arm) -> float:
        return float(arm.k) if arm.k else float(self.columns.get(arm.mode_label, 0))

    def finish(self, analysis: Analysis | None, last_run: str | None) -> None:
        """The sweep ended: the final analysis and the last run's curve, drawn now."""
        self.timer.stop()
        if analysis is not None:
            self.analysis = analysis
        self.speed_dirty = self.runs_dirty = True
        self.repaint(force=True)
        if last_run:
            self.speed_plot.setTitle(f"Last run: {last_run}")


SYMBOLS = ("o", "t", "s", "d", "star", "p", "h", "+")  # one per mode, in the sweep's order
CLAMP = (0.25, 4.0)  # the speedup axis never goes beyond this for an interval's sake
GREY = "#888"  # the modes' legend entries (the colours are the tasks')
STYLES = (Qt.PenStyle.SolidLine, Qt.PenStyle.DashLine, Qt.PenStyle.DotLine, Qt.PenStyle.DashDotLine)


def series_key(task: str, mode: str) -> str:
    """The items' key of a task's series in a mode (an arm's mode_label): the task alone for
    draft-mtp on the model's own heads (the only mode before others were swept), else
    "task, mode"."""
    return task if mode == MTP else f"{task}, {mode}"


def speedup_view(estimates: list[float], intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """The speedup axis's range: the point estimates and 1.0 with a margin, widened towards the
    intervals' ends by at most about the estimates' span (0.3x at least), never beyond CLAMP for
    an interval (an estimate outside it still shows), at round ticks."""
    lo, hi = min([*estimates, 1.0]), max([*estimates, 1.0])
    span = hi - lo
    pad, reach = max(0.05, 0.15 * span), max(0.3, span)
    ilo = min((i[0] for i in intervals), default=lo)
    ihi = max((i[1] for i in intervals), default=hi)
    a = min(lo - pad, max(ilo, lo - reach, CLAMP[0]))
    b = max(hi + pad, min(ihi, hi + reach, CLAMP[1]))
    a, b, _ = nice_range(a, b)
    return max(a, min(CLAMP[0], lo - pad), 0.0), min(b, max(CLAMP[1], hi + pad))


def _clip_tip(x: float, y: float, data: tuple[float, float]) -> str:
    lo, hi = data
    return f"95 % interval {lo:.2f}x-{hi:.2f}x: beyond the axis, cut at its edge"


def _speedup(c: CellStats) -> tuple[float, float, float] | None:
    """A cell's speedup estimate and its interval's distances below and above it (0 for an end
    not known); None without an estimate (the baseline, or no pairs yet)."""
    r = c.ratio
    if r is None or not r.estimate:
        return None
    est = r.estimate
    return est, est - (r.lo if r.lo is not None else est), (r.hi if r.hi is not None else est) - est


def _takes_k(mode_label: str) -> bool:
    return takes_k(mode_label.split()[0])


def _speed_curve(token_times: Sequence[float] | None) -> list[tuple[float, float]]:
    """(time, decode tok/s so far) along a finished run, at most ~200 points."""
    t = list(token_times or ())
    if len(t) < 3:
        return []
    step = max(1, len(t) // 200)
    return [(t[i], i / (t[i] - t[0])) for i in range(2, len(t), step) if t[i] > t[0]]

