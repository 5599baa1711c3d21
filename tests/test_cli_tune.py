"""mtp-tuner tune: the Start page's flow from the command line. Its request is the core's
(app.core.session.tune, which the Start page calls too), its options are checked in one line, and
a short live run on the tiny calibrated model prints the answer as JSON: per task its pick and
its llama-server command, and where the sweep stopped. No timing is asserted."""

from __future__ import annotations

import json

import pytest

from app.core.calibrated.demo import demo_model
from app.core.common.errors import UserError
from app.core.session.request import ADAPTIVE_MAX_REPS
from app.core.session.tune import QUICK_S, parse_uses, tune_request
from test_cli import assert_clean_error, cli


def test_the_uses_are_tasks_with_weights_if_given():
    assert parse_uses("code,story") == {"code": 1.0, "story": 1.0}
    assert parse_uses("code=0.7, story=0.3") == {"code": 0.7, "story": 0.3}
    assert parse_uses("code=2,story=0") == {"code": 2.0}  # a weight of 0 leaves the task out
    for bad, said in [("", "name at least one use"), ("code=-1", "must not be negative"),
                      ("code=x", "not a number"), ("code=0", "--for: the weights add up to zero"), ("code,code", "given twice")]:
        with pytest.raises(UserError, match=said):
            parse_uses(bad)


def test_quick_and_thorough_are_the_start_pages_requests():
    model = str(demo_model())
    quick = tune_request(model, {"code": 0.7, "story": 0.3}, quick=True, started=12.5)
    assert quick.adaptive is not None and quick.adaptive.budget_s == QUICK_S and quick.adaptive.started == 12.5
    assert quick.adaptive.ks == (1, 2, 3) and quick.mix == "code=0.7,story=0.3"  # the demo's own widths
    assert [p.task for p in quick.plan.prompts] == ["code", "story"]  # the demo's own prompt per task
    thorough = tune_request(model, {"code": 1}, quick=False)
    assert thorough.adaptive is not None and thorough.adaptive.budget_s is None
    assert thorough.adaptive.max_reps == ADAPTIVE_MAX_REPS  # the cap it states before it starts
    ngram = tune_request(model, {"code": 1}, quick=True, ngram=True)
    assert ngram.adaptive is None and ngram.until_decided and {a.mode for a in ngram.plan.arms if a.is_spec} == {
        "ngram-mod", "ngram-simple"}


def test_tune_options_are_checked_in_one_line(tmp_path):
    assert_clean_error(cli("tune", "--for", "code"), "tune needs --model FILE.gguf, --demo or --server-command")
    assert_clean_error(cli("tune", "--demo", "--quick", "--thorough"), "not allowed with argument")
    assert_clean_error(cli("tune", "--demo", "--for", "code=-1"), "must not be negative")
    assert_clean_error(cli("tune", "--model", str(tmp_path / "none.gguf")), "no such file")
    assert_clean_error(cli("tune", "--demo", "--quick", "soon"), "--quick")
    r = cli("tune", "--help")
    assert r.returncode == 0 and "--for USES" in r.stdout and "--thorough" in r.stdout
    assert "tune" in cli("--help").stdout


def test_a_short_quick_tune_on_the_demo_answers_as_json_with_a_command_per_task(tmp_path):
    out = tmp_path / "tune.jsonl"
    r = cli("tune", "--demo", "--for", "code=0.7,story=0.3", "--quick", "20s", "--json", "--out", str(out))
    assert r.returncode in (0, 1), r.stderr  # 1: no answer (a busy machine's runs are withheld)
    assert "Traceback" not in r.stderr
    assert "it runs until every task is decided, or for at most 20 s" in r.stderr  # the cap, said first
    d = json.loads(r.stdout)
    assert d["uses"] == {"code": 0.7, "story": 0.3} and d["quick"] is True and d["budget_s"] == 20.0
    assert d["results"] == str(out) and isinstance(d["elapsed_s"], float)
    dec = d["decisions"]
    assert dec["stopped"] in ("decided", "budget", "max_reps") and {t["task"] for t in dec["tasks"]} >= {"code", "story"}
    v = d["verdict"]
    if v is not None:  # the window's verdict: per task its pick and its own command (None when withheld)
        assert {t["task"] for t in v["per_task"]} == {"code", "story"} and v["mix"] == {"code": 0.7, "story": 0.3}
        assert all("command" in t and "k" in t for t in v["per_task"])
    if r.returncode == 0 and v is not None:
        assert all(t["command"] for t in v["per_task"])


def test_the_answer_is_the_windows_verdict_with_a_command_per_task(tmp_path, capsys):
    """tune's answer on recorded runs (a clear sweep: code pays, story does not): the window's
    verdict (build_verdict weighed by the uses), a command per task, and the decisions."""
    from tests.helpers import clear_sweep_file, tune_answer

    path = tmp_path / "clear.jsonl"
    rc = tune_answer(path, clear_sweep_file(path), "/m.gguf", {"code": 0.7, "story": 0.3}, 120.0)
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["decisions"]["stopped"] == "decided" and d["elapsed_s"] == 31.0
    per = {t["task"]: t for t in d["verdict"]["per_task"]}
    assert set(per) == {"code", "story"} and d["verdict"]["mix"] == {"code": 0.7, "story": 0.3}
    assert per["code"]["mtp"] and "--spec-type draft-mtp" in per["code"]["command"]  # its command turns MTP on
    assert per["story"]["command"] and "draft-mtp" not in per["story"]["command"]  # leave it off: plain


# -- the user's set-up and the engine: what bench and the Start page have --------------------------
def _gpu_machine_with_a_cpu_only_in_process_build():
    """A recorded NVIDIA machine whose llama-cpp-python is a CPU build beside a CUDA llama-server."""
    from app.core.engines.devices import engine_choice, host_gpu_names
    from tests.helpers import INPROC_CPU, LIST_CUDA, gpu_snapshot, server_info

    return engine_choice(host_gpu_names(gpu_snapshot()), [("inprocess", INPROC_CPU, None),
                                                          ("server", server_info(LIST_CUDA), None)])


def _tune_args(*argv: str):
    from app.cli.parser import build_parser

    return build_parser().parse_args(["tune", *argv])


def test_a_gpu_machine_with_a_cpu_only_in_process_build_tunes_on_llama_server(capsys):
    """The device check inside the tune flow: `tune` asks it (not the in-process engine pinned), as
    the Start page does (test_gui_start), and a named --engine wins."""
    from app.cli import tune
    from app.core.engines.base import EngineKind

    gpu = _gpu_machine_with_a_cpu_only_in_process_build()
    asked: list[str | None] = []

    def check(server_bin):
        asked.append(server_bin)
        return gpu

    r = tune.request_of(_tune_args("--demo", "--for", "code"), 0.0, check=check)
    assert asked == [None] and r.plan.engine is EngineKind.SERVER and r.engine.kind is EngineKind.SERVER
    assert "will measure on: NVIDIA GeForce RTX 3060 via llama-server b6123 (CUDA)" in capsys.readouterr().err
    r = tune.request_of(_tune_args("--demo", "--for", "code", "--engine", "inprocess"), 0.0, check=check)
    assert len(asked) == 1 and r.plan.engine is EngineKind.INPROCESS  # named: no check, the user's engine


def test_tune_takes_the_users_set_up_in_one_line_each(tmp_path):
    assert_clean_error(cli("tune", "--demo", "--rpc", "nohost"), "--rpc")
    assert_clean_error(cli("tune", "--demo", "--engine", "inprocess", "--rpc", "127.0.0.1:18950"),
                       "--engine inprocess cannot split a model over RPC workers")
    assert_clean_error(cli("tune", "--demo", "--server-command", "llama-server -m x.gguf"),
                       "does not combine with --demo")
    assert_clean_error(cli("tune", "--demo", "--ngram", "--drafter", str(tmp_path / "d.gguf")),
                       "d.gguf")  # the drafter is checked against the model first (test_tune_any_gguf)
    r = cli("tune", "--help")
    for flag in ("--engine", "--server-command", "--server-command-file", "--drafter", "--rpc", "--ngl",
                 "--threads", "--server-bin"):
        assert flag in r.stdout, flag


def _short_tune(*argv: str, out, budget: str = "20s") -> tuple[dict, list]:
    d, runs, said = _tune_json(*argv, out=out, budget=budget)
    assert runs, f"no run in the budget; tune said: {said[-2000:]}"  # why, when it measured nothing
    return d, runs


def _tune_json(*argv: str, out, budget: str) -> tuple[dict, list, str]:
    """tune --quick BUDGET --json --out OUT: its answer, the runs it wrote, what it printed to stderr."""
    from app.core.records.reader import load_records

    r = cli("tune", *argv, "--quick", budget, "--json", "--out", str(out), timeout=400)
    assert r.returncode in (0, 1), r.stderr  # 1: no answer (a busy machine's runs are withheld)
    assert "Traceback" not in r.stderr
    return json.loads(r.stdout), load_records(out) if out.exists() else [], r.stderr


@pytest.mark.server
def test_tune_with_the_users_server_command_runs_with_its_flags(server_bin, make_model, tmp_path):
    model = make_model(0.3)
    d, runs = _short_tune("--engine", "server", "--server-command", f"{server_bin} -m {model} -c 4096 -fa on",
                          "--for", "code", out=tmp_path / "cmd.jsonl")
    assert d["model"] == str(model) and runs and all(r.engine == "server" for r in runs)
    assert all(tuple(r.server_args) == ("-c", "4096", "-fa", "on") for r in runs)  # the user's flags
    assert any(r.status == "ok" for r in runs)
    if d["verdict"] is not None:  # the answer is the user's command (with the picked flags, if any)
        assert all(" -c 4096 -fa on" in t["command"] for t in d["verdict"]["per_task"] if t["command"])


@pytest.mark.server
def test_tune_with_a_drafter_measures_it_on_llama_server(server_bin, tmp_path):
    from app.core.calibrated import gemma4 as calibrated_gemma4

    target, assistant = calibrated_gemma4.make_gemma4_pair(tmp_path / "gemma", 0.3)
    d, runs = _short_tune("--model", str(target), "--drafter", str(assistant), "--server-bin", server_bin,
                          "--for", "code", out=tmp_path / "drafter.jsonl")
    assert runs and all(r.engine == "server" for r in runs) and all(r.status == "ok" for r in runs)
    spec = [r for r in runs if r.k is not None]
    # the Gemma 4 target has no MTP heads of its own: its assistant (Quick: at K=2, not combined with
    # ngram-mod; test_tune_any_gguf)
    assert spec and {r.drafter["path"] for r in spec} == {str(assistant)}
    assert {r.spec_type for r in spec} == {"draft-mtp"} and {r.k for r in spec} == {2}
    assert all(r.draft_n for r in spec)  # the drafter drafted


@pytest.mark.server
def test_tune_over_an_rpc_worker_splits_the_model_over_it(server_bin, rpc_worker_bin, make_model, tmp_path):
    from app.core.engines.server.rpc_worker import RpcWorker
    from app.core.records.reader import load_cost_records

    out = tmp_path / "rpc.jsonl"
    with RpcWorker(rpc_worker_bin) as worker:
        d, runs, said = _tune_json("--model", str(make_model(0.3)), "--rpc", str(worker.endpoint), "--server-bin",
                                   server_bin, "--for", "code", out=out, budget="150s")
    # the cost probe ran through llama-server and the worker: its step costs are those of the split model
    # (a probe disturbed by other programs is used for this sweep only, not written: tune says so)
    costs = load_cost_records(out)
    assert costs or "the probe ran while other programs were busy" in said, said[-2000:]
    for cost in costs:
        assert cost.engine == "server" and cost.backend == "RPC"
        assert cost.devices and all(str(worker.endpoint) in dev for dev in cost.devices)
    # over loopback RPC every speculative step pays round trips: the probe has ruled every K out (runs
    # at full acceptance slower than plain decoding) in some runs here and let K=4..5 through in
    # others (2026-12-07: 2.9-3.2 ms plain, 7.8-9.6 ms at K=1). Both are answers, on the split model.
    if not runs:  # the probe decided: leave it off, and why
        assert d["verdict"] is None and d["decisions"]["runs"] == 0
        assert [t["line"] for t in d["decisions"]["tasks"]] == [
            "code: decided, slower: leave it off (no draft width can pay on this machine)"]
    else:  # the runs measured the model split over the worker, and the answer's command names it
        task = d["verdict"]["per_task"][0]
        assert task["command"] and f"--rpc {worker.endpoint}" in task["command"]
        assert [w["endpoint"] for w in task["workers"]] == [str(worker.endpoint)]
        assert all(r.engine == "server" for r in runs)
        assert all(r.rpc is not None and r.rpc["workers"] == [str(worker.endpoint)] for r in runs)
