"""mtp-tuner rpc-worker, rpc check and rpc build on real processes: a worker that lives exactly as
long as its command (Ctrl-C, SIGTERM, SIGKILL), two loopback workers (one behind a latency relay)
and a dead port, and a llama.cpp built with RPC or not."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.helpers import ROOT, cli
from app.core.engines.server.relay import LatencyRelay
from app.core.engines.server.rpc_check import worker_info
from app.core.engines.server.rpc_worker import Endpoint, RpcWorker, free_port


def start_worker_command(server_bin, *extra):
    """``python -m app rpc-worker ...`` as a child process; (process, endpoint, the lines it said,
    the queue of its later lines) once it has said where it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "app", "rpc-worker", "--threads", "1", "--server-bin", server_bin,
                             *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()  # read in a thread: a buffered pipe and select() do not mix
    threading.Thread(target=lambda: [lines.put(line) for line in iter(proc.stdout.readline, "")],
                     daemon=True).start()
    said = []
    with contextlib.suppress(queue.Empty):
        while True:
            said.append(lines.get(timeout=60))
            if said[-1].startswith("on the main machine: --rpc "):
                host, _, port = said[-1].split()[5].rpartition(":")
                return proc, Endpoint(host, int(port)), said, lines
    proc.kill()
    pytest.fail(f"rpc-worker did not say where it listens: {said} {proc.stderr.read()}")


def _rest(lines: queue.Queue[str]) -> list[str]:
    out = []
    with contextlib.suppress(queue.Empty):
        while True:
            out.append(lines.get(timeout=2))
    return out


def worker_pids(proc) -> list[int]:
    return [c.pid for c in psutil.Process(proc.pid).children(recursive=True) if "rpc-server" in c.name()]


def gone(pids, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_rpc_worker_listens_on_a_free_loopback_port_and_stops_with_its_command(server_bin, rpc_worker_bin, sig):
    proc, endpoint, said, later = start_worker_command(server_bin, "--port", "0")
    try:
        assert endpoint.host == "127.0.0.1" and endpoint.port > 0
        assert said[0].startswith(f"RPC worker listening on 127.0.0.1:{endpoint.port} (")
        assert "RPC protocol" in said[0] and "GiB free" in said[0]
        pids = worker_pids(proc)
        assert len(pids) == 1
        assert worker_info(endpoint).reachable
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 130
        assert gone(pids) and not worker_info(endpoint, timeout=1).reachable
        assert "RPC worker stopped\n" in _rest(later)
    finally:
        proc.kill()
        proc.wait()


def test_rpc_worker_dies_with_its_command_when_the_command_is_killed(server_bin, rpc_worker_bin):
    port = free_port()
    proc, endpoint, _, _ = start_worker_command(server_bin, "--port", str(port))
    try:
        assert endpoint.port == port
        pids = worker_pids(proc)
        assert pids
        proc.kill()  # SIGKILL: nothing of ours runs; the worker must still go (PR_SET_PDEATHSIG)
        proc.wait(timeout=10)
        assert gone(pids), "the worker outlived a killed rpc-worker command"
    finally:
        proc.kill()
        proc.wait()


def test_rpc_worker_on_another_address_says_the_upstream_warning_first(server_bin, rpc_worker_bin):
    # a TEST-NET address nobody has: the warning must come before the worker even tries to bind
    r = cli("rpc-worker", "--host", "192.0.2.1", "--port", str(free_port()), "--server-bin", server_bin,
            timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("WARNING: llama.cpp's RPC worker is unauthenticated: anyone who can reach "
                               "192.0.2.1 port")
    assert "exited at start" in r.stderr or "did not listen" in r.stderr


def test_rpc_worker_without_a_worker_binary_says_how_to_rebuild(tmp_path, server_bin):
    fake = _script(tmp_path / "llama-server", f'exec "{server_bin}" "$@"\n')
    r = cli("rpc-worker", "--server-bin", str(fake), timeout=60)
    assert r.returncode == 2 and "-DGGML_RPC=ON" in r.stderr and "Traceback" not in r.stderr


def test_rpc_check_two_workers_one_behind_a_relay_and_a_dead_port(server_bin, rpc_worker_bin):
    dead = Endpoint("127.0.0.1", free_port())
    with RpcWorker(rpc_worker_bin, threads=1) as a, RpcWorker(rpc_worker_bin, threads=1) as b, \
            LatencyRelay(b.endpoint, delay_ms=2) as relay:
        r = cli("rpc", "check", f"{a.endpoint},{relay.endpoint},{dead}", "--json", "--server-bin", server_bin,
                timeout=120)
        assert r.returncode == 1, r.stderr
        out = json.loads(r.stdout)
        direct, slow, missing = out["workers"]
        assert out["this_machine_rpc_version"] and direct["rpc_version"] == out["this_machine_rpc_version"]
        for w in (direct, slow):
            assert w["reachable"] and w["build_matches"] is True and w["error"] is None
            assert w["devices"] and w["devices"][0]["total_bytes"] >= w["devices"][0]["free_bytes"] > 0
        assert slow["rtt_ms"] >= direct["rtt_ms"] + 4.0, (direct["rtt_ms"], slow["rtt_ms"])
        assert not missing["reachable"] and missing["error"].startswith("refused")

        r = cli("rpc", "check", f"{a.endpoint},{relay.endpoint}", "--server-bin", server_bin, timeout=120)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith(f"{a.endpoint}  reachable, round trip ") and "same RPC protocol" in lines[0]
        assert "GiB free of" in lines[1] and lines[2].startswith(f"{relay.endpoint}  reachable")


def test_rpc_check_refuses_a_malformed_list(server_bin):
    r = cli("rpc", "check", "host-without-port", timeout=60)
    assert r.returncode == 2 and "HOST:PORT" in r.stderr


def test_rpc_build_ready(server_bin, rpc_worker_bin):
    r = cli("rpc", "build", "--server-bin", server_bin, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"RPC: ready (llama-server {server_bin} has --rpc; worker: {rpc_worker_bin})"


def _script(path, text):
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return path


def test_rpc_build_without_rpc_says_how_to_rebuild(tmp_path, server_bin, rpc_worker_bin):
    # a server whose --help lists --rpc (every build does) but that refuses it, as a build without
    # RPC does; its worker beside it is real
    server = _script(tmp_path / "llama-server", f'if [ "$1" = --rpc ]; then echo \'error while handling argument '
                     f'"--rpc": RPC not supported in this build\' >&2; exit 1; fi\nexec "{server_bin}" "$@"\n')
    _script(tmp_path / "ggml-rpc-server", f'exec "{rpc_worker_bin}" "$@"\n')
    r = cli("rpc", "build", "--server-bin", str(server), timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith(f"RPC: not ready: {server} does not take --rpc (error while handling argument "
                               '"--rpc": RPC not supported in this build): it was built without RPC; rebuild')
    os.remove(tmp_path / "ggml-rpc-server")
    r = cli("rpc", "build", "--server-bin", str(server), timeout=120)
    assert r.returncode == 1 and "has no RPC worker" in r.stdout and "-DGGML_RPC=ON" in r.stdout


def test_rpc_build_of_a_server_without_the_option_says_how_to_rebuild(tmp_path, server_bin, rpc_worker_bin):
    server = _script(tmp_path / "llama-server", f'if [ "$1" = --help ]; then "{server_bin}" --help | grep -v -- '
                     f'"--rpc"; exit 0; fi\nexec "{server_bin}" "$@"\n')
    _script(tmp_path / "ggml-rpc-server", f'exec "{rpc_worker_bin}" "$@"\n')
    r = cli("rpc", "build", "--server-bin", str(server), timeout=120)
    assert r.returncode == 1 and r.stdout.startswith(f"RPC: not ready: {server} has no --rpc option")
    assert "-DGGML_RPC=ON" in r.stdout
