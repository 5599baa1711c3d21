"""The window's one job registry: every worker is started here, in one call that wires its
handlers, and stays registered until it finishes. Closing the window cancels and waits for all of
them, so no worker thread or child process outlives it.

    jobs.run(factory, parent, event=on_event, failed=state.show_error, finished=done)

``factory(cancel)`` is a core generator (see adapter.CoreJob). Each handler is a callable or a
sequence of callables, connected in that order after the registry's own bookkeeping (so a
``finished`` handler already sees the job gone). ``key`` names a job that must run only once at a
time (e.g. the binary whose flags are being read): ``get(key)`` finds it while it runs.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, Iterator

from PySide6.QtCore import QObject

from app.core.common.cancel import CancelToken

from .adapter import CoreJob

Handlers = Callable[..., object] | Iterable[Callable[..., object]] | None


class Jobs(QObject):
    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._jobs: set[CoreJob] = set()
        self._keyed: dict[Hashable, CoreJob] = {}

    def run(self, factory: Callable[[CancelToken], Iterator[object]], parent: QObject | None = None, *,
            key: Hashable | None = None, event: Handlers = None, failed: Handlers = None,
            finished: Handlers = None) -> CoreJob:
        """Make a CoreJob of ``factory`` (a child of ``parent``, else of the registry), register it,
        connect its handlers and start it; returns the job."""
        if key is not None and key in self._keyed:
            raise RuntimeError(f"a job for {key!r} is running already")
        job = CoreJob(factory, parent if parent is not None else self)
        self._jobs.add(job)
        if key is not None:
            self._keyed[key] = job
        job.finished.connect(lambda: self._forget(job, key))
        for signal, handlers in ((job.core_event, event), (job.failed, failed), (job.finished, finished)):
            for handler in handler_list(handlers):
                signal.connect(handler)
        job.start()
        return job

    def _forget(self, job: CoreJob, key: Hashable | None) -> None:
        self._jobs.discard(job)
        if key is not None and self._keyed.get(key) is job:
            del self._keyed[key]

    def get(self, key: Hashable) -> CoreJob | None:
        """The registered job started with ``key``, or None."""
        return self._keyed.get(key)

    def __iter__(self) -> Iterator[CoreJob]:
        return iter(list(self._jobs))

    def __len__(self) -> int:
        return len(self._jobs)

    def running(self) -> list[CoreJob]:
        return [j for j in self._jobs if j.is_running()]

    def cancel_all(self, wait_ms: int = 15000) -> None:
        """Cancel every running job and wait for each: the window closes with no worker left."""
        running = self.running()
        for job in running:
            job.cancel()
        for job in running:
            job.wait(wait_ms)


def handler_list(handlers: Handlers) -> list[Callable[..., object]]:
    if handlers is None:
        return []
    if callable(handlers):
        return [handlers]
    return list(handlers)
