"""Hardening round four (issue 53, defects 3 and 16) and the one confirm request (issue 54):
``recommend --confirm`` and the Export tab's Confirm make one core request (strict modes) that
never dials an RPC worker the results file names unless the user names it again; a worker that
cannot be reached at a sweep's start is refused in one line naming it, before any llama-server."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading

import pytest

from app.core.records.rpc import rpc_field
from app.core.records.writer import ResultsWriter
from helpers import clear_sweep_file, cli

SPLIT = "this sweep was split over RPC workers; name them again to confirm it there"


@contextlib.contextmanager
def listener():
    """A TCP port on loopback that counts the connections made to it (and closes each at once): a
    worker address a results file names."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.2)
    seen: list[object] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, addr = sock.accept()
            except OSError:
                continue
            seen.append(addr)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}", seen
    finally:
        stop.set()
        t.join(5)
        sock.close()


def _split_sweep(tmp_path, model, worker):
    """A clear sweep (code faster at K=2) of ``model`` on built-in-free prompts (a prompt file),
    its records saying it was split over ``worker``."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"id": "code", "task": "code", "text": "def add(a, b):"},
                                   {"id": "story", "task": "story", "text": "Once upon a time"}]))
    runs = [dataclasses.replace(r, model_path=str(model), n_predict=8, rpc=rpc_field((worker,), (0.3,)))
            for r in clear_sweep_file(tmp_path / "plain.jsonl")]
    path = tmp_path / "split.jsonl"
    with ResultsWriter(path) as w:
        for r in runs:
            w.append(r)
    return runs, path, prompts


def test_recommend_confirm_never_dials_the_workers_a_results_file_names(tmp_path, make_model):
    """Today's confirm took the file's workers when --rpc was not given: this machine's
    llama-server connected to them (a real worker would receive the model's tensors)."""
    with listener() as (worker, seen):
        _runs, path, prompts = _split_sweep(tmp_path, make_model(0.3), worker)
        try:
            p = cli("recommend", str(path), "--for", "code", "--confirm", "--prompts", str(prompts), timeout=120)
        except Exception as e:  # noqa: BLE001 - a hang is a failure too, after the connection count
            pytest.fail(f"recommend --confirm did not end ({type(e).__name__}); connections: {len(seen)}")
        assert seen == [], f"the recorded worker {worker} was dialled {len(seen)} times"
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert f"mtp-tuner: error: {SPLIT}" in p.stderr and "Traceback" not in p.stderr


def test_both_confirms_are_one_core_request_strict_and_never_dial_a_recorded_worker(state, tmp_path, make_model,
                                                                                    monkeypatch):
    """The Export tab's Confirm and recommend --confirm: the same refusal for a split sweep whose
    workers are not named again (no connection made), and strict modes on the request they run."""
    import app.core.session.sweep as S
    from app.core.common.errors import UserError
    from app.core.engines.base import EngineSettings
    from app.core.records.reader import load_records
    from app.core.session.confirm import confirm_request
    from app.core.session.events import RunFinished
    from app.core.verdict import build_verdict
    from app.gui.tabs.export import ExportTab
    from conftest import make_tab

    export = make_tab(ExportTab, state)
    with listener() as (worker, seen):
        runs, path, prompts = _split_sweep(tmp_path, make_model(0.3), worker)
        verdict = build_verdict(load_records(path))
        with pytest.raises(UserError, match=SPLIT):
            confirm_request(verdict, EngineSettings(), str(prompts), "code")
        state.set_results(load_records(path), path)
        monkeypatch.setattr(state, "user_prompt_file", lambda: str(prompts))
        export.select("code")
        assert export.current_export is not None
        export.confirm_with_server()
        assert export.confirm_job is None and any(SPLIT in e for e in state.errors), state.errors
        assert seen == []
    # a sweep on this machine: both make the strict request (the run itself replaced by a recorded
    # llama-server record, as test_gui_export does)
    local = [dataclasses.replace(r, rpc=None) for r in runs]
    here = tmp_path / "here.jsonl"
    with ResultsWriter(here) as w:
        for r in local:
            w.append(r)
    c, request = confirm_request(build_verdict(load_records(here)), EngineSettings(), str(prompts), "code")
    assert request.strict_modes and request.engine.rpc is None and not request.keep_results
    fast = next(r for r in local if r.task == "code" and r.k == 2)
    monkeypatch.setattr(S, "run", lambda req, cancel: iter([RunFinished(dataclasses.replace(fast, engine="server"))]))
    state.set_results(load_records(here), here)
    export.select("code")
    export.confirm_with_server()
    assert export.confirm_job is None or export.confirm_job.wait(10000)
    assert export.confirm_run is not None and export.confirm_run.strict_modes
    assert export.confirm_run.plan == request.plan


def test_a_worker_that_cannot_be_reached_at_the_sweeps_start_is_refused_naming_it(tmp_path, make_model, server_bin):
    """Today the sweep started llama-server with --rpc to a worker nothing listens at: a hang, or
    llama.cpp's abort text as each run's reason. Now one line names the worker before any
    llama-server starts (no server log is written)."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # bound once, nothing listens now
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        p = cli("bench", "--model", str(make_model(0.3)), "--rpc", f"127.0.0.1:{port}", "--k", "2", "--reps", "1",
                "--n-predict", "8", "--tasks", "code", "--per-task", "1", "--server-bin", server_bin,
                "--log-dir", str(logs), "--out", str(tmp_path / "r.jsonl"), timeout=150)
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"the sweep over an unreachable worker did not end ({type(e).__name__})")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert (f"mtp-tuner: error: RPC worker 127.0.0.1:{port} cannot be reached at the sweep's start: refused: "
            f"nothing listens at 127.0.0.1:{port}") in p.stderr, p.stderr[-2000:]
    assert list(logs.iterdir()) == [] and not (tmp_path / "r.jsonl").exists()
