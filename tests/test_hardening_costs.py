"""Cost records from a results file are outside input (issue 36, items 5 and 6): a planted or
damaged record (NaN, negative, zero or 1e308 step costs, a NaN middle check, strings for numbers,
a list for a path, a host that is a number, widths past llama.cpp's) is left out with one warning
naming its file and line, never priced with and never a traceback: not in probe reuse (the
in-process adaptive sweep), not in watch, not in the reader. Probe reuse also holds the model
file's content: a file changed in place at the same path and size is not the one probed."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
from pathlib import Path

import pytest

from helpers import ReuseEngine, replayed_watch, server_costs

from app.core.common.paths import results_dir
from app.core.engines.base import EngineKind
from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.records.cost import CostRecord, Spread, model_stamp
from app.core.records.prompt import Prompt
from app.core.records.reader import load_cost_records
from app.core.records.schema import host_info
from app.core.session.probes import reusable_probe, why_not

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.timezone.utc)
RAW = "@@raw@@"  # a value written into the line as it is: NaN, 1e400, a 400-digit integer


Eng = ReuseEngine  # what probe reuse asks of an engine


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    return model


def _plan(model: Path) -> Plan:
    return Plan(model=str(model), arms=(Arm(),), prompts=(Prompt("c1", "code", "def f(x):"),), engine="inprocess",
                n_predict=16, reps=1, warmup=0)


def _probe(model: Path, run_id: str, minutes_ago: float, step: float, now: dt.datetime = NOW) -> CostRecord:
    """An in-process probe of ``model`` as run_probe records it (content stamp included): whole
    steps of ``step`` ms at K = 1..3 against a plain step of 10 ms."""
    sp = lambda x: Spread(x, x, x, 5)  # noqa: E731
    t = {n: 10.0 + 0.2 * n for n in range(1, 5)}
    when = (now - dt.timedelta(minutes=minutes_ago)).isoformat(timespec="milliseconds")
    return CostRecord(6, "cost", run_id, "inprocess", "llama-cpp-python 0.3.36", str(model.resolve()),
                      model.stat().st_size, 64, 4, 2, {n: sp(v) for n, v in t.items()},
                      {n: sp(v / t[1]) for n, v in t.items()}, sp(2.0), {n: sp(2.0) for n in t}, sp(100.0), 5, True,
                      when, host_info(),
                      step_ms={k: {"accept": sp(step + k), "reject": sp(step + k)} for k in (1, 2, 3)},
                      plain_ms=sp(10.0), mid_check={"k": 2, "accepted_per_step": 1.0, "measured_ms": step,
                                                    "predicted_ms": step, "error": 0.01},
                      **model_stamp(model))


def _planted(rec: CostRecord, path: tuple, value, raw: str | None = None) -> str:
    """``rec``'s line with the field at ``path`` set to ``value`` (deleted when value is ...), or to
    the literal ``raw`` text."""
    d = json.loads(rec.to_json())
    *parents, last = path
    at = d
    for key in parents:
        at = at[key]
    if value is ...:
        del at[last]
    else:
        at[last] = RAW if raw is not None else value
    line = json.dumps(d)
    return line.replace(f'"{RAW}"', raw) if raw is not None else line


STEP = ("step_ms", "1", "accept", "median")
# (id, field path, value, raw JSON text): each a record no probe writes
HOSTILE = [
    ("nan-step", STEP, None, "NaN"), ("negative-step", STEP, -5.0, None), ("zero-step", STEP, 0, None),
    ("1e308-step", STEP, 1e308, None), ("1e400-step", STEP, None, "1e400"), ("string-step", STEP, "12.0", None),
    ("400-digit-step", STEP, None, "1" * 400), ("nan-middle-check", ("mid_check", "error"), None, "NaN"),
    ("string-middle-check", ("mid_check", "error"), "0.01", None), ("host-a-number", ("host",), 5, None),
    ("gpus-a-number", ("host", "gpus"), 5, None), ("path-a-list", ("model_path",), ["/m.gguf"], None),
    ("time-not-a-time", ("timestamp_utc",), "yesterday", None), ("size-negative", ("model_size",), -1, None),
    ("threads-true", ("threads",), True, None), ("devices-a-string", ("devices",), "CUDA0", None),
    ("no-reject", ("step_ms", "1", "reject"), ..., None), ("no-t_ms", ("t_ms",), ..., None),
    ("width-100", ("step_ms", "100"), {"accept": {"median": 1.0, "p10": 1.0, "p90": 1.0, "n": 5},
                                       "reject": {"median": 1.0, "p10": 1.0, "p90": 1.0, "n": 5}}, None),
    ("key-not-digits", ("t_ms", " 2"), {"median": 1.0, "p10": 1.0, "p90": 1.0, "n": 5}, None),
    ("spread-a-list", ("draft_ms",), [1, 2, 3], None), ("mid-check-a-string", ("mid_check",), "fine", None),
]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("name, path, value, raw", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_cost_record_is_left_out_with_one_warning_naming_its_line(tmp_path, caplog, name, path, value, raw):
    model = _model(tmp_path)
    f = tmp_path / "r.jsonl"
    good = _probe(model, "good", 30, 50.0)
    f.write_text(good.to_json() + "\n" + _planted(_probe(model, "planted", 10, 50.0), path, value, raw) + "\n"
                 + good.to_json() + "\n")
    with caplog.at_level(logging.WARNING):
        recs = load_cost_records(f)
    assert [r.run_id for r in recs] == ["good", "good"]
    (warning,) = _warnings(caplog)
    assert warning.startswith(f"{f} line 2: not a valid cost-probe record (") and warning.endswith("; left out")
    assert "\n" not in warning and len(warning) < 400 + len(str(f))
    problems: list[str] = []
    assert len(load_cost_records(f, problems)) == 2 and problems == [warning]  # or said to the caller


@pytest.mark.parametrize("name, value, raw", [("nan", None, "NaN"), ("negative", -40.0, None), ("zero", 0.0, None),
                                              ("tiny", 1e-300, None), ("huge", 1e308, None)])
def test_a_planted_cheap_probe_never_turns_no_k_can_pay_into_k_1_2(tmp_path, name, value, raw):
    """The genuine probe (30 min ago) says every width costs 10x the plain step: no K can pay. A
    newer planted record of the same set-up with impossible step costs was taken over it, and
    its costs made K = 1, 2 'pay'. Now the planted one is left out, said once, and the genuine one
    prices the sweep."""
    model = _model(tmp_path)
    folder = tmp_path / "results"
    folder.mkdir()
    genuine = _probe(model, "genuine", 30, 100.0)
    planted = _probe(model, "planted", 5, 100.0)
    lines = [planted.to_json()]
    for k in ("1", "2"):
        d = json.loads(lines[-1])
        d["step_ms"][k]["accept"]["median"] = d["step_ms"][k]["reject"]["median"] = RAW if raw else value
        lines.append(json.dumps(d).replace(f'"{RAW}"', raw) if raw else json.dumps(d))
    (folder / "a.jsonl").write_text(genuine.to_json() + "\n")
    (folder / "b.jsonl").write_text(lines[-1] + "\n")
    problems: list[str] = []
    rec, said, source = reusable_probe(_plan(model), Eng(), (1, 2, 3), folder=folder, now=NOW, problems=problems)
    assert rec is not None and rec.run_id == "genuine" and source == folder / "a.jsonl"
    assert len(problems) == 1 and problems[0].startswith(f"{folder / 'b.jsonl'} line 1: not a valid cost-probe record")
    assert "step_ms[1].accept.median" in problems[0]


def test_a_nan_middle_check_fails_the_check(tmp_path):
    """abs(nan) > tolerance is False: a NaN error passed the middle check."""
    model = _model(tmp_path)
    rec = _probe(model, "p", 10, 50.0)
    nan = dataclasses.replace(rec, mid_check={**rec.mid_check, "error": float("nan")})
    assert why_not(rec, _plan(model), Eng(), (1, 2, 3), NOW) is None
    assert why_not(nan, _plan(model), Eng(), (1, 2, 3), NOW) == "its middle-rate check failed"


def test_a_model_changed_in_place_is_not_the_one_probed(tmp_path):
    model = _model(tmp_path)
    plan, eng = _plan(model), Eng()
    rec = _probe(model, "p", 10, 50.0)
    assert why_not(rec, plan, eng, (1, 2, 3), NOW) is None
    # the same path and size, other bytes, and its modification time put back: the hash tells
    st = model.stat()
    model.write_bytes(b"GGUF" + bytes(reversed(range(256))) * 4)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert model.stat().st_size == st.st_size and model.stat().st_mtime_ns == st.st_mtime_ns
    assert why_not(rec, plan, eng, (1, 2, 3), NOW) == "the model file changed since"
    # the same bytes written again (re-downloaded, copied over): a new modification time
    model.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert why_not(rec, plan, eng, (1, 2, 3), NOW) == "the model file changed since"
    # a record made before probes kept the content: not taken (a probe costs minutes, a wrong price a sweep)
    old = dataclasses.replace(rec, model_mtime_ns=None, model_head_sha256=None)
    assert why_not(old, plan, eng, (1, 2, 3), NOW) == "made before probes kept the model's content"
    # the stamp goes through the file and back
    assert CostRecord.from_dict(json.loads(rec.to_json())) == rec


def test_the_probes_record_their_models_content(make_model, tmp_path):
    """The in-process probe, as it runs (a real probe of the calibrated model, two sizes)."""
    from app.core.measure.probe import run_probe

    model = make_model(0.0)
    (rec,) = [e for e in run_probe(str(model), max_batch=2, min_rounds=1, max_rounds=1, whole=False)
              if isinstance(e, CostRecord)]
    assert (rec.model_mtime_ns, rec.model_head_sha256) == tuple(model_stamp(model).values())
    assert CostRecord.from_dict(json.loads(rec.to_json())) == rec  # what it measured reads back as valid


WATCH_COSTS = {1: 10.0, 2: 10.5, 3: 11.0, 4: 11.5, 5: 12.0, 6: 12.5}


WATCH_HOSTILE = [h for h in HOSTILE if h[0] in ("nan-step", "zero-step", "string-step", "400-digit-step",
                                                 "host-a-number", "gpus-a-number", "path-a-list", "time-not-a-time",
                                                 "width-100", "no-reject")]


@pytest.mark.parametrize("name, path, value, raw", WATCH_HOSTILE, ids=[h[0] for h in WATCH_HOSTILE])
def test_watch_skips_a_hostile_cost_record_and_prices_with_the_good_one(tmp_path, caplog, name, path, value, raw):
    """A hostile record newer than the good one, in the cost file watch reads: one warning, and
    the server is priced by the good record (no traceback, no 'no cost record')."""
    good = dataclasses.replace(server_costs(WATCH_COSTS, 0.5), run_id="good",
                               timestamp_utc="2026-11-01T00:00:00.000+00:00")
    bad = dataclasses.replace(server_costs(WATCH_COSTS, 0.5), run_id="planted",
                              step_ms={k: {"accept": Spread(10.0 + k, 10.0 + k, 10.0 + k, 5),
                                           "reject": Spread(11.0 + k, 11.0 + k, 11.0 + k, 5)} for k in (1, 2, 3)},
                              plain_ms=Spread(10.0, 10.0, 10.0, 5))
    f = tmp_path / "costs.jsonl"
    f.write_text(good.to_json() + "\n" + _planted(bad, path, value, raw) + "\n")
    with caplog.at_level(logging.WARNING):
        s = replayed_watch(f)
    assert s.record.cost_run_id == "good" and s.recommendation.k is not None
    (warning,) = [w for w in _warnings(caplog) if "cost-probe" in w]
    assert warning.startswith(f"{f} line 2: not a valid cost-probe record")


def test_an_adaptive_sweep_in_process_goes_on_past_hostile_records(make_model, tmp_path):
    """Every adaptive sweep in process ended in a traceback with one of these in the results
    folder, until --reprobe. Now each is said once (its file and line) and the good probe is taken."""
    from app.core.engines.base import EngineSettings
    from app.core.engines.factory import make_engine
    from app.core.session.events import AdaptiveStage, SessionFinished
    from app.core.session.request import AdaptiveOptions, SweepRequest
    from app.core.session.sweep import prepare, run

    model = make_model(0.0)
    plan = Plan(model=str(model), arms=(Arm(),), prompts=(Prompt("c1", "code", "def f(x):"),
                                                          Prompt("s1", "story", "Once upon a time")),
                engine="inprocess", n_predict=16, reps=1, warmup=0)
    request = prepare(SweepRequest(plan, EngineSettings(ctx_size=512, threads=1),
                                   AdaptiveOptions(ks=(1, 2), max_reps=2), mix="code=1,story=1",
                                   out=tmp_path / "a.jsonl")).request
    with make_engine(request.engine) as eng:
        build = eng.build
    now = dt.datetime.now(dt.timezone.utc)
    good = dataclasses.replace(_probe(model, "good", 20, 10.0, now), llama_build=build, threads=1)
    newer = dataclasses.replace(good, run_id="planted", timestamp_utc=(now - dt.timedelta(minutes=1)).isoformat())
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "earlier.jsonl").write_text("\n".join([good.to_json(), _planted(newer, ("host",), 5),
                                                     _planted(newer, STEP, None, "NaN")]) + "\n")
    (folder / "later.jsonl").write_text(_planted(newer, ("step_ms", "1"), "fast") + "\n")
    events = list(run(request))  # the old code: AttributeError ('int' object has no attribute 'get')
    said = [e.message for e in events if isinstance(e, AdaptiveStage) and e.stage == "probe"]
    left_out = sorted(m.split(": ", 1)[0] for m in said if "not a valid cost-probe record" in m)
    assert left_out == [f"{folder / 'earlier.jsonl'} line {n}" for n in (2, 3)] + [f"{folder / 'later.jsonl'} line 1"]
    assert any(m.startswith("costs from the probe made 20 min ago") for m in said), said
    assert isinstance(events[-1], SessionFinished) and events[-1].n_ok > 0
    assert [c.run_id for c in load_cost_records(tmp_path / "a.jsonl")] == ["good"]
