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

from app.core.records.arm import Arm
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


def test_the_export_tabs_confirm_refuses_a_split_sweep_as_recommend_does_and_dials_nothing(state, tmp_path,
                                                                                            make_model, monkeypatch):
    """The Export tab's Confirm of a sweep split over workers the Machine tab does not name: the
    sentence recommend --confirm says, and no connection to the workers the file names."""
    from app.core.records.reader import load_records
    from app.gui.tabs.export import ExportTab
    from conftest import make_tab

    export = make_tab(ExportTab, state)
    with listener() as (worker, seen):
        _runs, path, prompts = _split_sweep(tmp_path, make_model(0.3), worker)
        monkeypatch.setattr(state, "user_prompt_file", lambda: str(prompts))
        state.set_results(load_records(path), path)
        export.select("code")
        assert export.current_export is not None
        export.confirm_with_server()
        if export.confirm_job is not None:  # today: a run started
            export.confirm_job.wait(60000)
        assert [e for e in state.errors if e.startswith(SPLIT)], state.errors
        assert seen == []


def test_both_confirms_run_the_one_core_request_with_strict_modes(state, tmp_path, make_model, monkeypatch):
    """The Export tab's Confirm ran a request of its own without strict modes (a mode llama-server
    cannot run dropped instead of said); it runs the core's confirm request now, recommend
    --confirm's: strict, no results file, no workers but those named. The run itself is replaced by
    a recorded llama-server record, as test_gui_export does."""
    import app.core.session.sweep as S
    from app.core.engines.base import EngineSettings
    from app.core.records.reader import load_records
    from app.core.session.events import RunFinished
    from app.core.verdict import build_verdict
    from app.gui.tabs.export import ExportTab
    from conftest import make_tab

    runs, _path, prompts = _split_sweep(tmp_path, make_model(0.3), "127.0.0.1:18252")
    local = [dataclasses.replace(r, rpc=None) for r in runs]
    here = tmp_path / "here.jsonl"
    with ResultsWriter(here) as w:
        for r in local:
            w.append(r)
    from app.core.session.confirm import confirm_request  # the core's one confirm request

    _c, request = confirm_request(build_verdict(load_records(here)), EngineSettings(), str(prompts), "code")
    assert request.strict_modes and request.engine.rpc is None and not request.keep_results
    export = make_tab(ExportTab, state)
    fast = next(r for r in local if r.task == "code" and r.k == 2)
    pair = [r for r in local if r.task == "code" and r.measured_arm in (fast.measured_arm, Arm())]
    monkeypatch.setattr(S, "run", lambda req, cancel: iter([RunFinished(dataclasses.replace(r, engine="server"))
                                                            for r in pair]))
    monkeypatch.setattr(state, "user_prompt_file", lambda: str(prompts))
    state.set_results(load_records(here), here)
    export.select("code")
    export.confirm_with_server()
    assert export.confirm_job is None or export.confirm_job.wait(10000)
    ran = getattr(export, "confirm_run", None)
    assert ran is not None and ran.strict_modes and not ran.keep_results and ran.plan == request.plan


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


def test_the_confirm_runs_counts_from_the_file_are_bounded(tmp_path):
    """The confirm run takes its tokens and context depth from the file's runs: a depth of 10^12
    sized its context; refused in one line naming the field, before anything is planned."""
    from app.core.common.errors import UserError
    from app.core.session.confirm import confirm_plan
    from app.core.verdict import build_verdict

    runs, _path, prompts = _split_sweep(tmp_path, "/m.gguf", "127.0.0.1:18252")
    runs = [dataclasses.replace(r, depth=10**12, rpc=None) for r in runs]
    with pytest.raises(UserError, match=r"depth is 1000000000000, beyond what a sweep plans \(0 to 1048576\); it is "
                                        "not confirmed"):
        confirm_plan(build_verdict(runs), str(prompts), task="code")
