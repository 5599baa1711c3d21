"""What several test modules share: one builder of run records (make_record), the CLI run and its
clean-error check, recorded hardware and device answers, cost records, and sparse GGUF headers.
Test modules import these from here, never from each other."""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

from app.core.engines.base import EngineKind
from app.core.engines.devices import CPU, BackendInfo, Device, parse_list_devices
from app.core.machine import hardware as H
from app.core.records.arm import Arm
from app.core.records.cost import CostRecord, Spread
from app.core.records.reader import load_records
from app.core.records.schema import SCHEMA_VERSION, RunRecord, tokens_sha256
from app.core.records.writer import ResultsWriter

ROOT = Path(__file__).resolve().parent.parent


# ---- run records ---------------------------------------------------------------------------------

RECORD_DEFAULTS: dict[str, Any] = dict(
    schema_version=SCHEMA_VERSION, run_id="r1", sweep_id="s1", status="ok", engine="server",
    arm_kind="mtp", k=2, p_min=0.0, task="code", prompt_id="p", rep=0, n_predict=4, n_generated=4,
    tok_s=10.0, tok_s_engine=10.1, draft_n=3, draft_accepted=2, acceptance=2 / 3,
    mtp_engaged=True, output_sha256=tokens_sha256([1, 2, 3, 4]), output_tokens=(1, 2, 3, 4),
    prompt_n=2, prompt_tokens=(5, 6), prompt_tok_s=100.0, llama_build="b1",
    model_path="/m.gguf", model_size=1, sampling={"temperature": 0.0},
    token_times=(0.1, 0.2, 0.3, 0.4), timestamp_utc="2026-01-01T00:00:00Z", host={})


def make_record(measured_arm: Arm | None = None, **overrides: Any) -> RunRecord:
    """A finished run record: a draft-mtp run at K=2 of four tokens (RECORD_DEFAULTS), with any
    field set by name in ``overrides``. ``measured_arm`` sets the arm's fields first (arm_kind, k,
    p_min, spec_type; for the baseline no drafts counted), which ``overrides`` may still change. A
    tok/s given alone brings the engine's own figure with it (the two clocks agree)."""
    fields = {**RECORD_DEFAULTS, "sampling": dict(RECORD_DEFAULTS["sampling"]), "host": {}}  # each its own dicts
    if measured_arm is not None:
        fields.update(arm_kind=measured_arm.kind, k=measured_arm.k,
                      p_min=None if measured_arm.is_baseline else measured_arm.p_min, spec_type=measured_arm.mode,
                      draft_sampling=measured_arm.draft_sampling)
        if measured_arm.is_baseline:
            fields.update(draft_n=None, draft_accepted=None, acceptance=None, mtp_engaged=None)
    fields.update(overrides)
    if "tok_s" in overrides and "tok_s_engine" not in overrides:  # the engine's own figure agrees with it
        fields["tok_s_engine"] = fields["tok_s"]
    return RunRecord(**fields)


def generated(engine, model, k, text="hello world", n=60, raw=True, p_min=0.0, temperature=0.0, seed=1):
    """One request through ``engine`` to its end: the Generation (draft-mtp at ``k``, or the
    baseline without one)."""
    from app.core.common.cancel import CancelToken
    from app.core.records.sampler import Sampler

    arm = Arm(k, p_min) if k else Arm()
    g = engine.generate(str(model), arm, text, raw=raw, n_predict=n,
                        sampler=Sampler(temperature=temperature, seed=seed), cancel=CancelToken())
    while True:
        try:
            next(g)
        except StopIteration as s:
            return s.value


def two_model_file(path: Path) -> None:
    """Sweep 'old' on model A where MTP clearly pays, then sweep 'new' on model B where it loses."""
    with ResultsWriter(path) as w:
        for sweep, model, speedup, minute in (("old111", "/models/A-Q4_0.gguf", 1.6, 0),
                                              ("new222", "/models/B-Q4_0.gguf", 0.7, 30)):
            for rep in range(6):
                ts = f"2026-01-01T00:{minute + rep * 2:02d}:00+00:00"
                ts2 = f"2026-01-01T00:{minute + rep * 2:02d}:30+00:00"
                w.append(make_record(run_id=f"{sweep}b{rep}", sweep_id=sweep, model_path=model, arm_kind="baseline",
                                     k=None, p_min=None, draft_n=None, draft_accepted=None, acceptance=None,
                                     mtp_engaged=None, rep=rep, tok_s=40.0 + 0.1 * rep, timestamp_utc=ts))
                w.append(make_record(run_id=f"{sweep}m{rep}", sweep_id=sweep, model_path=model, rep=rep,
                                     tok_s=(40.0 + 0.1 * rep) * speedup * (1 + 0.002 * rep), timestamp_utc=ts2))


def clear_sweep_file(path: Path, model: str = "/m.gguf", sweep_id: str = "clear") -> list[RunRecord]:
    """A sweep where code is clearly faster with MTP at K=2 (1.5x) and story clearly slower (0.6x), so the equal mix is not faster:
    paired, interleaved runs with 1 % noise and a recorded greedy sampler; written to ``path``."""
    import math
    import random

    rng = random.Random(7)
    sampling = {"temperature": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0, "seed": 42}
    out = []
    t = 0
    for rep in range(6):
        for task, s in (("code", 1.5), ("story", 0.6)):
            for k, speed in ((None, 1.0), (1, 1.0 + (s - 1) / 2), (2, s)):
                out.append(make_record(
                    run_id=f"{sweep_id}{task}{k}{rep}", sweep_id=sweep_id, engine="inprocess", task=task,
                    prompt_id=task, rep=rep, arm_kind="baseline" if k is None else "mtp", k=k,
                    p_min=None if k is None else 0.0, draft_n=None if k is None else 10,
                    draft_accepted=None if k is None else 7, acceptance=None if k is None else 0.7,
                    mtp_engaged=None if k is None else True, tok_s=40 * speed * math.exp(rng.gauss(0, 0.01)),
                    sampling=dict(sampling), model_path=model,
                    timestamp_utc=f"2026-01-01T00:{t // 60:02d}:{t % 60:02d}+00:00"))
                t += 1
    with ResultsWriter(path) as w:
        for r in out:
            w.append(r)
    return out


def tune_answer(path: Path, records: list[RunRecord], model: str, weights: dict[str, float],
                budget: float | None) -> int:
    """`tune`'s answer (app.cli.tune.answer, as JSON on stdout) on recorded runs of ``path``, as a
    sweep that ended decided after 31 s would give it; its exit code."""
    import argparse

    from app.cli import tune
    from app.cli.bench_view import BenchView
    from app.core.session.events import Decisions, SessionFinished

    view = BenchView()
    view.records = records
    view.path = path
    view.done = SessionFinished(path, len(records), len(records), 0, False)
    view.last_decisions = Decisions((), len(records), 0, 30.0, None, True, "decided")
    args = argparse.Namespace(json=True, thorough=False, server_bin=None, ngl=None)
    return tune.answer(view, model, weights, args, 31.0, budget)


# ---- the CLI in a child process ------------------------------------------------------------------


def cli(*args, env=None, timeout=300, fsize: int | None = None, cwd=ROOT):
    e = dict(os.environ)
    e.update(env or {})

    def limit():  # in the child only: a file-size limit stands in for a full disk
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, "-m", "app", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=e, preexec_fn=limit if fsize is not None else None)


def clean_error(r, *fragments, rc=2):
    assert r.returncode == rc, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)


# ---- costs as a probe reports them -----------------------------------------------------------------


@dataclasses.dataclass
class ReuseEngine:
    """What probe reuse asks of an engine (session.probes): its kind, build and threads."""
    kind: EngineKind = EngineKind.INPROCESS
    build: str = "llama-cpp-python 0.3.36"
    threads: int | None = 2


def fake_costs(t: dict[int, float], draft: float) -> CostRecord:
    """Costs as a probe would report them (a machine where wide verifies are cheap)."""
    sp = lambda x: Spread(x, x, x, 5)  # noqa: E731
    return CostRecord(1, "cost", "c", "inprocess", "b", "/m", 1, 64, max(t), 2,
                      {n: sp(v) for n, v in t.items()}, {n: sp(v / t[1]) for n, v in t.items()},
                      sp(draft), {n: sp(draft) for n in t}, sp(100.0), 5, True, "", {})


def server_costs(t: dict[int, float], draft: float, model: str = "/m/calibrated-p0.3.gguf", **over: Any) -> CostRecord:
    """fake_costs as a probe through llama-server on this machine would report them (watch's
    matching cost record): engine "server", this host, the model named."""
    from app.core.records.schema import host_info

    rec = fake_costs(t, draft)
    return dataclasses.replace(rec, engine="server", model_path=model, host=host_info(),
                               timestamp_utc="2026-12-01T00:00:00.000+00:00", **over)


# ---- a recorded llama-server for watch -------------------------------------------------------------

WATCH_SEQUENCE = ROOT / "tests" / "data" / "watch_sequence.json"


class ReplayClient:
    """A watch Client that answers from pages recorded off a real llama-server
    (tests/data/watch_sequence.json): each /metrics read moves to the next page (the last one
    stays); /props and /slots answer from the current page."""

    def __init__(self, pages: list[dict] | None = None, url: str = "http://127.0.0.1:8080"):
        import json

        self.pages = pages if pages is not None else json.loads(WATCH_SEQUENCE.read_text())["pages"]
        self.url, self.i, self.paths = url, -1, []

    def get(self, path: str, deadline=None, cancel=None):
        import json
        import time

        from app.core.watch.client import Page

        self.paths.append(path)
        if path == "/metrics":
            self.i = min(self.i + 1, len(self.pages) - 1)
        page = self.pages[max(self.i, 0)]
        if path == "/health":
            return Page(200, '{"status":"ok"}', {}, time.monotonic())
        if path == "/metrics":
            return Page(200, page["metrics"], {"process-start-time-unix": page["start"]}, time.monotonic())
        return Page(200, json.dumps(page[path.strip("/")]), {}, time.monotonic())

    def get_json(self, path: str, deadline=None, cancel=None):
        import json

        return json.loads(self.get(path).body)


def replayed_watch(cost_file: Path | None = None, pages: list[dict] | None = None, min_steps: int = 50,
                   url: str = "http://127.0.0.1:8080"):
    """The watch's Summary (its ``record`` the watch record) of the recorded llama-server
    (ReplayClient, all its pages or ``pages``), priced by the cost records in ``cost_file``."""
    from app.core.watch.watcher import Watcher

    w = Watcher(ReplayClient(pages, url))  # type: ignore[arg-type]
    w.attach()
    for _ in range(len(w.client.pages) - 1):  # type: ignore[attr-defined]
        w.poll()
    return w.summary(cost_files=[cost_file] if cost_file else [], min_steps=min_steps)


# ---- recorded hardware and devices ----------------------------------------------------------------


class RecordedNVML(types.SimpleNamespace):
    """pynvml's surface, answering with values recorded from a real card."""

    NVML_CLOCK_MEM = 2

    def __init__(self, cards, driver="550.54.14", cuda=12040, fail_init=False):
        super().__init__()
        self.cards, self.driver, self.cuda, self.fail_init = cards, driver, cuda, fail_init
        self.shutdown = False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.cards[i]

    def nvmlDeviceGetName(self, h):
        return h["name"].encode()

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=h["total"], free=h["free"], used=h["total"] - h["free"])

    def nvmlDeviceGetMemoryBusWidth(self, h):
        if h.get("bus") is None:
            raise RuntimeError("Not Supported")
        return h["bus"]

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_MEM
        return h["mem_clock"]


RTX3060 = {"name": "NVIDIA GeForce RTX 3060", "total": 12884901888, "free": 12309889024, "bus": 192,
           "mem_clock": 7501}


DEMO_V1 = ROOT / "tests" / "data" / "demo_sweep.jsonl"

# --list-devices as builds print it (CPU devices are never listed)
LIST_CUDA = "ggml_cuda_init: found 1 CUDA devices:\nAvailable devices:\n  CUDA0: NVIDIA GeForce RTX 3060 (12288 MiB, 11739 MiB free)\n"
LIST_NONE = "Available devices:\n  (none)\n"


def gpu_snapshot(gpus=True) -> H.HardwareSnapshot:
    """A hardware snapshot from recorded NVML answers (an RTX 3060), or one without a GPU."""
    found, notes = H.nvml_gpus(RecordedNVML([RTX3060] if gpus else []))
    return H.HardwareSnapshot("Linux", "recorded CPU", 8, 16, 32 * 2**30, 24 * 2**30, tuple(found), False,
                              tuple(notes))


def gpu_records(offloaded: int, fit, backend="CUDA"):
    """The demo sweep's records as a CUDA machine would have written them (recorded placement)."""
    host_gpu = {"gpus": [{"vendor": "nvidia", "name": "NVIDIA GeForce RTX 3060"}], "unified_memory": False}
    if fit is not None:
        host_gpu["gpu_layers_fit"] = fit
    return [dataclasses.replace(r, schema_version=2, backend=backend, devices=("CUDA0 (NVIDIA GeForce RTX 3060)",),
                                offloaded_layers=offloaded, layers_total=33, host=r.host | host_gpu)
            for r in load_records(DEMO_V1)]


CPU_DEV = Device(CPU, "recorded CPU", "cpu")
# llama-cpp-python as the CPU wheel answers (this machine's) and as a Metal build answers on a Mac
INPROC_CPU = BackendInfo("inprocess", "llama-cpp-python 0.3.16", (CPU,), (CPU_DEV,), False)
INPROC_METAL = BackendInfo("inprocess", "llama-cpp-python 0.3.16", ("Metal", "BLAS", CPU),
                           (Device("Metal", "Apple M5 Max", "gpu", 96 * 2**30), CPU_DEV), True)


def server_info(list_devices_text: str, build: str = "b6123 (abc1234)") -> BackendInfo:
    devs = parse_list_devices(list_devices_text)
    return BackendInfo("server", build, tuple(dict.fromkeys([d.backend for d in devs] + [CPU])),
                       devs + (Device(CPU, "", "cpu"),), bool(devs))


# ---- GGUF headers over sparse data ----------------------------------------------------------------


def sparse_gguf(path, arch, kv: dict, tensors: list[tuple[str, tuple[int, ...], str]]):
    """A GGUF with real metadata and a real tensor table whose data is a sparse hole: the file has
    its true size on paper and costs no disk."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from app.core.calibrated.gguf import add_value

    w = gguf.GGUFWriter(str(path), arch)
    for k, v in kv.items():
        add_value(w, k, v)
    total = 0
    for name, shape, qt in tensors:
        t = GGMLQuantizationType[qt]
        block, size = GGML_QUANT_SIZES[t]
        n = int(np.prod(shape))
        nbytes = n // block * size
        # add_tensor_info takes the numpy-order shape; for quantized types the last dim in bytes
        np_shape = list(reversed(shape))
        if qt != "F32":
            np_shape[-1] = np_shape[-1] // block * size
        w.add_tensor_info(name, np_shape, np.dtype(np.uint8) if qt != "F32" else np.dtype(np.float32),
                          nbytes, raw_dtype=t)
        total += gguf.GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(gguf.GGUFWriter.ggml_pad(size, 32) + total)
    return path


def vocab(n: int, *, tweak: int | None = None, kind: str = "gemma4", bos: int = 2) -> dict:
    toks = [f"<t{i}>" for i in range(n)]
    if tweak is not None:
        toks[tweak] = "<other>"
    return {"tokenizer.ggml.model": kind, "tokenizer.ggml.tokens": toks, "tokenizer.ggml.bos_token_id": bos,
            "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.add_bos_token": True}


def gemma4_target(path, n_embd=5376, n_vocab=1024, layers=4, **vk):
    """A Gemma 4 target's header: width n_embd, no NextN blocks."""
    a = "gemma4"
    kv = {f"{a}.block_count": layers, f"{a}.embedding_length": n_embd, f"{a}.context_length": 131072,
          f"{a}.attention.head_count": 32, f"{a}.attention.head_count_kv": 16, f"{a}.attention.key_length": 256,
          f"{a}.attention.value_length": 256, f"{a}.feed_forward_length": 4 * n_embd, **vocab(n_vocab, **vk)}
    t = [("token_embd.weight", (n_embd, n_vocab), "Q8_0")]
    for i in range(layers):
        t += [(f"blk.{i}.attn_norm.weight", (n_embd,), "F32"), (f"blk.{i}.attn_q.weight", (n_embd, n_embd), "Q4_K"),
              (f"blk.{i}.ffn_up.weight", (n_embd, 4 * n_embd), "Q4_K")]
    return sparse_gguf(path, a, kv, t)


def assistant(path, width_out=5376, n_embd=256, n_vocab=1024, layers=4, **vk):
    """A gemma4-assistant's header, as the converter writes it: embedding_length_out = the target's
    width, nextn_predict_layers = block_count, no K/V projections."""
    a = "gemma4-assistant"
    kv = {f"{a}.block_count": layers, f"{a}.nextn_predict_layers": layers, f"{a}.embedding_length": n_embd,
          f"{a}.embedding_length_out": width_out, f"{a}.context_length": 131072,
          f"{a}.attention.head_count": 4, f"{a}.attention.head_count_kv": 1, f"{a}.attention.key_length": 256,
          f"{a}.attention.value_length": 256, f"{a}.feed_forward_length": 4 * n_embd, **vocab(n_vocab, **vk)}
    t = [("token_embd.weight", (n_embd, n_vocab), "Q8_0"),
         ("nextn.pre_projection.weight", (2 * width_out, n_embd), "Q8_0"),
         ("nextn.post_projection.weight", (n_embd, width_out), "Q8_0"), ("output_norm.weight", (n_embd,), "F32")]
    for i in range(layers):
        t += [(f"blk.{i}.attn_norm.weight", (n_embd,), "F32"), (f"blk.{i}.attn_q.weight", (n_embd, 1024), "Q8_0"),
              (f"blk.{i}.ffn_up.weight", (n_embd, 4 * n_embd), "Q8_0")]
    return sparse_gguf(path, a, kv, t)


def drained(gen: Any) -> tuple[list[Any], Any]:
    """A generator's events, and what it returned (a phase's, a run's)."""
    events = []
    try:
        while True:
            events.append(next(gen))
    except StopIteration as stop:
        return events, stop.value
