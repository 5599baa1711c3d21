"""llama.cpp runtimes from upstream releases: reading a release (GitHub's release API JSON: asset
names, sizes, ``digest: "sha256:..."``; read from https only, bounded in size, a hostile answer one
line) and picking the build for this machine (a pure function of
a hardware snapshot and the asset list, saying why). Unpacking is in runtime_archive, the per-user
runtimes folder (several builds side by side, one selected) in runtime_store.

Downloading goes through app.core.machine.download (resumable, sha256-checked); validating a
build (``--version``, ``--list-devices``, ``--help``) and the install as a whole are in
app.core.engines.server.runtime_install, which runs llama-server.

A runtime is offered only when its folder holds ``runtime.json``, written last, after the build
was validated; a folder is moved into the runtimes folder whole (one rename), so nothing
half-unpacked ever sits under a runtime's name."""

from __future__ import annotations

import ctypes.util
import dataclasses
import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

from app.core.common.errors import UserError, network_problem, write_reason
from app.core.common import units

RELEASES_URL_ENV = "MTP_TUNER_RELEASES_URL"
DEFAULT_RELEASES_URL = "https://api.github.com/repos/ggml-org/llama.cpp/releases/latest"
SERVER_NAMES = ("llama-server", "llama-server.exe")
META = "runtime.json"
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# the oldest CUDA a driver must support to run a CUDA 12.x build: the build's own version
CUDA_MAJOR = 12


class RuntimeInstallError(UserError):
    """A runtime that cannot be listed, downloaded, unpacked, validated or selected."""


def os_error_text(e: OSError, where: Path) -> str:
    """One line for a failed file operation in the runtimes folder: the path and the cause."""
    return f"{e.filename or where}: cannot change the runtimes folder there ({write_reason(e)})"


# ------------------------------------------------------------------------------------------
# the release


@dataclasses.dataclass(frozen=True)
class Asset:
    name: str
    size: int
    url: str
    sha256: str | None  # from the API's ``digest`` ("sha256:<hex>"); None when the release gives none


@dataclasses.dataclass(frozen=True)
class Release:
    tag: str
    assets: tuple[Asset, ...]
    source: str  # the URL (or file) it was read from


def releases_url() -> str:
    return os.environ.get(RELEASES_URL_ENV) or DEFAULT_RELEASES_URL


_LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_RELEASE_BYTES = 16 << 20  # GitHub's answer for a release with its notes: well under 1 MiB


def check_url(url: str, what: str) -> str:
    """``url`` when it is https:// (or http:// to this machine: a local mirror, the tests' release
    server), else RuntimeInstallError: no file://, ftp:// or plain http to another host."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        host = u.hostname
    except ValueError:
        u, host = None, None
    if u is not None and host and (u.scheme == "https" or (u.scheme == "http" and host in _LOOPBACK)):
        return url
    raise RuntimeInstallError(f"{url[:200]!r}: {what} is not an https:// URL (plain http:// only to this "
                              "machine: 127.0.0.1 or localhost); refused")


def parse_release(obj: Any, source: str) -> Release:
    """A release from the API's JSON (one release object, or a list whose first is taken)."""
    if isinstance(obj, list):
        if not obj:
            raise RuntimeInstallError(f"{source}: the release list is empty")
        obj = obj[0]
    if not isinstance(obj, dict) or not isinstance(obj.get("assets"), list):
        raise RuntimeInstallError(f"{source}: not a GitHub release (no 'assets' list)")
    tag = obj.get("tag_name")
    if not isinstance(tag, str) or not tag:
        raise RuntimeInstallError(f"{source}: the release has no 'tag_name'")
    assets = []
    for i, a in enumerate(obj["assets"]):
        if not isinstance(a, dict):
            raise RuntimeInstallError(f"{source}: asset {i + 1} is not an object")
        name, size, url = a.get("name"), a.get("size"), a.get("browser_download_url")
        if not isinstance(name, str) or not name or not isinstance(url, str) or not url:
            raise RuntimeInstallError(f"{source}: asset {i + 1} has no name or download URL")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RuntimeInstallError(f"{source}: asset {name!r} has no usable size ({size!r})")
        digest = a.get("digest")
        sha = None
        if isinstance(digest, str) and digest.startswith("sha256:"):
            sha = digest[len("sha256:"):].lower()
            if not SHA256_HEX.fullmatch(sha):
                raise RuntimeInstallError(f"{source}: asset {name!r} has a malformed digest {digest[:80]!r}")
        assets.append(Asset(name, size, url, sha))
    return Release(tag, tuple(assets), source)


def fetch_release(url: str | None = None, timeout: float = 20.0) -> Release:
    """Read the release JSON from ``url`` (default: $MTP_TUNER_RELEASES_URL, else the latest
    ggml-org/llama.cpp release on GitHub)."""
    import httpx2  # deferred: heavy

    url = check_url(url or releases_url(), "the llama.cpp release URL")
    body = bytearray()
    try:
        with httpx2.stream("GET", url, headers={"Accept": "application/vnd.github+json"}, timeout=timeout,
                           follow_redirects=True) as r:
            if r.status_code >= 400:
                raise RuntimeInstallError(f"{url}: cannot read the llama.cpp release (the server answered "
                                          f"{r.status_code})")
            check_url(str(r.url), "the llama.cpp release URL (redirected)")
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_RELEASE_BYTES:
                    raise RuntimeInstallError(f"{url}: the release answer is over {units.size(MAX_RELEASE_BYTES)}; "
                                              "not a GitHub release, refused")
    except httpx2.HTTPError as e:
        offline = network_problem(e, urlsplit(url).hostname or url, "read the latest llama.cpp release")
        if offline:  # no network, refused, no answer: one plain sentence
            raise RuntimeInstallError(offline) from None
        raise RuntimeInstallError(f"{url}: cannot read the llama.cpp release ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:160] if str(e) else 'no answer'})") from None
    try:
        obj = json.loads(bytes(body))
    except RecursionError:
        raise RuntimeInstallError(f"{url}: the release answer is nested too deeply to be a GitHub release; "
                                  "refused") from None
    except ValueError:
        raise RuntimeInstallError(f"{url}: the release answer is not JSON") from None
    return parse_release(obj, url)


# ------------------------------------------------------------------------------------------
# picking the build


@dataclasses.dataclass(frozen=True)
class HostGPU:
    vendor: str  # "nvidia", "apple", "amd", "intel", "unknown"
    name: str
    cuda: str | None = None  # the CUDA version the NVIDIA driver supports (NVML), e.g. "12.4"
    driver: str | None = None


@dataclasses.dataclass(frozen=True)
class Host:
    """What the choice needs to know about a machine: OS, CPU architecture, GPUs (from the
    hardware snapshot: NVML, sysctl, the kernel), and whether a Vulkan loader is installed."""
    os: str  # "windows", "macos", "linux"
    arch: str  # "x64", "arm64"
    gpus: tuple[HostGPU, ...] = ()
    vulkan_loader: bool = False


@dataclasses.dataclass(frozen=True)
class Choice:
    asset: Asset
    extras: tuple[Asset, ...]  # unpacked into the same folder (the CUDA runtime DLLs)
    backend: str  # "cuda", "vulkan", "metal", "cpu"
    gpu_expected: bool  # --list-devices must then show a GPU
    why: str


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


def host_from_snapshot(snap: Any, system: str | None = None, machine: str | None = None,
                       vulkan_loader: bool | None = None) -> Host:
    """A :class:`Host` from a hardware snapshot (app.core.machine.hardware); the OS, architecture
    and Vulkan loader are this machine's unless given (tests give recorded ones)."""

    gpus = tuple(HostGPU(g.vendor, g.name, g.cuda, g.driver) for g in snap.gpus)
    return Host(_os_name(system or platform.system()), _arch_name(machine or platform.machine()), gpus,
                vulkan_loader_present() if vulkan_loader is None else vulkan_loader)


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


_CUDA_BUILD = re.compile(r"^llama-.*-bin-win-cuda-(?P<v>\d+\.\d+)-x64\.zip$")
_CUDART = "cudart-llama-bin-win-cuda-{v}-x64.zip"


def _one(assets: Iterable[Asset], pattern: str) -> Asset | None:
    rx = re.compile(pattern)
    hits = sorted((a for a in assets if rx.fullmatch(a.name)), key=lambda a: a.name)
    return hits[0] if hits else None


def choose_variant(host: Host, assets: Iterable[Asset]) -> Choice:
    """The build for this machine, and why. Windows x64: CUDA 12.x plus its cudart zip when the
    NVIDIA driver supports that CUDA, else Vulkan, else CPU; macOS arm64: Metal; Linux x64: Vulkan
    when a Vulkan loader is installed, else CPU. Raises RuntimeInstallError when the release has no
    build for this machine."""
    assets = list(assets)
    arch = "x64" if host.arch == "x64" else host.arch
    if host.os == "windows" and arch == "x64":
        reasons = []
        nvidia = [g for g in host.gpus if g.vendor == "nvidia"]
        cudas = sorted(((_ver(m.group("v")), a, m.group("v")) for a in assets
                        if (m := _CUDA_BUILD.match(a.name)) and _ver(m.group("v"))[0] == CUDA_MAJOR),
                       key=lambda t: t[0], reverse=True)
        if nvidia:
            g = nvidia[0]
            drv = _ver(g.cuda) if g.cuda else None
            usable = [c for c in cudas if drv and drv >= c[0]]
            if usable:
                v, a, vs = usable[0]
                rt = next((x for x in assets if x.name == _CUDART.format(v=vs)), None)
                if rt is not None:
                    return Choice(a, (rt,), "cuda", True,
                                  f"{g.name}: its driver {g.driver or ''} supports CUDA {g.cuda}, so the "
                                  f"CUDA {vs} build with its CUDA runtime ({rt.name})".replace("  ", " "))
                reasons.append(f"the release has no CUDA {vs} runtime zip ({_CUDART.format(v=vs)})")
            elif not cudas:
                reasons.append("the release has no CUDA 12.x build for Windows")
            elif not drv:
                reasons.append(f"{g.name}: the driver's CUDA version is unknown (NVML did not say)")
            else:
                reasons.append(f"{g.name}: its driver supports CUDA {g.cuda}, older than the CUDA "
                               f"{cudas[-1][2]} build needs (update the NVIDIA driver for CUDA)")
        else:
            reasons.append("no NVIDIA GPU found (NVML)")
        gpus = [g for g in host.gpus if g.vendor != "apple"]
        vk = _one(assets, r"llama-.*-bin-win-vulkan-x64\.zip")
        if vk is not None and (gpus or host.vulkan_loader):
            return Choice(vk, (), "vulkan", True,
                          f"{'; '.join(reasons)}: the Vulkan build, for "
                          + (gpus[0].name if gpus else "the GPU behind the installed Vulkan loader (vulkan-1.dll)"))
        cpu = _one(assets, r"llama-.*-bin-win-cpu-x64\.zip")
        if cpu is not None:
            why = "; ".join(reasons + (["no GPU and no Vulkan loader (vulkan-1.dll) found"] if vk is not None else
                                       ["the release has no Vulkan build for Windows"]))
            return Choice(cpu, (), "cpu", False, f"{why}: the CPU build")
        raise RuntimeInstallError("the release has no Windows x64 build (cpu, vulkan or cuda)")
    if host.os == "macos":
        if arch != "arm64":
            a = _one(assets, r"llama-.*-bin-macos-x64\.(zip|tar\.gz)")
            if a is None:
                raise RuntimeInstallError("the release has no macOS x64 build")
            return Choice(a, (), "cpu", False, "an Intel Mac: upstream's x64 build has no Metal, so the CPU build")
        a = _one(assets, r"llama-.*-bin-macos-arm64\.(zip|tar\.gz)")
        if a is None:
            raise RuntimeInstallError("the release has no macOS arm64 build")
        chip = next((g.name for g in host.gpus if g.vendor == "apple"), "Apple Silicon")
        return Choice(a, (), "metal", True, f"{chip}: the macOS arm64 build runs on the GPU with Metal")
    if host.os == "linux" and arch == "x64":
        vk = _one(assets, r"llama-.*-bin-ubuntu-vulkan-x64\.(zip|tar\.gz)")
        gpus = [g for g in host.gpus if g.vendor != "apple"]
        if host.vulkan_loader and vk is not None and gpus:
            return Choice(vk, (), "vulkan", True,
                          f"a Vulkan loader is installed and a GPU was found ({gpus[0].name}): the Vulkan build")
        cpu = _one(assets, r"llama-.*-bin-ubuntu-x64\.(zip|tar\.gz)")
        if cpu is None:
            raise RuntimeInstallError("the release has no Linux x64 (ubuntu) build")
        why = ("no Vulkan loader is installed (libvulkan.so.1)" if not host.vulkan_loader else
               "no GPU found" if not gpus else "the release has no Vulkan build for Linux")
        return Choice(cpu, (), "cpu", False, f"{why}: the CPU build")
    raise RuntimeInstallError(f"no upstream llama.cpp build is picked for {host.os} {host.arch}; "
                        "install llama-server yourself and give its path")


def choice_for_asset(release: Release, name: str) -> Choice:
    """The build asked for by asset name (``runtime install --asset``): its backend from the name,
    and for a Windows CUDA build the CUDA runtime zip :func:`choose_variant` would add. Raises
    RuntimeInstallError for a name the release lacks, or a CUDA build whose version cannot be read."""
    a = next((x for x in release.assets if x.name == name), None)
    if a is None:
        raise RuntimeInstallError(f"{release.source}: release {release.tag} has no asset {name!r}")
    low = a.name.lower()
    backend = next((b for b in ("cuda", "vulkan", "metal", "hip", "sycl") if b in low),
                   "metal" if "macos-arm64" in low else "cpu")
    extras: tuple[Asset, ...] = ()
    if backend == "cuda":
        m = _CUDA_BUILD.match(a.name)
        if m is None:
            raise RuntimeInstallError(f"{a.name!r}: not a Windows CUDA build this app can install (expected "
                                      "llama-...-bin-win-cuda-<version>-x64.zip, used with its cudart zip)")
        rt = _CUDART.format(v=m.group("v"))
        extras = tuple(x for x in release.assets if x.name == rt)
        if not extras:
            raise RuntimeInstallError(f"{release.source}: release {release.tag} has no CUDA runtime zip {rt!r} "
                                      f"for {a.name}")
    return Choice(a, extras, backend, backend != "cpu", f"asked for by name ({a.name})")
