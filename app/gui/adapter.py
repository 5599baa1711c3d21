"""The one Qt adapter: runs a core generator on a worker thread and turns its events into signals.

Core code knows nothing of Qt; the GUI knows nothing of threads beyond this file. Events are the
core's frozen dataclasses, passed as they are. Cancel is the core's CancelToken.

The worker is a plain Python thread that never calls Qt: it puts each event on a queue, and a
timer of the job, on the GUI thread, takes them off and emits the signals there. So only the GUI
thread takes Qt's locks on the app's behalf. With a QThread worker that emitted its events, the
tests hung twice (rarely): once the GUI thread waited on a Qt mutex holding the Python lock while
the worker thread waited for the Python lock. The exact lock was not caught; this removes every
way a worker takes one (see also collector.py: Python's collector never runs in a worker either).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Iterator

import shiboken6
from PySide6.QtCore import QObject, QTimer, Signal

from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError, os_problem
from app.core.common.redact import redact

POLL_MS = 15  # how often the GUI thread looks for the worker's events while it runs
SLICE_S = 0.04  # the most one look spends emitting, so a worker fast at events never freezes the window

_EVENT, _FAILED, _DONE = "event", "failed", "done"


def _run(factory: Callable[[CancelToken], Iterator[object]], cancel: CancelToken,
         out: queue.SimpleQueue[tuple[str, object]]) -> None:
    """The worker thread: the core generator's events onto ``out``, then its one failure, if any,
    in words, then the end. Nothing here touches Qt."""
    try:
        for ev in factory(cancel):
            out.put((_EVENT, ev))
    except Cancelled:
        pass
    except UserError as e:
        out.put((_FAILED, redact(e)))
    except OSError as e:  # a file, a folder or the disk: said in words; the traceback goes to the log
        logging.getLogger("mtp_tuner").warning("worker stopped", exc_info=True)
        out.put((_FAILED, redact(os_problem(e))))
    except Exception as e:  # shown once, in plain words (no secret); details go to the log
        logging.getLogger("mtp_tuner").exception("worker failed")
        out.put((_FAILED, redact(f"{type(e).__name__}: {e}")))
    finally:
        out.put((_DONE, None))


class CoreJob(QObject):
    """Start with :meth:`start`; ``core_event`` carries core events (named so as not to hide
    QObject.event, Qt's event handler); ``finished`` fires once, after every event and the
    failure. All three are emitted on the GUI thread."""

    core_event = Signal(object)
    failed = Signal(str)
    finished = Signal()

    def __init__(self, factory: Callable[[CancelToken], Iterator[object]], parent: QObject | None = None):
        super().__init__(parent)
        self.cancel_token = CancelToken()
        self._queue: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        # a daemon: the window cancels and waits for every job when it closes; one stuck in C
        # must not keep the process alive after that
        self._thread = threading.Thread(target=_run, args=(factory, self.cancel_token, self._queue),
                                        name="mtp-tuner-worker", daemon=True)
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self._deliver)
        self._over = False

    def start(self) -> None:
        self._thread.start()
        self._timer.start()

    def cancel(self) -> None:
        self.cancel_token.cancel()

    def is_running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, ms: int = 10000) -> bool:
        """Wait up to ``ms`` for the worker thread to end; True when it has (or never started).
        Its last events are still delivered by the event loop afterwards."""
        if self._thread.ident is None:
            return True
        self._thread.join(ms / 1000)
        if threading.current_thread() is threading.main_thread():
            QTimer.singleShot(0, self._deliver)  # the rest at the event loop's next turn, not the timer's
        return not self._thread.is_alive()

    def _deliver(self) -> None:
        """On the GUI thread: emit what the worker has queued, for at most SLICE_S."""
        deadline = time.monotonic() + SLICE_S
        while not self._over:
            if time.monotonic() > deadline:  # the rest at the event loop's next turn, after what waits
                QTimer.singleShot(0, self._deliver)
                return
            try:
                kind, item = self._queue.get_nowait()
            except queue.Empty:
                return
            if kind == _EVENT:
                self.core_event.emit(item)
            elif kind == _FAILED:
                self.failed.emit(item)
            else:
                self._over = True
                self._timer.stop()
                self._thread.join(5)  # it has only to return: "finished" means the thread is gone
                self.finished.emit()
            if not shiboken6.isValid(self):  # a handler deleted the job (its parent went): stop here
                return
