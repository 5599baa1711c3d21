"""The machine a llama.cpp build is for: OS, CPU architecture, GPUs (from the hardware snapshot:
NVML, sysctl, the kernel), whether a Vulkan loader and AMD's HIP runtime are installed; or a
described machine (``runtime install --dry-run --host FILE``). runtime_choice picks by it."""

from __future__ import annotations

import ctypes.util
import dataclasses
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

from app.core.common import jsonsafe
from app.core.common.errors import os_reason
from app.core.machine.runtimes import RuntimeInstallError


@dataclasses.dataclass(frozen=True)
class HostGPU:
    vendor: str  # "nvidia", "apple", "amd", "intel", "unknown"
    name: str
    cuda: str | None = None  # the CUDA version the NVIDIA driver supports (NVML), e.g. "12.4"
    driver: str | None = None


@dataclasses.dataclass(frozen=True)
class Host:
    """What the choice needs to know about a machine: OS, CPU architecture, GPUs (from the
    hardware snapshot: NVML, sysctl, the kernel), whether a Vulkan loader is installed, and
    whether AMD's HIP runtime (ROCm's libamdhip64 / the driver's amdhip64 DLL) is."""
    os: str  # "windows", "macos", "linux"
    arch: str  # "x64", "arm64"
    gpus: tuple[HostGPU, ...] = ()
    vulkan_loader: bool = False
    hip_runtime: bool = False


def _os_name(system: str) -> str:
    s = system.lower()
    if s.startswith("win"):
        return "windows"
    if s.startswith("darwin") or s.startswith("mac"):
        return "macos"
    return "linux" if s.startswith("linux") else s


def _arch_name(machine: str) -> str:
    m = machine.lower()
    if m in ("x86_64", "amd64", "x64"):
        return "x64"
    if m in ("arm64", "aarch64"):
        return "arm64"
    return m


def vulkan_loader_present() -> bool:
    """Is the Vulkan loader (libvulkan.so.1 / vulkan-1.dll) installed?"""
    if sys.platform == "win32":
        root = Path(os.environ.get("SystemRoot", r"C:\Windows"))
        return (root / "System32" / "vulkan-1.dll").is_file()
    if ctypes.util.find_library("vulkan"):
        return True
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"):
        if Path(d, "libvulkan.so.1").exists():
            return True
    return False


def hip_runtime_present() -> bool:
    """Is AMD's HIP runtime installed (ROCm's libamdhip64.so on Linux; amdhip64*.dll, which the
    AMD driver or the HIP SDK puts in System32, on Windows)?"""
    if sys.platform == "win32":
        root = Path(os.environ.get("SystemRoot", r"C:\Windows")) / "System32"
        return any(root.glob("amdhip64*.dll"))
    if ctypes.util.find_library("amdhip64"):
        return True
    return any(Path("/opt").glob("rocm*/lib/libamdhip64.so*"))


def host_from_snapshot(snap: Any, system: str | None = None, machine: str | None = None,
                       vulkan_loader: bool | None = None, hip_runtime: bool | None = None) -> Host:
    """A :class:`Host` from a hardware snapshot (app.core.machine.hardware); the OS, architecture,
    Vulkan loader and HIP runtime are this machine's unless given (tests give recorded ones)."""

    gpus = tuple(HostGPU(g.vendor, g.name, g.cuda, g.driver) for g in snap.gpus)
    os_ = _os_name(system or platform.system())
    amd = any(g.vendor == "amd" for g in gpus)
    if hip_runtime is None:  # the snapshot names AMD GPUs on Linux only; on Windows the driver's HIP DLL does
        hip_runtime = (amd or (os_ == "windows" and not gpus)) and hip_runtime_present()
    if hip_runtime and not amd:
        gpus += (HostGPU("amd", "the AMD GPU of the installed HIP runtime (amdhip64.dll)"),)
    return Host(os_, _arch_name(machine or platform.machine()), gpus,
                vulkan_loader_present() if vulkan_loader is None else vulkan_loader, hip_runtime)


HOST_VENDORS = ("nvidia", "amd", "intel", "apple", "unknown")


def host_from_file(path: "str | os.PathLike[str]") -> Host:
    """A described machine (``runtime install --dry-run --host FILE``): ``{"os": "windows|linux|macos",
    "arch": "x64|arm64", "gpus": [{"vendor": "nvidia|amd|intel|apple", "name": "...", "cuda": "12.9"
    or null, "driver": "..."}], "vulkan_loader": true|false, "hip_runtime": true|false}`` (gpus,
    vulkan_loader and hip_runtime may be left out: none, false, false). Raises
    RuntimeInstallError naming the file and the cause."""
    where = os.fspath(path)

    def bad(cause: str) -> RuntimeInstallError:
        return RuntimeInstallError(f"{where}: not a machine description ({cause})")

    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
    except OSError as e:
        raise RuntimeInstallError(f"{where}: cannot read the machine description ({os_reason(e)})") from None
    try:
        obj = jsonsafe.loads(raw)
    except jsonsafe.TooDeep:
        raise bad("nested too deeply") from None
    except ValueError as e:
        raise bad(f"not JSON: {str(e).splitlines()[0][:120]}") from None
    if not isinstance(obj, dict):
        raise bad("expected a JSON object with os, arch and gpus")
    unknown = sorted(set(obj) - {"os", "arch", "gpus", "vulkan_loader", "hip_runtime"})
    if unknown:
        raise bad(f"unknown key {unknown[0]!r}; the keys are os, arch, gpus, vulkan_loader, hip_runtime")
    os_, arch = obj.get("os"), obj.get("arch")
    if os_ not in ("windows", "linux", "macos"):
        raise bad(f"os is {os_!r}; expected windows, linux or macos")
    if arch not in ("x64", "arm64"):
        raise bad(f"arch is {arch!r}; expected x64 or arm64")
    for key in ("vulkan_loader", "hip_runtime"):
        if not isinstance(obj.get(key, False), bool):
            raise bad(f"{key} is {obj[key]!r}; expected true or false")
    gpus_in = obj.get("gpus", [])
    if not isinstance(gpus_in, list):
        raise bad("gpus is not a list")
    gpus = []
    for i, g in enumerate(gpus_in, 1):
        if not isinstance(g, dict):
            raise bad(f"gpu {i} is not an object")
        vendor, name = g.get("vendor"), g.get("name", "")
        if vendor not in HOST_VENDORS:
            raise bad(f"gpu {i}: vendor is {vendor!r}; expected one of {', '.join(HOST_VENDORS)}")
        if not isinstance(name, str):
            raise bad(f"gpu {i}: name is not text")
        cuda, driver = g.get("cuda"), g.get("driver")
        if cuda is not None and not (isinstance(cuda, str) and re.fullmatch(r"\d+(\.\d+)?", cuda)):
            raise bad(f"gpu {i}: cuda is {cuda!r}; expected a version like \"12.9\" or null")
        if driver is not None and not isinstance(driver, str):
            raise bad(f"gpu {i}: driver is not text")
        gpus.append(HostGPU(vendor, name or f"{vendor.upper()} GPU", cuda, driver))
    return Host(os_, arch, tuple(gpus), bool(obj.get("vulkan_loader", False)), bool(obj.get("hip_runtime", False)))
