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
