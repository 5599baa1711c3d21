"""Hardware snapshot: CPU, RAM, NVIDIA GPUs through NVML, Apple Silicon unified memory and its GPU
share, other GPUs by name; peak memory bandwidth for the roofline. Never crashes when a library
or tool is missing: what cannot be read is reported as unknown, with a note."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

from app.core.common.resources import resource
from app.core.common.units import size


@dataclasses.dataclass(frozen=True)
class GPU:
    vendor: str  # "nvidia", "apple", "amd", "intel", "unknown"
    name: str
    vram_total: int | None  # bytes (Apple: the GPU's usable share of unified memory)
    vram_free: int | None
    bandwidth_gbs: float | None
    bandwidth_source: str  # "nvml", "table", "unknown"
    bus_width_bits: int | None = None
    mem_clock_mhz: int | None = None
    driver: str | None = None
    cuda: str | None = None
    gpu_cores: int | None = None


@dataclasses.dataclass(frozen=True)
class HardwareSnapshot:
    os: str
    cpu_model: str
    cpu_cores: int | None
    cpu_threads: int | None
    ram_total: int | None
    ram_available: int | None
    gpus: tuple[GPU, ...]
    unified_memory: bool
    notes: tuple[str, ...] = ()

    @property
    def cpu_only(self) -> bool:
        return not self.gpus

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _table() -> dict[str, Any]:
    try:
        table: dict[str, Any] = json.loads(resource("bandwidth.json").read_text(encoding="utf-8"))
        return table
    except (OSError, ValueError):
        return {"apple": {}, "gpus": {}}


def bandwidth_by_name(name: str) -> float | None:
    gpus = _table().get("gpus", {})
    low = name.lower()
    for key in sorted(gpus, key=len, reverse=True):
        if key.lower() in low:
            return float(gpus[key])
    return None


def apple_bandwidth(chip: str, gpu_cores: int | None) -> float | None:
    apple = _table().get("apple", {})
    m = re.search(r"(M\d+(?:\s+(?:Pro|Max|Ultra))?)", chip)
    if not m or m.group(1) not in apple:
        return None
    row = apple[m.group(1)]
    if gpu_cores is not None and str(gpu_cores) in row:
        return float(row[str(gpu_cores)])
    return float(row["*"]) if "*" in row else None


# ------------------------------------------------------------------------------------------
# NVIDIA


def nvml_gpus(nvml: Any = None) -> tuple[list[GPU], list[str]]:
    """GPUs through NVML. ``nvml`` is the pynvml module (tests pass recorded answers)."""
    notes: list[str] = []
    if nvml is None:
        try:
            with warnings.catch_warnings():  # the pynvml shim warns that it is deprecated
                warnings.simplefilter("ignore")
                import pynvml as nvml  # type: ignore[no-redef]  # optional: NVIDIA machines only
        except Exception:
            return [], ["NVML: the pynvml package is not importable"]
    try:
        nvml.nvmlInit()
    except Exception as e:
        return [], [f"NVML: not available ({_short(e)}); no NVIDIA driver?"]
    out = []
    try:
        try:
            driver = _s(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        try:
            v = int(nvml.nvmlSystemGetCudaDriverVersion())
            cuda = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            cuda = None
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = _s(nvml.nvmlDeviceGetName(h))
            total = free = None
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                total, free = int(mem.total), int(mem.free)
            except Exception as e:
                notes.append(f"NVML: memory of GPU {i} unreadable ({_short(e)})")
            bus = clock = None
            try:
                bus = int(nvml.nvmlDeviceGetMemoryBusWidth(h))
                clock = int(nvml.nvmlDeviceGetMaxClockInfo(h, getattr(nvml, "NVML_CLOCK_MEM", 2)))
            except Exception as e:
                notes.append(f"NVML: memory bus of GPU {i} unreadable ({_short(e)})")
            bw: float | None
            if bus and clock:
                bw, src = bus / 8 * clock * 2 / 1000, "nvml"  # DDR: two transfers per clock
            else:
                bw = bandwidth_by_name(name)
                src = "table" if bw else "unknown"
            out.append(GPU("nvidia", name, total, free, bw, src, bus, clock, driver, cuda))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return out, notes


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _short(e: Exception) -> str:
    return (str(e) or type(e).__name__).splitlines()[0][:120]


# ------------------------------------------------------------------------------------------
# Apple


def apple_gpu(sysctl: Callable[[str], str | None], gpu_cores: int | None) -> tuple[GPU | None, list[str]]:
    """Apple Silicon from sysctl answers: chip, unified memory, the GPU's usable share.

    The share is ``iogpu.wired_limit_mb`` when set (non-zero), else macOS's default working-set
    limit: about 2/3 of memory up to 36 GB, 3/4 above."""
    notes: list[str] = []
    chip = (sysctl("machdep.cpu.brand_string") or "").strip()
    mem = sysctl("hw.memsize")
    if not chip.startswith("Apple") or not mem:
        return None, notes
    total = int(mem.strip())
    wired = sysctl("iogpu.wired_limit_mb")
    try:
        wired_mb = int(wired.strip()) if wired else 0
    except ValueError:
        wired_mb = 0
    if wired_mb > 0:
        usable = wired_mb * 1024 * 1024
        notes.append(f"GPU memory limit raised by iogpu.wired_limit_mb = {wired_mb}")
    else:
        usable = int(total * (2 / 3 if total <= 36 * 2**30 else 3 / 4))
    bw = apple_bandwidth(chip, gpu_cores)
    return GPU("apple", chip + (f" ({gpu_cores}-core GPU)" if gpu_cores else ""), usable, None, bw,
               "table" if bw else "unknown", gpu_cores=gpu_cores), notes


def _sysctl(key: str) -> str | None:
    try:
        r = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _apple_gpu_cores() -> int | None:
    try:
        r = subprocess.run(["ioreg", "-rc", "AGXAccelerator", "-d", "1"], capture_output=True, text=True,
                           timeout=5)
        m = re.search(r'"gpu-core-count"\s*=\s*(\d+)', r.stdout)
        return int(m.group(1)) if m else None
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------------------------------
# other GPUs, CPU


def linux_drm_gpus(root: str = "/sys/class/drm") -> list[GPU]:
    """AMD and Intel GPUs named by the kernel (no vendor tools needed)."""
    out: list[GPU] = []
    vendors = {"0x1002": "amd", "0x8086": "intel"}
    base = Path(root)
    if not base.is_dir():
        return out
    for card in sorted(base.glob("card[0-9]*")):
        if "-" in card.name:
            continue
        dev = card / "device"
        try:
            vendor = (dev / "vendor").read_text().strip()
        except OSError:
            continue
        if vendor not in vendors:
            continue
        name = ""
        for f in ("product_name", "label"):
            try:
                name = (dev / f).read_text().strip()
                break
            except OSError:
                pass
        name = name or f"{vendors[vendor].upper()} GPU {dev.joinpath('device').read_text().strip() if dev.joinpath('device').exists() else ''}"
        total = None
        try:
            total = int((dev / "mem_info_vram_total").read_text().strip())
        except (OSError, ValueError):
            pass
        bw = bandwidth_by_name(name)
        out.append(GPU(vendors[vendor], name, total, None, bw, "table" if bw else "unknown"))
    return out


def cpu_model() -> str:
    if sys.platform.startswith("linux"):
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.lower().startswith(("model name", "hardware", "processor\t: arm")):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
    if sys.platform == "darwin":
        v = _sysctl("machdep.cpu.brand_string")
        if v:
            return v
    return platform.processor() or platform.machine() or "unknown"


def snapshot(nvml: Any = None) -> HardwareSnapshot:
    notes: list[str] = []
    ram_total = ram_avail = cores = threads = None
    try:
        import psutil  # deferred: a C extension, only for the snapshot (not at the window's start)

        vm = psutil.virtual_memory()
        ram_total, ram_avail = int(vm.total), int(vm.available)
        cores = psutil.cpu_count(logical=False)
        threads = psutil.cpu_count(logical=True)
    except Exception as e:
        notes.append(f"psutil unavailable ({_short(e)})")
        threads = os.cpu_count()
    gpus: list[GPU] = []
    unified = False
    if sys.platform == "darwin":
        g, n = apple_gpu(_sysctl, _apple_gpu_cores())
        notes += n
        if g:
            gpus.append(g)
            unified = True
    else:
        g_nv, n = nvml_gpus(nvml)
        gpus += g_nv
        if not g_nv:
            notes += n
        if sys.platform.startswith("linux"):
            gpus += linux_drm_gpus()
    if not gpus:
        notes.append("no GPU found: CPU only (decode reads weights from system RAM)")
    os_name = f"{platform.system()} {platform.release()}".strip()
    return HardwareSnapshot(os_name, cpu_model(), cores, threads, ram_total, ram_avail, tuple(gpus),
                            unified, tuple(notes))


def format_snapshot(h: HardwareSnapshot) -> str:
    def gib(b: int | None) -> str:
        return "unknown" if b is None else size(b, 1, "GiB")

    lines = [f"OS:   {h.os}", f"CPU:  {h.cpu_model} ({h.cpu_cores or '?'} cores, {h.cpu_threads or '?'} threads)",
             f"RAM:  {gib(h.ram_total)} total, {gib(h.ram_available)} available"]
    for g in h.gpus:
        bw = f"{g.bandwidth_gbs:.0f} GB/s ({g.bandwidth_source})" if g.bandwidth_gbs else "bandwidth unknown"
        extra = ""
        if g.bus_width_bits:
            extra = f", {g.bus_width_bits}-bit bus at {g.mem_clock_mhz} MHz"
        mem = f"{gib(g.vram_total)}" + (f" ({gib(g.vram_free)} free)" if g.vram_free is not None else "")
        label = "GPU share of unified memory" if g.vendor == "apple" else "VRAM"
        lines.append(f"GPU:  {g.name}: {label} {mem}, {bw}{extra}"
                     + (f", driver {g.driver}, CUDA {g.cuda}" if g.driver else ""))
    if not h.gpus:
        lines.append("GPU:  none (CPU only)")
    for n in h.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
