"""Asking an RPC worker what it is, in llama.cpp's own protocol (ggml/src/ggml-rpc/ggml-rpc.cpp):
is it there, how long one round trip takes, which protocol version its build speaks, and how much
memory each of its devices has. ``mtp-tuner rpc check``, the Machine tab and the records of a sweep
use it; nothing here loads a model or allocates on the worker.

The wire format (native byte order, little-endian on every platform llama.cpp runs on):
a request is ``cmd (u8) | size (u64) | payload``, a reply ``size (u64) | payload``. The first
command on a connection must be HELLO (a 24-byte capabilities block, all zero: plain TCP); the
reply is ``major, minor, patch, pad`` and the worker's capabilities. A second HELLO ends the
connection, so round trips are timed with DEVICE_COUNT (empty request, 4-byte reply), the cheapest
command there is. Builds before the capabilities block took an empty HELLO and answered 3 bytes;
a worker that hangs up on the current HELLO is asked once more that way.

A worker serves one client at a time: while a llama-server holds its connection, a check waits
and times out (and resets its connection, see ``_Connection.close``). Everything the worker sends
is distrusted: sizes are checked before reading, counts and amounts are bounded (a device's free
memory no more than its total), and every failure is one sentence. The timeout is one deadline
for the whole check of a worker, not one per request (a peer trickling its answers a byte at a
time would otherwise cost the timeout for every one of its seventy-odd requests), and
:func:`check_workers` asks all workers at once under one deadline for all."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import socket
import statistics
import struct
import threading
import time
from typing import Iterator, NamedTuple, Sequence

from app.core.common.errors import EngineError, os_reason
from app.core.engines.server.rpc_worker import Endpoint, RpcWorker, find_worker

CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14  # upstream: "RPC_CMD_HELLO must be always 14"
CMD_DEVICE_COUNT = 15
CONN_CAPS_SIZE = 24
MAX_REPLY = 4 << 20  # no reply to the commands we send is longer than a few dozen bytes
MAX_DEVICES = 64
MAX_MEMORY = 1 << 50  # 1 PiB: a device reporting more is not telling the truth
MAX_SHOWN = 1024  # bytes of a stranger's reply quoted in an error
GRACE_S = 0.5  # past the deadline, a check still running (a host name being looked up) is given up


class Device(NamedTuple):
    """One device of a worker as it reports it. The protocol carries no device names (the worker
    prints them only on its own console), so a device is named by its index."""

    name: str
    free: int
    total: int


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    endpoint: Endpoint
    reachable: bool
    rtt_ms: float | None = None  # median round trip (DEVICE_COUNT) on one connection
    version: tuple[int, int, int] | None = None  # the RPC protocol its build speaks
    devices: tuple[Device, ...] = ()
    error: str | None = None  # what went wrong, in words; may be set on a reachable worker too
    # it answered HELLO but not as a worker does afterwards (a refused answer, or none in time):
    # reachable, yet not usable (a note such as an older protocol leaves this False)
    refused: bool = False

    @property
    def free_bytes(self) -> int:
        return sum(d.free for d in self.devices)

    @property
    def usable(self) -> bool:
        """It answered every question as an RPC worker does."""
        return self.reachable and not self.refused


class _Refused(Exception):
    """The peer is not (or not behaving as) an RPC worker; the message is the reason in words."""


class _ConnectTimeout(Exception):
    """Nothing answered the TCP connection within the timeout."""


def _quote(data: bytes) -> str:
    """A stranger's bytes, shown safely: printable ASCII only, bounded."""
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in data[:MAX_SHOWN])
    return repr(text[:60])


def _left(deadline: float) -> float:
    """Seconds to ``deadline``; socket.timeout when it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout
    return left


class _Connection:
    """One TCP connection to a worker; every request on it ends by ``deadline`` (time.monotonic),
    the whole check's."""

    def __init__(self, endpoint: Endpoint, deadline: float):
        self.endpoint, self.deadline = endpoint, deadline
        try:
            self.sock = socket.create_connection((endpoint.host.strip("[]"), endpoint.port),
                                                 timeout=_left(deadline))
        except socket.timeout:
            raise _ConnectTimeout from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending = False  # a request sent whose reply is not read yet

    def close(self) -> None:
        """Close; with a reset instead of a FIN when a request is still unanswered: a worker that
        accepts this connection later (it was busy) then finds it gone, instead of answering a
        HELLO nobody reads and dying of the SIGPIPE (upstream's worker does not ignore it)."""
        if self.pending:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def _read_exact(self, n: int, what: str) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self.sock.settimeout(_left(self.deadline))
            chunk = self.sock.recv(min(n - len(buf), 1 << 16))
            if not chunk:
                if buf:
                    raise _Refused(f"not an RPC worker (it hung up in the middle of its answer to {what}: "
                                   f"{_quote(bytes(buf))})")
                raise ConnectionResetError(f"it hung up without answering {what}")
            buf += chunk
        return bytes(buf)

    def call(self, cmd: int, payload: bytes, sizes: range, what: str) -> bytes:
        """Send one command, read its reply; the reply's size must be in ``sizes``."""
        self.sock.settimeout(_left(self.deadline))
        self.pending = True
        self.sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
        head = self._read_exact(8, what)
        (size,) = struct.unpack("<Q", head)
        if size > MAX_REPLY:
            raise _Refused(f"not an RPC worker (it announced a {size}-byte answer to {what}; "
                           f"first bytes {_quote(head)})")
        if size not in sizes:
            raise _Refused(f"not an RPC worker (a {size}-byte answer to {what}, expected "
                           f"{sizes.start if len(sizes) == 1 else f'{sizes.start} to {sizes.stop - 1}'}; "
                           f"first bytes {_quote(head)})")
        reply = self._read_exact(size, what)
        self.pending = False
        return reply


def _hello(endpoint: Endpoint, deadline: float) -> tuple[_Connection, tuple[int, int, int], bool]:
    """Connect and say HELLO; the connection, the worker's version, and whether it speaks the
    current framing (an older build answers only the empty HELLO of its time)."""
    for current in (True, False):
        conn = _Connection(endpoint, deadline)
        try:
            reply = conn.call(CMD_HELLO, bytes(CONN_CAPS_SIZE) if current else b"", range(3, 65), "HELLO")
            return conn, (reply[0], reply[1], reply[2]), current
        except ConnectionResetError:
            conn.close()
            if not current:
                raise _Refused("not an RPC worker (it hung up without answering HELLO)") from None
        except BaseException:
            conn.close()
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def _device_count(conn: _Connection) -> int:
    (count,) = struct.unpack("<I", conn.call(CMD_DEVICE_COUNT, b"", range(4, 5), "DEVICE_COUNT"))
    return int(count)


def _devices(conn: _Connection, count: int) -> tuple[Device, ...]:
    if count > MAX_DEVICES:
        raise _Refused(f"not an RPC worker (it claims {count} devices; at most {MAX_DEVICES} are believed)")
    out = []
    for i in range(count):
        reply = conn.call(CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), range(16, 17), "GET_DEVICE_MEMORY")
        free, total = struct.unpack("<QQ", reply)
        if total > MAX_MEMORY or free > MAX_MEMORY:
            raise _Refused(f"not an RPC worker (device {i} claims {max(free, total)} bytes of memory)")
        if free > total:
            raise _Refused(f"not an RPC worker (device {i} claims {free} bytes free of {total} in all)")
        out.append(Device(f"device {i}", int(free), int(total)))
    return tuple(out)


def _round_trips(conn: _Connection, rounds: int) -> float:
    """The median of ``rounds`` timed round trips, after one untimed (the warm-up)."""
    _device_count(conn)
    times = []
    for _ in range(max(1, rounds)):
        t0 = time.perf_counter()
        _device_count(conn)
        times.append((time.perf_counter() - t0) * 1000.0)
    return float(statistics.median(times))


def _reason(e: BaseException, endpoint: Endpoint, timeout: float, step: str) -> str:
    if isinstance(e, _Refused):
        return str(e)
    if isinstance(e, _ConnectTimeout):
        return f"timed out after {timeout:g} s connecting to {endpoint}"
    if isinstance(e, socket.timeout):
        return (f"timed out after {timeout:g} s waiting for {step} (a worker serves one client at a time: "
                "is a llama-server using it?)")
    if isinstance(e, ConnectionRefusedError):
        return f"refused: nothing listens at {endpoint}"
    if isinstance(e, socket.gaierror):
        return f"unknown host {endpoint.host!r}"
    if isinstance(e, ConnectionResetError):
        return f"not an RPC worker ({e.args[0] if e.args and isinstance(e.args[0], str) else 'it hung up'})"
    if isinstance(e, OSError):
        return f"cannot reach {endpoint} ({os_reason(e)})"
    return f"not an RPC worker ({type(e).__name__})"


def worker_info(endpoint: Endpoint, timeout: float = 3.0, rounds: int = 5,
                deadline: float | None = None) -> WorkerInfo:
    """Ask one worker everything ``rpc check`` shows, all of it within ``timeout`` seconds (or by
    ``deadline``, time.monotonic, when given); never raises for what the network or the peer
    does (the answer's ``error`` says it in words)."""
    step = "its answer to HELLO"
    if deadline is None:
        deadline = time.monotonic() + timeout
    try:
        conn, version, current = _hello(endpoint, deadline)
    except (OSError, _Refused, _ConnectTimeout, ValueError, struct.error) as e:
        return WorkerInfo(endpoint, False, error=_reason(e, endpoint, timeout, step))
    try:
        if not current:
            return WorkerInfo(endpoint, True, version=version,
                              error=f"an older llama.cpp (RPC protocol {'.'.join(map(str, version))}): "
                                    "its devices and round-trip time are not asked")
        step = "its round trips"
        rtt = _round_trips(conn, rounds)
        step = "its devices"
        devices = _devices(conn, _device_count(conn))
        return WorkerInfo(endpoint, True, rtt, version, devices)
    except (OSError, _Refused, ValueError, struct.error) as e:
        return WorkerInfo(endpoint, True, version=version, error=_reason(e, endpoint, timeout, step), refused=True)
    finally:
        conn.close()


def iter_workers(endpoints: Sequence[Endpoint], timeout: float = 3.0, rounds: int = 5) -> Iterator[WorkerInfo]:
    """Ask every worker at once (a thread each), with one deadline for all: ``timeout`` seconds
    from now. Yields each answer as it comes, then, at the deadline (and a moment's grace for a
    host name still being looked up, which no socket timeout bounds), a "no answer" for every
    worker still being asked; so it ends within ``timeout`` + GRACE_S whatever the peers do."""
    deadline = time.monotonic() + timeout
    answers: queue.Queue[WorkerInfo] = queue.Queue()

    def ask(e: Endpoint) -> None:
        answers.put(worker_info(e, timeout, rounds, deadline=deadline))

    for e in endpoints:  # daemon threads: one stuck in a name lookup never holds the process
        threading.Thread(target=ask, args=(e,), name=f"rpc-check {e}", daemon=True).start()
    waiting = list(endpoints)
    while waiting:
        try:
            info = answers.get(timeout=max(0.0, deadline + GRACE_S - time.monotonic()))
        except queue.Empty:
            break
        if info.endpoint in waiting:
            waiting.remove(info.endpoint)
            yield info
    for e in waiting:
        yield WorkerInfo(e, False, error=f"no answer within {timeout:g} s")


def check_workers(endpoints: Sequence[Endpoint], timeout: float = 3.0, rounds: int = 5) -> list[WorkerInfo]:
    """iter_workers' answers in the order of ``endpoints``."""
    got = {i.endpoint: i for i in iter_workers(endpoints, timeout, rounds)}
    return [got[e] for e in endpoints]


def rtt_ms(endpoint: Endpoint, rounds: int = 5, timeout: float = 3.0) -> float | None:
    """The median round-trip time to a worker in ms, None when it cannot be measured (unreachable,
    or busy: measure before llama-server connects to it or after it has stopped)."""
    return worker_info(endpoint, timeout, rounds).rtt_ms


_LOCAL: dict[tuple[str, float], tuple[int, int, int] | None] = {}
_LOCAL_LOCK = threading.Lock()


def local_version(server_bin: str | os.PathLike[str]) -> tuple[int, int, int] | None:
    """The RPC protocol version of this machine's llama.cpp (the worker beside ``server_bin``,
    started for a moment on loopback and asked); None when it has no worker or the worker would
    not answer. Cached per worker binary and modification time."""
    worker = find_worker(server_bin)
    if worker is None:
        return None
    key = (worker, os.stat(worker).st_mtime)
    with _LOCAL_LOCK:
        if key not in _LOCAL:
            try:
                with RpcWorker(worker, threads=1) as w:
                    _LOCAL[key] = worker_info(w.endpoint, timeout=10.0, rounds=1).version
            except EngineError:
                _LOCAL[key] = None
        return _LOCAL[key]


def version_text(version: tuple[int, int, int] | None) -> str:
    return ".".join(str(v) for v in version) if version else "unknown"


def compatible(local: tuple[int, int, int], remote: tuple[int, int, int]) -> bool:
    """What llama-server requires of a worker when it connects: the same major version and a
    minor version no newer than its own."""
    return remote[0] == local[0] and remote[1] <= local[1]


def build_match(local: tuple[int, int, int] | None, remote: tuple[int, int, int] | None) -> tuple[bool | None, str]:
    """Whether a worker's build fits this machine's, and the sentence saying so (None: unknown)."""
    if local is None or remote is None:
        side = "this machine's llama.cpp (no RPC worker to ask)" if local is None else "the worker"
        return None, f"build match unknown: the RPC protocol of {side} is not known"
    if remote == local:
        return True, f"same RPC protocol as this machine ({version_text(local)})"
    if compatible(local, remote):
        return True, f"compatible: worker {version_text(remote)}, this machine {version_text(local)}"
    return False, (f"does not match: worker speaks RPC {version_text(remote)}, this machine's llama-server "
                   f"{version_text(local)}, which will refuse it; install the same llama.cpp release on both")


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def devices_text(devices: tuple[Device, ...]) -> str:
    """``device 0: 11.2 GiB free of 15.6 GiB; device 1: ...`` (what the worker reports)."""
    return "; ".join(f"{d.name}: {gib(d.free)} free of {gib(d.total)}" for d in devices) or "no devices reported"


def to_dict(info: WorkerInfo, local: tuple[int, int, int] | None) -> dict[str, object]:
    """One worker as ``rpc check --json`` gives it."""
    match, words = build_match(local, info.version)
    return {"endpoint": str(info.endpoint), "reachable": info.reachable, "usable": info.usable, "rtt_ms": info.rtt_ms,
            "rpc_version": version_text(info.version) if info.version else None,
            "devices": [{"name": d.name, "free_bytes": d.free, "total_bytes": d.total} for d in info.devices],
            "build_matches": match, "build": words, "error": info.error}
