"""The network probe's arithmetic on recorded numbers (no timing): round trips from the slope, the
relay's own cost, the explanation, the prediction at another round trip, and the record read back
typed and bounded."""

from __future__ import annotations

import dataclasses
import json

import pytest

from app.core.analysis import breakeven
from app.core.analysis.network import TYPICAL_LINKS, explain, latest_network, links_of, network_model, predictions
from app.core.common.errors import UserError
from app.core.records.cost import CostRecord, NetworkCost, Spread
from helpers import fake_costs

R0, RELAY = 0.05, 0.1  # the link's round trip, the relay's own cost of one (ms)
# (compute ms, round trips) of each step: the plain one, K=2 at full acceptance and at full rejection
PLAIN, ACCEPT, REJECT = (10.0, 3.0), (14.0, 6.0), (12.0, 5.0)


def sp(x: float) -> Spread:
    return Spread(x, x * 0.98, x * 1.02, 7)


def points(line: tuple[float, float], delays: tuple[float, ...]) -> tuple[Spread, ...]:
    """What the probe would time through the relay at each delay for a step of this line."""
    c, n = line
    return tuple(sp(c + n * (R0 + RELAY + 2 * d)) for d in delays)


def direct(line: tuple[float, float]) -> Spread:
    """What the probe times for a step of this line without the relay: the link as it is."""
    return sp(line[0] + line[1] * R0)


def net_record(delays: tuple[float, ...] = (0.0, 2.0), rtt: float | None = R0) -> CostRecord:
    net = NetworkCost(delays, points(PLAIN, delays), {2: {"accept": points(ACCEPT, delays),
                                                          "reject": points(REJECT, delays)}},
                      direct(PLAIN), rtt, 2, ("-ot", r"blk\.4\.=CPU"),
                      direct_ms={2: {"accept": direct(ACCEPT), "reject": direct(REJECT)}})
    return dataclasses.replace(fake_costs({1: 10.0}, 1.0), engine="server", network=net, draft_ms=None, catchup_ms=None,
                               timestamp_utc="2026-12-03T16:00:00.000+00:00")


def test_the_slope_is_the_round_trips_and_the_relay_is_taken_out():
    rec = net_record()
    assert rec.network is not None
    assert rec.network.relay_ms == pytest.approx(RELAY)
    m = network_model(rec)
    assert m is not None
    assert (m.plain.compute_ms, m.plain.round_trips) == pytest.approx(PLAIN)
    assert (m.accept[2].compute_ms, m.accept[2].round_trips) == pytest.approx(ACCEPT)
    assert (m.reject[2].compute_ms, m.reject[2].round_trips) == pytest.approx(REJECT)
    # the step at the link as it is, timed without the relay: what a later sweep is priced with
    assert m.accept[2].at(R0) == pytest.approx(14.0 + 6.0 * R0) == rec.network.direct_ms[2]["accept"].median
    # a step that accepts one of two drafts is half way, round trips too
    half = m.step(2, 1.0)
    assert (half.compute_ms, half.round_trips) == pytest.approx((13.0, 5.5))


def test_three_delays_fit_one_line_and_noise_below_zero_is_no_round_trip():
    m = network_model(net_record((0.0, 1.0, 3.0)))
    assert m is not None and m.accept[2].round_trips == pytest.approx(6.0)
    flat = NetworkCost((0.0, 2.0), (sp(10.0), sp(9.9)), {}, sp(10.0), None, 1)
    assert flat.line(flat.plain_ms)[1] == 0.0 and flat.relay_ms == 0.0


def test_the_explanation_says_round_trips_and_the_share_waiting():
    m = network_model(net_record())
    assert m is not None
    lines = explain(m, 5.0, {2: 1.0})
    # K=2 at full acceptance over 5 ms: 14 + 6 * 5 = 44 ms a step, 30 of them waiting
    assert lines == ["baseline: 3.0 round trips a token, 60 % of the step is waiting on the network at 5 ms",
                     "K=2: 6.0 round trips a step, 68 % of the step is waiting on the network at 5 ms "
                     "(at 100 % acceptance)"]
    assert explain(m, 5.0, {}) == lines[:1]  # a K without an acceptance is left out


def test_the_prediction_is_the_break_even_model_on_the_lines():
    m = network_model(net_record())
    assert m is not None
    # full acceptance at K=2: 3 tokens a step of 14 + 6 R against 3 plain steps of 10 + 3 R
    for rtt in (0.3, 5.0, 12.0):
        assert m.speedup(2, 1.0, rtt) == pytest.approx(3 * (10 + 3 * rtt) / (14 + 6 * rtt))
        assert m.speedup(2, 0.7, rtt) == pytest.approx(
            breakeven.predicted_speedup(0.7, 2, breakeven.Costs({1: 10 + 3 * rtt}, 0.0, {}, "network",
                                                                {2: 14 + 6 * rtt}, {2: 12 + 5 * rtt})))
    assert m.tok_s(None, 0.0, 5.0) == pytest.approx(1000 / 25)
    assert m.tok_s(2, 1.0, 5.0) == pytest.approx(2000 / (13 + 5.5 * 5))  # one of two drafts accepted a step
    assert predictions(m, [("Wi-Fi", 5.0)], 1.0) == [f"Wi-Fi at 5 ms: K=2 {3 * 25 / 44:.2f}x"]
    assert links_of(m) == [("your link (measured)", R0), *TYPICAL_LINKS]
    assert links_of(m, (12.0,)) == [("your link (measured)", R0), ("yours", 12.0)]


def test_through_the_relay_a_step_sees_the_link_the_relay_and_twice_the_delay():
    m = network_model(net_record())
    assert m is not None
    # probed at 0 and 2 ms, the line gives the step at 3 ms exactly as it was built
    assert m.relay_tok_s(None, 0.0, 3.0) == pytest.approx(1000 / (PLAIN[0] + PLAIN[1] * (R0 + RELAY + 6.0)))
    assert m.relay_tok_s(2, 2.0, 3.0) == pytest.approx(3000 / (ACCEPT[0] + ACCEPT[1] * (R0 + RELAY + 6.0)))


def test_the_link_is_priced_from_the_steps_timed_without_the_relay_not_by_taking_its_cost_out():
    """The relay costs per message, not per round trip (benchmarks/rpc_latency.py, 2026-12-03: it
    added 2.2 ms to a plain step of one round trip): a K=4 step of 15 round trips through it at no
    delay is not its direct step plus 15 x 2.2 ms. The predictions start from the direct steps."""
    delays = (0.0, 1.0)
    plain_direct, k4_direct = 10.0, 17.0  # ms at the link as it is (0.1 ms round trip)
    net = NetworkCost(delays, (sp(12.2), sp(14.6)), {4: {"accept": (sp(46.5), sp(74.8)),
                                                         "reject": (sp(43.5), sp(74.7))}},
                      sp(plain_direct), 0.1, 1, direct_ms={4: {"accept": sp(k4_direct), "reject": sp(k4_direct)}})
    m = network_model(dataclasses.replace(net_record(), network=net))
    assert m is not None
    assert m.accept[4].at(0.1) == pytest.approx(k4_direct) and m.plain.at(0.1) == pytest.approx(plain_direct)
    # the relay's own cost per step, as measured (not round trips x the plain step's)
    assert m.accept[4].relay_ms == pytest.approx(46.5 - k4_direct) and m.relay_ms == pytest.approx(2.2)
    assert m.relay_tok_s(4, 4.0, 1.0) == pytest.approx(5000 / 74.8)  # through the relay: its own points
    # the same record without the direct steps (the first records of this kind) takes the relay's cost
    # out by round trips, an estimate; through the relay both give the same steps
    old = network_model(dataclasses.replace(net_record(), network=dataclasses.replace(net, direct_ms=None)))
    assert old is not None and old.accept[4].at(0.1) != pytest.approx(k4_direct, rel=0.05)
    assert old.relay_tok_s(4, 4.0, 1.0) == pytest.approx(m.relay_tok_s(4, 4.0, 1.0))


def test_the_record_reads_back_and_the_latest_network_record_is_found():
    rec = net_record()
    back = CostRecord.from_dict(json.loads(rec.to_json()))
    assert back == rec
    assert latest_network([fake_costs({1: 10.0}, 0.0), back, fake_costs({1: 10.0}, 0.0)]) is back
    assert latest_network([back], model_path="/other") is None


@pytest.mark.parametrize("change, says", [
    (lambda n: n.update(delays_ms=[1.0, 2.0]), "delays_ms"),
    (lambda n: n.update(delays_ms=[0.0, -2.0]), "delays_ms"),
    (lambda n: n.update(delays_ms=[0.0, float("nan")]), "delays_ms"),
    (lambda n: n.update(plain_ms=n["plain_ms"][:1]), "plain_ms"),
    (lambda n: n["step_ms"]["2"].update(accept="x"), "accept"),
    (lambda n: n["step_ms"].update({"99": n["step_ms"]["2"]}), "step_ms"),
    (lambda n: n.update(link_rtt_ms=1e9), "link_rtt_ms"),
    (lambda n: n.update(workers=0), "workers"),
    (lambda n: n.update(direct_plain_ms=None), "direct_plain_ms"),
])
def test_a_network_part_out_of_bounds_is_refused_by_name(change, says):
    d = json.loads(net_record().to_json())
    change(d["network"])
    with pytest.raises(ValueError, match=says):
        CostRecord.from_dict(d)


def test_delays_are_zero_and_those_asked():
    from app.core.measure.network import check_delays

    assert check_delays([3, 1]) == (0.0, 1.0, 3.0)
    for bad in ([], [0], [-1], [5000]):
        with pytest.raises(UserError):
            check_delays(bad)


def test_recommend_rtt_puts_the_sweeps_acceptance_on_the_probes_lines(tmp_path):
    from app.core.measure.cost_text import save_cost_record
    from helpers import clear_sweep_file, cli

    path = tmp_path / "r.jsonl"
    clear_sweep_file(path)
    r = cli("recommend", str(path), "--rtt", "0.3,5")
    assert r.returncode == 0, r.stderr
    assert "no network probe of this model" in r.stdout
    save_cost_record(path, dataclasses.replace(net_record(), model_path="/m.gguf"))
    r = cli("recommend", str(path), "--rtt", "0.3,5")
    assert r.returncode == 0, r.stderr
    out = r.stdout[r.stdout.index("Over RPC"):]
    # the sweep measured 70 % acceptance at K=1 and K=2; the record priced K=2 only
    assert "Over RPC (2 workers, with -ot blk\\.4\\.=CPU; the link's round trip 0.05 ms" in out
    assert "K=2: " in out and " round trips a step, " in out and "K=1:" not in out
    assert "yours at 0.3 ms: K=2 " in out and "yours at 5 ms: K=2 " in out
    r = cli("recommend", str(path), "--rtt", "0,5")
    assert r.returncode == 2 and "--rtt" in r.stderr


def test_the_check_at_a_delay_the_probe_did_not_use_on_recorded_numbers():
    """benchmarks/rpc_latency.py, 2026-12-03, demo model p=0.3, one loopback worker, K=4: the probe
    at +0 and +1 ms each way (medians), the runs at +3 ms: 18.7 tok/s, 36 % of drafts accepted
    (1.44 a step). The prediction is the line through the probe's two points at the runs' own
    acceptance; on that shared machine other arms missed by up to 28 % (docs/methodology.md)."""
    delays = (0.0, 1.0)
    net = NetworkCost(delays, (sp(8.49), sp(10.65)), {4: {"accept": (sp(47.11), sp(84.83)),
                                                          "reject": (sp(52.26), sp(77.50))}},
                      sp(7.73), 0.072, 1)
    m = network_model(dataclasses.replace(net_record(), network=net))
    assert m is not None
    trips = 12.62 + (18.86 - 12.62) * 0.36  # round trips at 1.44 of 4 drafts accepted a step
    assert m.step(4, 1.44).round_trips == pytest.approx(trips, rel=1e-3)
    predicted = m.relay_tok_s(4, 1.44, 3.0)
    assert predicted == pytest.approx(1000 * 2.44 / (52.26 + (47.11 - 52.26) * 0.36 + trips * 6), rel=1e-3)
    assert abs(predicted / 18.7 - 1) <= 0.10
