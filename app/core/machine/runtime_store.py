"""The per-user runtimes folder: several llama.cpp builds side by side, one selected (persisted).
A runtime is offered only when its folder holds ``runtime.json``, written last, after the build
was validated (app.core.engines.server.runtime_install).

An install unpacks into ``.staging-<name>-<pid>`` while it holds that folder's lock
(``.staging-<name>-<pid>.lock``, app.core.common.filelock: the operating system drops it when the
process dies). A work folder whose lock nobody holds is left over from an install that was
killed: :func:`clean_stale` (run when any runtime command starts) deletes it, and puts back a
runtime that was moved aside (``.replaced-*``) to be replaced; one in use is listed by
:func:`work_folders`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

from app.core.common import filelock
from app.core.common import jsonsafe
from app.core.common.atomic import write_text_atomic
from app.core.common.errors import UserError
from app.core.common.paths import data_dir
from app.core.machine.hub_names import check_relative_name
from app.core.machine.runtimes import META, RUNTIME_NAME, RuntimeInstallError, os_error_text


# ------------------------------------------------------------------------------------------
# the runtimes folder


def runtimes_dir() -> Path:
    return data_dir() / "runtimes"


@dataclasses.dataclass(frozen=True)
class Runtime:
    name: str  # the folder's name: "<tag>-<backend>"
    folder: Path
    server: Path
    tag: str
    backend: str
    asset: str
    version: str
    devices: tuple[str, ...]
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["folder"], d["server"] = str(self.folder), str(self.server)
        return d


def runtime_name(tag: str, backend: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{tag}-{backend}").strip("._-")
    return name if usable_name(name) else f"runtime-{name}".strip("-")


MAX_SAME_NAME = 50


def name_for(tag: str, backend: str, asset: str) -> tuple[str, str]:
    """The folder a build of ``asset`` is installed into, and a note when it is not the plain
    ``<tag>-<backend>``: that name when it is free or already holds this asset (a reinstall
    replaces it), else ``<tag>-<backend>-2``, ``-3``, ...: an install never touches another
    build's files."""
    base = runtime_name(tag, backend)
    root = runtimes_dir()
    taken = []
    for n in range(1, MAX_SAME_NAME + 1):
        name = base if n == 1 else f"{base}-{n}"
        folder = root / name
        if not os.path.lexists(folder):
            break
        rt = read_runtime(folder)
        if rt is not None and rt.asset == asset:
            return name, ""
        taken.append(f"{name} (holds {rt.asset})" if rt else f"{name} (a folder that is not a runtime)")
    else:
        raise RuntimeInstallError(f"{root}: {MAX_SAME_NAME} folders named {base}[-N] hold other builds; remove "
                                  f"some (mtp-tuner runtime remove NAME) to install {asset}")
    note = f"{', '.join(taken)}: taken, so {asset} is installed beside it as {name}" if taken else ""
    return name, note


def write_meta(folder: Path, rt: Runtime) -> None:
    d = rt.to_dict()
    d["server"] = str(rt.server.relative_to(rt.folder))
    d.pop("folder")
    write_text_atomic(folder / META, json.dumps(d, indent=2))


def read_runtime(folder: Path) -> Runtime | None:
    try:
        d = jsonsafe.loads((folder / META).read_text(encoding="utf-8"))
        server = folder / d["server"]
        rt = Runtime(folder.name, folder, server, str(d["tag"]), str(d["backend"]), str(d["asset"]),
                     str(d["version"]), tuple(d.get("devices") or ()), str(d.get("why") or ""))
        inside = os.path.commonpath([os.path.abspath(folder), os.path.abspath(server)]) == os.path.abspath(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rt if inside and server.is_file() else None


def installed() -> list[Runtime]:
    """The runtimes that were validated (a folder with runtime.json and its llama-server)."""
    root = runtimes_dir()
    if not root.is_dir():
        return []
    out = []
    for f in sorted(root.iterdir()):
        if f.is_dir() and usable_name(f.name):
            rt = read_runtime(f)
            if rt is not None:
                out.append(rt)
    return out


def usable_name(name: object) -> bool:
    """A runtime's folder name: letters, digits and ``._-``, a letter or digit first, and a name
    every OS writes as given (no device name, no trailing dot): it cannot leave the runtimes folder."""
    if not isinstance(name, str) or not RUNTIME_NAME.fullmatch(name):
        return False
    try:
        check_relative_name(name)
    except UserError:
        return False
    return True


def get(name: str) -> Runtime:
    rt = read_runtime(runtimes_dir() / name) if usable_name(name) else None
    if rt is None:
        have = ", ".join(r.name for r in installed()) or "none"
        raise RuntimeInstallError(f"{name!r}: no such runtime installed (installed: {have})")
    return rt


def _selected_file() -> Path:
    return runtimes_dir() / "selected.json"


def selected() -> Runtime | None:
    """The selected runtime, when it is still installed."""
    try:
        name = jsonsafe.loads(_selected_file().read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(name, str):
        return None
    try:
        return get(name)
    except RuntimeInstallError:
        return None


def selected_server() -> str | None:
    """The selected runtime's llama-server (the server engine's default binary), else None."""
    rt = selected()
    if rt is None or not os.access(rt.server, os.X_OK):
        return None
    return str(rt.server)


def select(name: str) -> Runtime:
    rt = get(name)
    try:
        write_text_atomic(_selected_file(), json.dumps({"name": rt.name}))
    except OSError as e:
        raise RuntimeInstallError(f"{os_error_text(e, _selected_file())}; {rt.name} not selected") from None
    return rt


def remove(name: str) -> Runtime:
    """Delete an installed runtime; when it was the selected one, nothing is selected after."""
    rt = get(name)
    was = selected()
    trash = rt.folder.with_name(f".removing-{rt.name}-{os.getpid()}")
    try:
        if was is not None and was.name == rt.name:
            _selected_file().unlink(missing_ok=True)
        os.replace(rt.folder, trash)  # gone from the list at once, then deleted
    except OSError as e:
        raise RuntimeInstallError(f"{os_error_text(e, rt.folder)}; {rt.name} not removed") from None
    shutil.rmtree(trash, ignore_errors=True)
    return rt


# ------------------------------------------------------------------------------------------
# work folders: an install's staging folder, a runtime moved aside while it is replaced

STAGING, REPLACED, REMOVING = ".staging-", ".replaced-", ".removing-"
_LOCK = ".lock"


def staging_folder(name: str) -> Path:
    return runtimes_dir() / f"{STAGING}{name}-{os.getpid()}"


def replaced_folder(staging: Path) -> Path:
    """Where the runtime a staging folder replaces waits until the new one is in place."""
    return staging.with_name(REPLACED + staging.name[len(STAGING):])


def _lock_of(folder: Path) -> Path:
    rest = folder.name.split("-", 1)[1] if "-" in folder.name else folder.name
    return folder.with_name(f"{STAGING}{rest}{_LOCK}")


@contextlib.contextmanager
def working(staging: Path) -> Iterator[None]:
    """Hold ``staging``'s lock while it (and the runtime it replaces) are worked on."""
    with filelock.exclusive(_lock_of(staging), f"{staging}: already being installed (pid {{pid}})"):
        yield


@dataclasses.dataclass(frozen=True)
class WorkFolder:
    folder: Path
    pid: int | None  # the install's process, from the name
    live: bool  # its install is still running (it holds the lock)
    size: int  # bytes in it now

    def text(self) -> str:
        what = "unpacking" if self.folder.name.startswith(STAGING) else "replacing"
        who = f"pid {self.pid}" if self.pid is not None else "another process"
        from app.core.machine.modelinfo import size_text

        return (f"{self.folder} ({size_text(self.size)}): {what}, by {who} still running" if self.live else
                f"{self.folder} ({size_text(self.size)}): left over from an install that stopped; not removed")


def _bytes_in(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def _pid(folder: Path) -> int | None:
    tail = folder.name.removesuffix(_LOCK).rsplit("-", 1)[-1]
    return int(tail) if tail.isascii() and tail.isdigit() else None


def _work_entries() -> list[Path]:
    root = runtimes_dir()
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    return [p for p in entries if p.name.startswith((STAGING, REPLACED, REMOVING))]


def clean_stale() -> list[str]:
    """Delete the work folders no running install holds (left by a process that was killed or lost
    power), putting back a runtime that was moved aside to be replaced when its name is free; one
    line per folder dealt with."""
    notes = []
    for p in _work_entries():
        if p.name.endswith(_LOCK) and p.is_file() and not p.is_symlink():
            if not p.with_name(p.name[:-len(_LOCK)]).exists():  # an orphan lock: taken and released, gone
                with contextlib.suppress(UserError):
                    with filelock.exclusive(p, ""):
                        pass
            continue
        if not p.is_dir() or p.is_symlink():
            continue
        if p.name.startswith(REMOVING):  # a removed runtime's files: nobody needs them
            shutil.rmtree(p, ignore_errors=True)
            continue
        try:
            with filelock.exclusive(_lock_of(p), ""):
                size = _bytes_in(p)
                back = p.with_name(p.name[len(REPLACED):].rsplit("-", 1)[0]) if p.name.startswith(REPLACED) else None
                if back is not None and usable_name(back.name) and not os.path.lexists(back):
                    os.replace(p, back)
                    notes.append(f"{back.name}: put back from {p.name}, left over from an install that stopped")
                    continue
                shutil.rmtree(p, ignore_errors=True)
                if not p.exists():
                    from app.core.machine.modelinfo import size_text

                    notes.append(f"removed {p.name} ({size_text(size)}), left over from an install that stopped")
        except (UserError, OSError):
            continue  # in use (its install is running), or not ours to change: listed by work_folders
    return notes


def work_folders() -> list[WorkFolder]:
    """The work folders there now: those of installs still running, and any left over that could
    not be removed."""
    out = []
    for p in _work_entries():
        if not p.is_dir() or p.is_symlink():
            continue
        live = False
        if not p.name.startswith(REMOVING):
            try:
                with filelock.exclusive(_lock_of(p), ""):
                    pass
            except filelock.LockBusy:
                live = True
            except UserError:
                pass
        out.append(WorkFolder(p, _pid(p), live, _bytes_in(p)))
    return out
