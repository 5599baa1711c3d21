"""RPC workers: endpoints typed and bounded, a worker of ours bound to loopback unless asked, and
never left behind (real ggml-rpc-server processes on 127.0.0.1)."""

from __future__ import annotations

import socket
import struct
import time

import psutil
import pytest

from app.core.common.errors import EngineError, UserError
from app.core.common.workers import Workers
from app.core.engines.server.rpc_worker import Endpoint, RpcWorker, find_worker, is_loopback, worker_problem


def test_endpoints_are_parsed_bounded_and_each_named_once():
    """Workers: parsed once at the door, carried as such (a tuple of their texts, with their
    endpoints), written once into llama-server's --rpc (arg)."""
    w = Workers.parse("127.0.0.1:50052, 192.168.1.20:50053")
    assert w.endpoints == (Endpoint("127.0.0.1", 50052), Endpoint("192.168.1.20", 50053))
    assert w == ("127.0.0.1:50052", "192.168.1.20:50053") and w.arg == "127.0.0.1:50052,192.168.1.20:50053"
    assert Workers.parse("[::1]:5000,localhost:7").arg == "[::1]:5000,localhost:7"
    assert Workers.parse(["a:1"]).plus([Endpoint("b", 2)]) == ("a:1", "b:2")
    for bad in ("", "host", "host:0", "host:70000", "h;rm -rf:1", "a:1,a:1", ",".join(f"h:{i + 1}" for i in range(17))):
        with pytest.raises(UserError):
            Workers.parse(bad)
    with pytest.raises(UserError, match="named twice"):
        Workers.parse(["a:1"]).plus([Endpoint("a", 1)])


def test_loopback_is_this_machine_only():
    assert is_loopback("127.0.0.1") and is_loopback("127.5.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("example.org")


def test_a_worker_asked_for_another_address_without_the_explicit_flag_is_refused(tmp_path):
    with pytest.raises(UserError, match="unauthenticated"):
        RpcWorker(str(tmp_path / "ggml-rpc-server"), host="0.0.0.0")


def test_a_build_without_rpc_says_how_to_rebuild(tmp_path):
    server = tmp_path / "llama-server"
    server.write_text("")
    assert find_worker(server) is None
    problem = worker_problem(server)
    assert problem and "-DGGML_RPC=ON" in problem and "--no-cache-dir" in problem


def test_a_worker_listens_on_loopback_and_is_gone_after_stop(rpc_worker_bin):
    with RpcWorker(rpc_worker_bin, threads=1) as w:
        assert w.endpoint.loopback and w.running
        with socket.create_connection(("127.0.0.1", w.endpoint.port), timeout=5):
            pass
        pid = w.proc.pid
    assert not w.running
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_worker_that_cannot_bind_says_so(rpc_worker_bin):
    with RpcWorker(rpc_worker_bin, threads=1) as first:
        with pytest.raises(EngineError, match="already in use"):
            RpcWorker(rpc_worker_bin, port=first.endpoint.port, threads=1).start(timeout=10)


def test_a_worker_of_ours_survives_a_client_that_hangs_up_on_its_answer(rpc_worker_bin):
    """Upstream's worker writes without MSG_NOSIGNAL; ours inherits an ignored SIGPIPE."""
    with RpcWorker(rpc_worker_bin, threads=1) as w:
        with socket.create_connection(("127.0.0.1", w.endpoint.port)) as holder:
            holder.sendall(struct.pack("<BQ", 14, 24) + bytes(24))  # HELLO, then keep the worker busy
            holder.recv(64)
            with socket.create_connection(("127.0.0.1", w.endpoint.port)) as early:
                early.sendall(struct.pack("<BQ", 14, 24) + bytes(24))  # waits in the queue, then hangs up
                time.sleep(0.2)
        time.sleep(0.5)
        assert w.running, f"the worker died (exit {w.proc.returncode})"


def test_ctrl_c_while_a_worker_starts_leaves_no_worker(rpc_worker_bin, monkeypatch):
    import app.core.engines.server.rpc_worker as RW

    w = RpcWorker(rpc_worker_bin, threads=1)

    def interrupted(host, port):  # the port is free before the start; Ctrl-C comes while waiting
        if w.proc is None:
            return False
        raise KeyboardInterrupt
    monkeypatch.setattr(RW, "_listening", interrupted)
    with pytest.raises(KeyboardInterrupt):
        w.start()
    assert w.proc is not None and not w.running
