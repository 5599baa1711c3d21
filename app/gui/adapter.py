"""The one Qt adapter: runs a core generator on a worker thread and turns its events into signals.

Core code knows nothing of Qt; the GUI knows nothing of threads beyond this file. Events are the
core's frozen dataclasses, passed as they are. Cancel is the core's CancelToken.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterator

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError, os_problem
from app.core.common.redact import redact


class _Worker(QObject):
    core_event = Signal(object)
    failed = Signal(str)
    done = Signal()

    def __init__(self, factory: Callable[[CancelToken], Iterator[object]], cancel: CancelToken):
        super().__init__()
        self._factory = factory
        self._cancel = cancel

    @Slot()
    def run(self) -> None:
        try:
            for ev in self._factory(self._cancel):
                self.core_event.emit(ev)
        except Cancelled:
            pass
        except UserError as e:
            self.failed.emit(redact(e))
        except OSError as e:  # a file, a folder or the disk: said in words; the traceback goes to the log
            logging.getLogger("mtp_tuner").warning("worker stopped", exc_info=True)
            self.failed.emit(redact(os_problem(e)))
        except Exception as e:  # shown once, in plain words (no secret); details go to the log
            logging.getLogger("mtp_tuner").exception("worker failed")
            self.failed.emit(redact(f"{type(e).__name__}: {e}"))
        finally:
            self.done.emit()


class CoreJob(QObject):
    """Start with :meth:`start`; ``core_event`` carries core events (named so as not to hide
    QObject.event, Qt's event handler); ``finished`` fires once."""

    core_event = Signal(object)
    failed = Signal(str)
    finished = Signal()

    def __init__(self, factory: Callable[[CancelToken], Iterator[object]], parent: QObject | None = None):
        super().__init__(parent)
        self.cancel_token = CancelToken()
        self._thread = QThread()
        self._thread.setObjectName("mtp-tuner-worker")
        self._worker = _Worker(factory, self.cancel_token)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.run)
        self._worker.core_event.connect(self.core_event)
        self._worker.failed.connect(self.failed)
        # quit() straight from the worker thread (it is thread-safe): a queued quit would wait for
        # the GUI's event loop, so closing the window (which waits for the thread) would stall
        self._worker.done.connect(self._thread.quit, Qt.ConnectionType.DirectConnection)
        self._thread.finished.connect(self._on_finished)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self.cancel_token.cancel()

    def is_running(self) -> bool:
        return self._thread.isRunning()

    def wait(self, ms: int = 10000) -> bool:
        return self._thread.wait(ms)

    def _on_finished(self) -> None:
        self.finished.emit()
