"""llama.cpp's RPC worker (``ggml-rpc-server``; ``rpc-server`` in builds before mid-2026): finding
it beside llama-server, the workers a user names (``host:port[,host:port]``), and a worker we
start ourselves, owned like every child process of ours (its own process group, killed as a whole,
dead with us on Linux).

The RPC backend is unauthenticated: a worker that listens beyond this machine lets anyone on the
network run code on it. A worker binds to 127.0.0.1 unless its caller passes ``allow_remote``
(the CLI's explicit ``--host``), and then the upstream warning is said first (REMOTE_WARNING)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from app.core.common.errors import EngineError, UserError, os_reason
from app.core.engines.commands import RPC_REBUILD as REBUILD
from app.core.engines.server.binary import child_env, group_kwargs, kill_group

WORKER_NAMES = ("ggml-rpc-server", "rpc-server")  # the name since mid-2026, the older one
DEFAULT_PORT = 50052  # upstream's default
LOOPBACK = "127.0.0.1"
MAX_WORKERS = 16  # endpoints in one --rpc list
START_TIMEOUT_S = 30.0
REMOTE_WARNING = ("WARNING: llama.cpp's RPC worker is unauthenticated: anyone who can reach {where} can run "
                  "code on this machine through it. Never expose it to an open network; use it only on a "
                  "network you trust (a home LAN behind a router, a VPN).")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One worker's address as llama-server's ``--rpc`` takes it."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or ``localhost``: reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_endpoint(text: str) -> Endpoint:
    """``host:port`` (``[v6]:port`` for IPv6); UserError naming what is wrong."""
    t = text.strip()
    if t.startswith("["):
        host, sep, port = t[1:].partition("]:")
    else:
        host, sep, port = t.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"RPC worker {text[:80]!r}: expected HOST:PORT, e.g. 192.168.1.20:{DEFAULT_PORT}")
    if len(host) > 253 or any(c.isspace() or c in ",;/\\'\"`$" for c in host):
        raise UserError(f"RPC worker {text[:80]!r}: {host[:80]!r} is not a host name or address")
    return Endpoint(host, int(port))


def parse_endpoints(text: str) -> tuple[Endpoint, ...]:
    """``host:port[,host:port]`` as llama-server's ``--rpc`` takes it; each worker once."""
    parts = [p for p in (text or "").split(",") if p.strip()]
    if not parts:
        raise UserError("--rpc: name at least one worker, HOST:PORT[,HOST:PORT]")
    if len(parts) > MAX_WORKERS:
        raise UserError(f"--rpc: {len(parts)} workers; at most {MAX_WORKERS}")
    endpoints = tuple(parse_endpoint(p) for p in parts)
    if len(set(endpoints)) < len(endpoints):
        raise UserError("--rpc: a worker is named twice")
    return endpoints


def rpc_arg(endpoints: tuple[Endpoint, ...]) -> str:
    """The value of llama-server's ``--rpc``."""
    return ",".join(str(e) for e in endpoints)


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


def free_port(host: str = LOOPBACK) -> int:
    """A port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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

    def start(self, timeout: float = START_TIMEOUT_S) -> "RpcWorker":
        """Start it and wait until it accepts connections; EngineError naming the binary and its
        last words when it exits or stays silent."""
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self.log or subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT if self.log else subprocess.DEVNULL,
                                         env=child_env(), restore_signals=False, **group_kwargs())
        except OSError as e:
            raise EngineError(f"{self.binary}: cannot start the RPC worker ({os_reason(e)})") from None
        deadline = time.monotonic() + timeout
        probe_host = LOOPBACK if self.endpoint.host in ("0.0.0.0", "::") else self.endpoint.host
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise EngineError(f"{self.binary}: the RPC worker exited at start (exit code {code}); is port "
                                  f"{self.endpoint.port} already in use?")
            try:
                with socket.create_connection((probe_host, self.endpoint.port), timeout=0.5):
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
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
