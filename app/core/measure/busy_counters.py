"""The counters that say what other programs take (app.core.measure.busy reads them): the CPU
seconds of the CPUs this process may use and of every process (psutil), sampled at a run's start
and end and, cheaply, every TICK_S while it measures; and NVML's per-process GPU use.

Measured, never guessed: what cannot be read is None (no sample, no ticks, no NVML)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
from typing import Any

from app.core.common.cpus import allowed_cpus
from app.core.common.text import shown


@dataclasses.dataclass(frozen=True)
class Sample:
    t: float  # time.monotonic()
    busy: float  # CPU seconds the allowed CPUs were busy (all processes)
    total: float  # CPU seconds the allowed CPUs ran (busy and idle)
    procs: dict[int, tuple[str, float]]  # pid -> (name, its CPU seconds)
    own: frozenset[int]  # this process and its descendants
    own_reaped: float  # CPU seconds of this process's children that ended (reaped)
    nvml_us: int  # wall time in microseconds, for NVML's per-process samples since


def _system_times(psutil: Any) -> tuple[float, float]:
    """(CPU seconds busy, CPU seconds in all) of the CPUs this process may run on, all processes."""
    per = psutil.cpu_times(percpu=True)
    cpus = allowed_cpus()
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


def sample() -> Sample | None:
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
    return Sample(time.monotonic(), busy, total, procs, frozenset(own), reaped, int(time.time() * 1e6))


NAME_LIMIT = 40  # a process name as shown: "CPU 21 % (top: python 20 %)"


def _name(raw: object, pid: int) -> str:
    """A process's name as the app keeps and shows it: anyone can name a process anything (10,000
    characters, escapes, a line break), so it is one escaped line of at most NAME_LIMIT characters."""
    return shown(raw, NAME_LIMIT) if isinstance(raw, str) and raw.strip() else f"pid {pid}"


@dataclasses.dataclass(frozen=True)
class Tick:
    """The CPU counters at one moment of a run: all CPU seconds busy and in all (the CPUs this
    process may use), and this app's own (its process, its children, the children it reaped)."""

    t: float
    busy: float
    total: float
    own: float


class Ticker:
    """Samples the CPU counters every ``interval`` seconds (busy.TICK_S) on a thread while a run
    measures (``Tick``s, for its busiest second). Only cheap reads: the system's CPU times, this
    process's and its children's."""

    def __init__(self, interval: float) -> None:
        self.ticks: list[Tick] = []
        self._interval = interval
        self._stop = threading.Event()
        self._seen: dict[int, float] = {}  # a child's pid -> its CPU seconds when last read
        self._procs: dict[int, Any] = {}  # this process's children seen so far
        self._me: Any = None
        self._thread = threading.Thread(target=self._run, name="busy-ticker", daemon=True)

    def start(self) -> "Ticker":
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
