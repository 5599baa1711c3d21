"""The network probe on real processes: a loopback RPC worker, a relay the probe runs itself, a
tiny calibrated model with an MTP head. Behaviour only (round trips found, the record kept, the
sentences), never a speed: the arithmetic is checked on recorded numbers (test_network_model)."""

from __future__ import annotations

import dataclasses
import json
import re

from app.core.common.workers import Workers
from app.core.analysis.network import explain, network_model
from app.core.engines.base import EngineSettings
from app.core.engines.server.rpc_worker import RpcWorker
from app.core.records.cost import CostRecord
from app.core.records.reader import load_cost_records
from app.core.session.cost_probe import probe_network
from helpers import cli


def test_the_probe_finds_round_trips_through_its_relay_and_keeps_the_record(server_bin, rpc_worker_bin, make_model):
    model = str(make_model(0.0))
    with RpcWorker(rpc_worker_bin) as w1, RpcWorker(rpc_worker_bin) as w2:  # the model split over two
        workers = Workers((w1.endpoint, w2.endpoint))
        events = list(probe_network(EngineSettings(kind="server", server_bin=server_bin, rpc=workers),
                                    model, delays=(2.0,), max_k=1, min_rounds=1, max_rounds=2))
    rec = events[-1]
    assert isinstance(rec, CostRecord) and rec.network is not None
    net = rec.network
    assert net.delays_ms == (0.0, 2.0) and net.workers == 2 and set(net.step_ms) == {1}
    assert not any(w in json.dumps(dataclasses.asdict(net)) for w in workers)  # no address kept
    assert net.link_rtt_ms is not None and net.link_rtt_ms > 0  # asked before llama-server held the worker
    m = network_model(rec)
    assert m is not None
    # every step crosses the network at least once; a speculative step more often than a plain one
    assert m.plain.round_trips > 0 and m.accept[1].round_trips > 0 and m.reject[1].round_trips > 0
    assert rec.step_ms is not None and rec.plain_ms is not None and rec.step_ms[1]["accept"].median > 0
    assert CostRecord.from_dict(json.loads(rec.to_json())) == rec
    for line in explain(m, 5.0, 0.7):
        assert re.fullmatch(r"(baseline|K=1): \d+\.\d round trips a (token|step), \d+ % of the step is waiting on "
                            r"the network at 5 ms( \(at 70 % acceptance\))?", line), line


def test_probe_network_on_the_command_line(server_bin, rpc_worker_bin, make_model, tmp_path):
    model, out = str(make_model(0.0)), tmp_path / "r.jsonl"
    with RpcWorker(rpc_worker_bin) as w:
        r = cli("probe", "--model", model, "--server-bin", server_bin, "--rpc", str(w.endpoint), "--network",
                "--delays", "1", "--max-batch", "2", "--max-rounds", "1", "--rtt", "12", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "through the relay, ms a step" in r.stdout and "+1 ms" in r.stdout
    assert "Over RPC (1 worker; the link's round trip " in r.stdout
    assert re.search(r"yours at 12 ms: K=1 \d+\.\d\dx", r.stdout)
    [rec] = load_cost_records(out)
    assert rec.network is not None and rec.network.delays_ms == (0.0, 1.0)


def test_the_network_options_are_refused_without_workers(make_model):
    model = str(make_model(0.0))
    r = cli("probe", "--model", model, "--network")
    assert r.returncode != 0 and "--rpc" in r.stderr
    r = cli("probe", "--model", model, "--delays", "3")
    assert r.returncode != 0 and "--network" in r.stderr
    r = cli("probe", "--model", model, "--rpc", "nohost", "--network")
    assert r.returncode != 0 and "HOST:PORT" in r.stderr
