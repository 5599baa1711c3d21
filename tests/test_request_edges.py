"""The request's edges priced (issue 57, item 4): the probe reads what a request's first step and
its capped last steps cost over steady steps (measure.whole_step.steady_steps / edges), the cost
record keeps them, and the break-even model prices an answer of n tokens with them
(breakeven.answer_speedup). Recorded numbers only."""

from __future__ import annotations

import dataclasses
import json

import pytest

from app.core.analysis import breakeven
from app.core.measure.whole_step import steady_steps
from app.core.records.cost import CostRecord, Spread
from tests.helpers import fake_costs
from tests.test_cost_where import _times

EDGE_FIRST, EDGE_LAST = "edge_first_ms", "edge_last_ms"  # whole_step's names for them


def test_the_probe_reads_the_first_and_the_capped_last_steps_of_a_request():
    # full rejection at K=3, n = 1 + 16 + 3: a first step of 150 ms, 15 steady ones of 105 ms, the
    # end caps the drafts at 2 and 1 (90, 80 ms) and one plain step (36 ms)
    tm, steps = steady_steps(_times([(1, 150.0)] + [(1, 105.0)] * 15 + [(1, 90.0), (1, 80.0), (1, 36.0)]), 3, 20)
    assert steps == 15 and tm["predicted_ms"] == pytest.approx(15 * 105.0)  # the steady reading as before
    assert tm[EDGE_FIRST] == pytest.approx(150.0 - 105.0)
    assert tm[EDGE_LAST] == pytest.approx(90.0 + 80.0 + 36.0 - 3 * 105.0)  # 3 tokens a steady step each
    # full acceptance at K=3: 4 tokens a step, no capped step at the end
    tm, _ = steady_steps(_times([(4, 160.0)] + [(4, 104.0)] * 15), 3, 65)
    assert tm[EDGE_FIRST] == pytest.approx(56.0) and tm[EDGE_LAST] == pytest.approx(0.0)
    # a plain request: its first step over the steady one
    tm, _ = steady_steps(_times([(1, 80.0)] + [(1, 36.0)] * 8), 0, 10)
    assert tm[EDGE_FIRST] == pytest.approx(44.0) and tm[EDGE_LAST] == pytest.approx(0.0)


def test_the_edges_of_a_width_pool_its_first_steps_and_take_its_capped_ones_at_full_rejection():
    from app.core.measure.whole_step import edges

    raws = {("plain", 0): [({EDGE_FIRST: 4.0, EDGE_LAST: 0.0}, 0)] * 3,
            ("accept", 1): [({EDGE_FIRST: 6.0, EDGE_LAST: 0.0}, 8), ({EDGE_FIRST: 8.0, EDGE_LAST: 0.0}, 8)],
            ("reject", 1): [({EDGE_FIRST: 7.0, EDGE_LAST: 2.5}, 8)],
            ("accept", 2): [({"predicted_n": 9}, 8)], ("reject", 2): [({"predicted_n": 9}, 8)]}  # no stamps
    e = edges(raws, 2)
    assert set(e) == {0, 1}  # K=2's requests carried no edges: left out
    assert e[0]["first"].median == 4.0 and e[1]["first"].median == 7.0 and e[1]["last"].median == 2.5


def _probe_with_edges() -> CostRecord:
    """A llama-server probe's costs: plain step 1.0 ms, K=2 steps 1.6 ms (accept) / 1.5 ms (reject),
    a request's first step 2.0 ms dearer for K=2 and 0.5 ms for the plain request, the capped
    last steps 1.2 ms at full rejection (the H200's shape: sub-millisecond steps, ms edges)."""
    sp = lambda x: Spread(x, x, x, 5)  # noqa: E731
    rec = fake_costs({1: 1.0}, 0.0)
    return dataclasses.replace(rec, engine="server", plain_ms=sp(1.0), draft_ms=None, catchup_ms=None,
                               step_ms={2: {"accept": sp(1.6), "reject": sp(1.5)}},
                               edge_ms={0: {"first": sp(0.5), "last": sp(0.0)}, 2: {"first": sp(2.0), "last": sp(1.2)}})


def test_an_answer_of_64_tokens_pays_its_requests_edges():
    costs = breakeven.Costs.from_probe(_probe_with_edges())
    alpha, k = 0.8, 2
    mean_len = breakeven.mean_accepted_length(alpha, k)  # 1 + 0.8 + 0.64 = 2.44 tokens a step
    accepted = mean_len - 1
    step = 1.5 + (1.6 - 1.5) * accepted / k
    steady = mean_len * 1.0 / step
    assert breakeven.predicted_speedup(alpha, k, costs) == pytest.approx(steady)  # no length: steady steps
    # 63 tokens after the first: 63 plain steps + 0.5 ms against 63 / 2.44 steps + 2.0 + 1.2 x (1 - 1.44 / 2)
    edge = 2.0 + 1.2 * (1 - accepted / k)
    at64 = (63 * 1.0 + 0.5) / (63 / mean_len * step + edge)
    assert breakeven.predicted_speedup(alpha, k, costs, 64) == pytest.approx(at64)
    assert at64 / steady == pytest.approx(0.953, abs=0.001)  # 5 % less at 64 tokens
    at1024 = breakeven.predicted_speedup(alpha, k, costs, 1024)
    assert at64 < at1024 < steady and at1024 / steady > 0.99  # a long answer pays about the steady steps
    # a probe without edges (older records, a server that stamps no tokens): the steady speedup at any length
    plain = breakeven.Costs.from_probe(dataclasses.replace(_probe_with_edges(), edge_ms=None))
    assert breakeven.predicted_speedup(alpha, k, plain, 64) == pytest.approx(steady)


def test_the_cost_record_keeps_the_edges_and_checks_them_on_read():
    rec = _probe_with_edges()
    back = CostRecord.from_dict(json.loads(rec.to_json()))
    assert back.edge_ms == rec.edge_ms
    d = json.loads(rec.to_json())
    d["edge_ms"]["2"]["last"]["median"] = -0.4  # cheaper than the steady steps it replaces: kept
    assert CostRecord.from_dict(d).edge_ms[2]["last"].median == -0.4
    d["edge_ms"]["2"]["first"]["median"] = float("inf")
    with pytest.raises(ValueError, match=r"edge_ms\[2\]\.first\.median"):
        CostRecord.from_dict(d)
    d["edge_ms"] = {"65": d["edge_ms"]["0"]}
    with pytest.raises(ValueError, match="edge_ms"):
        CostRecord.from_dict(d)


def _sweep_at_64_tokens() -> list:
    """Recorded: 6 repetitions of code, baseline at 40 tok/s, K=2 at 1.40x, 64 tokens a request,
    52 drafts of which 37 accepted (acceptance 71 %), on the probe's set-up."""
    from app.core.records.arm import Arm
    from tests.helpers import make_record

    out = []
    for rep in range(6):
        base = 40.0 * (1 + 0.004 * (-1) ** rep)
        out.append(make_record(Arm(), run_id=f"b{rep}", rep=rep, tok_s=base, n_predict=64, n_generated=64))
        out.append(make_record(Arm(2, 0.0), run_id=f"k{rep}", rep=rep, tok_s=base * 1.40 * (1 + 0.003 * (-1) ** rep),
                               n_predict=64, n_generated=64, draft_n=52, draft_accepted=37, acceptance=37 / 52))
    return out


def _probe_of_the_sweep(**over) -> CostRecord:
    return dataclasses.replace(_probe_with_edges(), model_path="/m.gguf", llama_build="b1", **over)


def test_the_verdict_says_what_an_answer_of_128_tokens_and_of_the_users_length_gains():
    from app.core.analysis.analysis import analyze
    from app.core.verdict import build_verdict, verdict_dict, verdict_text
    from app.core.records.arm import Arm

    runs = _sweep_at_64_tokens()
    v = build_verdict(runs, cost_records=[_probe_of_the_sweep()], answer_tokens=1024)
    assert v.cost_source == "probe" and v.pick.arm == Arm(2, 0.0)
    measured = v.pick.ratio.estimate
    alpha = analyze(runs).cell("code", Arm(2, 0.0)).alpha
    mean_len = breakeven.mean_accepted_length(alpha, 2)
    step = 1.5 + 0.1 * (mean_len - 1) / 2
    edge = 2.0 + 1.2 * (1 - (mean_len - 1) / 2)

    def model(n):  # by hand: (n - 1) plain steps + the plain edge over (n - 1) / mean_len steps + the K=2 edge
        return ((n - 1) + 0.5) / ((n - 1) / mean_len * step + edge)

    at128, at1024 = measured * model(128) / model(64), measured * model(1024) / model(64)
    assert [(g.tokens, g.own) for g in v.answers] == [(128, False), (1024, True)]
    assert v.answers[0].speedup == pytest.approx(at128) and v.answers[1].speedup == pytest.approx(at1024)
    assert measured < at128 < at1024  # a longer answer pays the edges over more tokens
    words = (f"An answer of 128 tokens: {at128:.2f}x; of 1,024 tokens (your answer length): {at1024:.2f}x "
             "(each request's first and last steps priced by the cost probe)")
    assert v.answer_words == words and f"  {words}" in verdict_text(v).splitlines()
    assert verdict_dict(v)["answers"] == [{"tokens": 128, "speedup": pytest.approx(at128), "own": False},
                                          {"tokens": 1024, "speedup": pytest.approx(at1024), "own": True}]
    # the model check prices the runs' own length (64 tokens) with the edges: within 5 % of the measurement
    (check,) = v.model_check.checks
    assert check.predicted == pytest.approx(breakeven.predicted_speedup(alpha, 2, v.costs, 64))
    # no length of the user's: 128 tokens alone; a probe without edges: no length is said
    assert [g.tokens for g in build_verdict(runs, cost_records=[_probe_of_the_sweep()]).answers] == [128]
    bare = build_verdict(runs, cost_records=[_probe_of_the_sweep(edge_ms=None)], answer_tokens=1024)
    assert bare.answers == () and "An answer of" not in verdict_text(bare)


def test_recommend_takes_the_answer_length(tmp_path, capsys):
    from app.cli import main

    path = tmp_path / "results.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in _sweep_at_64_tokens()) + _probe_of_the_sweep().to_json() + "\n")
    assert main(["recommend", str(path), "--answer-length", "1024"]) == 0
    assert "of 1,024 tokens (your answer length)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["recommend", str(path), "--answer-length", "0"])
    assert "--answer-length" in capsys.readouterr().err


def test_the_window_takes_the_answer_length_and_says_the_gains_on_the_mixs_line(state, qtbot, tmp_path):
    pytest.importorskip("PySide6")
    from app.gui.tabs.export import ExportTab
    from app.gui.tabs.results.banner import VerdictBanner
    from tests.conftest import make_tab

    state.set_results(_sweep_at_64_tokens(), tmp_path / "r.jsonl", cost_records=[_probe_of_the_sweep()])
    assert [g.tokens for g in state.verdict.answers] == [128]
    export = make_tab(ExportTab, state)
    qtbot.addWidget(export)
    export.answer_box.setValue(1024)  # as recommend --answer-length 1024
    assert state.answer_length == 1024 and [g.tokens for g in state.verdict.answers] == [128, 1024]
    assert state.settings.value("answer_length") in (1024, "1024")  # kept for the next start
    banner = VerdictBanner()
    qtbot.addWidget(banner)
    banner.show_verdict(state.verdict)
    assert state.verdict.answer_words in banner.rows[""].reason.text()
    export.answer_box.setValue(0)  # "not set": 128 tokens alone
    assert state.answer_length is None and [g.tokens for g in state.verdict.answers] == [128]
    state.settings.setValue("answer_length", "12; rm -rf /")  # a hostile settings file: not set
    from app.core.analysis.answer import answer_length_of

    assert answer_length_of(state.settings.value("answer_length")) is None and answer_length_of("2048") == 2048
    assert answer_length_of(True) is None and answer_length_of(10**9) is None


EDGES_64 = __import__("pathlib").Path(__file__).parent / "data" / "edges_demo_64.jsonl"


def test_a_recorded_probe_with_edges_prices_a_recorded_64_token_sweep():
    """Recorded (benchmarks/breakeven_validation.py --size demo --n-predict 64 --p 0,0.6 --k 1,2,3
    --reps 6 --probe-rounds 40 --probe-precision 2 --save, in process, BENCH_THREADS=1, on the
    2-core machine at load 12-15): the in-process probe with the request's edges and the two
    sweeps. At 64 tokens each prediction moves by what the recorded edges say, and lies inside its
    cell's 95 % interval, the mean error under 5 % (the worst cell, 7.9 %, is the machine's noise:
    its interval is ±12 %)."""
    from app.core.analysis.analysis import analyze
    from app.core.records.arm import Arm
    from app.core.records.reader import load_cost_records, load_records

    (probe,) = load_cost_records(str(EDGES_64))
    runs = load_records(str(EDGES_64))
    costs = breakeven.Costs.from_probe(probe)
    e = probe.edge_ms
    assert set(e) == {0, 1, 2, 3} and e[0]["first"].median > 0 and all(e[k]["first"].median > 0 for k in (1, 2, 3))
    errors = []
    for model in sorted({r.model_path for r in runs}):
        a = analyze([r for r in runs if r.model_path == model])
        for k in (1, 2, 3):
            c = a.cell("t", Arm(k, 0.0))
            mean_len = breakeven.mean_accepted_length(c.alpha, k)
            acc = mean_len - 1
            step = costs.step(k, acc)
            edge = e[k]["first"].median + e[k]["last"].median * (1 - acc / k)
            by_hand = (63 * costs.verify(1) + e[0]["first"].median + e[0]["last"].median) / (63 / mean_len * step + edge)
            pred = breakeven.predicted_speedup(c.alpha, k, costs, 64)
            assert pred == pytest.approx(by_hand)
            assert pred != pytest.approx(breakeven.predicted_speedup(c.alpha, k, costs), rel=1e-4)  # the edges move it
            assert c.ratio.lo <= pred <= c.ratio.hi
            errors.append(abs(pred / c.ratio.estimate - 1))
    assert len(errors) == 6 and sum(errors) / len(errors) < 0.05
