"""llama.cpp's thread count for a sweep: the physical cores this process may use, less the cores
other programs keep busy (measured at the sweep's start by app.core.measure.busy)."""

from __future__ import annotations

import os
import time

from app.core.common.cpus import physical_cores
from app.core.measure.busy import Busy, BusyMonitor, free_of


def measure_now(seconds: float = 0.3) -> Busy:
    """What other programs take now, over a short interval (for the thread count at a sweep's start)."""
    m = BusyMonitor(gpu=False, tick_s=None)
    m.start()
    time.sleep(seconds)
    return m.poll()  # (shorter than busy.MIN_WINDOW_S: the one interval there is)


def choose_threads(busy: Busy | None = None, cores: int | None = None) -> tuple[int | None, str | None]:
    """llama.cpp's thread count from the cores other programs leave free: the physical cores less
    the cores others keep busy (free_of), never more threads than free cores; with the sentence that
    says so. (None, None) when others' share is not known. ``busy``: measured now when None."""
    b = busy if busy is not None else measure_now()
    if b.cpu is None:
        return None, None
    n = cores or physical_cores()
    free = free_of(n, b.cpu)
    if free >= n:
        return n, f"threads: {n}, the {n} cores ({b.text()})"
    return free, f"threads: {free} of {n} cores, the ones other programs leave free ({b.text()})"
