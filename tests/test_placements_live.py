"""Where drafting runs, on real processes: two ggml-rpc-server workers on 127.0.0.1 (the second
behind a latency relay, as a worker on another machine would be), the tiny
calibrated model with an MTP head, and each placement a setting of one sweep: its llama-server
started with the placement's flags (its log says where the MTP block went), each record carrying
them, and the verdict naming a placement with a command that carries its flags."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from app.core.common.workers import Workers
from app.core.analysis.settings import setting_label, split_by_setting
from app.core.engines.base import EngineSettings
from app.core.engines.server.relay import LatencyRelay
from app.core.engines.server.rpc_worker import RpcWorker, free_port
from app.core.measure.placements import placement_axis
from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.session.events import SessionFinished
from app.core.session.request import SweepRequest
from app.core.session.sweep import prepare, run
from app.core.verdict.joint import joint_verdict
from helpers import cli

pytestmark = pytest.mark.server

OT = r"blk\.4\.=CPU"  # the calibrated model: 5 blocks, the last its NextN (MTP) block


def test_each_placement_starts_and_runs_over_two_workers(tmp_path, make_model, server_bin, rpc_worker_bin):
    model = str(make_model(0.3))
    out, logs = tmp_path / "r.jsonl", tmp_path / "logs"
    with RpcWorker(rpc_worker_bin, threads=1) as w1, RpcWorker(rpc_worker_bin, threads=1) as w2, \
            LatencyRelay(w2.endpoint, delay_ms=1) as far:
        rpc = Workers((w1.endpoint, far.endpoint))
        axis, notes = placement_axis(("default", "mtp-local", "workers"), model=model, server_bin=server_bin,
                                     rpc=rpc, drafter=False)
        assert notes == [] and axis.values == ("default", "mtp-local", "workers")
        # llama.cpp names the workers' devices RPC0, RPC1 (llama-server --rpc ... --list-devices)
        assert axis.bundles == ((), ("-ot", OT), ("--device", "RPC0,RPC1", "-ot", OT))
        plan = Plan(model=model, arms=(Arm(), Arm(2)), prompts=(Prompt("c1", "code", "def f(x):"),),
                    n_predict=16, reps=2, warmup=0)
        settings = EngineSettings(ctx_size=512, threads=1, n_gpu_layers="99", server_bin=server_bin,
                                  log_dir=str(logs), rpc=rpc)
        prepared = prepare(SweepRequest(plan, settings, out=out, strict_modes=True,
                                        placements=("default", "mtp-local", "workers")))
        events = list(run(prepared.request))  # the session makes the same axis once the workers are up
        done = events[-1]
        assert isinstance(done, SessionFinished) and (done.n_ok, done.n_failed) == (12, 0), events
        # each placement's servers ran with its flags: llama.cpp says so in their logs
        assert sorted(p.name for p in logs.iterdir()) == [
            "placement-default", "placement-mtp-local", "placement-workers"]
        for folder, moved in (("placement-default", False), ("placement-mtp-local", True),
                              ("placement-workers", True)):
            for log in (logs / folder).iterdir():
                text = log.read_text(encoding="utf-8")
                # the MTP block is loaded for draft-mtp only (a plain server leaves it unused)
                assert ("tensor overrides to CPU" in text) is (moved and "draft-mtp" in log.name), (folder, log.name)
                assert re.search(r"using device RPC0 .*\n(.*\n)*.*using device RPC1 ", text), (folder, log.name)
        # the records carry each placement's flags, the reference first
        runs = load_records(out)
        assert [r.server_args for r in runs] == [()] * 4 + [("-ot", OT)] * 4 + [("--device", "RPC0,RPC1", "-ot", OT)] * 4
        jv = joint_verdict(runs, binary=server_bin)
        assert jv is not None and jv.placements
        assert [v.label for v in jv.values] == ["llama.cpp's own split", "MTP block on this machine",
                                                "all but the MTP block on the workers"]
        assert jv.sentence.startswith("over this link ")
        by_label = {setting_label(g, runs): g[0].server_args for g in split_by_setting(runs).values()}
        best = by_label[jv.best.label]
        # the command carries the workers, then the placement that won (its recorded flags)
        argv = jv.best.verdict.export.argv
        assert argv[:5 + len(best)] == (server_bin, "-m", model, "--rpc", ",".join(rpc), *best)
        # with each worker's own command, to start on its machine first
        assert [w.argv for w in jv.best.verdict.export.workers] == [
            ("ggml-rpc-server", "-H", e.host, "-p", str(e.port)) for e in (w1.endpoint, far.endpoint)]
        assert ("--spec-type" in argv) is (jv.best.verdict.pick.arm is not None)
        assert json.loads(json.dumps(jv.as_dict()))["placement"] in ("default", "mtp-local", "workers")
        # and the workers placement's command starts llama-server as written (--rpc before --device)
        workers = next(v for v in jv.values if v.label == "all but the MTP block on the workers")
        assert _starts([*workers.verdict.command("code").export.argv, "--port", str(free_port())])


def _starts(argv: list[str]) -> bool:
    """Whether llama-server started with ``argv`` says it listens within a minute (then stopped)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            if "listening on" in line:
                return True
            if time.monotonic() > deadline:
                break
        return False
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_bench_over_workers_of_its_own_names_where_drafting_runs(tmp_path, make_model, server_bin):
    """bench --rpc-local 2 --placements auto: the placements that apply (workers is mtp-local on a
    machine without a GPU: said), the verdict's line, the command with --rpc and the placement;
    recommend on the results file tells the same."""
    model = str(make_model(0.3))
    out = tmp_path / "r.jsonl"
    r = cli("bench", "--model", model, "--server-bin", server_bin, "--rpc-local", "2", "--placements", "auto",
            "--k", "2", "--reps", "2", "--warmup", "0", "--n-predict", "16", "--tasks", "code", "--per-task", "1",
            "--ngl", "99", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "placement drafter-local left out: the sweep has no drafter model" in r.stderr
    assert "placement workers left out: without a GPU here" in r.stderr
    assert "== llama.cpp's own split ==" in r.stdout and "== MTP block on this machine ==" in r.stdout
    where = next(line for line in r.stdout.splitlines() if line.startswith("where drafting runs: over this link "))
    command = next(line for line in r.stdout.splitlines() if line.startswith("command: "))
    assert re.search(r" --rpc 127\.0\.0\.1:\d+,127\.0\.0\.1:\d+", command)
    assert ("-ot 'blk\\.4\\.=CPU'" in command) is ("MTP block" in where.split(":")[1])
    r2 = cli("recommend", str(out), "--server-bin", server_bin)
    assert r2.returncode == 0, r2.stderr
    assert where in r2.stdout.splitlines()


def test_a_drafter_on_this_machine_over_two_workers(tmp_path, server_bin, rpc_worker_bin):
    """drafter-local: --device-draft with this machine's devices (none here: its CPU); the drafter
    model's weights stay off the workers, the target's go to them. A target without an MTP block:
    auto leaves mtp-local (and workers) out, said."""
    from app.core.calibrated import gguf as calibrated_gguf

    target, drafter = (str(p) for p in calibrated_gguf.make_pair(tmp_path, 0.3, 7, mtp=False))
    out, logs = tmp_path / "r.jsonl", tmp_path / "logs"
    with RpcWorker(rpc_worker_bin, threads=1) as w1, RpcWorker(rpc_worker_bin, threads=1) as w2:
        settings = EngineSettings(ctx_size=512, threads=1, n_gpu_layers="99", server_bin=server_bin,
                                  log_dir=str(logs), rpc=Workers((w1.endpoint, w2.endpoint)))
        plan = Plan(model=target, arms=(Arm(), Arm(2, 0.0, "draft-simple", drafter)),
                    prompts=(Prompt("c1", "code", "def f(x):"),), n_predict=16, reps=1, warmup=0)
        prepared = prepare(SweepRequest(plan, settings, out=out, strict_modes=True, placements=("auto",)))
        events = list(run(prepared.request))
    assert any("placement mtp-local left out" in str(getattr(e, "message", "")) for e in events)
    done = events[-1]
    assert isinstance(done, SessionFinished) and (done.n_ok, done.n_failed) == (4, 0), events
    runs = load_records(out)
    assert [r.server_args for r in runs] == [()] * 2 + [("--device-draft", "none")] * 2
    on_workers = {}
    for folder in ("placement-default", "placement-drafter-local"):
        log = next(p for p in (logs / folder).iterdir() if "draft-simple" in p.name).read_text(encoding="utf-8")
        on_workers[folder] = len(re.findall(r"RPC\d\[[^\]]+\] model buffer size", log))
    assert on_workers["placement-drafter-local"] < on_workers["placement-default"], on_workers
