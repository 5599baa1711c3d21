"""The cost probe's one entry point (session.cost_probe: which probe runs, with what), and the one
rule of whether a cost record prices a set-up (analysis.costs.differs), as each caller reads it."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import fake_costs

from app.core.analysis.costs import RunSetup, differs, same_build, same_host
from app.core.common.errors import UserError
from app.core.engines.base import EngineKind, EngineSettings
from app.core.measure import probe, server_probe
from app.core.records.cost import CostRecord
from app.core.session import cost_probe


@pytest.fixture
def probes(monkeypatch):
    """Both probes replaced by ones that note their arguments and answer a record."""
    seen: dict[str, dict] = {}

    def fake(name):
        def run(model, **kw):
            seen[name] = {"model": model, **kw}
            yield fake_costs({1: 10.0}, 1.0)
        return run

    monkeypatch.setattr(probe, "run_probe", fake("inprocess"))
    monkeypatch.setattr(server_probe, "run_server_probe", fake("server"))
    return seen


def test_the_entry_point_runs_the_probe_of_the_settings_engine_with_every_argument(probes):
    server = EngineSettings(kind=EngineKind.SERVER, threads=3, n_gpu_layers="12", server_bin="/bin/llama-server",
                            log_dir="/logs")
    events = list(cost_probe.probe_costs(server, "m.gguf", depth=256, max_k=4, drafter="d.gguf", min_rounds=2,
                                         max_rounds=7, target_rel=0.02))
    assert len(events) == 1 and list(probes) == ["server"]
    assert probes["server"] == {"model": "m.gguf", "server_bin": "/bin/llama-server", "drafter": "d.gguf",
                                "mode": "draft-mtp", "depth": 256, "max_k": 4, "threads": 3, "n_gpu_layers": "12",
                                "min_rounds": 2, "max_rounds": 7, "target_rel": 0.02, "cancel": None, "log_dir": "/logs"}
    # draft-simple's step (a drafter's K steps and the target's verify), timed through llama-server (issue 55 item 6)
    list(cost_probe.probe_costs(server, "m.gguf", max_k=6, drafter="d.gguf", mode="draft-simple"))
    assert probes["server"]["mode"] == "draft-simple" and probes["server"]["drafter"] == "d.gguf"
    inprocess = EngineSettings(threads=2, n_gpu_layers="0", server_bin="/bin/llama-server")  # a binary: not its concern
    list(cost_probe.probe_costs(inprocess, "m.gguf", depth=128, max_k=4, max_rounds=9))
    assert probes["inprocess"] == {"model": "m.gguf", "depth": 128, "max_batch": 5, "threads": 2, "n_gpu_layers": "0",
                                   "min_rounds": 5, "max_rounds": 9, "target_rel": 0.05, "cancel": None}
    with pytest.raises(UserError, match="drafter"):  # the in-process probe cannot time a drafter's step
        list(cost_probe.probe_costs(inprocess, "m.gguf", drafter="d.gguf"))
    with pytest.raises(UserError, match="llama-server only"):
        list(cost_probe.probe_costs(inprocess, "m.gguf", mode="draft-simple"))


@dataclasses.dataclass
class _Engine:
    settings: EngineSettings  # what an engine exposes of itself (Engine.settings)


def test_the_adaptive_sweeps_probe_runs_where_its_engine_runs(probes):
    server = _Engine(EngineSettings(EngineKind.SERVER, threads=4, n_gpu_layers="auto", server_bin="/opt/llama-server"))
    list(cost_probe.probe_where(server, "m.gguf", depth=512, max_k=3, rounds=4))
    assert {k: probes["server"][k] for k in ("server_bin", "threads", "n_gpu_layers", "depth", "max_k",
                                             "min_rounds", "max_rounds")} == \
        {"server_bin": "/opt/llama-server", "threads": 4, "n_gpu_layers": "auto", "depth": 512, "max_k": 3,
         "min_rounds": 3, "max_rounds": 4}
    inprocess = _Engine(EngineSettings(EngineKind.INPROCESS, threads=2, n_gpu_layers="0"))
    list(cost_probe.probe_where(inprocess, "m.gguf", depth=64, max_k=2, rounds=2))
    assert {k: probes["inprocess"][k] for k in ("threads", "n_gpu_layers", "max_batch", "min_rounds")} == \
        {"threads": 2, "n_gpu_layers": "0", "max_batch": 3, "min_rounds": 2}  # its layers on the GPU too


# -- the one rule ---------------------------------------------------------------------------------
def _probe(**over) -> CostRecord:
    rec = fake_costs({1: 10.0}, 1.0)
    return dataclasses.replace(rec, **{"model_path": "/m/a.gguf", "model_size": 100, "engine": "server",
                                       "backend": "CUDA", "devices": ("CUDA0",), "llama_build": "b100-abcdef0",
                                       "threads": 4, "host": {"os": "Linux-6.1", "machine": "x86_64", "cpu_count": 8},
                                       "model_mtime_ns": 1, "model_head_sha256": "aa", **over})


def test_a_record_prices_a_set_up_only_where_both_say_the_same():
    full = RunSetup("/m/a.gguf", "server", "CUDA", ("CUDA0",), "b100-abcdef0", model_size=100, model_mtime_ns=1,
                    model_head_sha256="aa", threads=4, host={"os": "Linux-6.5", "machine": "x86_64", "cpu_count": 8})
    rec = _probe()
    assert differs(rec, full) is None  # another kernel of the same OS is the same machine
    assert differs(rec, RunSetup(None, "server")) is None  # nothing else known: nothing else compared
    cases = {
        "model": dict(model_path="/m/b.gguf"),
        "size": dict(model_size=101),
        "content": dict(model_head_sha256="bb"),
        "engine": dict(engine="inprocess"),
        "backend": dict(backend="Vulkan"),
        "devices": dict(devices=("CUDA0", "CUDA1")),
        "build": dict(llama_build="b101"),
        "drafter": dict(drafter="/m/d.gguf"),
        "threads": dict(threads=2),
    }
    for facet, over in cases.items():
        d = differs(rec, dataclasses.replace(full, **over))
        assert d is not None and d.facet == facet, facet
    d = differs(rec, dataclasses.replace(full, host={"machine": "x86_64", "cpu_count": 96}))
    assert d is not None and d.facet == "host" and d.detail == "CPU count 8 there, 96 here"
    # by the file's name alone (a server's path is on its own machine), and a drafter not known
    by_name = RunSetup(None, "server", model_name="a.gguf", drafter="/m/d.gguf", drafter_known=False)
    assert differs(rec, by_name) is None
    assert differs(rec, dataclasses.replace(by_name, model_name="b.gguf")).facet == "model"
    two = dataclasses.replace(full, devices=("CUDA0", "CUDA1"))
    assert differs(dataclasses.replace(rec, devices=("CUDA1", "CUDA0")), two) is None  # a set: the order is not a place


def test_builds_are_the_same_as_far_as_both_strings_say():
    assert same_build("b11434 (515e855)", "b11434-515e855")  # the binary's --version and /props
    assert not same_build("b11434 (515e855)", "b11500-aaaaaaa")
    assert not same_build("b1", "b2")
    assert same_build("0.6.0-dev (build 0, commit unknown)", "b11434-515e855")  # a side that does not know
    assert same_build(None, "b2") and same_build("x", "x")
    assert not same_build("llama-cpp-python 0.3.36", "llama-cpp-python 0.3.40")  # two versions, no build number


def test_hosts_differ_by_architecture_count_os_family_and_gpus():
    here = {"os": "Linux-6.1-x86_64", "machine": "x86_64", "cpu_count": 8}
    assert same_host(here, {**here, "os": "Linux-6.8-x86_64"}) is None
    assert same_host(here, {**here, "machine": "arm64"}) == "CPU architecture x86_64 there, arm64 here"
    assert same_host(here, {**here, "os": "Windows-10"}) == "Linux there, Windows here"
    assert same_host({**here, "gpus": [{"name": "H200"}]}, {**here, "gpus": []}) == "GPUs H200 there, none here"
    assert same_host(here, {"cpu_count": None}) is None  # not said: not held against
