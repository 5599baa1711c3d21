"""The core session: one owner of a sweep (prepare's checks, run's events and the engine and
results file it opens and closes), dispatch, and the confirm run of a verdict's pick, on the
calibrated model through the real engines."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.common.errors import UserError
from app.core.engines.base import EngineKind, EngineSettings
from app.core.measure.plan import Plan, make_arms
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.session import confirm as C
from app.core.session.events import (AdaptiveResult, EngineReady, RunFailed, RunFinished, SessionFinished, SweepError,
                                     SweepStarted, dispatch)
from app.core.session.request import AdaptiveOptions, SweepRequest
from app.core.session.sweep import engine_for, prepare, run
from app.core.verdict import build_verdict
from conftest import ROOT

PROMPTS = (Prompt("c1", "code", "def f(x):"), Prompt("s1", "story", "Once upon a time"))


def plan_of(model, **kw) -> Plan:
    base = dict(model=str(model), arms=make_arms([1, 2]), prompts=PROMPTS, engine="inprocess", n_predict=16,
                reps=1, warmup=0)
    return Plan(**{**base, **kw})


# -- prepare: every check once, each one line -------------------------------------------------

def test_prepare_refuses_what_cannot_run_with_one_line(make_model, tmp_path):
    model = make_model(0.0)
    cases = [
        (SweepRequest(plan_of(model), EngineSettings(ctx_size=32)), "the context size 32 is too small"),
        (SweepRequest(plan_of(model), EngineSettings(n_gpu_layers="many")), "GPU layers must be a count"),
        (SweepRequest(plan_of(model), mix="code=1,poetry=2"), "poetry"),
        (SweepRequest(plan_of(model, arms=make_arms([1], modes=["draft-mtp", "ngram-mod"])),
                      adaptive=AdaptiveOptions()), "adaptive sweep measures the model's own MTP heads"),
        (SweepRequest(plan_of(model), out=tmp_path), "is a folder; give a file name"),
    ]
    for request, words in cases:
        with pytest.raises(UserError) as e:
            prepare(request)
        assert words in str(e.value) and "\n" not in str(e.value), (words, str(e.value))


def test_prepare_fixes_the_engine_the_context_and_the_destination(make_model, tmp_path):
    model = make_model(0.0)
    got = prepare(SweepRequest(plan_of(model, arms=make_arms([1], modes=["draft-mtp", "ngram-mod"]), depths=(0, 3000)),
                               EngineSettings(ctx_size=1024, server_bin="/x/llama-server"), choose_engine=True))
    req = got.request
    assert req.plan.engine == "server" and req.engine.kind is EngineKind.SERVER
    assert req.engine.ctx_size >= 3000 + 16 and req.engine.server_bin == "/x/llama-server"
    assert any(n.startswith("engine: llama-server, for ngram-mod") for n in got.notes)
    assert any(n.startswith(f"context size {req.engine.ctx_size}") for n in got.notes)
    assert req.out is not None and req.out.parent.is_dir()  # the default file, in the results folder
    # the model's own heads alone: in process, no note; the in-process engine never gets a server binary
    plain = prepare(SweepRequest(plan_of(model, engine="server"), EngineSettings(server_bin="/x/llama-server"),
                                 out=tmp_path / "r.jsonl", choose_engine=True))
    assert plain.request.engine.kind is EngineKind.INPROCESS and plain.request.engine.server_bin is None
    assert plain.notes == () and plain.request.out == tmp_path / "r.jsonl"
    assert engine_for([Arm(), Arm(2)]) == (EngineKind.INPROCESS, None)
    assert engine_for([Arm(), Arm(2, 0.0, "draft-mtp", "/d.gguf")])[1].startswith(
        "engine: llama-server, for draft-mtp with a drafter")


# -- run: the engine and the results file are the session's --------------------------------------

def test_run_yields_ready_first_and_finished_last_and_writes_every_run(make_model, tmp_path):
    out = tmp_path / "r.jsonl"
    request = prepare(SweepRequest(plan_of(make_model(0.0)), EngineSettings(ctx_size=512), out=out)).request
    events = list(run(request))
    assert isinstance(events[0], EngineReady) and events[0].engine == "inprocess" and events[0].results_path == out
    done = events[-1]
    assert isinstance(done, SessionFinished) and done.ok and not done.cancelled
    finished = [e.record for e in events if isinstance(e, RunFinished)]
    assert done.n_ok == len(finished) == 2 * 3 and done.written == 6 and done.results_path == out
    assert [r.run_id for r in load_records(out)] == [r.run_id for r in finished]
    assert sum(isinstance(e, SweepStarted) for e in events) == 1


def test_a_session_closed_early_closes_its_engine_and_file(make_model, tmp_path, monkeypatch):
    from app.core.engines import inprocess

    closed = []
    real_close = inprocess.InProcessEngine.close
    monkeypatch.setattr(inprocess.InProcessEngine, "close", lambda self: (closed.append(1), real_close(self)))
    out = tmp_path / "r.jsonl"
    request = prepare(SweepRequest(plan_of(make_model(0.0)), EngineSettings(ctx_size=512), out=out)).request
    events = run(request)
    for ev in events:
        if isinstance(ev, RunFinished):
            break
    events.close()  # Ctrl+C in the CLI, a closed window
    assert closed == [1]
    assert len(load_records(out)) == 1  # the finished run is kept, the file closed (it can be opened again)
    with open(out, "a"):
        pass


def test_a_confirm_session_keeps_no_file_and_strict_modes_stop_before_any_run(make_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    request = prepare(SweepRequest(plan_of(make_model(0.0), arms=(Arm(1),)), EngineSettings(ctx_size=512),
                                   keep_results=False)).request
    events = list(run(request))
    assert events[0].results_path is None and events[-1].written == 0 and events[-1].results_path is None
    assert list(tmp_path.iterdir()) == []
    # a mode the in-process engine cannot run: the CLI's strict session stops before any run...
    odd = plan_of(make_model(0.0), arms=(Arm(), Arm(mode="ngram-mod")))
    strict = SweepRequest(odd, EngineSettings(ctx_size=512), keep_results=False, strict_modes=True)
    with pytest.raises(UserError, match="ngram-mod"):
        list(run(prepare(strict).request))
    # ...the window's drops those arms, says so, and runs the rest
    events = list(run(prepare(dataclasses.replace(strict, strict_modes=False)).request))
    assert [e for e in events if isinstance(e, SweepError)] and events[-1].n_ok == 2 and not events[-1].ok


def test_the_adaptive_session_ends_with_its_pick(make_model, tmp_path, monkeypatch):
    from app.core.records.cost import CostRecord, Spread
    from app.core.session import adaptive

    sp = lambda x: Spread(x, x, x, 5)  # noqa: E731
    t = {n: 10.0 + 0.1 * n for n in range(1, 4)}
    cost = CostRecord(1, "cost", "c", "inprocess", "b", "/m", 1, 64, 3, 2, {n: sp(v) for n, v in t.items()},
                      {n: sp(v / t[1]) for n, v in t.items()}, sp(0.5), {n: sp(0.5) for n in t}, sp(100.0), 5,
                      True, "", {})
    real = adaptive.adaptive_sweep

    def with_cost(*a, **kw):  # the probe's costs given, as a probe on a quiet machine would measure them
        return real(*a, **{**kw, "cost": cost})

    monkeypatch.setattr("app.core.session.sweep.adaptive_sweep", with_cost)
    request = prepare(SweepRequest(plan_of(make_model(0.0), n_predict=32), EngineSettings(ctx_size=512),
                                   AdaptiveOptions(ks=(1, 2), max_reps=2), mix="code=1,story=1",
                                   out=tmp_path / "a.jsonl")).request
    events = list(run(request))
    done = events[-1]
    assert isinstance(done, SessionFinished) and isinstance(done.adaptive, AdaptiveResult)
    assert done.adaptive is next(e for e in events if isinstance(e, AdaptiveResult))
    assert done.n_ok == done.adaptive.runs > 0 and done.written == done.n_ok


# -- dispatch ------------------------------------------------------------------------------------

def test_dispatch_finds_the_handler_of_the_type_or_its_base_or_the_default():
    class Special(RunFinished):
        pass

    seen = []
    handlers = {RunFinished: lambda e: seen.append("finished"), RunFailed: lambda e: seen.append("failed")}
    assert dispatch(RunFinished(None), handlers) and dispatch(Special(None), handlers)
    assert not dispatch(SweepError("x"), handlers)
    assert dispatch(SweepError("x"), handlers, default=lambda e: seen.append("default"))
    assert seen == ["finished", "finished", "default"]


# -- the confirm run -----------------------------------------------------------------------------

def _prompt_file(tmp_path: Path) -> str:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([{"id": p.id, "task": p.task, "text": p.text} for p in PROMPTS]))
    return str(path)


def _verdict_of(path: Path, mix=None):
    return build_verdict([r for r in load_records(path) if r.status == "ok"], mix=mix)


def test_confirm_plan_takes_the_pick_at_the_judged_setting(make_model, tmp_path):
    out = tmp_path / "r.jsonl"
    list(run(prepare(SweepRequest(plan_of(make_model(0.0)), EngineSettings(ctx_size=512), out=out)).request))
    v = _verdict_of(out, mix="code=1")
    prompts = _prompt_file(tmp_path)
    c = C.confirm_plan(v, prompts)
    assert c.task == "code" and c.prompt_id == "c1" and c.plan.engine == "server"
    assert c.plan.arms == ((Arm(), v.pick.arm) if v.pick.arm else (Arm(),)) and c.sweep_engine == "inprocess"
    assert c.sweep_tok_s > 0
    with pytest.raises(UserError, match="no recommendation yet"):
        C.confirm_plan(None)
    assert C.confirm_plan(v, prompts, task="story").task == "story"
    with pytest.raises(UserError, match="prompt 'c1' of the sweep is no longer in the suites"):
        C.confirm_plan(v)


def test_confirm_text_says_what_the_speeds_mean():
    rec = next(r for r in load_records(ROOT / "tests" / "data" / "demo_sweep.jsonl") if r.status == "ok" and r.k)
    plan = Plan(model="m.gguf", arms=(rec.measured_arm,), prompts=(Prompt(rec.prompt_id, rec.task, "x"),))
    c = C.ConfirmPlan(plan, rec.measured_arm, rec.task, rec.prompt_id, "inprocess", 50.0)
    same = C.confirm_text(c, [dataclasses.replace(rec, tok_s=52.0)])
    assert same.startswith("llama-server (") and "the sweep (inprocess) measured 50.0 tok/s" in same
    assert "the measurement holds there" in same
    slower = C.confirm_text(c, [dataclasses.replace(rec, tok_s=30.0)])
    assert "0.60x the in-process sweep's speed" in slower and "sweep on llama-server" in slower
    drift = C.confirm_text(dataclasses.replace(c, sweep_engine="server"), [dataclasses.replace(rec, tok_s=80.0)])
    assert "1.60x the sweep's speed" in drift and "run the sweep again" in drift
    assert C.confirm_text(c, []) == "the confirmation run did not finish"
    failed = C.confirm_text(c, [dataclasses.replace(rec, status="failed", tok_s=None, error="server died")])
    assert failed == "the llama-server run failed: server died"


@pytest.mark.server
def test_recommend_confirm_runs_the_pick_on_llama_server(make_model, tmp_path, server_bin):
    out = tmp_path / "r.jsonl"
    list(run(prepare(SweepRequest(plan_of(make_model(0.0), arms=make_arms([2])), EngineSettings(ctx_size=512),
                                  out=out)).request))
    r = subprocess.run([sys.executable, "-m", "app", "recommend", str(out), "--mix", "code=1", "--confirm",
                        "--prompts", _prompt_file(tmp_path), "--server-bin", server_bin, "--ctx-size", "512"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert any(x.startswith("llama-server timed ") for x in r.stdout.splitlines()), r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("confirm: "))
    assert "llama-server (" in line and "on code/c1" in line and "the sweep (inprocess) measured" in line
    assert "confirm: llama-server: 2 of " in r.stderr, r.stderr  # its progress as it went
    # --json keeps stdout the verdict's JSON; the confirm line goes to stderr
    r = subprocess.run([sys.executable, "-m", "app", "recommend", str(out), "--json", "--confirm",
                        "--prompts", _prompt_file(tmp_path), "--server-bin", server_bin, "--ctx-size", "512"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    assert "confirm: llama-server (" in r.stderr


def test_a_plain_sweep_until_decided_stops_at_the_round_that_decides(make_model, tmp_path, monkeypatch):
    """A recorded rule (decided once every arm has 2 pairs): the grid runs in rounds of one
    repetition and stops after the second, not at --reps."""
    from app.core.analysis.decide import TaskDecision
    from app.core.session import until
    from app.core.session.events import Decisions

    def rule(records, tasks, arms, **_):
        out = []
        for t in tasks:
            n = min(sum(1 for r in records if r.task == t and r.measured_arm == a) for a in arms[t])
            out.append(TaskDecision(t, n >= 2, None, None, (), None, 0 if n >= 2 else 1))
        return tuple(out)

    monkeypatch.setattr(until, "decide", rule)
    request = prepare(SweepRequest(plan_of(make_model(0.0), reps=5), EngineSettings(ctx_size=512),
                                   out=tmp_path / "u.jsonl", until_decided=True)).request
    events = list(run(request))
    decisions = [e for e in events if isinstance(e, Decisions)]
    assert [d.final for d in decisions] == [False, True] and decisions[-1].stopped == "decided"
    finished = [e.record for e in events if isinstance(e, RunFinished)]
    assert len(finished) == 2 * 2 * 3 and {r.rep for r in finished} == {0, 1}  # 2 rounds of 2 prompts x 3 arms
    assert events[-1].n_ok == len(finished) and len(load_records(tmp_path / "u.jsonl")) == len(finished)


def test_bench_budget_options_are_checked_before_anything_runs(make_model, tmp_path):
    def bench(*args):
        return subprocess.run([sys.executable, "-m", "app", "bench", "--model", str(make_model(0.0)), "--tasks", "code",
                               "--per-task", "1", "--out", str(tmp_path / "b.jsonl"), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    for args, words in [(("--adaptive", "--budget", "soon"), "expected a duration like 90s, 3m or 2m30s"),
                        (("--adaptive", "--budget", "0s"), "the budget must be more than nothing"),
                        (("--budget", "3m"), "--budget and --budget-tokens end an --adaptive sweep"),
                        (("--budget-tokens", "500"), "--budget and --budget-tokens end an --adaptive sweep"),
                        (("--min-gain", "5"), "--min-gain is for a sweep that stops once decided"),
                        (("--adaptive", "--min-gain", "80"), "between 0 and 50"),
                        (("--until-decided", "--min-gain", "nan"), "expected a finite number")]:
        r = bench(*args)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert not (tmp_path / "b.jsonl").exists()
