"""The per-user runtimes folder: several llama.cpp builds side by side, one selected (persisted).
A runtime is offered only when its folder holds ``runtime.json``, written last, after the build
was validated (app.core.engines.server.runtime_install)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

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


def write_meta(folder: Path, rt: Runtime) -> None:
    d = rt.to_dict()
    d["server"] = str(rt.server.relative_to(rt.folder))
    d.pop("folder")
    write_text_atomic(folder / META, json.dumps(d, indent=2))


def _read(folder: Path) -> Runtime | None:
    try:
        d = json.loads((folder / META).read_text(encoding="utf-8"))
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
            rt = _read(f)
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
    rt = _read(runtimes_dir() / name) if usable_name(name) else None
    if rt is None:
        have = ", ".join(r.name for r in installed()) or "none"
        raise RuntimeInstallError(f"{name!r}: no such runtime installed (installed: {have})")
    return rt


def _selected_file() -> Path:
    return runtimes_dir() / "selected.json"


def selected() -> Runtime | None:
    """The selected runtime, when it is still installed."""
    try:
        name = json.loads(_selected_file().read_text(encoding="utf-8")).get("name")
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
