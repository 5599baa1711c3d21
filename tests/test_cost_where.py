"""Costs priced where the runs ran: the llama-server probe (the whole speculative step with
llama.cpp's synthetic acceptance), the whole-step in-process probe, cost records that say where
they were measured, and the verdict that prices runs only with a probe of their own set-up."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import stat
import statistics
from pathlib import Path

import pytest

from helpers import cli, fake_costs, make_record

from app.core.analysis import breakeven
from app.core.analysis.costs import RunSetup, matching_probe, run_setup
from app.core.calibrated import gemma4 as g4
from app.core.common.errors import UserError
from app.core.common.cancel import CancelToken
from app.core.measure.cost_text import format_probe
from app.core.measure.probe import run_probe
from app.core.measure.whole_step import ProbeProgress, steady_steps, step_cost, whole_steps
from app.core.measure.server_probe import NoSyntheticAcceptance, run_server_probe, synth_problem
from app.core.records.cost import CostRecord, Spread
from app.core.records.reader import load_cost_records
from app.core.verdict.verdict import FITTED, PROBE, build_verdict


def _record(events) -> CostRecord:
    recs = [e for e in events if isinstance(e, CostRecord)]
    assert len(recs) == 1
    return recs[0]


def _sp(x: float) -> Spread:
    return Spread(x, x, x, 5)


def _whole(engine="server", backend="CUDA", devices=("CUDA0 (H200)",), build="b1", depth=64, model="/m") -> CostRecord:
    rec = fake_costs({1: 10.0}, 0.0)
    return dataclasses.replace(rec, engine=engine, backend=backend, devices=devices, llama_build=build, depth=depth,
                               model_path=model, draft_ms=None, catchup_ms=None, plain_ms=_sp(10.0),
                               step_ms={k: {"accept": _sp(10.0 + k), "reject": _sp(12.0 + k)} for k in (1, 2, 3)})


# -- the accounting and the model, on numbers -------------------------------------------------------
def test_step_cost_recovers_the_full_step_from_a_request_with_capped_last_steps():
    # full rejection at K=3, N = 40: 36 full steps of 50 ms, then drafts of 2 and 1 (priced on the line
    # from the plain 20 ms step) and one plain step; /metrics counts the 38 steps that drafted
    t1, c, k = 20.0, 50.0, 3
    total = 36 * c + (t1 + 2 / 3 * (c - t1)) + (t1 + 1 / 3 * (c - t1)) + t1
    tm = {"predicted_n": 40, "predicted_ms": total, "draft_n": 36 * 3 + 2 + 1, "draft_n_accepted": 0}
    assert step_cost(tm, 38, k, t1) == pytest.approx(c)
    # full acceptance, whole steps only: 12 steps of K + 1 tokens
    tm = {"predicted_n": 1 + 12 * 4, "predicted_ms": 12 * 70.0, "draft_n": 36, "draft_n_accepted": 36}
    assert step_cost(tm, 12, k, t1) == pytest.approx(70.0)
    assert step_cost({"predicted_n": 5, "predicted_ms": 80.0}, 0, k, t1) is None  # no step drafted


def _times(steps: list[tuple[int, float]]) -> list[float]:
    """Token times (s) of a request: the first token at 0, then each step's tokens at its end."""
    out, t = [0.0], 0.0
    for tokens, ms in steps:
        t += ms / 1000
        out += [t] * tokens
    return out


def test_the_in_process_probe_times_only_the_steady_full_width_steps():
    # recorded shape of a full-rejection request at K=3, n = 1 + 16 + 3: a slow first step (150 ms),
    # 15 steps of 105 ms, then the end caps the drafts at 2 and 1 (90, 80 ms) and one plain step (36 ms)
    k, n = 3, 20
    times = _times([(1, 150.0)] + [(1, 105.0)] * 15 + [(1, 90.0), (1, 80.0), (1, 36.0)])
    assert len(times) == n
    tm, steps = steady_steps(times, k, n)
    assert steps == 15 and tm["draft_n"] == 45 and tm["draft_n_accepted"] == 0
    assert step_cost(tm, steps, k, 36.0) == pytest.approx(105.0)
    # the request's whole span, priced by step_cost's line, reads it dear: the bias this removes
    span = {"predicted_n": n, "predicted_ms": (times[-1] - times[0]) * 1000, "draft_n": 16 * 3 + 2 + 1,
            "draft_n_accepted": 0}
    assert step_cost(span, 18, k, 36.0) > 108.0
    # full acceptance: 16 steps of K + 1 tokens, the first one slow
    times = _times([(4, 160.0)] + [(4, 104.0)] * 15)
    tm, steps = steady_steps(times, k, 65)
    assert steps == 15 and tm["draft_n_accepted"] == 45 and step_cost(tm, steps, k, 36.0) == pytest.approx(104.0)
    # mixed acceptance counts every full-width step's tokens; a plain request its plain steps
    times = _times([(2, 120.0), (1, 100.0), (4, 110.0), (2, 100.0), (1, 50.0)])
    tm, steps = steady_steps(times, 3, 11)
    assert (steps, tm["predicted_n"], tm["draft_n_accepted"]) == (2, 6, 3)  # the 4th step was capped at 2
    assert tm["predicted_ms"] == pytest.approx(210.0)
    tm, steps = steady_steps(_times([(1, 80.0)] + [(1, 36.0)] * 8), 0, 10)
    assert steps == 0 and tm["predicted_ms"] / (tm["predicted_n"] - 1) == pytest.approx(36.0)
    assert steady_steps([0.0, 0.1], 3, 2)[1] == 0  # nothing steady: no step, and step_cost says None


def test_whole_step_costs_interpolate_by_the_drafts_accepted():
    costs = breakeven.Costs.from_probe(_whole())
    assert costs.whole_steps and costs.widths() == [1, 2, 3] and costs.verify(1) == 10.0
    assert costs.step(2) == 12.0 and costs.step(2, 0.0) == 14.0 and costs.step(2, 1.0) == pytest.approx(13.0)
    # speedup = tokens per step * plain step / the step at that acceptance
    assert breakeven.speedup_at_length(2.0, 2, costs) == pytest.approx(2.0 * 10.0 / 13.0)
    with pytest.raises(KeyError):
        costs.step(4)  # a width the probe did not measure is not priced


# -- the record: where it ran, and older files --------------------------------------------------------
def test_cost_records_keep_where_they_ran_and_old_ones_still_load(tmp_path):
    rec = _whole()
    back = CostRecord.from_dict(json.loads(rec.to_json()))
    assert back == rec and back.where() == "through llama-server on CUDA0 (H200)"
    old = json.loads(fake_costs({1: 10.0, 2: 12.0}, 1.0).to_json())  # a schema-4 line: none of the new keys
    for key in ("backend", "devices", "spec_type", "drafter", "step_ms", "mid_check", "plain_ms"):
        old.pop(key)
    old["schema_version"] = 4
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({**old, "record_type": "cost"}) + "\n")
    (loaded,) = load_cost_records(f)
    assert loaded.backend is None and loaded.devices == () and loaded.step_ms is None and loaded.prices_steps


# -- which probe prices which runs ------------------------------------------------------------------
def _runs(engine="server", backend="CUDA", devices=("CUDA0 (H200)",), build="b1", model="/m"):
    return [make_record(engine=engine, backend=backend, devices=devices, llama_build=build, model_path=model)]


def test_a_probe_prices_only_runs_of_its_own_set_up():
    cuda = _runs()
    setup = run_setup(cuda)
    inproc = _whole(engine="inprocess", backend="CPU", devices=("CPU",))
    probe, why = matching_probe([inproc], setup)
    assert probe is None and why == "the probe ran in process on the CPU; these runs ran through llama-server on CUDA0 (H200)"
    server = _whole()
    assert matching_probe([inproc, server], setup) == (server, None)
    probe, why = matching_probe([_whole(devices=("CUDA1 (H200)",))], setup)
    assert probe is None and "CUDA1" in why
    probe, why = matching_probe([_whole(build="b2")], setup)
    assert probe is None and why == "the probe ran on llama.cpp b2; these runs on b1"
    assert matching_probe([_whole(model="/other")], setup) == (None, None)  # no probe of this model at all
    # nearest depth among the matching ones, the latest of equals
    deep, shallow, again = _whole(depth=4096), _whole(depth=64), _whole(depth=64, build="b1")
    assert matching_probe([deep, shallow, again], dataclasses.replace(setup, depth=0))[0] is again
    assert matching_probe([deep, shallow], dataclasses.replace(setup, depth=3000))[0] is deep
    # an older probe (no backend, no devices) is not held against what it did not record
    old = dataclasses.replace(_whole(), backend=None, devices=())
    assert matching_probe([old], setup)[0] is old
    assert RunSetup("/m", "inprocess", "CPU").where() == "in process on the CPU"


def _cuda_runs() -> list:
    runs = []
    for rep in range(3):
        for k in (None, 2):
            n = 64
            runs.append(make_record(run_id=f"{k}-{rep}", arm_kind="baseline" if k is None else "mtp", k=k,
                                    p_min=None if k is None else 0.0, rep=rep, n_predict=n, n_generated=n,
                                    tok_s=100.0 if k is None else 1 / 0.007, draft_n=40 if k else None, draft_accepted=30 if k else None,
                                    acceptance=0.75 if k else None, backend="CUDA", devices=("CUDA0 (H200)",),
                                    token_times=tuple(i * (0.01 if k is None else 0.007) for i in range(n)),
                                    spec_type=None if k is None else "draft-mtp", model_path="/m"))
    return runs


def test_the_verdict_says_which_probe_priced_the_curves():
    runs = _cuda_runs()
    fitted = build_verdict(runs, cost_records=[_whole(engine="inprocess", backend="CPU", devices=("CPU",))])
    assert fitted.cost_source == FITTED and fitted.cost_probe is None
    assert fitted.cost_label == ("costs fitted from the runs: the probe ran in process on the CPU; these runs ran "
                                 "through llama-server on CUDA0 (H200)")
    priced = build_verdict(runs, cost_records=[_whole()])
    assert priced.cost_source == PROBE and priced.costs.whole_steps
    assert priced.cost_label.startswith("priced by the cost probe through llama-server on CUDA0 (H200)")


def _replay(load):
    """Requests on a machine whose speed changes over time: request number i costs ``load(i)`` times
    what it costs on a quiet machine (plain step 5 ms; whole step at K: 10 + 2K ms when it accepts
    everything, 11 + 2K ms when it rejects everything, the line between for the drafts accepted)."""
    count = [0]

    def request(k, rates, n):
        f = load(count[0])
        count[0] += 1
        if k == 0:
            return {"predicted_n": n, "predicted_ms": (n - 1) * 5.0 * f}, 0
        steps = 8
        a = sum(rates)  # the synthetic rates are unconditional per position: their sum is E[accepted]
        acc = round(steps * a)
        cost = (11.0 + 2 * k) - (acc / steps) / k
        return ({"predicted_n": 1 + steps + acc, "predicted_ms": steps * cost * f, "draft_n": steps * k,
                 "draft_n_accepted": acc}, steps)
    return request


def _steps(request, interleave, by_width=False):
    gen = whole_steps(request, 5.0, 3, 8, 5, 5, 0.05, CancelToken(), interleave=interleave, warmup_whole=True,
                      by_width=by_width)
    while True:
        try:
            next(gen)
        except StopIteration as s:
            return s.value


def test_whole_steps_are_measured_interleaved_and_paired_so_a_busy_spell_does_not_move_one_setting():
    # the cause of issue 28's model-check misses through llama-server: the probe measured each
    # setting in its own window (one server after the other), so a busy spell or slow drift over a
    # window moved that setting alone (K=1 came out dearer at full rejection than at full
    # acceptance, 14.8 against 11.7 ms, and three probes back to back disagreed by 10-25 %)
    def spell(i):  # a busy spell over the six requests the one-after-the-other probe spends on K=1 rejecting
        return 1.5 if 6 <= i < 12 else 1.0

    def drift(i):  # the machine slows down steadily over the probe (by a sixth over it)
        return 1.0 + 0.003 * i

    for load, by_width in ((spell, False), (drift, False), (spell, True), (drift, True)):
        steps, _, _, plains, _ = _steps(_replay(load), interleave=True, by_width=by_width)
        plain = statistics.median(plains)  # each step is priced at the plain step's median
        for k in (1, 2, 3):  # step / plain, what the speedup depends on, as on a quiet machine
            assert steps[k]["accept"].median / plain == pytest.approx((10.0 + 2 * k) / 5.0, rel=0.03)
            assert steps[k]["reject"].median / plain == pytest.approx((11.0 + 2 * k) / 5.0, rel=0.03)
    # one setting after the other, the same spell makes K=1 rejecting half as dear again as it is
    seq = _steps(_replay(spell), interleave=False)[0]
    assert seq[1]["reject"].median / seq[1]["accept"].median > 1.3


# -- real probes ------------------------------------------------------------------------------------
def test_server_probe_times_the_whole_step_on_the_servers_device(server_bin, make_model):
    model = make_model(0.0)
    rec = _record(run_server_probe(str(model), server_bin=server_bin, max_k=2, min_rounds=1, max_rounds=2, steps=6))
    assert rec.engine == "server" and rec.backend == "CPU" and rec.devices == ("CPU",)
    assert rec.llama_build and rec.llama_build != "unknown" and rec.spec_type == "draft-mtp" and rec.drafter is None
    assert sorted(rec.step_ms) == [1, 2] and all(set(v) == {"accept", "reject"} for v in rec.step_ms.values())
    assert all(s.median > 0 for v in rec.step_ms.values() for s in v.values()) and rec.plain_ms.median > 0
    assert rec.mid_check["k"] == 1 and 0 < rec.mid_check["accepted_per_step"] < 1
    assert CostRecord.from_dict(json.loads(rec.to_json())) == rec
    text = format_probe(rec)
    assert "through llama-server on the CPU" in text and "whole speculative step" in text
    assert "T(n)/T(1)" not in text  # no verify table: the server times whole steps only
    assert breakeven.Costs.from_probe(rec).widths() == [1, 2]


def test_server_probe_interleaves_the_settings_with_the_plain_step(server_bin, make_model):
    """One K's servers and the baseline stay up and each round visits them all with the plain step,
    which is measured in the same rounds (not before and after the settings, one window each)."""
    events = list(run_server_probe(str(make_model(0.0)), server_bin=server_bin, max_k=1, min_rounds=2,
                                   max_rounds=2, steps=4))
    rec = _record(events)
    rounds = [e.message.split(" (")[0] for e in events
              if isinstance(e, ProbeProgress) and e.message.startswith("whole steps")]
    assert rounds == ["whole steps, K=1, round 1", "whole steps, K=1, round 2"]
    assert rec.plain_ms.n == rec.step_ms[1]["accept"].n == rec.step_ms[1]["reject"].n == 2


def test_the_server_probe_reads_its_steady_steps_from_the_servers_own_stamps(server_bin, make_model):
    """llama-server stamps every token with its own clock (timings_per_token), the tokens of one
    step sharing the stamp: the server probe reads a request as the in-process probe reads its own,
    its full-width steps after the first (the first step and the capped last ones left out)."""
    from app.core.engines.server.engine import ServerEngine
    from app.core.measure.server_probe import SYNTH_FLAG, timed_request
    from app.core.measure.whole_step import run_to_end
    from app.core.records.arm import Arm
    from app.core.records.sampler import greedy

    cancel = CancelToken()
    eng = ServerEngine(server_bin, ctx_size=512, threads=2)
    try:
        cfg = eng.config_for(str(make_model(0.0)), Arm(2, 0.0))
        srv = eng.server(dataclasses.replace(cfg, extra=cfg.extra + (SYNTH_FLAG, "1,1")), cancel)
        prompt = srv.tokenize("hello world")
        n = 1 + 6 * 3 + 1  # six full steps of K + 1 tokens, then one token the budget leaves undrafted
        raw = run_to_end(srv.stream_completion(prompt, n, greedy(), cancel, ignore_eos=True, server_times=True))
        stamps = raw["server_times"]
        assert len(stamps) == len(raw["tokens"]) == n and stamps == sorted(stamps)
        assert [len(list(g)) for _, g in itertools.groupby(stamps)] == [1] + [3] * 6 + [1]
        tm, steps = timed_request(srv, prompt, n, cancel, k=2)
        assert steps == 5 and tm["predicted_n"] == 1 + 5 * 3 and tm["draft_n"] == 10 and tm["draft_n_accepted"] == 10
        own, own_steps = steady_steps(stamps, 2, n)  # the first request, read the same way
        assert own_steps == 5 and own["predicted_ms"] == pytest.approx((stamps[-2] - stamps[3]) * 1000)
        assert tm["predicted_ms"] > 0
        plain = run_to_end(srv.stream_completion(prompt, n, greedy(), cancel, ignore_eos=True))
        assert plain["server_times"] is None  # not asked for: the sweep's requests stay as they were
    finally:
        eng.close()


def test_a_chunk_stamp_is_read_only_when_it_is_a_finite_time():
    from app.core.engines.server.process import _stamp

    assert _stamp({"predicted_ms": 12.5}) == pytest.approx(0.0125) and _stamp({"predicted_ms": 0}) == 0.0
    for bad in (None, [], "x", {}, {"predicted_ms": "12"}, {"predicted_ms": True}, {"predicted_ms": -1.0},
                {"predicted_ms": float("nan")}, {"predicted_ms": float("inf")}, {"predicted_ms": 1e12}):
        assert _stamp(bad) is None


def test_server_probe_of_a_gemma4_pair_drafts_with_the_assistant(server_bin, tmp_path):
    target, assistant = g4.make_gemma4_pair(tmp_path)
    rec = _record(run_server_probe(str(target), server_bin=server_bin, drafter=str(assistant), max_k=2,
                                   min_rounds=1, max_rounds=1, steps=6))
    assert rec.engine == "server" and rec.drafter == str(assistant.resolve()) and rec.backend == "CPU"
    assert sorted(rec.step_ms) == [1, 2] and rec.llama_build


def test_inprocess_probe_times_whole_steps_in_its_own_loop(make_model):
    rec = _record(run_probe(str(make_model(0.0)), max_batch=3, min_rounds=1, max_rounds=1, steps=6))
    assert rec.engine == "inprocess" and rec.backend == "CPU" and rec.devices and rec.spec_type == "draft-mtp"
    assert sorted(rec.step_ms) == [1, 2] and rec.plain_ms is not None and rec.draft_ms is not None
    assert breakeven.Costs.from_probe(rec).whole_steps


def test_whole_step_requests_are_centred_on_the_probes_depth(make_model, monkeypatch):
    """A request at full acceptance is K + 1 times longer than one at full rejection or a plain one;
    each starts half its length before the depth, so all are measured around it (started at the
    depth, the longest ones were measured deeper than the plain step they are set against)."""
    from app.core.engines.inprocess import InProcessEngine
    from app.core.measure.whole_step import centred_prompt_len

    assert centred_prompt_len(64, 97) == 16 and centred_prompt_len(64, 25) == 52 and centred_prompt_len(8, 97) == 1
    seen: list[tuple[int, int, bool]] = []
    real = InProcessEngine.generate

    def generate(self, model, arm, text, **kw):
        seen.append((len(self.prompt_tokens(text, kw["raw"])), kw["n_predict"], bool(arm.k)))
        return (yield from real(self, model, arm, text, **kw))

    monkeypatch.setattr(InProcessEngine, "generate", generate)
    depth = 48
    _record(run_probe(str(make_model(0.0)), depth=depth, max_batch=3, min_rounds=1, max_rounds=1, steps=6))
    measured = [(p, n, spec) for p, n, spec in seen if n > 4]  # not the warm-ups (4 tokens at most)
    lengths = {n for _, n, _ in measured}
    assert len(lengths) >= 4 and any(spec for *_, spec in measured) and any(not spec for *_, spec in measured)
    for p, n, _ in measured:  # the filler's words: at most a few tokens over the centred length
        assert centred_prompt_len(depth, n) <= p <= centred_prompt_len(depth, n) + 3
        assert abs(p + (n - 1) / 2 - depth) <= 4


def _without_synth(tmp_path: Path, real: str) -> str:
    """A real llama-server behind a script whose --help leaves out the synthetic acceptance flags."""
    fake = tmp_path / "llama-server"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "--help" ]; then "{real}" --help | grep -v -- "--spec-synth"; exit 0; fi\n'
                    f'exec "{real}" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return str(fake)


def test_a_server_without_synthetic_acceptance_is_one_line(server_bin, make_model, tmp_path):
    assert synth_problem(frozenset({"--spec-synth-rates"})) is None
    fake = _without_synth(tmp_path, server_bin)
    with pytest.raises(NoSyntheticAcceptance) as e:
        _record(run_server_probe(str(make_model(0.0)), server_bin=fake, max_k=1, min_rounds=1, max_rounds=1))
    assert isinstance(e.value, UserError) and "--spec-synth-rates" in str(e.value) and "\n" not in str(e.value)
    r = cli("probe", "--engine", "server", "--server-bin", fake, "--model", str(make_model(0.0)), "--max-batch", "2",
            "--max-rounds", "1", "--out", str(tmp_path / "r.jsonl"))
    assert r.returncode != 0 and "Traceback" not in r.stderr and "--spec-synth-rates" in r.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_recommend_prices_server_runs_only_with_a_server_probe(server_bin, make_model, tmp_path):
    model, out = str(make_model(0.0)), str(tmp_path / "r.jsonl")
    env = {"MTP_TUNER_TEST_SERVER_BIN": server_bin}
    r = cli("bench", "--model", model, "--engine", "server", "--server-bin", server_bin, "--k", "1", "--reps", "2",
            "--n-predict", "16", "--per-task", "1", "--tasks", "story", "--warmup", "0", "--out", out, env=env)
    assert r.returncode == 0, r.stderr
    r = cli("probe", "--model", model, "--max-batch", "2", "--max-rounds", "1", "--out", out)
    assert r.returncode == 0, r.stderr

    def verdict() -> dict:
        r = cli("recommend", out, "--json", "--server-bin", server_bin)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    v = verdict()
    assert v["cost_source"] != "probe" and v["cost_probe"] is None
    assert v["cost_note"] and "in process" in v["cost_note"] and "through llama-server" in v["cost_note"]
    r = cli("probe", "--engine", "server", "--server-bin", server_bin, "--model", model, "--max-batch", "2",
            "--max-rounds", "1", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "whole speculative step" in r.stdout and "through llama-server" in r.stdout
    v = verdict()
    assert v["cost_source"] == "probe" and v["cost_probe"]["engine"] == "server" and v["cost_note"] is None
    assert v["cost_probe"]["backend"] == "CPU" and v["costs"]["step_ms"]
    assert os.path.getsize(out) > 0


def test_the_window_names_what_priced_the_curves_and_where_the_probe_ran(state, qtbot, tmp_path):
    from app.gui.tabs.machine import MachineTab
    from app.gui.tabs.results import ResultsTab
    from conftest import make_tab

    results, machine = make_tab(ResultsTab, state), make_tab(MachineTab, state)
    for t in (results, machine):
        qtbot.addWidget(t)
    state.set_results(_cuda_runs(), tmp_path / "r.jsonl",
                      cost_records=[_whole(engine="inprocess", backend="CPU", devices=("CPU",))])
    assert results.cost_label.text() == ("Costs: costs fitted from the runs: the probe ran in process on the CPU; "
                                         "these runs ran through llama-server on CUDA0 (H200).")
    state.add_probe(_whole())  # a probe through llama-server on the runs' device
    assert results.cost_label.text().startswith("Costs: priced by the cost probe through llama-server on CUDA0")
    assert machine.probe_verdict.text().startswith("Measured through llama-server on CUDA0 (H200): MTP can pay")
    xs, ys = machine.probe_curve.getData()
    assert list(xs) == [1, 2, 3, 4] and ys[0] == 1.0 and ys[1] == pytest.approx(11.0 / 10.0)


def test_the_machine_tabs_probe_runs_where_the_sweep_will(state, qtbot, sweep_tab):
    assert state.sweep_engine == "inprocess"
    sweep_tab.form.engine_box.setCurrentIndex(1)
    assert state.sweep_engine == "server"


def test_the_adaptive_planner_probes_with_the_engine_it_sweeps_with(server_bin, make_model, tmp_path):
    from app.core.engines.server.engine import ServerEngine
    from app.core.measure.plan import Plan
    from app.core.records.arm import Arm
    from app.core.records.prompt import Prompt
    from app.core.records.writer import ResultsWriter
    from app.core.session.adaptive import adaptive_sweep

    plan = Plan(model=str(make_model(0.0)), arms=(Arm(),), prompts=(Prompt("a", "code", "hello world"),),
                engine="server", n_predict=12, reps=1, warmup=0)
    out = tmp_path / "r.jsonl"
    writer = ResultsWriter(out)
    with ServerEngine(server_bin, ctx_size=1024) as eng:
        gen = adaptive_sweep(plan, eng, ks=(1, 2), min_reps=1, max_reps=1, probe_rounds=1, writer=writer)
        for ev in gen:  # the probe comes first, and its record is written: stop when it has decided
            if getattr(ev, "stage", None) == "probe" and "can pay" in ev.message:
                break
        gen.close()
    writer.close()
    (cost,) = load_cost_records(out)
    assert cost.engine == "server" and cost.backend == "CPU" and sorted(cost.step_ms) == [1, 2]


def test_a_model_without_mtp_heads_is_one_line_before_any_server_starts(make_model, tmp_path):
    r = cli("probe", "--engine", "server", "--model", str(make_model(0.0, mtp=False)), "--max-batch", "2",
            "--max-rounds", "1", "--out", str(tmp_path / "r.jsonl"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "no MTP heads" in r.stderr and "--drafter" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "exited during start-up" not in r.stderr


def test_inprocess_synthetic_acceptance_sets_the_decision_not_the_drafts(make_model):
    from app.core.common.cancel import CancelToken
    from app.core.engines.inprocess import InProcessEngine
    from app.core.records.arm import Arm
    from app.core.records.sampler import greedy

    def run(eng, model, rates):
        eng.synth_rates = rates
        g = eng.generate(str(model), Arm(2), "hello world", raw=True, n_predict=25, sampler=greedy(),
                         cancel=CancelToken(), ignore_eos=True)
        while True:
            try:
                next(g)
            except StopIteration as s:
                return s.value

    with InProcessEngine(ctx_size=512, max_k=2) as eng:
        real = run(eng, make_model(0.0), None)  # the designed model: every draft right
        assert real.draft_accepted == real.draft_n > 0
        none = run(eng, make_model(0.0), (0.0, 0.0))  # every draft rejected all the same
        assert none.draft_accepted == 0 and none.draft_steps == 23 and len(none.tokens) == 25
        every = run(eng, make_model(0.6), (1.0, 1.0))  # a poor head's drafts all taken
        assert every.draft_accepted == every.draft_n == 16 and every.draft_steps == 8
