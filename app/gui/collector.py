"""Python's cycle collector runs on the GUI thread only, between Qt's events.

Left automatic, the collector runs wherever an allocation crosses its threshold: in a sweep's
worker thread, or in the GUI thread in the middle of a Qt call that holds one of Qt's connection
locks (a connect, a disconnect, a signal's emission). Collecting an old window or menu there
deletes its Qt objects on the spot, and a QObject's destructor takes the locks of its connections.
Qt keeps those locks in one shared pool of 131 mutexes picked by the object's address, so among a
window's hundreds of objects one nearly always wants the very lock the interrupted call holds, and
the thread can wait on itself forever. The GUI tests hung twice in a way that fits (a ``~QMenu``
of an earlier test's window deleted by the collector, and a ``disconnect`` in pyqtgraph, each
waiting on a Qt mutex); the exact lock was not caught. Deleting Qt objects from a worker thread is
unsafe besides.

So, as pyqtgraph's own ``GarbageCollector`` recipe does, automatic collection is off while the
window runs, and a timer in the GUI thread collects the generations that are due. A timer's slot
runs from the event loop, where no Qt lock is held.
"""

from __future__ import annotations

import gc

INTERVAL_MS = 500


def collect_due() -> int:
    """Collect the generations Python itself would have collected by now (its thresholds against
    its counts); returns the oldest generation collected, -1 for none. Call it on the GUI thread,
    outside any Qt call."""
    threshold = gc.get_threshold()
    counts = gc.get_count()
    done = -1
    for gen in range(3):
        if counts[gen] <= threshold[gen] or threshold[gen] <= 0:
            break
        gc.collect(gen)
        done = gen
    return done


class MainThreadCollector:
    """Automatic collection off; :func:`collect_due` every ``INTERVAL_MS`` on the thread that
    makes this (the GUI thread, after the QApplication). :meth:`uninstall` puts things back."""

    def __init__(self, interval_ms: int = INTERVAL_MS):
        from PySide6.QtCore import QTimer

        self._was_enabled = gc.isenabled()
        self._timer = QTimer()
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(collect_due)

    def install(self) -> MainThreadCollector:
        gc.disable()
        self._timer.start()
        return self

    def uninstall(self) -> None:
        self._timer.stop()
        collect_due()
        if self._was_enabled:
            gc.enable()
