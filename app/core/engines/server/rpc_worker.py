"""llama.cpp's RPC worker (``ggml-rpc-server``; ``rpc-server`` in builds before mid-2026): finding
it beside llama-server, the workers a user names (``host:port[,host:port]``), and a worker we
start ourselves, owned like every child process of ours (its own process group, killed as a whole,
dead with us on Linux).

The RPC backend is unauthenticated: a worker that listens beyond this machine lets anyone on the
network run code on it. A worker binds to 127.0.0.1 unless its caller passes ``allow_remote``
(the CLI's explicit ``--host``), and then the upstream warning is said first (REMOTE_WARNING)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from app.core.common.errors import EngineError, UserError, os_reason
from app.core.common.workers import DEFAULT_PORT as DEFAULT_PORT, MAX_WORKERS as MAX_WORKERS  # re-exported
from app.core.common.workers import Endpoint as Endpoint, is_loopback as is_loopback
from app.core.common.workers import parse_endpoint as parse_endpoint
from app.core.engines.commands import RPC_REBUILD as REBUILD
from app.core.engines.server.binary import _run_quiet, child_env, group_kwargs, kill_group, probe_capabilities

WORKER_NAMES = ("ggml-rpc-server", "rpc-server")  # the name since mid-2026, the older one
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 30.0
REMOTE_WARNING = ("WARNING: llama.cpp's RPC worker is unauthenticated: anyone who can reach {where} can run "
                  "code on this machine through it. Never expose it to an open network; use it only on a "
                  "network you trust (a home LAN behind a router, a VPN).")


def _exe(name: str) -> str:
    return name + ".exe" if sys.platform == "win32" else name


def find_worker(server_bin: str | os.PathLike[str] | None = None) -> str | None:
    """The worker of the same llama.cpp as ``server_bin`` (beside it, under either name), else
    one on PATH when no server is named; None when there is none."""
    if server_bin:
        folder = Path(server_bin).resolve().parent
        for name in WORKER_NAMES:
            p = folder / _exe(name)
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
        return None
    for name in WORKER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def worker_problem(server_bin: str | os.PathLike[str] | None) -> str | None:
    """Why this llama.cpp cannot split a model over RPC workers (no worker beside its llama-server),
    with how to fix it; None when it can."""
    if find_worker(server_bin):
        return None
    where = f" beside {server_bin}" if server_bin else " on PATH"
    return f"this llama.cpp has no RPC worker (no {' or '.join(WORKER_NAMES)}{where}): it was built without RPC; {REBUILD}"


def rpc_build_problem(server_bin: str) -> str | None:
    """Why this llama-server cannot use RPC workers, with how to fix it; None when it can. Asked
    of the server itself: its --help lists --rpc in every build, so it is given a worker of its own
    llama.cpp (started for a moment on loopback) and must accept it before ``--version``; a build
    without RPC refuses ("RPC not supported in this build"). pip's wheel cache does not key on
    build flags, so an install can bring back a build without RPC: this is the check after it."""
    caps = probe_capabilities(server_bin)
    if "--rpc" not in caps.flags:
        return f"{server_bin} has no --rpc option: this llama.cpp is too old or built without RPC; {REBUILD}"
    worker_bin = find_worker(server_bin)
    if worker_bin is None:
        return worker_problem(server_bin)
    with RpcWorker(worker_bin, threads=1) as w:
        rc, out = _run_quiet([server_bin, "--rpc", str(w.endpoint), "--version"], timeout=60.0)
    if rc != 0:
        lines = [line.strip() for line in out.splitlines() if line.strip()] or ["no output"]
        said = next((line for line in reversed(lines) if "rpc" in line.lower()), lines[-1])
        return f"{server_bin} does not take --rpc ({said[:200]}): it was built without RPC; {REBUILD}"
    return None


def free_port(host: str = LOOPBACK) -> int:
    """A port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class RpcWorker:
    """A worker we start and own: ``with RpcWorker(binary) as w: ... w.endpoint ...``. It is
    stopped (its whole process group) on ``stop()``, on leaving the ``with``, and on Linux when
    this process dies, so no worker outlives the sweep, the command or the app that started it.

    It inherits our ignored SIGPIPE (``restore_signals=False``): upstream's worker writes without
    MSG_NOSIGNAL, so a client that hangs up before reading an answer would otherwise kill it."""

    def __init__(self, binary: str, host: str = LOOPBACK, port: int = 0, threads: int | None = None,
                 device: str | None = None, allow_remote: bool = False, log: IO[bytes] | None = None):
        if not is_loopback(host) and not allow_remote:
            raise UserError(f"an RPC worker binds to {LOOPBACK} unless you ask for {host!r} explicitly "
                            "(--host): the RPC backend is unauthenticated")
        self.binary = binary
        self.endpoint = Endpoint(host, port or free_port(host if is_loopback(host) else LOOPBACK))
        self.threads, self.device, self.log = threads, device, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def argv(self) -> list[str]:
        argv = [self.binary, "-H", self.endpoint.host, "-p", str(self.endpoint.port)]
        if self.threads:
            argv += ["-t", str(self.threads)]
        if self.device:
            argv += ["-d", self.device]
        return argv

    @property
    def _probe_host(self) -> str:
        """Where this machine reaches the worker (a wildcard address through loopback)."""
        return LOOPBACK if self.endpoint.host in ("0.0.0.0", "::") else self.endpoint.host

    def start(self, timeout: float = START_TIMEOUT_S) -> "RpcWorker":
        """Start it and wait until it accepts connections; EngineError naming the binary and its
        last words when it exits or stays silent."""
        if _listening(self._probe_host, self.endpoint.port):  # else our "it listens" would be the other program
            raise EngineError(f"cannot start an RPC worker on {self.endpoint}: port {self.endpoint.port} is already "
                              "in use (another worker?); choose another port")
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self.log or subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT if self.log else subprocess.DEVNULL,
                                         env=child_env(), restore_signals=False, **group_kwargs())
        except OSError as e:
            raise EngineError(f"{self.binary}: cannot start the RPC worker ({os_reason(e)})") from None
        try:
            return self._wait_listening(timeout)
        except BaseException:  # a failure, or Ctrl-C while waiting: the worker must not stay behind
            self.stop()
            raise

    def _wait_listening(self, timeout: float) -> "RpcWorker":
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                where = "" if self.endpoint.loopback else f", or is {self.endpoint.host} not an address of this machine"
                raise EngineError(f"{self.binary}: the RPC worker exited at start (exit code {self.proc.returncode}); "
                                  f"is port {self.endpoint.port} already in use{where}?")
            if _listening(self._probe_host, self.endpoint.port):
                return self
            if time.monotonic() > deadline:
                raise EngineError(f"{self.binary}: the RPC worker did not listen on {self.endpoint} within "
                                  f"{timeout:g} s")
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Kill its process group and reap it (idempotent)."""
        if self.proc is None:
            return
        kill_group(self.proc)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not honoured
            pass

    def __enter__(self) -> "RpcWorker":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
