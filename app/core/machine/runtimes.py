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
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

from app.core.common.errors import UserError, network_problem, write_reason
from app.core.common import jsonsafe, units
from app.core.common.spec_modes import BROKEN_BUILDS, MTP
from app.core.common.text import shown

RELEASES_URL_ENV = "MTP_TUNER_RELEASES_URL"
# the recent releases, newest first: "latest" may be a tag that holds no binaries (runtimes.pick)
DEFAULT_RELEASES_URL = "https://api.github.com/repos/ggml-org/llama.cpp/releases?per_page=20"
SERVER_NAMES = ("llama-server", "llama-server.exe")
META = "runtime.json"
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


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


def parse_releases(obj: Any, source: str) -> tuple[Release, ...]:
    """The releases of the API's JSON: one release object, or a listing (a list of them, as
    ``/releases`` answers). Drafts are left out."""
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        raise RuntimeInstallError(f"{source}: the release list is empty")
    out = tuple(_parse_one(o, source) for o in items if not (isinstance(o, dict) and o.get("draft") is True))
    if not out:
        raise RuntimeInstallError(f"{source}: the release list holds only drafts")
    return out


def parse_release(obj: Any, source: str) -> Release:
    """A release from the API's JSON (one release object, or a list whose first is taken)."""
    if isinstance(obj, list):
        if not obj:
            raise RuntimeInstallError(f"{source}: the release list is empty")
        obj = obj[0]
    return _parse_one(obj, source)


def _parse_one(obj: Any, source: str) -> Release:
    if not isinstance(obj, dict) or not isinstance(obj.get("assets"), list):
        raise RuntimeInstallError(f"{source}: not a GitHub release (no 'assets' list)")
    tag = obj.get("tag_name")
    if not isinstance(tag, str) or not tag.strip():
        raise RuntimeInstallError(f"{source}: the release has no 'tag_name'")
    tag = shown(tag, 100)  # outside text: shown in lines and names, so one escaped line
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
    """Read the release JSON from ``url`` (default: $MTP_TUNER_RELEASES_URL, else the recent
    ggml-org/llama.cpp releases on GitHub); of a listing, the first."""
    return parse_release(_fetch_json(url, timeout), url or releases_url())


def fetch_releases(url: str | None = None, timeout: float = 20.0) -> tuple[Release, ...]:
    """Every release the JSON at ``url`` holds (one release, or a listing); see :func:`pick`."""
    return parse_releases(_fetch_json(url, timeout), url or releases_url())


def load_releases(path: "str | os.PathLike[str]") -> tuple[Release, ...]:
    """A recorded release listing (``runtime install --releases FILE``): what GitHub's release API
    answered, saved to a file. Raises RuntimeInstallError naming the file and the cause."""
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RELEASE_BYTES + 1)
    except OSError as e:
        raise RuntimeInstallError(f"{where}: cannot read the release listing ({e.strerror or e})") from None
    if len(raw) > MAX_RELEASE_BYTES:
        raise RuntimeInstallError(f"{where}: over {units.size(MAX_RELEASE_BYTES)}; not a release listing")
    try:
        obj = jsonsafe.loads(raw)
    except jsonsafe.TooDeep:
        raise RuntimeInstallError(f"{where}: nested too deeply to be a release listing") from None
    except ValueError as e:
        raise RuntimeInstallError(f"{where}: not JSON ({str(e).splitlines()[0][:120]})") from None
    return parse_releases(obj, where)


def _fetch_json(url: str | None, timeout: float) -> Any:
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
        return jsonsafe.loads(bytes(body))
    except jsonsafe.TooDeep:
        raise RuntimeInstallError(f"{url}: the release answer is nested too deeply to be a GitHub release; "
                                  "refused") from None
    except ValueError:
        raise RuntimeInstallError(f"{url}: the release answer is not JSON") from None


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
    hardware snapshot: NVML, sysctl, the kernel), whether a Vulkan loader is installed, and
    whether AMD's HIP runtime (ROCm's libamdhip64 / the driver's amdhip64 DLL) is."""
    os: str  # "windows", "macos", "linux"
    arch: str  # "x64", "arm64"
    gpus: tuple[HostGPU, ...] = ()
    vulkan_loader: bool = False
    hip_runtime: bool = False


@dataclasses.dataclass(frozen=True)
class Choice:
    asset: Asset
    extras: tuple[Asset, ...]  # unpacked into the same folder (the CUDA runtime libraries)
    backend: str  # "cuda", "rocm", "hip", "vulkan", "metal", "cpu"
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
        raise RuntimeInstallError(f"{where}: cannot read the machine description ({e.strerror or e})") from None
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


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


# Upstream's asset names (.github/workflows/release.yml), by pattern: the tag, the platform and
# backend, a version where the backend has one, the CPU architecture; never a list of versions.
_V = r"(?P<v>\d+(?:\.\d+)+)"
_ARCHIVE = r"\.(?:zip|tar\.gz)"
# the first spelling of each is the current one: "cuda-12.4" (older: "cuda-cu12.2.0")
_PATTERNS = {
    "cuda": r"llama-.+-bin-{os}-cuda-(?:cu)?" + _V + r"-{arch}" + _ARCHIVE,
    "rocm": r"llama-.+-bin-{os}-rocm-" + _V + r"(?:-{arch})?" + _ARCHIVE,
    "hip": r"llama-.+-bin-{os}-hip(?:-radeon)?-{arch}" + _ARCHIVE,
    "vulkan": r"llama-.+-bin-{os}-vulkan-{arch}" + _ARCHIVE,
    # older Windows names: avx2 (x64), llvm (arm64)
    "cpu": r"llama-.+-bin-{os}(?:-cpu|-avx2|-llvm)?-{arch}" + _ARCHIVE,
}
_OS_WORD = {"windows": "win", "linux": "ubuntu", "macos": "macos"}


def _builds(assets: list[Asset], backend: str, os_: str, arch: str) -> list[tuple[tuple[int, ...], str, Asset]]:
    """The release's ``backend`` builds for (os, arch), newest version first: (version, its text,
    asset); builds without a version sort by name (the CPU one before an avx2 one)."""
    rx = re.compile(_PATTERNS[backend].format(os=_OS_WORD[os_], arch=arch))
    if backend == "rocm" and arch != "x64":  # an unnamed architecture is x64
        rx = re.compile(_PATTERNS[backend].replace("(?:-{arch})?", "-{arch}").format(os=_OS_WORD[os_], arch=arch))
    out = []
    for a in assets:
        m = rx.fullmatch(a.name)
        if m:
            v = m.groupdict().get("v") or ""
            out.append((_ver(v) if v else (), v, a))
    out.sort(key=lambda t: (t[0], "-avx2-" not in t[2].name and "-llvm-" not in t[2].name), reverse=True)
    return out


def _cudart(assets: list[Asset], os_: str, arch: str, v: str) -> Asset | None:
    """The CUDA runtime archive that goes with the CUDA ``v`` build: Windows
    ``cudart-llama-bin-win-cuda-13.4-x64.zip`` (older: ``...-win-cu12.2.0-x64.zip``), Linux
    ``cudart-llama-bNNNN-bin-ubuntu-cuda-12.8-x64.tar.gz`` (the tag in the name, the architecture
    perhaps not)."""
    rx = re.compile(r"cudart-llama-(?:.+-)?bin-" + _OS_WORD[os_] + r"-(?:cuda-|cu)(?:cu)?" + re.escape(v)
                    + rf"(?:-{arch})?" + _ARCHIVE)
    hits = sorted((a for a in assets if rx.fullmatch(a.name)), key=lambda a: f"-{arch}." not in a.name)
    return hits[0] if hits else None


def _cuda_choice(host: Host, assets: list[Asset], reasons: list[str]) -> Choice | None:
    """The newest CUDA build the NVIDIA driver supports, with its CUDA runtime; None (and why, in
    ``reasons``) when there is none."""
    nvidia = [g for g in host.gpus if g.vendor == "nvidia"]
    if not nvidia:
        return None
    g = nvidia[0]
    cudas = _builds(assets, "cuda", host.os, host.arch)
    if not cudas:
        reasons.append(f"the release has no CUDA build for {host.os} {host.arch}")
        return None
    drv = _ver(g.cuda) if g.cuda else None
    if not drv:
        reasons.append(f"{g.name}: the driver's CUDA version is unknown (NVML did not say)")
        return None
    usable = [c for c in cudas if drv >= c[0]]
    if not usable:
        reasons.append(f"{g.name}: its driver supports CUDA {g.cuda}, older than the CUDA {cudas[-1][1]} build "
                       "needs (update the NVIDIA driver for CUDA)")
        return None
    for _, vs, a in usable:
        rt = _cudart(assets, host.os, host.arch, vs)
        if rt is not None:
            newer = [c[1] for c in cudas if c[0] > _ver(vs)]
            return Choice(a, (rt,), "cuda", True,
                          f"{g.name}: its driver {g.driver or ''} supports CUDA {g.cuda}, so the CUDA {vs} build "
                          f"with its CUDA runtime ({rt.name})".replace("  ", " ")
                          + (f"; the CUDA {', '.join(newer)} build needs a newer driver" if newer else ""))
        reasons.append(f"the release has no CUDA {vs} runtime archive (cudart) for {a.name}")
    return None


def _amd_choice(host: Host, assets: list[Asset], reasons: list[str]) -> Choice | None:
    """A ROCm (or the older HIP) build for an AMD GPU where the HIP runtime is installed."""
    amd = [g for g in host.gpus if g.vendor == "amd"]
    if not amd:
        return None
    if not host.hip_runtime:
        reasons.append(f"{amd[0].name}: no HIP runtime installed (ROCm's libamdhip64 / amdhip64.dll), so no "
                       "ROCm build")
        return None
    for backend in ("rocm", "hip"):
        found = _builds(assets, backend, host.os, host.arch)
        if found:
            _, vs, a = found[0]
            what = f"ROCm {vs}" if backend == "rocm" else "HIP"
            return Choice(a, (), backend, True, f"{amd[0].name} with the HIP runtime installed: the {what} build")
    reasons.append(f"the release has no ROCm/HIP build for {host.os} {host.arch}")
    return None


def choose_variant(host: Host, assets: Iterable[Asset]) -> Choice:
    """The build for this machine, and why. Windows and Linux: for an NVIDIA GPU the newest CUDA
    build its driver supports (13.x, then 12.x) with its CUDA runtime archive; for an AMD GPU with
    the HIP runtime a ROCm (or HIP) build; else the Vulkan build for a GPU with a Vulkan loader;
    else the CPU build. Windows on arm64: the CPU build. macOS arm64: Metal; an Intel Mac: CPU.
    Asset names are matched by pattern (_PATTERNS). Raises RuntimeInstallError when the release
    has no build for this machine."""
    assets = list(assets)
    os_, arch = host.os, host.arch
    if os_ not in _OS_WORD or arch not in ("x64", "arm64"):
        raise RuntimeInstallError(f"no upstream llama.cpp build is picked for {host.os} {host.arch}; "
                                  "install llama-server yourself and give its path")
    cpu = _builds(assets, "cpu", os_, arch)
    if os_ == "macos":
        if not cpu:
            raise RuntimeInstallError(f"the release has no macOS {arch} build")
        if arch != "arm64":
            return Choice(cpu[0][2], (), "cpu", False, "an Intel Mac: upstream's x64 build has no Metal, so the CPU build")
        chip = next((g.name for g in host.gpus if g.vendor == "apple"), "Apple Silicon")
        return Choice(cpu[0][2], (), "metal", True, f"{chip}: the macOS arm64 build runs on the GPU with Metal")
    where = {"windows": "Windows", "linux": "Linux"}[os_] + f" {arch}"
    reasons: list[str] = []
    gpu_path = not (os_ == "windows" and arch == "arm64")  # Windows on arm64: upstream's GPU builds are previews
    if gpu_path:
        choice = _cuda_choice(host, assets, reasons) or _amd_choice(host, assets, reasons)
        if choice is not None:
            return choice
        if not [g for g in host.gpus if g.vendor in ("nvidia", "amd")]:
            reasons.append("no NVIDIA or AMD GPU found")
        gpus = [g for g in host.gpus if g.vendor != "apple"]
        vk = _builds(assets, "vulkan", os_, arch)
        loader = "vulkan-1.dll" if os_ == "windows" else "libvulkan.so.1"
        # Windows: a GPU the snapshot does not name (it names NVIDIA's only) may stand behind an
        # installed loader; Linux names AMD and Intel GPUs too, and the loader is a package
        want = (bool(gpus) or host.vulkan_loader) if os_ == "windows" else (bool(gpus) and host.vulkan_loader)
        if vk and want:
            target = gpus[0].name if gpus else f"the GPU behind the installed Vulkan loader ({loader})"
            return Choice(vk[0][2], (), "vulkan", True, f"{'; '.join(reasons)}: the Vulkan build, for {target}")
        if not vk and (gpus or host.vulkan_loader):
            reasons.append(f"the release has no Vulkan build for {where}")
        elif not gpus and not host.vulkan_loader:
            reasons.append(f"no GPU and no Vulkan loader ({loader}) found")
        elif not gpus:
            reasons.append("no GPU found")
        else:
            reasons.append(f"no Vulkan loader is installed ({loader})")
    else:
        reasons.append("Windows on arm64: upstream's CPU build")
    if not cpu:
        raise RuntimeInstallError(f"the release has no {where} build"
                                  + (" (cpu, vulkan, cuda or rocm)" if gpu_path else " (cpu)"))
    return Choice(cpu[0][2], (), "cpu", False, f"{'; '.join(reasons)}: the CPU build")


# builds that cannot start draft-mtp on any model with MTP heads (llama.cpp #28159, fixed by #28173)
BROKEN_MTP_BUILDS = BROKEN_BUILDS[MTP][0]


def tag_number(tag: str) -> int | None:
    """The build number of a ``bNNNN`` release tag, else None (a semver tag, a preview)."""
    m = re.fullmatch(r"b(\d+)", tag)
    return int(m.group(1)) if m else None


def _has_binaries(rel: Release) -> bool:
    return any(a.name.startswith("llama-") and "-bin-" in a.name for a in rel.assets)


def pick(host: Host, releases: Iterable[Release]) -> tuple[Release, Choice, tuple[str, ...]]:
    """The newest ``bNNNN`` release that has a build for ``host``, that build, and why others were
    passed over (a "latest" that holds no binaries, a release without a build for this machine,
    a build that cannot run draft-mtp). Releases under other tags are tried after the bNNNN ones.
    Raises RuntimeInstallError when none has a build for this machine."""
    rels = list(releases)
    numbered = sorted((r for r in rels if tag_number(r.tag) is not None), key=lambda r: -(tag_number(r.tag) or 0))
    ordered = numbered + [r for r in rels if tag_number(r.tag) is None]
    skipped: list[str] = []
    for rel in rels:  # what "latest" may point at: a tag that holds no binaries
        if tag_number(rel.tag) is None and not _has_binaries(rel):
            skipped.append(f"{rel.tag}: skipped (no binaries in this release)")
    ordered = [r for r in ordered if tag_number(r.tag) is not None or _has_binaries(r)]
    last: RuntimeInstallError | None = None
    for rel in ordered:
        n = tag_number(rel.tag)
        if n is not None and n in BROKEN_MTP_BUILDS:
            skipped.append(f"{rel.tag}: skipped (builds b10741-b10748 cannot start draft-mtp; b10749 fixed it)")
            continue
        if not _has_binaries(rel):
            skipped.append(f"{rel.tag}: skipped (no binaries in this release)")
            continue
        try:
            return rel, choose_variant(host, rel.assets), tuple(skipped)
        except RuntimeInstallError as e:
            last = e
            skipped.append(f"{rel.tag}: skipped ({e})")
    if not rels:
        raise RuntimeInstallError("the release listing is empty")
    raise RuntimeInstallError(f"no release has a build for {host.os} {host.arch}"
                              + (f" ({last})" if last else f" ({skipped[-1]})" if skipped else ""))


def choice_for_asset(release: Release, name: str) -> Choice:
    """The build asked for by asset name (``runtime install --asset``): its backend from the name,
    and for a CUDA build the CUDA runtime archive :func:`choose_variant` would add. Raises
    RuntimeInstallError for a name the release lacks, or a CUDA build whose version cannot be read."""
    a = next((x for x in release.assets if x.name == name), None)
    if a is None:
        raise RuntimeInstallError(f"{release.source}: release {release.tag} has no asset {name!r}")
    low = a.name.lower()
    backend = next((b for b in ("cuda", "vulkan", "metal", "rocm", "hip", "sycl") if b in low),
                   "metal" if "macos-arm64" in low else "cpu")
    extras: tuple[Asset, ...] = ()
    if backend == "cuda":
        m = re.fullmatch(r"llama-.+-bin-(?P<os>win|ubuntu)-cuda-(?:cu)?" + _V + r"-(?P<arch>x64|arm64)" + _ARCHIVE,
                         a.name)
        if m is None:
            raise RuntimeInstallError(f"{a.name!r}: not a CUDA build this app can install (expected "
                                      "llama-...-bin-win|ubuntu-cuda-<version>-<arch>.zip|.tar.gz, used with its "
                                      "cudart archive)")
        os_ = "windows" if m.group("os") == "win" else "linux"
        rt = _cudart(list(release.assets), os_, m.group("arch"), m.group("v"))
        if rt is None:
            raise RuntimeInstallError(f"{release.source}: release {release.tag} has no CUDA runtime archive "
                                      f"(cudart-llama-...-cuda-{m.group('v')}) for {a.name}")
        extras = (rt,)
    return Choice(a, extras, backend, backend != "cpu", f"asked for by name ({a.name})")
