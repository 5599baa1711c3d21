"""The Watch tab, "Tune from your own use": attach to the user's running llama-server (its /metrics,
/props, /slots and /health; nothing else is read and nothing is changed), and show as traffic comes
in the window's counts, acceptance by draft position, the predicted speedup of off and each K
(with its interval; K past the server's own extrapolated), and the recommendation with its reason.
The core's app.core.watch does the work on a worker (app.gui.jobs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QDoubleSpinBox, QFileDialog, QFormLayout, QGridLayout, QGroupBox, QHBoxLayout,
                               QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget)

from app.core.common.cancel import CancelToken
from app.core.common.text import html_text, shown
from app.core.watch.client import KEY_ENV, Client, normal_url, read_api_key
from app.core.watch.watcher import Live, Summary, mode_of, run_watch

from ..adapter import CoreJob
from ..common import make_plot
from ..jobs import Jobs
from ..state import AppState

BLUE, GREY, GREEN = "#1f77b4", "#9a9a9a", "#2ca02c"
LONG = 1000  # the app's sentences with outside text inside (a reason, a note): one line, bounded
INTRO = ("Tune from your own use: watch your running llama-server while you work (your agent, your chats) and "
         "see which draft width your real traffic wants. Only its counters are read (/metrics, /props, /slots, "
         "/health): no prompt, and nothing on the server changes. Start the server with --metrics.")


class WatchTab(QWidget):
    def __init__(self, state: AppState, jobs: Jobs, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state, self.jobs = state, jobs
        self.job: CoreJob | None = None
        self.last: Live | None = None
        # how a server is reached: the tests give a recorded one
        self.client_factory: Callable[[str, str | None], Client] = lambda url, key: Client(url, key)

        intro = QLabel(INTRO, wordWrap=True)
        self.url = QLineEdit("http://127.0.0.1:8080")
        self.url.setToolTip("The address of your llama-server (started with --metrics)")
        self.key_file = QLineEdit(placeholderText=f"optional: a file holding the API key (else {KEY_ENV})")
        self.key_file.setToolTip("Sent only to this server as its Authorization header; never saved or shown")
        self.costs = QLineEdit(placeholderText="optional: results file with the cost probe "
                                               "(default: the newest matching probe in the results folder)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse_costs)
        self.command = QLineEdit(placeholderText="optional: paste your llama-server command "
                                                 "(to see it with --metrics added when the server lacks it)")
        self.minutes = QDoubleSpinBox(decimals=1, minimum=0.1, maximum=24 * 60.0, value=10.0, suffix=" min")
        self.interval = QDoubleSpinBox(decimals=1, minimum=0.1, maximum=600.0, value=5.0, suffix=" s")
        self.start_button = QPushButton("Start watching")
        self.start_button.clicked.connect(self.start_watch)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.setToolTip("End the window now: the summary and the watch record are kept")
        self.stop_button.clicked.connect(self.stop_watch)

        form = QFormLayout()
        form.addRow("Server", self.url)
        form.addRow("API key file", self.key_file)
        row = QHBoxLayout()
        row.addWidget(self.costs, 1)
        row.addWidget(browse)
        form.addRow("Costs", row)
        form.addRow("Your command", self.command)
        timing = QHBoxLayout()
        for w in (QLabel("watch for"), self.minutes, QLabel("reading every"), self.interval):
            timing.addWidget(w)
        timing.addStretch(1)
        timing.addWidget(self.start_button)
        timing.addWidget(self.stop_button)
        form.addRow("", timing)

        # every label here may show what the server said (its model path, its errors): plain text,
        # so a model called "<h1>..." or "<a href=...>" is shown as it is, never as markup
        self.status = QLabel("Not watching.", wordWrap=True, textFormat=Qt.TextFormat.PlainText)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        counts_box = QGroupBox("This window")
        grid = QGridLayout(counts_box)
        self.values: dict[str, QLabel] = {}
        names = (("server", "server"), ("window", "window"), ("requests", "requests"),
                 ("generated", "generated"), ("speed", "decode speed"), ("steps", "draft steps"),
                 ("drafted", "drafted / accepted"), ("positions", "accepted by position"))
        for i, (key, text) in enumerate(names):
            grid.addWidget(QLabel(text + ":"), i, 0)
            lab = self.values[key] = QLabel("-", wordWrap=True, textFormat=Qt.TextFormat.PlainText)
            lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            grid.addWidget(lab, i, 1)
        grid.setColumnStretch(1, 1)
        grid.setRowStretch(len(names), 1)
        counts_box.setMaximumWidth(420)

        self.acc_plot = make_plot("Acceptance by draft position", "draft position", "share of steps",
                                  left_units="%", legend=False,
                                  tip="The share of verification steps that accepted the drafts up to this "
                                      "position, over this window (llama.cpp's 'acc per pos')")
        self.acc_plot.getAxis("bottom").setTickSpacing(1, 1)
        self.acc_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush=BLUE)
        self.acc_plot.addItem(self.acc_bars)
        # a mark on each bar's top: a data item, which the plot's empty state looks for (bars are not one)
        self.acc_tops = pg.ScatterPlotItem(size=6, symbol="s", brush=pg.mkBrush(BLUE), pen=None)
        self.acc_plot.addItem(self.acc_tops)
        self.sp_plot = make_plot("Predicted speedup per K", "K (0 = off)", "speedup over plain decoding",
                                 legend=False, tip="Predicted from this window's acceptance by position and the "
                                                   "cost probe; bars: the interval from the counts; grey: K "
                                                   "past the server's own (extrapolated)")
        self.sp_plot.getAxis("bottom").setTickSpacing(1, 1)
        self.sp_plot.addLine(y=1.0, pen=pg.mkPen(GREY, style=Qt.PenStyle.DashLine))
        self.sp_points = pg.ScatterPlotItem(size=10)
        self.sp_err = pg.ErrorBarItem(x=np.zeros(0), y=np.zeros(0), top=np.zeros(0), bottom=np.zeros(0), beam=0.2)
        self.sp_plot.addItem(self.sp_err)
        self.sp_plot.addItem(self.sp_points)
        for plot in (self.acc_plot, self.sp_plot):  # no SI scaling: "K (0 = off) (x0.001)" on a range within (-1, 1)
            for name in ("bottom", "left"):
                plot.getAxis(name).enableAutoSIPrefix(False)
        self.sp_plot.setXRange(-0.5, 4.5, padding=0)  # until there are predictions: off and K=1..4
        self.sp_plot.setYRange(0.5, 1.5, padding=0)
        self.acc_plot.setXRange(0.5, 3.5, padding=0)
        self.acc_plot.setYRange(0, 100, padding=0.02)

        self.recommendation = QLabel("The recommendation appears once the window has enough draft steps and a "
                                     "cost probe of this model and device prices them.", wordWrap=True,
                                     textFormat=Qt.TextFormat.PlainText)
        self.recommendation.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        font = self.recommendation.font()
        font.setPointSizeF(font.pointSizeF() * 1.15)
        self.recommendation.setFont(font)
        self.costs_line = QLabel("", wordWrap=True, textFormat=Qt.TextFormat.PlainText)

        plots = QHBoxLayout()
        plots.addWidget(counts_box, 0)
        plots.addWidget(self.acc_plot, 3)
        plots.addWidget(self.sp_plot, 3)
        lay = QVBoxLayout(self)
        lay.addWidget(intro)
        lay.addLayout(form)
        lay.addWidget(self.status)
        # the answer first, then its evidence: the counts and the two plots
        lay.addWidget(QLabel("<b>Recommendation</b>"))
        lay.addWidget(self.recommendation)
        lay.addWidget(self.costs_line)
        lay.addLayout(plots, 1)

    # -- actions ---------------------------------------------------------------------------

    def _browse_costs(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Results file with a cost probe", "", "Results (*.jsonl)")
        if path:
            self.costs.setText(path)

    def start_watch(self) -> None:
        if self.job is not None:
            return
        try:
            key = read_api_key(self.key_file.text().strip() or None)
            url = normal_url(self.url.text().strip())  # refuses a password before anything shows the address
            client = self.client_factory(url, key)
        except Exception as e:  # a UserError (never quoting a password): one line in the status and the error
            self._failed(str(e))
            return
        duration, interval = self.minutes.value() * 60.0, min(self.interval.value(), self.minutes.value() * 60.0)
        costs, command = self.costs.text().strip() or None, self.command.text().strip() or None

        def factory(cancel: CancelToken) -> Iterator[Live]:
            return run_watch(client, duration, interval, costs=costs, command=command, cancel=cancel)

        self.status.setText(f"Attaching to {url}…")
        self.start_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.job = self.jobs.run(factory, self, event=self.show_live, failed=self._failed, finished=self._finished)

    def stop_watch(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def _failed(self, message: str) -> None:
        message = shown(message, LONG)
        self.status.setText(message)
        self.state.show_error(message)

    def _finished(self) -> None:
        if self.status.text().startswith("Attaching to "):  # stopped before the first reading
            self.status.setText("Stopped before the first reading: nothing to keep.")
        self.job = None
        self.start_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    # -- showing ---------------------------------------------------------------------------

    def show_live(self, live: Live) -> None:
        if not isinstance(live, Live):
            return
        self.last = live
        s = live.summary
        c = s.counts
        v = self.values
        model = shown(Path(s.server.model_path).name) if s.server.model_path else "?"
        v["server"].setText(f"{model}\n{shown(mode_of(s.spec_types))}{f', K={s.server_k}' if s.server_k else ''}; "
                            f"build {shown(s.server.build or '?')}")
        v["server"].setToolTip(f"<p>{html_text(f'{s.server.url}: {s.server.model_path or chr(63)}', LONG)}</p>")
        v["window"].setText(f"{c.seconds:.0f} s" + (f" (since the {'last ' if c.restarts > 1 else ''}restart)"
                                                    if c.restarts else ""))
        v["requests"].setText(f"at least {c.requests}")
        v["generated"].setText(f"{c.generated:,} tokens")
        v["speed"].setText(f"{c.decode_tok_s:.1f} tok/s" if c.decode_tok_s else "-")
        v["steps"].setText(f"{c.draft_steps:,}")
        v["drafted"].setText(f"{c.draft_tokens:,} / {c.accepted:,}"
                             + (f" ({c.accepted / c.draft_tokens:.0%})" if c.draft_tokens else ""))
        v["positions"].setText(" / ".join(f"{a:,}" for a in c.accepted_per_pos) or "-")
        rates = c.rates
        self.acc_bars.setOpts(x=list(range(1, len(rates) + 1)), height=[100 * r for r in rates])
        self.acc_tops.setData(x=list(range(1, len(rates) + 1)), y=[100 * r for r in rates])
        if rates:
            self.acc_plot.setXRange(0.5, len(rates) + 0.5, padding=0)
            self.acc_plot.setYRange(0, 100, padding=0.02)
        self._show_predictions(s)
        self.recommendation.setText(shown(s.recommendation.reason, LONG))
        self.costs_line.setText(shown(s.costs_line, LONG) if s.predictions and s.costs_line else "")
        if live.final:
            where = (f"the watch record was appended to {shown(live.saved_to, LONG)}" if live.saved_to else
                     f"the watch record could not be saved: {shown(live.save_error, LONG)}")
            self.status.setText(f"Watch ended after {c.seconds:.0f} s; {where}.")
        else:
            self.status.setText(f"Watching {s.server.url}: {c.seconds:.0f} s so far."
                                + (f" {shown(live.note, LONG)}." if live.note else ""))

    def _show_predictions(self, s: Summary) -> None:
        preds = s.predictions
        xs = [p.k for p in preds]
        ys = [p.speedup for p in preds]
        self.sp_points.setData(x=xs, y=ys, brush=[pg.mkBrush(GREY if p.extrapolated else
                                                             GREEN if p.k == s.recommendation.k else BLUE)
                                                  for p in preds])
        self.sp_err.setData(x=np.array(xs, float), y=np.array(ys, float),
                            top=np.array([p.hi - p.speedup for p in preds], float),
                            bottom=np.array([p.speedup - p.lo for p in preds], float))
        if preds:
            self.sp_plot.setXRange(-0.5, max(xs) + 0.5, padding=0)
            lo, hi = min(min(p.lo for p in preds), 1.0), max(max(p.hi for p in preds), 1.0)
            self.sp_plot.setYRange(lo - 0.05, hi + 0.05, padding=0)

    def speedup_data(self) -> tuple[list[float], list[float]]:
        """The predicted speedups the plot shows (x: K, 0 = off)."""
        xs, ys = self.sp_points.getData()
        return [float(x) for x in xs], [float(y) for y in ys]

    def acceptance_data(self) -> list[float]:
        """The acceptance bars' heights (percent of the steps, position 1 first)."""
        return [float(h) for h in (self.acc_bars.opts.get("height") or [])]
