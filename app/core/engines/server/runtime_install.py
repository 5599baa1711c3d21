"""Installing a llama.cpp runtime from an upstream release: download the chosen archive(s)
(resumable, sha256-checked: app.core.machine.download), unpack them safely into a staging folder
beside the runtimes, validate the build there (``--version``; ``--list-devices`` shows a GPU
when a GPU build was chosen; ``--help`` accepts ``--spec-type draft-mtp``), then write its
runtime.json and move the folder into place in one rename, and select it. A build that fails
is deleted and the error says why; the runtime selected before stays selected and untouched.
What the archives unpack to is bounded (runtime_archive.Budget); each asset gets its own folder
(another build of the same tag and backend goes beside it, never over it); the staging folder is
held by a lock, so a later runtime command can tell one left by a killed install and delete it
(runtime_store.clean_stale)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError, UserError
from app.core.common.paths import cache_dir
from app.core.engines.server.binary import probe_capabilities
from app.core.engines.server.devices import read_devices
from app.core.engines.server.rpc_worker import find_worker
from app.core.machine import runtime_choice, runtime_host, runtime_release, runtimes
from app.core.machine import runtime_archive as RA
from app.core.machine import runtime_store as RS
from app.core.machine.download import DownloadProgress, Fetched, fetch_locked, locked, make_folder
from app.core.machine.hardware import HardwareSnapshot
from app.core.machine.modelinfo import size_text

_ASSET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}$")


@dataclasses.dataclass(frozen=True)
class Step:
    """One line of what the install is doing now."""
    text: str


def downloads_dir() -> Path:
    return cache_dir() / "runtime-downloads"


def _download(asset: runtime_release.Asset, cancel: CancelToken) -> Iterator[DownloadProgress | Step | Path]:
    if not _ASSET_NAME.fullmatch(asset.name):
        raise runtimes.RuntimeInstallError(f"{asset.name[:200]!r}: not a usable release asset name; refused")
    if not asset.sha256:
        raise runtimes.RuntimeInstallError(f"{asset.url}: the release gives no sha256 digest for {asset.name}, so it "
                              "cannot be verified; not installed")
    runtime_release.check_url(asset.url, f"the download URL of {asset.name}")
    folder = downloads_dir()
    make_folder(folder, "runtime downloads folder")
    dest = folder / asset.name
    yield Step(f"downloading {asset.name} ({size_text(asset.size)}) from {asset.url}")
    meta = {"url": asset.url, "sha256": asset.sha256, "size": asset.size}
    import httpx2  # deferred: heavy

    def redirect_ok(request: Any) -> None:  # a redirect is held to the same rule as the listed URL
        runtime_release.check_url(str(request.url), f"the download of {asset.name} (redirected)")

    with locked(dest), httpx2.Client(event_hooks={"request": [redirect_ok]}) as session:
        for ev in fetch_locked(asset.url, dest, label=asset.url, meta=meta, expected_sha256=asset.sha256,
                               expected_size=asset.size, cancel=cancel, error=runtimes.RuntimeInstallError,
                               listed_by="the release", session=session):
            if isinstance(ev, Fetched):
                if ev.resumed_from:
                    yield Step(f"resumed from byte {ev.resumed_from:,}")
                yield Step(f"sha256 ok: {ev.sha256}")
                yield ev.path
            else:
                yield ev


def validate(server: Path, choice_backend: str, gpu_expected: bool, why: str = "",
             cancel: CancelToken | None = None) -> tuple[str, tuple[str, ...]]:
    """(version, devices) of an unpacked build, or RuntimeInstallError saying what failed. The
    version is the one probe_capabilities reads (the same words as everywhere else: "b11434
    (515e855)")."""
    try:
        caps = probe_capabilities(str(server), cancel=cancel)
    except EngineError as e:
        raise runtimes.RuntimeInstallError(f"{e}; a library may be missing") from None
    if caps.build_number is None and "(build " not in caps.version:
        raise runtimes.RuntimeInstallError(f"{server}: --version failed ({caps.version}); a library may be missing")
    try:  # asked now, not from the per-binary cache: this folder is new
        found = read_devices(str(server), 60.0, cancel)
    except EngineError as e:
        raise runtimes.RuntimeInstallError(str(e)) from None
    devices = tuple(d.label() for d in found)
    if gpu_expected and not any(d.is_gpu for d in found):
        raise runtimes.RuntimeInstallError(f"{server}: --list-devices shows no GPU, but the {choice_backend} build was "
                              f"chosen for a GPU ({why or 'recorded in the hardware snapshot'}); it would "
                              "run on the CPU (a missing GPU runtime or driver?)")
    if not caps.supports_mtp:
        raise runtimes.RuntimeInstallError(f"{server}: {caps.mtp_problem() or '--help has no draft-mtp'}")
    return caps.version, devices


def install(choice: runtime_choice.Choice, tag: str, *, cancel: CancelToken | None = None,
            select: bool = True) -> Iterator[DownloadProgress | Step | RS.Runtime]:
    """Download, unpack, validate and offer one build; yields progress and steps, then the
    :class:`Runtime`. Raises UserError (RuntimeInstallError) or Cancelled; on any failure nothing of
    this build is left in the runtimes folder."""
    cancel = cancel or CancelToken()
    for text in RS.clean_stale():
        yield Step(text)
    archives: list[Path] = []
    for asset in (choice.asset, *choice.extras):
        for ev in _download(asset, cancel):
            if isinstance(ev, Path):
                archives.append(ev)
            else:
                yield ev
    root = RS.runtimes_dir()
    make_folder(root, "runtimes folder")
    name, note = RS.name_for(tag, choice.backend, choice.asset.name)
    if note:
        yield Step(note)
    staging = RS.staging_folder(name)
    try:
        with RS.working(staging):
            yield from _unpack_and_place(choice, tag, name, archives, staging, cancel)
    except runtimes.RuntimeInstallError:
        # refused (an unsafe member, no llama-server, a build that fails its checks): the archive
        # would be refused again, so it is not kept in the download cache to be resumed or reused
        for a in archives:
            a.unlink(missing_ok=True)
        raise
    for a in archives:  # installed: the archives are not needed any more
        a.unlink(missing_ok=True)
    if select:
        RS.select(name)
    yield RS.get(name)


def _unpack_and_place(choice: runtime_choice.Choice, tag: str, name: str, archives: list[Path], staging: Path,
                      cancel: CancelToken) -> Iterator[Step]:
    """Unpack into ``staging`` (its lock held), validate, and move it into place as ``name``: a
    runtime of the same asset there is replaced (and comes back when the last rename fails); one
    of another asset is never touched."""
    root = staging.parent
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        budget = RA.Budget()
        for a in archives:
            cancel.check()
            yield Step(f"unpacking {a.name}")
            RA.safe_extract(a, staging, budget)
        server = RA.find_server(staging)
        if server is None:
            raise runtimes.RuntimeInstallError(f"{choice.asset.name}: the archive has no llama-server; not installed")
        yield Step("validating: --version, --list-devices, --help (draft-mtp)")
        version, devices = validate(server, choice.backend, choice.gpu_expected, choice.why, cancel)
        yield Step(f"version: {version}")
        yield Step(f"devices: {', '.join(devices) if devices else 'none (CPU only)'}")
        yield Step("draft-mtp: accepted by --spec-type")
        worker = find_worker(server)  # kept as the archive names it (ggml-rpc-server, or rpc-server before)
        yield Step(f"RPC worker: {Path(worker).name} (mtp-tuner rpc-worker runs it)" if worker else
                   "RPC worker: none in this build (it cannot split a model over other machines)")
        final = root / name
        rt = RS.Runtime(name, final, final / server.relative_to(staging), tag, choice.backend,
                       choice.asset.name, version, devices, choice.why)
        RS.write_meta(staging, dataclasses.replace(rt, folder=staging, server=server))
        old = None
        if os.path.lexists(final):
            there = RS.read_runtime(final)
            if there is None or there.asset != choice.asset.name:
                raise runtimes.RuntimeInstallError(f"{final}: another build was put there while this one was being "
                                            "installed; left as it is, nothing installed (run the install again)")
            old = RS.replaced_folder(staging)
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        try:
            os.replace(staging, final)  # one rename: the runtime appears whole
        except BaseException:
            if old is not None:  # the build it was to replace comes back
                os.replace(old, final)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError):
            raise runtimes.RuntimeInstallError(f"{runtimes.os_error_text(e, root)}; nothing installed") from None
        if isinstance(e, UserError) and not isinstance(e, runtimes.RuntimeInstallError):
            raise runtimes.RuntimeInstallError(str(e)) from None
        if isinstance(e, runtimes.RuntimeInstallError):
            msg = str(e) if "nothing installed" in str(e) else f"{e}; the build was removed, nothing installed"
            raise runtimes.RuntimeInstallError(msg) from None
        raise


def install_for_machine(hw: HardwareSnapshot, *,
                        cancel: CancelToken | None = None) -> Iterator[DownloadProgress | Step | RS.Runtime]:
    """"Get llama.cpp for this machine": read the upstream releases, pick the newest with a build
    for the hardware snapshot ``hw`` (saying which, why, and which releases it passed over, as
    Steps), then :func:`install` it."""
    host = runtime_host.host_from_snapshot(hw)  # looking for a Vulkan loader runs ldconfig: a worker's job
    rel, choice, skipped = runtime_choice.pick(host, runtime_release.fetch_releases())
    for text in skipped:  # a "latest" without binaries, a build that cannot run draft-mtp
        yield Step(text)
    yield Step(f"llama.cpp {rel.tag}: {choice.asset.name}" + "".join(f" + {x.name}" for x in choice.extras))
    yield Step(f"why: {choice.why}")
    yield from install(choice, rel.tag, cancel=cancel)
