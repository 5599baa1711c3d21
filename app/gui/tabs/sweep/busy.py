"""The Sweep tab's busy indicator: what other programs take from the machine now (measured every
POLL_MS through app.core.measure.busy, naming the busiest), the runs of the sweep they disturbed,
and what the sweep chose from it (llama.cpp's thread count)."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QWidget

from app.core.measure.busy import BUSY_SHARE, DISTURBED, Busy, BusyMonitor, pct
from app.core.records.schema import RunRecord

POLL_MS = 2000
BUSY_STYLE = "color: #b00020; font-weight: bold"  # other programs are busy now
EARLIER_STYLE = "color: #b26a00"  # quiet now, but runs of this sweep were disturbed earlier: said calmly


class BusyIndicator(QLabel):
    """A line: "Other programs: CPU 12 % (top: chrome 8 %)", in bold red while they take more than
    busy.BUSY_SHARE now, in amber when the machine is quiet now but runs of this sweep were
    disturbed, plain otherwise; with the sweep's disturbed runs and its notes after it."""

    def __init__(self, parent: QWidget | None = None, monitor: BusyMonitor | None = None) -> None:
        super().__init__("Other programs: measuring…", parent)
        self.setWordWrap(True)
        self.setToolTip(f"What programs other than MTP Tuner and its llama-server take from this machine, measured "
                        f"every {POLL_MS // 1000} s. A run during which they take more than {pct(BUSY_SHARE)} of the "
                        "CPU (or of the GPU in use) is marked disturbed, measured again and left out of the verdict")
        self.monitor = monitor if monitor is not None else BusyMonitor(tick_s=None)  # polled: no run's ticks
        self.busy = Busy()
        self.disturbed = self.runs = 0
        self.notes: tuple[str, ...] = ()
        self.monitor.start()
        self.timer = QTimer(self, interval=POLL_MS)
        self.timer.timeout.connect(self.poll)
        self.timer.start()

    def poll(self) -> None:
        """Measure since the last poll (a hidden tab skips the work, and measures again when shown)."""
        if not self.isVisible():
            self.monitor.start()
            return
        self.show_busy(self.monitor.poll())

    def show_busy(self, b: Busy) -> None:
        self.busy = b
        self._render()

    def reset(self, notes: tuple[str, ...] = ()) -> None:
        """A sweep starts: no run disturbed yet; ``notes``: what the sweep's preparation said."""
        self.disturbed = self.runs = 0
        self.notes = tuple(notes)
        self._render()

    def run_done(self, rec: RunRecord) -> None:
        """A run finished: count it, and whether other programs disturbed it."""
        self.runs += 1
        self.disturbed += DISTURBED in rec.flags
        self._render()

    def _render(self) -> None:
        b = self.busy
        line = "Other programs: measuring…" if b.cpu is None and b.gpu is None else \
            "Other programs: " + b.text().removeprefix("other programs: ")
        if b.disturbed:
            line += " — busy: runs now would be disturbed; close them"
        if self.runs:
            line += f". This sweep: {self.disturbed} of {self.runs} runs disturbed"
            if self.disturbed:
                line += " (left out of the verdict; measured again within the re-run limit)"
        text = "\n".join((line, *self.notes))
        self.setText(text)
        self.setStyleSheet(BUSY_STYLE if b.disturbed else EARLIER_STYLE if self.disturbed else "")
