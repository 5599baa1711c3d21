"""Sweeps over real llama.cpp RPC workers (ggml-rpc-server on 127.0.0.1, one behind a latency
relay adding 1 ms each way): acceptance exactly the calibrated oracle's at K = 1, 2, 3, the
records naming the workers and their round trips at the start and the end; and the workers the
app starts itself (bench --rpc-local) gone after a sweep that finished, was cancelled, or whose
process was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from app.core.common.workers import Workers
from app.core.calibrated import design as calibrated
from app.core.common.cancel import CancelToken
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.server.relay import LatencyRelay
from app.core.engines.server.rpc_worker import RpcWorker
from app.core.measure.plan import Plan, make_arms
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records, load_rpc_records
from app.core.session.events import RunFinished, SessionFinished, SweepWarning
from app.core.session.request import SweepRequest
from app.core.session.sweep import prepare, run as session_run
from conftest import ROOT

pytestmark = pytest.mark.server

N_PREDICT = 48
PROMPTS = (Prompt("hello", "code", "hello world"), Prompt("cats", "story", "Write a story about 101 cats."))
DELAY_MS = 1.0


def _request(server_bin, model, out=None, ks=(1, 2, 3), **kw) -> SweepRequest:
    plan = Plan(model=str(model), arms=make_arms(list(ks)), prompts=PROMPTS, engine=EngineKind.SERVER,
                n_predict=N_PREDICT, reps=1, warmup=0)
    settings = EngineSettings(kind=EngineKind.SERVER, server_bin=server_bin, ctx_size=1024, rpc=kw.pop("rpc", None))
    return prepare(SweepRequest(plan, settings, out=out, keep_results=out is not None, **kw)).request


def _workers_of(pid: int) -> list[psutil.Process]:
    """The RPC workers among the children of process ``pid`` (not zombies)."""
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "rpc-server" in p.name() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _gone(procs: list[psutil.Process], timeout: float = 15.0) -> bool:
    """Every one of ``procs`` has exited (a zombie counts as gone: it runs no more)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


def test_acceptance_over_rpc_is_exactly_the_calibrated_oracles(server_bin, rpc_worker_bin, make_model, tmp_path):
    """Two workers, the second reached through the relay: every speculative run drafts and accepts
    exactly what the calibrated oracle replays, its output is the baseline's, and every record
    names both workers with their round trips (the relayed one at least 2 x 1 ms)."""
    path = make_model(0.3)
    tables = calibrated.load_tables(path)
    out = tmp_path / "rpc.jsonl"
    with RpcWorker(rpc_worker_bin) as near, RpcWorker(rpc_worker_bin) as far, \
            LatencyRelay(far.endpoint, delay_ms=DELAY_MS) as relay:
        rpc = Workers((near.endpoint, relay.endpoint))
        events = list(session_run(_request(server_bin, path, out, rpc=rpc)))
    done = events[-1]
    assert isinstance(done, SessionFinished) and done.n_failed == 0 and not done.errors, done
    warnings = [e.message for e in events if isinstance(e, SweepWarning)]
    assert any("one llama-server runs at a time" in w for w in warnings), warnings  # the pool of one, and why
    assert not any("fit in memory" in w for w in warnings)
    runs = load_records(out)
    assert len(runs) == len(PROMPTS) * 4 and all(r.status == "ok" for r in runs)
    base = {r.prompt_id: r for r in runs if r.k is None}
    for r in runs:
        assert r.rpc is not None and r.rpc["workers"] == list(rpc)
        near_ms, far_ms = r.rpc["rtt_start_ms"]
        assert near_ms is not None and far_ms is not None and far_ms >= 2 * DELAY_MS > near_ms
        if r.k is None:
            continue
        sim = calibrated.simulate(tables, r.prompt_tokens, r.k, N_PREDICT)
        assert (r.draft_n, r.draft_accepted) == (sim.draft_n, sim.draft_accepted), (r.k, r.prompt_id)
        assert r.acceptance == sim.acceptance and (r.accepted_per_pos, r.draft_steps) == (sim.accepted_per_pos,
                                                                                          sim.steps)
        assert r.output_tokens == base[r.prompt_id].output_tokens  # greedy: speculation changes no token
    assert {r.k for r in runs} == {None, 1, 2, 3}
    (line,) = load_rpc_records(out)
    assert line.sweep_id == runs[0].sweep_id and line.workers == rpc
    assert line.rtt_start_ms == tuple(runs[0].rpc["rtt_start_ms"])
    assert line.rtt_end_ms[1] is not None and line.rtt_end_ms[1] >= 2 * DELAY_MS


def test_our_own_workers_split_the_sweep_and_are_gone_when_it_finishes(server_bin, rpc_worker_bin, make_model):
    seen: list[psutil.Process] = []
    records = []
    for ev in session_run(_request(server_bin, make_model(0.3), ks=(2,), rpc_local=2)):
        if isinstance(ev, RunFinished):
            records.append(ev.record)
            seen = seen or _workers_of(os.getpid())
    assert len(seen) == 2 and len(records) == 2 * len(PROMPTS)
    assert all(w.startswith("127.0.0.1:") for w in records[0].rpc["workers"]) and len(records[0].rpc["workers"]) == 2
    assert _gone(seen) and not _workers_of(os.getpid())


@pytest.mark.parametrize("how", ["cancel", "close"])
def test_our_own_workers_are_gone_when_the_sweep_is_cancelled(server_bin, rpc_worker_bin, make_model, how):
    """Cancelled through its token (the window's Cancel), or its events closed (Ctrl+C in bench)."""
    cancel = CancelToken()
    events = session_run(_request(server_bin, make_model(0.3), rpc_local=2), cancel)
    seen: list[psutil.Process] = []
    for ev in events:
        if isinstance(ev, RunFinished):
            seen = _workers_of(os.getpid())
            if how == "close":
                events.close()
                break
            cancel.cancel()
    else:
        assert isinstance(ev, SessionFinished) and ev.cancelled
    assert len(seen) == 2 and _gone(seen) and not _workers_of(os.getpid())


def test_no_worker_outlives_a_killed_bench(server_bin, rpc_worker_bin, make_model, tmp_path):
    """`bench --rpc-local 2` killed with SIGKILL mid-sweep: its workers die with it (and its
    llama-server too)."""
    proc = subprocess.Popen([sys.executable, "-m", "app", "bench", "--model", str(make_model(0.3)), "--engine",
                             "server", "--server-bin", server_bin, "--rpc-local", "2", "--k", "1,2,3", "--reps", "5",
                             "--n-predict", "128", "--out", str(tmp_path / "killed.jsonl")],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        workers: list[psutil.Process] = []
        children: list[psutil.Process] = []
        while time.monotonic() < deadline and proc.poll() is None:
            workers = _workers_of(proc.pid)
            children = psutil.Process(proc.pid).children(recursive=True)
            if len(workers) == 2 and any("llama-server" in c.name() for c in children):
                break  # mid-sweep: its workers up, its server started on them
            time.sleep(0.2)
        assert proc.poll() is None and len(workers) == 2, proc.stderr.read().decode() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _gone(children), [c.pid for c in children if c.is_running()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
