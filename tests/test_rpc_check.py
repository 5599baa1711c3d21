"""Asking an RPC worker what it is: real ggml-rpc-server workers on 127.0.0.1, and fake peers that
send garbage, huge sizes, too many devices, a byte at a time, or nothing."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time

import pytest

from app.core.engines.server.rpc_check import (CMD_DEVICE_COUNT, CMD_GET_DEVICE_MEMORY, CMD_HELLO, Device,
                                                build_match, local_version, rtt_ms, worker_info)
from app.core.engines.server.rpc_worker import Endpoint, RpcWorker, free_port


class FakePeer:
    """A loopback TCP server running ``handler(conn)`` for each connection, in its own thread."""

    def __init__(self, handler):
        self.handler = handler
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.endpoint = Endpoint("127.0.0.1", self.listener.getsockname()[1])
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()

    def _serve(self, conn):
        try:
            self.handler(conn, self.stop)
        except OSError:
            pass

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def __enter__(self):
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.listener.close()
        for c in self.conns:
            c.close()


def read_request(conn) -> tuple[int, bytes]:
    head = b""
    while len(head) < 9:
        chunk = conn.recv(9 - len(head))
        if not chunk:
            raise OSError("closed")
        head += chunk
    cmd, size = struct.unpack("<BQ", head)
    payload = b""
    while len(payload) < size:
        payload += conn.recv(size - len(payload))
    return cmd, payload


def reply(conn, payload: bytes) -> None:
    conn.sendall(struct.pack("<Q", len(payload)) + payload)


def worker_like(devices: int = 1, memory: tuple[int, int] = (1 << 30, 2 << 30)):
    """A peer that answers like a v7 worker, with ``devices`` devices of ``memory`` (free, total)."""
    def handler(conn, stop):
        while True:
            cmd, payload = read_request(conn)
            if cmd == CMD_HELLO:
                reply(conn, bytes([7, 0, 0, 0]) + bytes(24))
            elif cmd == CMD_DEVICE_COUNT:
                reply(conn, struct.pack("<I", devices))
            elif cmd == CMD_GET_DEVICE_MEMORY:
                reply(conn, struct.pack("<QQ", *memory))
    return handler


def check(handler, timeout: float = 1.0):
    with FakePeer(handler) as peer:
        t0 = time.monotonic()
        info = worker_info(peer.endpoint, timeout=timeout, rounds=3)
        return info, time.monotonic() - t0


def test_a_peer_that_answers_like_a_worker_is_read_as_one():
    info, _ = check(worker_like(devices=2))
    assert info.reachable and info.error is None and info.version == (7, 0, 0)
    assert info.devices == (Device("device 0", 1 << 30, 2 << 30), Device("device 1", 1 << 30, 2 << 30))
    assert info.rtt_ms is not None and 0 < info.rtt_ms < 1000 and info.free_bytes == 2 << 30


def test_garbage_is_not_a_worker():
    def http(conn, stop):
        conn.recv(100)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    info, _ = check(http)
    assert not info.reachable and info.error.startswith("not an RPC worker") and "HTTP/1.1" in info.error


def test_a_huge_announced_size_is_refused_before_reading():
    def huge(conn, stop):
        read_request(conn)
        conn.sendall(struct.pack("<Q", 1 << 40) + b"x" * 64)
        stop.wait(5)
    info, elapsed = check(huge)
    assert not info.reachable and "1099511627776-byte answer" in info.error and elapsed < 1.0


def test_a_peer_that_says_nothing_times_out_in_plain_words():
    def silent(conn, stop):
        read_request(conn)
        stop.wait(10)
    info, elapsed = check(silent, timeout=0.5)
    assert not info.reachable and info.error.startswith("timed out after 0.5 s") and "one client at a time" in info.error
    assert elapsed < 1.5


def test_a_peer_that_drips_one_byte_at_a_time_is_cut_off_at_the_deadline():
    def drip(conn, stop):
        read_request(conn)
        while not stop.is_set():
            conn.sendall(b"\0")
            time.sleep(0.1)
    info, elapsed = check(drip, timeout=0.5)
    assert not info.reachable and info.error.startswith("timed out") and elapsed < 1.5


def test_a_peer_that_hangs_up_is_not_a_worker():
    def hang_up(conn, stop):
        conn.close()
    info, _ = check(hang_up)
    assert not info.reachable and info.error == "not an RPC worker (it hung up without answering HELLO)"


def test_too_many_devices_or_impossible_memory_are_not_believed():
    info, _ = check(worker_like(devices=1000))
    assert info.reachable and info.devices == () and "claims 1000 devices" in info.error
    info, _ = check(worker_like(memory=(1 << 62, 1 << 62)))
    assert info.reachable and info.devices == () and "claims" in info.error and "memory" in info.error


def test_an_older_worker_that_takes_only_the_empty_hello_still_tells_its_version():
    def old(conn, stop):
        cmd, payload = read_request(conn)
        if cmd == CMD_HELLO and not payload:
            reply(conn, bytes([2, 0, 0]))
            stop.wait(5)
        conn.close()  # as such a build does: a HELLO of another size ends the connection
    info, _ = check(old)
    assert info.reachable and info.version == (2, 0, 0) and "older llama.cpp" in info.error
    assert build_match((7, 0, 0), info.version)[0] is False


def test_nothing_listening_is_refused():
    info = worker_info(Endpoint("127.0.0.1", free_port()), timeout=1.0)
    assert not info.reachable and info.error.startswith("refused") and info.rtt_ms is None


def test_build_match_in_words():
    assert build_match((7, 0, 0), (7, 0, 0)) == (True, "same RPC protocol as this machine (7.0.0)")
    assert build_match((7, 1, 0), (7, 0, 3))[0] is True
    ok, words = build_match((7, 0, 0), (7, 1, 0))
    assert ok is False and "will refuse it" in words
    assert build_match((7, 0, 0), (6, 0, 0))[0] is False
    assert build_match(None, (7, 0, 0))[0] is None and build_match((7, 0, 0), None)[0] is None


def test_a_real_worker_tells_its_version_devices_and_round_trip(rpc_worker_bin, server_bin):
    with RpcWorker(rpc_worker_bin, threads=1) as w:
        info = worker_info(w.endpoint)
        assert info.reachable and info.error is None, info.error
        assert info.version is not None and info.version[0] >= 1
        assert info.devices and all(d.total > 0 and 0 < d.free <= d.total for d in info.devices)
        assert info.rtt_ms is not None and 0 < info.rtt_ms < 100
        assert rtt_ms(w.endpoint, rounds=2) is not None
        assert local_version(server_bin) == info.version
        assert build_match(local_version(server_bin), info.version)[0] is True


def test_a_worker_busy_with_another_client_is_said_to_be_busy(rpc_worker_bin):
    with RpcWorker(rpc_worker_bin, threads=1) as w:
        with socket.create_connection(("127.0.0.1", w.endpoint.port)) as holder:
            holder.sendall(struct.pack("<BQ", CMD_HELLO, 24) + bytes(24))
            holder.recv(64)
            info = worker_info(w.endpoint, timeout=0.5)
        assert not info.reachable and "one client at a time" in info.error
        assert worker_info(w.endpoint).reachable  # free again once the other client has gone


def test_a_check_that_gives_up_on_a_busy_worker_does_not_kill_it_later(rpc_worker_bin):
    """Upstream's worker dies of SIGPIPE when a client hangs up on an answer it asked for; a worker
    started by someone else (SIGPIPE not ignored, as here) must survive our timed-out check."""
    from app.core.engines.server.binary import group_kwargs, kill_group

    port = free_port()
    proc = subprocess.Popen([rpc_worker_bin, "-p", str(port), "-t", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, **group_kwargs())
    try:
        endpoint = Endpoint("127.0.0.1", port)
        deadline = time.monotonic() + 30
        while not worker_info(endpoint).reachable:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port)) as holder:
            holder.sendall(struct.pack("<BQ", CMD_HELLO, 24) + bytes(24))
            holder.recv(64)
            assert not worker_info(endpoint, timeout=0.3).reachable
        time.sleep(0.5)
        assert proc.poll() is None, f"the worker died (exit {proc.returncode})"
        assert worker_info(endpoint).reachable
    finally:
        kill_group(proc)
        proc.wait()


def test_no_worker_beside_the_server_means_no_local_version(tmp_path):
    server = tmp_path / "llama-server"
    server.write_text("")
    assert local_version(server) is None


@pytest.mark.parametrize("host", ["no-such-host.invalid"])
def test_an_unknown_host_is_said_in_words(host):
    info = worker_info(Endpoint(host, 50052), timeout=1.0)
    assert not info.reachable and ("unknown host" in info.error or "cannot reach" in info.error)
