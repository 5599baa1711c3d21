"""Backend truth: which backends and devices each engine really has, where a run's
model really ran (records, schema 2), and the confounder that blocks a verdict measured on the
CPU of a machine that has a GPU. This machine has no GPU: the GPU side is recorded answers (NVML,
--list-devices, load logs) as data; the runs are real CPU runs (in-process and llama-server)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from app.core.analysis.analysis import analyze
from app.core.analysis.placement import FEWER_LAYERS, ON_CPU
from app.core.common.errors import EngineError
from app.core.engines.devices import (CPU, Device, backend_of, engine_backends, format_engine_backends,
                                      parse_list_devices, parse_load_log)
from app.core.machine import hardware as H
from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.records.schema import SCHEMA_VERSION, RunRecord
from app.core.records.writer import ResultsWriter
from app.core.verdict import build_verdict, markdown_report, verdict_dict, verdict_text
from app.core.verdict.verdict import CPU_MARK
from conftest import ROOT
from tests.helpers import DEMO_V1, LIST_CUDA, LIST_NONE, gpu_records, gpu_snapshot

PROMPTS = (Prompt("p1", "code", "def fibonacci(n):"),)

# a CUDA load log at -lv 4 (the lines llama.cpp prints while it places a model)
CUDA_LOG = ["0.00.2 I llama_prepare_model_devices: using device CUDA0 (NVIDIA GeForce RTX 3060) (0000:01:00.0) - 11739 MiB free",
            "0.00.3 I load_tensors: offloading output layer to GPU",
            "0.00.3 I load_tensors: offloading 32 repeating layers to GPU",
            "0.00.3 I load_tensors: offloaded 33/33 layers to GPU",
            "0.00.3 I load_tensors:        CUDA0 model buffer size =  4403.49 MiB",
            "0.00.3 I load_tensors:   CPU_Mapped model buffer size =   281.81 MiB"]


# ------------------------------------------------------------------------------------------
# parsing what the engines say


def test_list_devices_is_parsed_gpu_none_and_not_a_list():
    (d,) = parse_list_devices(LIST_CUDA)
    assert (d.name, d.description, d.backend, d.is_gpu) == ("CUDA0", "NVIDIA GeForce RTX 3060", "CUDA", True)
    assert d.memory_total == 12288 * 2**20 and d.memory_free == 11739 * 2**20
    assert parse_list_devices(LIST_NONE) == ()
    with pytest.raises(EngineError, match="Available devices"):
        parse_list_devices("error: invalid argument: --list-devices\n")


def test_backend_names():
    assert [backend_of(n) for n in ("CUDA0", "Vulkan1", "MTL0", "Metal", "CPU_Mapped", "CPU")] == \
        ["CUDA", "Vulkan", "Metal", "Metal", CPU, CPU]


def test_load_log_gives_device_and_layers():
    p = parse_load_log(CUDA_LOG)
    assert (p.backend, p.devices, p.offloaded, p.layers_total, p.on_cpu) == \
        ("CUDA", ("CUDA0 (NVIDIA GeForce RTX 3060)",), 33, 33, False)
    partial = parse_load_log([ln.replace("33/33", "20/33") for ln in CUDA_LOG])
    assert partial.offloaded == 20 and partial.backend == "CUDA"
    # a GPU build told -ngl 0: the log says 0 layers went to the GPU
    assert parse_load_log(["load_tensors: offloaded 0/33 layers to GPU"]).on_cpu
    # a CPU-only build logs no offload lines at all, and lists no device: the CPU, 0 layers
    cpu = parse_load_log(["load_tensors:   CPU_Mapped model buffer size =     3.44 MiB"], (), 6)
    assert (cpu.backend, cpu.offloaded, cpu.layers_total) == (CPU, 0, 6)
    # a GPU build whose log said nothing of the load (llama-server below -lv 4): the listed GPU, layers unknown
    quiet = parse_load_log([], parse_list_devices(LIST_CUDA), 33)
    assert quiet.backend == "CUDA" and quiet.offloaded is None
    # a CPU build with the RPC backend, run without workers, says it offloaded the -ngl it was
    # asked for, yet used no device and kept every weight on the CPU: 0 layers on a GPU
    rpc_only = parse_load_log(["load_tensors: offloaded 6/6 layers to GPU",
                               "load_tensors:   CPU_Mapped model buffer size =     3.44 MiB"], (), 6)
    assert (rpc_only.backend, rpc_only.offloaded, rpc_only.on_cpu) == (CPU, 0, True)


# ------------------------------------------------------------------------------------------
# the engines on this machine


def test_inprocess_engine_reports_its_own_library():
    from app.core.engines.llama_backend import inprocess_backends, llama

    L, _ = llama()
    info = inprocess_backends()
    # the library says it can offload when it has a GPU device or the RPC backend (built into the
    # project's llama.cpp for issue 41); the engine says so only for a GPU device of this machine
    assert info.gpu_offload == any(d.kind in ("gpu", "igpu") for d in info.devices)
    assert not info.gpu_offload or L.llama_supports_gpu_offload()
    if "RPC" in info.backends:  # the RPC build: the library says it can offload, yet nothing goes to a GPU here
        assert L.llama_supports_gpu_offload()
    assert any(d.kind == "cpu" for d in info.devices) and CPU in info.backends
    if not info.gpu_offload:  # this machine's CPU build: no GPU device, and it says it will use the CPU
        assert not info.gpus and "CPU" in info.will_use()


def test_server_list_devices_is_read_and_cached(server_bin, monkeypatch):
    from app.core.engines.server import devices as SD

    devices = SD.list_devices(server_bin)
    info = SD.server_backends(server_bin)
    assert info.gpu_offload == bool(devices) and CPU in info.backends
    monkeypatch.setattr(SD, "_run_quiet", lambda *a, **k: pytest.fail("--list-devices run twice"))
    assert SD.list_devices(server_bin) == devices  # cached per binary, like the capabilities


def test_hw_prints_each_engines_device(server_bin):
    r = subprocess.run([sys.executable, "-m", "app", "hw"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "engines (the device each will really use):" in r.stdout
    assert "in-process (llama-cpp-python): " in r.stdout and "llama-server: " in r.stdout
    r = subprocess.run([sys.executable, "-m", "app", "hw", "--json"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    d = json.loads(r.stdout)
    engines = {e["engine"]: e for e in d["engines"]}
    assert set(engines) == {"inprocess", "server"} and all(e["will_use"] for e in engines.values())


def test_engine_rows_name_a_missing_server():
    rows = engine_backends("/nonexistent/llama-server")
    assert rows[1][0] == "server" and rows[1][1] is None and "no llama-server binary" in rows[1][2]
    assert "llama-server: not available (" in format_engine_backends(rows)


# ------------------------------------------------------------------------------------------
# records: schema 2 fields, old files still load


def test_schema_1_file_still_loads_on_both_readers(monkeypatch):
    from app.core.records import reader

    fast = load_records(DEMO_V1)
    assert fast and {r.schema_version for r in fast} == {1}
    assert all(r.backend is None and r.devices == () and r.offloaded_layers is None for r in fast)
    monkeypatch.setattr(reader, "_run_decoder", lambda: None)  # json + from_dict only
    assert load_records(DEMO_V1) == fast
    assert not analyze(fast).findings or all(f.code not in (ON_CPU, FEWER_LAYERS) for f in analyze(fast).findings)


def test_schema_2_record_round_trips(tmp_path, monkeypatch):
    from app.core.records import reader

    r0 = load_records(DEMO_V1)[0]
    rec = dataclasses.replace(r0, schema_version=SCHEMA_VERSION, backend="CUDA", devices=("CUDA0 (RTX 3060)",),
                              offloaded_layers=20, layers_total=33,
                              host=r0.host | {"gpus": [{"vendor": "nvidia", "name": "RTX 3060"}]})
    path = tmp_path / "v2.jsonl"
    path.write_text(rec.to_json() + "\n")
    assert load_records(path) == [rec]
    monkeypatch.setattr(reader, "_run_decoder", lambda: None)
    assert load_records(path) == [rec]
    assert RunRecord.from_dict(json.loads(rec.to_json())) == rec


# ------------------------------------------------------------------------------------------
# the confounder: a GPU recorded, the runs on the CPU


def _sweep(engine, model, hardware, path):
    plan = Plan(model=str(model), arms=(Arm(), Arm(2)), prompts=PROMPTS, engine=engine.name, n_predict=24,
                reps=2, warmup=0)
    with ResultsWriter(path) as w:
        recs = [e.record for e in run_sweep(plan, engine, w, hardware=hardware) if isinstance(e, RunFinished)]
    key = lambda r: (r.run_id, r.backend, r.devices, r.offloaded_layers, r.layers_total, r.host)  # noqa: E731
    loaded = load_records(path)
    assert recs and list(map(key, loaded)) == list(map(key, recs))  # the file carries the placement and GPUs
    return loaded


def _check_marked(recs, gpu: bool):
    v = build_verdict(recs)
    codes = [f.code for f in v.analysis.findings]
    text, d, md = verdict_text(v), verdict_dict(v), markdown_report(v)
    if gpu:
        f = next(f for f in v.analysis.findings if f.code == ON_CPU)
        assert "NVIDIA GeForce RTX 3060" in f.message and "ran on the CPU" in f.message
        assert "measure again" in f.fix
        assert v.gpu_warning.startswith(CPU_MARK)
        assert CPU_MARK in text and d["measured_on_cpu"] is True and CPU_MARK in d["gpu_warning"]
        assert f"Warning: {CPU_MARK}" in md
    else:
        assert ON_CPU not in codes and v.gpu_warning is None
        assert CPU_MARK not in text and d["measured_on_cpu"] is False and CPU_MARK not in md


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-recorded", "no-gpu"])
def test_inprocess_cpu_sweep_on_a_gpu_machine_is_marked(make_model, tmp_path, gpu):
    from app.core.engines.inprocess import InProcessEngine

    with InProcessEngine(ctx_size=512) as eng:
        recs = _sweep(eng, make_model(0.5), gpu_snapshot(gpu), tmp_path / "r.jsonl")
    assert all(r.schema_version == SCHEMA_VERSION for r in recs)
    if eng.placement is not None and not eng.placement.on_cpu:
        pytest.skip("this llama-cpp-python offloads to a GPU: the CPU case cannot be made here")
    assert {(r.backend, r.offloaded_layers) for r in recs} == {(CPU, 0)}
    assert all(r.layers_total and r.devices == (CPU,) for r in recs)
    assert [g["name"] for g in recs[0].host["gpus"]] == (["NVIDIA GeForce RTX 3060"] if gpu else [])
    _check_marked(recs, gpu)


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-recorded", "no-gpu"])
def test_cpu_llama_server_sweep_on_a_gpu_machine_is_marked(server_bin, make_model, tmp_path, gpu):
    from app.core.engines.server.devices import list_devices
    from app.core.engines.server.engine import ServerEngine

    if list_devices(server_bin):
        pytest.skip("this llama-server has a GPU device: the CPU case cannot be made with it")
    with ServerEngine(server_bin, ctx_size=512) as eng:
        recs = _sweep(eng, make_model(0.5), gpu_snapshot(gpu), tmp_path / "r.jsonl")
    assert {(r.engine, r.backend, r.offloaded_layers) for r in recs} == {("server", CPU, 0)}
    _check_marked(recs, gpu)


def test_fewer_layers_than_the_fit_said_is_a_finding():
    a = analyze(gpu_records(20, "all"))
    (f,) = [f for f in a.findings if f.code == FEWER_LAYERS]
    assert "20 of 33" in f.message and "puts 33" in f.message and "-ngl" in f.fix
    assert build_verdict(gpu_records(20, "all")).gpu_warning.startswith(CPU_MARK)
    # all layers on the GPU, or as many as the fit said (a model larger than the card): no finding
    for offloaded, fit in ((33, "all"), (20, 20), (20, None)):
        codes = [f.code for f in analyze(gpu_records(offloaded, fit)).findings]
        assert FEWER_LAYERS not in codes and ON_CPU not in codes
        assert build_verdict(gpu_records(offloaded, fit)).gpu_warning is None


def test_the_gpu_warning_is_its_problem_and_fix_as_every_rendering_shows_them():
    """The verdict keeps what happened and the fix apart; the warning line and the Markdown report
    are built from them (the report used to cut the mark off the warning's text by length)."""
    v = build_verdict(gpu_records(0, "all"))
    (f,) = [f for f in v.analysis.findings if f.code == ON_CPU]
    assert (v.gpu_problem, v.gpu_fix) == (f.message, f.advice)  # the parts: each front end words them
    assert v.gpu_warning == f"{CPU_MARK}: {f.message}; fix: {f.fix}" and verdict_dict(v)["gpu_warning"] == v.gpu_warning
    assert f"> **Warning: {CPU_MARK}.** {f.message}; fix: {f.fix}\n" in markdown_report(v)
    odd = dataclasses.replace(v, gpu_problem="runs ran on the CPU: CUDA build missing", gpu_fix="install one")
    assert f"> **Warning: {CPU_MARK}.** runs ran on the CPU: CUDA build missing; fix: install one\n" in markdown_report(odd)
    assert f"\n!! {CPU_MARK}: runs ran on the CPU: CUDA build missing; fix: install one" in verdict_text(odd)
    clean = build_verdict(gpu_records(33, "all"))
    assert clean.gpu_problem is clean.gpu_fix is clean.gpu_warning is None and "Warning" not in markdown_report(clean)


def test_apple_unified_memory_counts_as_a_gpu():
    recs = [dataclasses.replace(r, host=r.host | {"gpus": [{"vendor": "apple", "name": "Apple M2 Pro"}],
                                                  "unified_memory": True})
            for r in gpu_records(0, "all", backend=CPU)]
    (f,) = [f for f in analyze(recs).findings if f.code == ON_CPU]
    assert "Apple M2 Pro" in f.message


def test_one_definition_of_a_gpu_machine_amd_included():
    """On an AMD machine the engine choice (Sweep tab) and the analysis agree that it has a GPU: runs
    on the CPU there are "measured on the CPU"; an Intel iGPU counts for neither."""
    from app.core.engines.devices import host_gpu_names

    def snapshot(vendor, name):
        return H.HardwareSnapshot("Linux", "recorded CPU", 8, 16, 32 * 2**30, 24 * 2**30,
                                  (H.GPU(vendor, name, 16 * 2**30, None, None, "unknown"),), False, ())

    for vendor, name, gpu in (("amd", "Radeon RX 7800 XT", True), ("intel", "Intel UHD 770", False)):
        recs = [dataclasses.replace(r, host=r.host | {"gpus": [{"vendor": vendor, "name": name}]})
                for r in gpu_records(0, "all", backend=CPU)]
        on_cpu = [f for f in analyze(recs).findings if f.code == ON_CPU]
        assert host_gpu_names(snapshot(vendor, name)) == ([name] if gpu else [])
        assert bool(on_cpu) is gpu and (not gpu or name in on_cpu[0].message)


def test_placement_of_a_record_is_the_one_the_analysis_and_the_report_read():
    """Placement.of_record, .on_cpu and .text() are the one reading of a record's placement: the
    analysis' "ran on the CPU" and the report's "ran on" line come from them; the layer count
    (block_count + the output layer) from one helper for both engines."""
    from app.core.engines.devices import Placement, layers_total
    from app.core.machine.gguf_info import GGUFHeader

    assert Placement.of_record(load_records(DEMO_V1)[0]) is None  # schema 1: not recorded
    for offloaded, backend, on_cpu in ((0, "CUDA", True), (33, CPU, True), (20, "CUDA", False)):
        recs = gpu_records(offloaded, None, backend=backend)
        p = Placement.of_record(recs[0])
        assert p == Placement(backend, ("CUDA0 (NVIDIA GeForce RTX 3060)",), offloaded, 33) and p.on_cpu is on_cpu
        assert any(f.code == ON_CPU for f in analyze(recs).findings) is on_cpu
        assert f"- ran on: {p.text()}\n" in markdown_report(build_verdict(recs))
    assert Placement("CPU", (), 0, 33).text() == "CPU (-); 0/33 layers on the GPU"
    for blocks, want in ((32, 33), (None, None), (True, None), ("32", None)):
        meta = {"general.architecture": "qwen3"} | ({} if blocks is None else {"qwen3.block_count": blocks})
        assert layers_total(GGUFHeader("m.gguf", 3, meta, (), 0, 0)) == want


def test_two_in_process_loads_at_once_each_keep_their_load_lines(monkeypatch):
    """A probe and a sweep loading in-process at the same time (both startable from the window):
    each load's capture gets its own load log, so both placements are known; the second waits for
    the first (one capture at a time). llama.cpp's log callback is fed recorded load logs."""
    import threading

    from app.core.engines import llama_backend as B

    B.llama()
    log = lambda line: B._log_cb(2, (line + "\n").encode(), None)  # as llama.cpp calls it
    got: dict[str, list[str]] = {}
    a_in, b_done = threading.Event(), threading.Event()
    partial = [ln.replace("33 repeating", "19 repeating").replace("33/33", "20/33") for ln in CUDA_LOG]

    def load_a():
        with B.capture_log() as lines:
            for ln in CUDA_LOG[:2]:
                log(ln)
            a_in.set()
            b_done.wait(timeout=1.0)  # without the lock, b's whole load happens here
            for ln in CUDA_LOG[2:]:
                log(ln)
        got["a"] = lines

    def load_b():
        a_in.wait(timeout=10)
        with B.capture_log() as lines:
            for ln in partial:
                log(ln)
        b_done.set()
        got["b"] = lines

    threads = [threading.Thread(target=load_a), threading.Thread(target=load_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    a, b = parse_load_log(got["a"], layers_total=33), parse_load_log(got["b"], layers_total=33)
    assert (a.backend, a.offloaded, b.backend, b.offloaded) == ("CUDA", 33, "CUDA", 20)
    assert got["a"] == CUDA_LOG and got["b"] == partial


def test_the_backend_is_set_up_once_when_two_threads_ask_at_once(monkeypatch):
    import threading

    from app.core.engines import llama_backend as B

    B.llama()
    inits, entered = [], threading.Event()

    def slow_init(L):
        inits.append(L)
        entered.set()
        threading.Event().wait(0.3)  # the other thread asks meanwhile
        B._backend_ready = True

    monkeypatch.setattr(B, "_backend_ready", False)
    monkeypatch.setattr(B, "_init_backend", slow_init)
    first = threading.Thread(target=B.llama)
    first.start()
    entered.wait(timeout=10)
    second = threading.Thread(target=B.llama)
    second.start()
    first.join(timeout=30)
    second.join(timeout=30)
    assert len(inits) == 1


def test_device_label():
    assert Device("CUDA0", "NVIDIA GeForce RTX 3060", "gpu", 12 * 2**30).label() == \
        "CUDA0: NVIDIA GeForce RTX 3060, 12.0 GiB"
