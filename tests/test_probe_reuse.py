"""An adaptive sweep in process reuses a recent probe of the same set-up from the results folder
instead of probing again (minutes on a CPU), says so, and copies it into its own results file;
anything that changes the step costs (model, build, threads, depth, widths, machine, age, a failed
middle check) makes it probe; ``--reprobe`` always does; llama-server sweeps always do."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from app.core.common.paths import results_dir
from app.core.engines.base import EngineKind, EngineSettings
from tests.helpers import ReuseEngine
from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.records.cost import CostRecord, Spread, model_stamp
from app.core.records.prompt import Prompt
from app.core.records.reader import load_cost_records
from app.core.records.schema import host_info, utc_now
from app.core.records.writer import ResultsWriter
from app.core.session.events import AdaptiveStage, SessionFinished
from app.core.session.probes import MAX_AGE_H, reusable_probe, why_not
from app.core.session.request import AdaptiveOptions, SweepRequest
from app.core.session.sweep import prepare, run

PROMPTS = (Prompt("c1", "code", "def f(x):"), Prompt("s1", "story", "Once upon a time"))
NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.timezone.utc)


Eng = ReuseEngine  # what probe reuse asks of an engine


def _plan(model: Path) -> Plan:
    return Plan(model=str(model), arms=(Arm(),), prompts=PROMPTS, engine="inprocess", n_predict=16, reps=1,
                warmup=0)


def _probe(model: Path, *, build: str = "llama-cpp-python 0.3.36", threads: int = 2, ks=(1, 2, 3),
           when: dt.datetime = NOW - dt.timedelta(minutes=20), mid_error: float | None = 0.01,
           run_id: str = "p1") -> CostRecord:
    sp = lambda x: Spread(x, x, x, 5)  # noqa: E731
    t = {n: 10.0 + 0.2 * n for n in range(1, max(ks) + 2)}
    return CostRecord(5, "cost", run_id, "inprocess", build, str(model.resolve()), model.stat().st_size, 64,
                      max(ks) + 1, threads, {n: sp(v) for n, v in t.items()}, {n: sp(v / t[1]) for n, v in t.items()},
                      sp(2.0), {n: sp(2.0) for n in t}, sp(100.0), 5, True,
                      when.isoformat(timespec="milliseconds"), host_info(),
                      step_ms={k: {"accept": sp(12.0 + k), "reject": sp(12.5 + k)} for k in ks},
                      plain_ms=sp(10.2),
                      mid_check=None if mid_error is None else {"k": 2, "accepted_per_step": 0.8, "measured_ms": 13.0,
                                                                "predicted_ms": 13.0, "error": mid_error},
                      **model_stamp(model))  # as run_probe records it: the model file's content


def test_a_probe_is_reused_only_for_the_same_set_up_and_says_why_not(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 60)
    plan, eng = _plan(model), Eng()
    assert why_not(_probe(model), plan, eng, (1, 2, 3), NOW) is None
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + b"\0" * 60)
    cases = {
        "another model file": _probe(other),
        "another llama.cpp build": _probe(model, build="llama-cpp-python 0.3.40"),
        "another thread count": _probe(model, threads=1),
        "not every width timed": _probe(model, ks=(1, 2)),
        f"older than {MAX_AGE_H:.0f} h": _probe(model, when=NOW - dt.timedelta(hours=MAX_AGE_H + 1)),
        "its middle-rate check failed": _probe(model, mid_error=0.4),
    }
    for why, rec in cases.items():
        assert why_not(rec, plan, eng, (1, 2, 3), NOW) == why, why
    assert why_not(_probe(model), dataclasses.replace(plan, depths=(512,)), eng, (1, 2, 3), NOW) \
        == "another context depth"
    moved = dataclasses.replace(_probe(model), host={**host_info(), "cpu_count": 96})
    assert why_not(moved, plan, eng, (1, 2, 3), NOW) == "another machine"
    server = dataclasses.replace(_probe(model), engine="server")
    assert why_not(server, plan, eng, (1, 2, 3), NOW) == "not an in-process probe of an in-process sweep"
    assert why_not(_probe(model, mid_error=None), plan, eng, (1, 2, 3), NOW) is None  # no check made: fine
    unstamped = dataclasses.replace(_probe(model), model_mtime_ns=None, model_head_sha256=None)  # an older record
    assert why_not(unstamped, plan, eng, (1, 2, 3), NOW) == "made before probes kept the model's content"
    # the newest that fits, from the results folder (a foreign file passed over)
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "junk.jsonl").write_text("not json\n")
    with ResultsWriter(folder / "a.jsonl") as w:
        w.append_line(_probe(model, run_id="old", when=NOW - dt.timedelta(hours=2)).to_json())
        w.append_line(_probe(model, run_id="new").to_json())
        w.append_line(_probe(model, run_id="newer-but-other-build", build="x",
                             when=NOW - dt.timedelta(minutes=1)).to_json())
    rec, said, source = reusable_probe(plan, eng, (1, 2, 3), folder=folder, now=NOW)
    assert rec is not None and rec.run_id == "new" and source == folder / "a.jsonl"
    assert said.startswith("costs from the probe made 20 min ago") and "--reprobe" in said
    assert reusable_probe(plan, Eng(kind=EngineKind.SERVER), (1, 2, 3), folder=folder, now=NOW)[0] is None


def test_the_adaptive_session_takes_the_recent_probe_and_copies_it_into_its_file(make_model, tmp_path):
    model = make_model(0.0)
    plan = _plan(model)
    request = prepare(SweepRequest(plan, EngineSettings(ctx_size=512, threads=1),
                                   AdaptiveOptions(ks=(1, 2), max_reps=2), mix="code=1,story=1",
                                   out=tmp_path / "a.jsonl")).request
    from app.core.engines.factory import make_engine

    with make_engine(request.engine) as eng:
        build = eng.build
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    probe = _probe(model, build=build, threads=1, ks=(1, 2), when=dt.datetime.now(dt.timezone.utc)
                   - dt.timedelta(minutes=5))
    with ResultsWriter(folder / "earlier.jsonl") as w:
        w.append_line(probe.to_json())
    events = list(run(request))
    stages = [e.message for e in events if isinstance(e, AdaptiveStage) and e.stage == "probe"]
    assert stages and stages[0].startswith("costs from the probe made 5 min ago"), stages
    assert not any("plain decode step" in m for m in stages)  # not probed again
    assert isinstance(events[-1], SessionFinished) and events[-1].n_ok > 0
    assert [c.run_id for c in load_cost_records(tmp_path / "a.jsonl")] == [probe.run_id]
    # --reprobe: measured anew (the probe's own stages), the earlier one not taken
    again = dataclasses.replace(request, adaptive=dataclasses.replace(request.adaptive, reprobe=True),
                                out=tmp_path / "b.jsonl")
    stages = [e.message for e in run(again) if isinstance(e, AdaptiveStage) and e.stage == "probe"]
    assert not any(m.startswith("costs from the probe made") for m in stages)
    assert any("plain decode step" in m for m in stages), stages
    assert [c.run_id for c in load_cost_records(tmp_path / "b.jsonl")] != [probe.run_id]


def test_reprobe_belongs_to_the_adaptive_sweep(capsys):
    from helpers import cli

    r = cli("bench", "--demo", "--reprobe")
    assert r.returncode == 2 and "--reprobe is --adaptive's" in r.stderr, r.stderr
