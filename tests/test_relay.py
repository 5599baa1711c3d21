"""The latency relay: bytes arrive unchanged and in order, each way later by the delay in force."""

from __future__ import annotations

import socket
import statistics
import threading
import time

import pytest

from app.core.engines.server.relay import LatencyRelay
from app.core.engines.server.rpc_worker import LOOPBACK, Endpoint


@pytest.fixture
def echo_server():
    listener = socket.socket()
    listener.bind((LOOPBACK, 0))
    listener.listen(4)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(65536), b"")],
                             daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield Endpoint(LOOPBACK, listener.getsockname()[1])
    listener.close()


def _round_trips(sock: socket.socket, n: int) -> list[float]:
    times = []
    for i in range(n):
        msg = f"ping {i}".encode()
        t = time.perf_counter()
        sock.sendall(msg)
        got = b""
        while len(got) < len(msg):
            got += sock.recv(64)
        times.append((time.perf_counter() - t) * 1000)
        assert got == msg
    return times


def test_bytes_pass_unchanged_in_order_and_each_round_trip_pays_the_delay_twice(echo_server):
    with LatencyRelay(echo_server, delay_ms=0) as relay:
        with socket.create_connection((LOOPBACK, relay.endpoint.port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            blob = bytes(range(256)) * 4096  # 1 MiB: many chunks, order kept
            threading.Thread(target=s.sendall, args=(blob,), daemon=True).start()
            got = b""
            while len(got) < len(blob):
                got += s.recv(65536)
            assert got == blob
            direct = statistics.median(_round_trips(s, 10))
            relay.delay_ms = 5  # changed on an open connection
            slowed = statistics.median(_round_trips(s, 10))
    # two crossings of 5 ms each; the machine may add to it, never take from it
    assert slowed - direct >= 9.5
    assert slowed < direct + 200  # not a second: the delay, not a stall


def test_a_delay_out_of_range_is_refused(echo_server):
    with pytest.raises(ValueError):
        LatencyRelay(echo_server, delay_ms=-1)
    relay = LatencyRelay(echo_server)
    with pytest.raises(ValueError):
        relay.delay_ms = 5000
    relay.close()
