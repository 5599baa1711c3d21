"""Cooperative cancellation shared by the runner, the engines and the front ends."""

from __future__ import annotations

import threading
from typing import Callable

from app.core.common.errors import Cancelled


class CancelToken:
    """Set once by the user (any thread); work checks it and registered callbacks run at once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def cancel(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks = list(self._callbacks)
        for cb in callbacks:
            try:
                cb()
            except Exception:  # a failing callback must not stop the others
                pass

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when cancelled meanwhile."""
        return self._event.wait(seconds)

    def on_cancel(self, cb: Callable[[], None]) -> Callable[[], None]:
        """Register ``cb``; returns a function that unregisters it."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(cb)
                return lambda: self._remove(cb)
        cb()
        return lambda: None

    def _remove(self, cb: Callable[[], None]) -> None:
        with self._lock:
            if cb in self._callbacks:
                self._callbacks.remove(cb)
