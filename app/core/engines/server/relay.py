"""A loopback TCP relay that adds a known delay each way: how the app measures what a slower link
would cost without netem (which needs root and a kernel that has it). llama-server connects to the
relay instead of an RPC worker; every chunk the relay reads is sent on ``delay_ms`` later, in
order, in each direction, so one round trip costs twice the delay more.

The delay can be changed while connections are open (``relay.delay_ms = 3``): llama-server keeps
its connection to a worker for its whole life, so one server start is measured at several delays.
A chunk takes the delay in force when it was read."""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time

from app.core.engines.server.rpc_worker import LOOPBACK, Endpoint

CHUNK = 1 << 16
MAX_DELAY_MS = 1000.0


class _Pipe:
    """One direction of one connection: a reader that stamps chunks with their due time, a writer
    that sends each when due."""

    def __init__(self, relay: "LatencyRelay", src: socket.socket, dst: socket.socket):
        self.relay, self.src, self.dst = relay, src, dst
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                data = self.src.recv(CHUNK)
                if not data:
                    break
                due = time.perf_counter() + self.relay.delay_ms / 1000.0
                with self.ready:
                    self.queue.append((due, data))
                    self.ready.notify()
        except OSError:
            pass
        with self.ready:
            self.closed = True
            self.ready.notify()

    def _write(self) -> None:
        try:
            while True:
                with self.ready:
                    while not self.queue and not self.closed:
                        self.ready.wait()
                    if not self.queue:
                        break
                    due, data = self.queue.popleft()
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                self.dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            self.dst.shutdown(socket.SHUT_WR)


class LatencyRelay:
    """``with LatencyRelay(worker_endpoint, delay_ms=2) as r: ... --rpc {r.endpoint} ...``: listens
    on 127.0.0.1 (a free port), forwards every connection to ``target`` with ``delay_ms`` added
    each way. Closing it closes every connection it holds."""

    def __init__(self, target: Endpoint, delay_ms: float = 0.0):
        self.target = target
        self.delay_ms = delay_ms
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(16)
        self.endpoint = Endpoint(LOOPBACK, int(self._listener.getsockname()[1]))
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._open = True

    @property
    def delay_ms(self) -> float:
        return self._delay_ms

    @delay_ms.setter
    def delay_ms(self, value: float) -> None:
        if not 0.0 <= float(value) <= MAX_DELAY_MS:
            raise ValueError(f"a relay delay of {value} ms: expected 0 to {MAX_DELAY_MS:g} ms")
        self._delay_ms = float(value)

    def start(self) -> "LatencyRelay":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while self._open:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((self.target.host, self.target.port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if not self._open:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            _Pipe(self, client, upstream).start()
            _Pipe(self, upstream, client).start()

    def close(self) -> None:
        with self._lock:
            self._open = False
            sockets, self._sockets = self._sockets, []
        with contextlib.suppress(OSError):
            self._listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> "LatencyRelay":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
