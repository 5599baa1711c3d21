"""What other programs take from the machine while a run measures: the share of the CPU capacity
this process may use (its CPU affinity) that processes other than this app and its children
(llama-server) took, the top one of them by name, and, with NVML, other processes' share of the
GPU (utilisation, memory) on a device this app uses.

    m = BusyMonitor()
    m.start()
    ...  # one run
    b = m.stop()          # Busy(cpu=0.61, cpu_peak=0.93, gpu=None, top="chrome", top_cpu=0.45, ...)
    b.disturbed           # others took more than BUSY_SHARE, over the run or over its busiest second
    m.poll()              # since the last start/stop/poll (the window's live label)

Measured, never guessed: what cannot be read (no psutil answer, no NVML, a process that is not
ours to read) is None, and a run with None is not disturbed. ``make_monitor()`` is the runner's
default; ``MTP_TUNER_BUSY=off`` gives one that measures nothing (the test suite sets it: its
runs share a CI machine's cores, and the busy logic has tests of its own).

The readings come from busy_counters (psutil's CPU times, NVML); the thread count a sweep starts
with, from the cores others leave free, is chosen in threads.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Protocol, Sequence

from app.core.common.cpus import allowed_cpus
from app.core.common.text import shown
from app.core.measure.busy_counters import NAME_LIMIT, Sample, Ticker, Tick, gpu_others, sample

DISTURBED = "disturbed"  # a run record's flag: other programs took more than BUSY_SHARE during it
# A run is disturbed when other programs took more than a quarter of the CPU capacity (or of the
# GPU in use): on a 4-core desktop that is one core kept busy. llama.cpp's CPU decode splits each
# step over all its threads and waits for the slowest, so one stolen core slows every step; an idle
# desktop's background (indexers, a browser tab at rest) stays well under 10 %.
BUSY_SHARE = 0.25
# Disturbed runs are re-run up to this share of the sweep's runs (at least MIN_RERUNS runs);
# after that they stay marked and are not repeated.
MAX_RERUN_SHARE = 0.25
MIN_RERUNS = 2
# The verdict is withheld when more than this share of the runs was disturbed. With every
# disturbed run re-run within MAX_RERUN_SHARE, at most 0.25 / 1.25 = 20 % of a file's runs are
# disturbed: a verdict is withheld only when the disturbances outran the re-runs.
MAX_DISTURBED_SHARE = 0.25
MIN_WINDOW_S = 1.0  # the shortest time a share is measured over (BusyMonitor)
# While a run measures, the monitor samples the CPU counters this often (the system's and this
# app's own, no process listing: a few /proc reads), so a run is also judged by its busiest second
# (``Busy.cpu_peak``): a program that starts near a run's end takes little of the whole run's time
# but slows every step it overlaps.
TICK_S = 0.2
BUSY_ENV = "MTP_TUNER_BUSY"  # "off": measure nothing (other_cpu/other_gpu None)


@dataclasses.dataclass(frozen=True)
class Busy:
    """What other programs took over an interval. Shares are 0-1 of the capacity (the CPUs this
    process may run on; the GPU device); None: not measured."""

    cpu: float | None = None
    gpu: float | None = None  # other processes' utilisation of a GPU this app uses
    # others' share over the busiest MIN_WINDOW_S of the interval (None: not sampled, or the
    # interval was shorter than that: ``cpu`` is then measured over MIN_WINDOW_S anyway)
    cpu_peak: float | None = None
    gpu_memory: float | None = None  # other processes' share of that GPU's memory
    top: str | None = None  # the other process that took the most CPU, by name
    top_cpu: float | None = None  # its share of the CPU capacity
    cores: int | None = None  # the CPUs this process may run on

    @property
    def disturbed(self) -> bool:
        """Others took more than BUSY_SHARE of the CPU (over the run, or over its busiest second)
        or of the GPU in use."""
        return any(v is not None and v > BUSY_SHARE for v in (self.cpu, self.cpu_peak, self.gpu))

    @property
    def free_cores(self) -> int | None:
        """Whole cores the others left free (at least 1), or None when not measured."""
        if self.cpu is None or not self.cores:
            return None
        return free_of(self.cores, self.cpu)

    def text(self) -> str:
        """One line for a message or the window: "other programs: CPU 61 % (top: chrome 45 %), GPU 30 %"."""
        if self.cpu is None and self.gpu is None:
            return "other programs: not measured"
        parts = []
        if self.cpu is not None:
            top = f" (top: {shown(self.top, NAME_LIMIT)} {pct(self.top_cpu)})" if self.top and self.top_cpu is not None else ""
            peak = (f", {pct(self.cpu_peak)} in its busiest second" if self.cpu_peak is not None
                    and self.cpu_peak > BUSY_SHARE and self.cpu_peak - self.cpu >= 0.05 else "")
            parts.append(f"CPU {pct(self.cpu)}{top}{peak}")
        if self.gpu is not None:
            mem = f", memory {pct(self.gpu_memory)}" if self.gpu_memory is not None else ""
            parts.append(f"GPU {pct(self.gpu)}{mem}")
        return "other programs: " + ", ".join(parts)


def free_of(cores: int, others: float) -> int:
    """The cores left free when others take ``others`` of them all: their busy cores rounded to
    the nearest whole core (a background taking less than half a core leaves it free), at least 1."""
    return max(1, cores - math.floor(cores * others + 0.5))


def pct(share: float | None) -> str:
    return "?" if share is None else f"{100 * share:.0f} %"


class Monitor(Protocol):
    """What the runner asks of a monitor (tests give one that replays recorded shares)."""

    def start(self) -> None: ...

    def stop(self) -> Busy: ...


class NoMonitor:
    """Measures nothing: every interval is Busy() (unknown, never disturbed)."""

    def start(self) -> None:
        pass

    def stop(self) -> Busy:
        return Busy()

    def poll(self) -> Busy:
        return Busy()

    def close(self) -> None:
        pass


def _between(a: Sample, b: Sample) -> Busy:
    """Busy between two samples: all CPU time minus this app's (its process and every child seen
    in either sample, ended children included), over the capacity."""
    total = b.total - a.total
    cores = len(allowed_cpus() or ()) or os.cpu_count() or 1
    if total <= 0:
        return Busy(cores=cores)
    own = a.own | b.own
    own_cpu = max(0.0, b.own_reaped - a.own_reaped)
    others: dict[str, float] = {}
    for pid, (name, t1) in b.procs.items():
        t0 = a.procs.get(pid, (name, 0.0))[1]
        d = max(0.0, t1 - t0)
        if pid in own:
            own_cpu += d
        else:
            others[name] = others.get(name, 0.0) + d  # a program's processes (chrome's many) as one
    cpu = min(1.0, max(0.0, (b.busy - a.busy - own_cpu) / total))
    top, top_t = max(others.items(), key=lambda kv: kv[1], default=(None, 0.0))
    top_cpu = min(cpu, top_t / total)  # (the counters are read moments apart: never more than all others)
    if top is None or top_cpu < 0.005:
        top, top_cpu_or_none = None, None
    else:
        top_cpu_or_none = top_cpu
    return Busy(cpu=cpu, top=top, top_cpu=top_cpu_or_none, cores=cores)


def peak_share(ticks: Sequence[Tick], window: float = MIN_WINDOW_S) -> float | None:
    """Others' largest share of the CPU over any stretch between two ticks at least ``window``
    seconds apart (the shortest such stretch from each tick), or None when the ticks span less."""
    best: float | None = None
    j = 0
    for i, a in enumerate(ticks):
        j = max(j, i + 1)
        while j < len(ticks) and ticks[j].t - a.t < window:
            j += 1
        if j >= len(ticks):
            break
        b = ticks[j]
        total = b.total - a.total
        if total <= 0:
            continue
        share = min(1.0, max(0.0, (b.busy - a.busy - (b.own - a.own)) / total))
        best = share if best is None else max(best, share)
    return best


class BusyMonitor:
    """Measures what other programs take between ``start`` and ``stop`` (or between polls), over
    at least MIN_WINDOW_S: a shorter run is measured with the time before it, back to the newest
    sample MIN_WINDOW_S old (the system's CPU counters tick every 10 ms: a 50 ms run alone would be
    a few ticks, too coarse to tell busy from quiet). Between ``start`` and ``stop`` a thread also
    samples the counters every TICK_S: ``stop`` gives the busiest second too (``Busy.cpu_peak``)."""

    def __init__(self, gpu: bool = True, tick_s: float | None = TICK_S) -> None:
        self._samples: list[Sample] = []  # oldest first: the newest MIN_WINDOW_S old, and the later ones
        self._gpu = gpu
        self._tick_s = tick_s
        self._ticker: Ticker | None = None

    def start(self) -> None:
        s = sample()
        if s is not None:
            self._keep(s)
        if self._ticker is not None:
            self._ticker.stop()
        self._ticker = Ticker(self._tick_s).start() if self._tick_s else None

    def stop(self) -> Busy:
        ticker, self._ticker = self._ticker, None
        peak = peak_share(ticker.stop()) if ticker is not None else None
        b = self.poll()
        if peak is None or b.cpu is None:
            return b
        return dataclasses.replace(b, cpu_peak=max(peak, b.cpu))

    def close(self) -> None:
        """Stop the sampling thread of a run that did not reach ``stop``."""
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.stop()

    def poll(self) -> Busy:
        """Busy since the last start, stop or poll, or over MIN_WINDOW_S if that was more recent
        (the first call only starts: unknown)."""
        now = sample()
        if now is None:
            return Busy()
        older = [s for s in self._samples if s.t <= now.t - MIN_WINDOW_S]
        prev = older[-1] if older else (self._samples[0] if self._samples else None)
        self._keep(now)
        if prev is None:
            return Busy()
        b = _between(prev, now)
        if self._gpu:
            gpu, mem = gpu_others(now.own, prev.nvml_us)
            b = dataclasses.replace(b, gpu=gpu, gpu_memory=mem)
        return b

    def _keep(self, s: Sample) -> None:
        old = [x for x in self._samples if x.t <= s.t - MIN_WINDOW_S]
        self._samples = old[-1:] + [x for x in self._samples if x.t > s.t - MIN_WINDOW_S] + [s]


def make_monitor() -> BusyMonitor | NoMonitor:
    """The runner's monitor: a BusyMonitor, or NoMonitor with MTP_TUNER_BUSY=off."""
    if os.environ.get(BUSY_ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return NoMonitor()
    return BusyMonitor()


__all__ = ["Busy", "BusyMonitor", "peak_share", "TICK_S", "NoMonitor", "Monitor", "make_monitor", "pct", "free_of",
           "DISTURBED", "BUSY_SHARE", "MAX_RERUN_SHARE", "MIN_RERUNS", "MAX_DISTURBED_SHARE", "BUSY_ENV"]
