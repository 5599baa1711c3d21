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
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
import warnings
from typing import Any, Protocol, Sequence

from app.core.common.text import shown

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


@dataclasses.dataclass(frozen=True)
class _Sample:
    t: float  # time.monotonic()
    busy: float  # CPU seconds the allowed CPUs were busy (all processes)
    total: float  # CPU seconds the allowed CPUs ran (busy and idle)
    procs: dict[int, tuple[str, float]]  # pid -> (name, its CPU seconds)
    own: frozenset[int]  # this process and its descendants
    own_reaped: float  # CPU seconds of this process's children that ended (reaped)
    nvml_us: int  # wall time in microseconds, for NVML's per-process samples since


def _cpus() -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(0))  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):
        return None


def _system_times(psutil: Any) -> tuple[float, float]:
    """(CPU seconds busy, CPU seconds in all) of the CPUs this process may run on, all processes."""
    per = psutil.cpu_times(percpu=True)
    cpus = _cpus()
    chosen = [per[i] for i in cpus if i < len(per)] if cpus else list(per)
    if not chosen:
        chosen = list(per)
    busy = total = 0.0
    for t in chosen:
        d = t._asdict()
        # guest time is counted in user time too (Linux); idle and iowait are not busy
        tot = sum(d.values()) - d.get("guest", 0.0) - d.get("guest_nice", 0.0)
        total += tot
        busy += tot - d.get("idle", 0.0) - d.get("iowait", 0.0)
    return busy, total


def _sample() -> _Sample | None:
    try:
        import psutil
    except ImportError:  # pragma: no cover - a dependency
        return None
    try:
        busy, total = _system_times(psutil)
        me = psutil.Process()
        own = {me.pid}
        try:
            own.update(c.pid for c in me.children(recursive=True))
        except psutil.Error:
            pass
        try:
            mt = me.cpu_times()
            reaped = float(mt.children_user + mt.children_system)
        except (psutil.Error, AttributeError):
            reaped = 0.0
        procs: dict[int, tuple[str, float]] = {}
        for p in psutil.process_iter(["name", "cpu_times"]):
            ct = p.info.get("cpu_times")
            if ct is None:
                continue
            procs[p.pid] = (_name(p.info.get("name"), p.pid), float(ct.user + ct.system))
    except Exception:  # noqa: BLE001 - psutil on an odd platform: not measured
        return None
    return _Sample(time.monotonic(), busy, total, procs, frozenset(own), reaped, int(time.time() * 1e6))


NAME_LIMIT = 40  # a process name as shown: "CPU 21 % (top: python 20 %)"


def _name(raw: object, pid: int) -> str:
    """A process's name as the app keeps and shows it: anyone can name a process anything (10,000
    characters, escapes, a line break), so it is one escaped line of at most NAME_LIMIT characters."""
    return shown(raw, NAME_LIMIT) if isinstance(raw, str) and raw.strip() else f"pid {pid}"


def _between(a: _Sample, b: _Sample) -> Busy:
    """Busy between two samples: all CPU time minus this app's (its process and every child seen
    in either sample, ended children included), over the capacity."""
    total = b.total - a.total
    cores = len(_cpus() or ()) or os.cpu_count() or 1
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


@dataclasses.dataclass(frozen=True)
class Tick:
    """The CPU counters at one moment of a run: all CPU seconds busy and in all (the CPUs this
    process may use), and this app's own (its process, its children, the children it reaped)."""

    t: float
    busy: float
    total: float
    own: float


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


class _Ticker:
    """Samples the CPU counters every TICK_S on a thread while a run measures (``Tick``s, for its
    busiest second). Only cheap reads: the system's CPU times, this process's and its children's."""

    def __init__(self, interval: float = TICK_S) -> None:
        self.ticks: list[Tick] = []
        self._interval = interval
        self._stop = threading.Event()
        self._seen: dict[int, float] = {}  # a child's pid -> its CPU seconds when last read
        self._procs: dict[int, Any] = {}  # this process's children seen so far
        self._me: Any = None
        self._thread = threading.Thread(target=self._run, name="busy-ticker", daemon=True)

    def start(self) -> "_Ticker":
        self._thread.start()
        return self

    def stop(self) -> list[Tick]:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._tick()  # the run's end
        return self.ticks

    def _tick(self) -> None:
        try:
            import psutil

            busy, total = _system_times(psutil)
            me = self._me = self._me or psutil.Process()
            mt = me.cpu_times()
            own = float(mt.user + mt.system) + float(getattr(mt, "children_user", 0.0)
                                                     + getattr(mt, "children_system", 0.0))
            try:
                for c in me.children(recursive=True):
                    self._procs.setdefault(c.pid, c)
            except psutil.Error:
                pass
            for pid, p in list(self._procs.items()):
                try:
                    ct = p.cpu_times()
                    self._seen[pid] = float(ct.user + ct.system)
                except psutil.Error:
                    self._procs.pop(pid, None)  # ended: its last reading stays counted
            own += sum(self._seen.values())
        except Exception:  # noqa: BLE001 - not measured: no ticks (the run's average still is)
            return
        self.ticks.append(Tick(time.monotonic(), busy, total, own))

    def _run(self) -> None:
        self._tick()
        while not self._stop.wait(self._interval):
            self._tick()


class BusyMonitor:
    """Measures what other programs take between ``start`` and ``stop`` (or between polls), over
    at least MIN_WINDOW_S: a shorter run is measured with the time before it, back to the newest
    sample MIN_WINDOW_S old (the system's CPU counters tick every 10 ms: a 50 ms run alone would be
    a few ticks, too coarse to tell busy from quiet). Between ``start`` and ``stop`` a thread also
    samples the counters every TICK_S: ``stop`` gives the busiest second too (``Busy.cpu_peak``)."""

    def __init__(self, gpu: bool = True, tick_s: float | None = TICK_S) -> None:
        self._samples: list[_Sample] = []  # oldest first: the newest MIN_WINDOW_S old, and the later ones
        self._gpu = gpu
        self._tick_s = tick_s
        self._ticker: _Ticker | None = None

    def start(self) -> None:
        s = _sample()
        if s is not None:
            self._keep(s)
        if self._ticker is not None:
            self._ticker.stop()
        self._ticker = _Ticker(self._tick_s).start() if self._tick_s else None

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
        now = _sample()
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

    def _keep(self, s: _Sample) -> None:
        old = [x for x in self._samples if x.t <= s.t - MIN_WINDOW_S]
        self._samples = old[-1:] + [x for x in self._samples if x.t > s.t - MIN_WINDOW_S] + [s]


def make_monitor() -> BusyMonitor | NoMonitor:
    """The runner's monitor: a BusyMonitor, or NoMonitor with MTP_TUNER_BUSY=off."""
    if os.environ.get(BUSY_ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return NoMonitor()
    return BusyMonitor()


def measure_now(seconds: float = 0.3) -> Busy:
    """What other programs take now, over a short interval (for the thread count at a sweep's start)."""
    m = BusyMonitor(gpu=False, tick_s=None)
    m.start()
    time.sleep(seconds)
    return m.poll()  # (shorter than MIN_WINDOW_S: the one interval there is)


def physical_cores() -> int:
    """The physical cores among the CPUs this process may run on (llama.cpp gains nothing from a
    core's second hardware thread)."""
    logical = len(_cpus() or ()) or os.cpu_count() or 1
    try:
        import psutil

        phys = psutil.cpu_count(logical=False) or logical
        all_logical = psutil.cpu_count(logical=True) or logical
    except Exception:  # noqa: BLE001 - not known: count each CPU
        return logical
    return max(1, min(phys, round(logical * phys / all_logical)))


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


# ------------------------------------------------------------------------------------------
# NVML


_nvml: Any = None
_nvml_failed = False


def _nvml_module() -> Any:
    global _nvml, _nvml_failed
    if _nvml is not None or _nvml_failed:
        return _nvml
    try:
        with warnings.catch_warnings():  # the pynvml shim warns that it is deprecated
            warnings.simplefilter("ignore")
            import pynvml
        pynvml.nvmlInit()
        _nvml = pynvml
    except Exception:  # noqa: BLE001 - no NVIDIA driver, no GPU: not measured
        _nvml_failed = True
    return _nvml


def gpu_others(own: frozenset[int], since_us: int, nvml: Any = None) -> tuple[float | None, float | None]:
    """(other processes' utilisation, their share of the memory) of the busiest NVIDIA device that
    one of ``own`` uses, or (None, None): no NVML, no device of ours (a CPU run; a container whose
    process ids NVML does not see), or per-process utilisation not reported."""
    nv = nvml if nvml is not None else _nvml_module()
    if nv is None:
        return None, None
    best: tuple[float | None, float | None] = (None, None)
    try:
        for i in range(int(nv.nvmlDeviceGetCount())):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(h))
            with_graphics = getattr(nv, "nvmlDeviceGetGraphicsRunningProcesses", None)
            if with_graphics is not None:
                try:
                    procs += list(with_graphics(h))
                except Exception:  # noqa: BLE001 - not supported on this device
                    pass
            if not any(p.pid in own for p in procs):
                continue  # a device this app does not use
            mem_total = float(nv.nvmlDeviceGetMemoryInfo(h).total) or 1.0
            mem = sum(float(p.usedGpuMemory or 0) for p in procs if p.pid not in own) / mem_total
            try:
                samples = nv.nvmlDeviceGetProcessUtilization(h, since_us)
            except Exception:  # noqa: BLE001 - not reported (older GPUs, no samples yet)
                util = None
            else:
                util = min(1.0, sum(float(s.smUtil) for s in samples if s.pid not in own) / 100.0)
            if best[0] is None or (util or 0.0) > (best[0] or 0.0):
                best = (util, min(1.0, mem))
    except Exception:  # noqa: BLE001 - NVML failed midway: not measured
        return None, None
    return best


__all__ = ["Busy", "BusyMonitor", "Tick", "peak_share", "TICK_S", "NoMonitor", "Monitor", "make_monitor", "measure_now", "gpu_others", "pct",
           "choose_threads", "physical_cores", "free_of",
           "DISTURBED", "BUSY_SHARE", "MAX_RERUN_SHARE", "MIN_RERUNS", "MAX_DISTURBED_SHARE", "BUSY_ENV"]
