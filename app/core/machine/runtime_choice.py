"""Picking the llama.cpp build for a machine: a pure function of the host (runtime_host) and a
release's asset list (runtime_release), saying why; the release to take it from (the newest
numbered one with a build for the machine); or the build asked for by name."""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from app.core.common.spec_modes import BROKEN_BUILDS, MTP
from app.core.machine.runtime_host import Host
from app.core.machine.runtime_release import Asset, Release
from app.core.machine.runtimes import RuntimeInstallError


@dataclasses.dataclass(frozen=True)
class Choice:
    asset: Asset
    extras: tuple[Asset, ...]  # unpacked into the same folder (the CUDA runtime libraries)
    backend: str  # "cuda", "rocm", "hip", "vulkan", "metal", "cpu"
    gpu_expected: bool  # --list-devices must then show a GPU
    why: str


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
