"""Memory fit of a model (what ``inspect`` and the window show): the bytes of weights, KV cache,
MTP's own block and KV, recurrent-state snapshots and compute buffers against a device, with
MTP's overhead counted; and the roofline ceiling of decode speed."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Mapping, Sequence

from app.core.common.units import size
from app.core.machine.modelinfo import ModelInfo, size_text

if TYPE_CHECKING:  # drafter imports this module's neighbours; the type is for annotations only
    from app.core.machine.drafter import DrafterInfo
    from app.core.machine.hardware import HardwareSnapshot

COMPUTE_BUFFER_FRACTION = 0.03  # compute buffers when the header lacks the vocabulary size (rough)
COMPUTE_BUFFER_MIN = 300 * 2**20
N_UBATCH = 512  # llama.cpp's default physical batch (-ub): the compute buffers scale with it
DEVICE_MARGIN = 1024 * 2**20  # what llama.cpp's own --fit keeps free per GPU (-fitt default): driver,
#                               CUDA/Metal context, fragmentation

CTX_PAD = 256  # llama.cpp pads the context to a multiple of this many cells (llama-context.cpp)
HEADER_MODEL = "header model"  # what sized a figure without llama.cpp's own sizing


@dataclasses.dataclass(frozen=True)
class Sized:
    """One fit's caches and compute buffers as llama.cpp itself sized them (app.core.engines.dry_run,
    through app.core.session.memory.sized_fit_summary: the sweep's own memory check): the parts at
    the fit's context by arm_memory's part names ("kv", "recurrent", "compute", "mtp_kv",
    "mtp_compute", "drafter_kv", "drafter_compute", "repack"), how much each grows per context
    token, and what sized them."""

    parts: Mapping[str, int]
    per_token: Mapping[str, float]
    by: str


@dataclasses.dataclass(frozen=True)
class FitResult:
    mode: str  # "baseline" or "mtp"
    need_bytes: int
    available_bytes: int | None
    verdict: str  # "fits", "fits with flags", "does not fit", "unknown"
    flags: tuple[str, ...]
    max_context: int | None
    breakdown: dict[str, int]
    explanation: str
    sized_by: str = HEADER_MODEL  # what sized the caches and compute buffers (llama.cpp's dry run or this)


def fit(info: ModelInfo, available: int | None, *, ctx: int = 8192, cache_type: str = "f16",
        mtp: bool = False, k: int = 3, draft_cache_type: str = "f16", ram_available: int | None = None,
        on_gpu: bool = True, n_ubatch: int = N_UBATCH,
        drafter: "DrafterInfo | ModelInfo | None" = None, sized: Sized | None = None) -> FitResult:
    """Does the model fit ``available`` bytes (GPU free memory or the Apple usable share; system
    RAM when ``on_gpu`` is False, where no offload flags apply)? With a separate ``drafter``
    (-md), its weights, its own KV cache (none for a Gemma 4 assistant, which reads the target's;
    a draft-simple model's at the same context, typed by ``draft_cache_type`` as -ctkd/-ctvd) and
    its context's compute buffer are three more lines of the breakdown. ``sized``: the caches and
    compute buffers as llama.cpp itself sized them, in place of the header model's (the weights
    stay the header's; on the CPU its repacked copies, "cpu_repack", are one more line)."""
    host = info.input_bytes if (on_gpu and not info.tied_output) else 0  # embeddings stay in RAM
    weights = info.weight_bytes - (0 if mtp else info.mtp_bytes) - host
    kv = info.kv_bytes_per_token(cache_type) * ctx
    mtp_kv = info.mtp_kv_bytes_per_token(draft_cache_type) * ctx if mtp else 0.0
    # rollback snapshots: llama.cpp keeps 1 + K recurrent states with draft-mtp/eagle3/dflash/dspark
    snapshots = mtp or (drafter is not None and _kind(drafter) != "model")
    rec = recurrent_state_bytes(info) * ((1 + k) if (snapshots and info.n_recurrent) else 1)
    contexts = 2 if mtp else 1  # the MTP context has its own compute buffers, about the target's
    compute = compute_buffer_bytes(info, ctx, n_ubatch) * contexts
    margin = DEVICE_MARGIN if on_gpu else 0
    d_weights, d_kv_tok, d_fixed, d_compute = (drafter_parts(drafter, ctx, draft_cache_type, n_ubatch, on_gpu)
                                               if drafter is not None else (0, 0.0, 0, 0))
    d_kv = d_kv_tok * ctx
    if sized is not None:
        p = sized.parts
        kv, mtp_kv, rec = p.get("kv", 0), p.get("mtp_kv", 0), p.get("recurrent", 0)
        compute, d_kv, d_compute = p.get("compute", 0) + p.get("mtp_compute", 0), p.get("drafter_kv", 0), \
            p.get("drafter_compute", 0)
    breakdown = {"weights": int(weights), "kv_cache": int(kv), "mtp_kv_cache": int(mtp_kv),
                 "recurrent_state": int(rec), "compute_buffers": int(compute), "device_margin": margin}
    if sized is not None and not on_gpu and sized.parts.get("repack"):
        breakdown["cpu_repack"] = int(sized.parts["repack"])
    d_total = d_weights + d_kv + d_compute
    if drafter is not None:
        breakdown.update({"drafter_weights": int(d_weights), "drafter_kv_cache": int(d_kv),
                          "drafter_compute_buffers": int(d_compute)})
    need = int(sum(breakdown.values()))
    by = sized.by if sized is not None else HEADER_MODEL
    mode = ("mtp" if mtp else "baseline") if drafter is None else ("mtp+drafter" if mtp else "drafter")
    if available is None:
        return FitResult(mode, need, None, "unknown", (), None, breakdown,
                         "free GPU memory unknown: cannot judge the fit", sized_by=by)
    if sized is not None:  # each part along its line (llama.cpp's own sizes at two contexts)
        per_tok = sum(sized.per_token.get(part, 0.0) for part in _GROWING)
        fixed = need - per_tok * ctx
    else:
        fixed = weights + rec + compute_buffer_bytes(info, 0, n_ubatch) * contexts + margin + d_weights + d_fixed
        per_tok = (info.kv_bytes_per_token(cache_type) + (info.mtp_kv_bytes_per_token(draft_cache_type) if mtp else 0)
                   + _MASK_BYTES * n_ubatch * (contexts + (drafter is not None)) + d_kv_tok)
    max_ctx = int((available - fixed) // per_tok) if per_tok and available > fixed else (None if per_tok else None)
    if sized is not None and max_ctx is not None:  # llama.cpp pads -c up to whole 256 cells: exact on its line there
        max_ctx -= max_ctx % CTX_PAD
    if max_ctx is not None and info.context_length:
        max_ctx = min(max_ctx, info.context_length)
    if need <= available:
        if not on_gpu:
            return FitResult(mode, need, available, "fits", ("-c", str(ctx)), max_ctx, breakdown,
                             f"fits in system RAM with {ctx} context (CPU only: decode is RAM-bound)", sized_by=by)
        return FitResult(mode, need, available, "fits", ("-ngl", "999", "-c", str(ctx)), max_ctx, breakdown,
                         f"everything on the GPU with {ctx} context, {size(available - need, 1, 'GiB')} to "
                         f"spare beyond the {size(DEVICE_MARGIN, 0, 'GiB')} llama.cpp keeps free"
                         + (f"; the token embeddings ({size(host, 2, 'GiB')}) stay in system RAM" if host else ""),
                         sized_by=by)
    if not on_gpu:
        return FitResult(mode, need, available, "does not fit", (), max_ctx, breakdown,
                         f"needs {size(need, 1, 'GiB')}, {size(available, 1, 'GiB')} of RAM available", sized_by=by)
    over = need - available
    if info.is_moe and info.expert_bytes:
        per_layer = info.expert_bytes / max(1, info.n_layers + (info.nextn_layers if mtp else 0))
        n = math.ceil(over / per_layer) if per_layer else None
        if n is not None and n <= info.n_layers and (ram_available is None or n * per_layer < ram_available):
            return FitResult(mode, need, available, "fits with flags",
                             ("-ngl", "999", "--n-cpu-moe", str(n), "-c", str(ctx)), max_ctx, breakdown,
                             f"keep the experts of the first {n} layers in system RAM (--n-cpu-moe {n}); "
                             "attention, shared weights and the MTP block stay on the GPU", sized_by=by)
    per_layer = weights / max(1, info.n_layers + (info.nextn_layers if mtp else 0) + 1)
    layers = int((available - kv - mtp_kv - rec - compute - margin - d_total) // per_layer) if per_layer else 0
    if layers >= 1:
        return FitResult(mode, need, available, "fits with flags", ("-ngl", str(layers), "-c", str(ctx)),
                         max_ctx, breakdown, f"only {layers} layers fit on the GPU (-ngl {layers}); "
                         "the rest run from system RAM, much slower", sized_by=by)
    return FitResult(mode, need, available, "does not fit", (), max_ctx, breakdown,
                     f"needs {size(need, 1, 'GiB')}, {size(available, 1, 'GiB')} available", sized_by=by)


_GROWING = ("kv", "mtp_kv", "recurrent", "compute", "mtp_compute", "drafter_kv", "drafter_compute")
_MASK_BYTES = 2  # the attention mask: f16, context x ubatch
# activations per token: bytes per unit of the widest layer and per unit of n_embd, fitted to
# llama.cpp's CPU allocation for two calibrated shapes (tests/test_modelinfo.py checks others)
_ACT_WIDTH, _ACT_EMBD = 12.7, 4.7


def compute_buffer_bytes(info: ModelInfo, ctx: int, n_ubatch: int = N_UBATCH) -> int:
    """One context's compute buffer as llama.cpp reserves it (its worst-case graph of one ubatch):
    the larger of the output phase (f32 logits for every token of the ubatch) and the layer phase
    (the f16 attention mask over the context plus the widest activations). Checked against
    llama.cpp's own allocation on CPU (tests/test_modelinfo.py); without the vocabulary size in the
    header: a rough share of the weights."""
    if not info.n_vocab or not info.n_embd:
        return int(max(COMPUTE_BUFFER_MIN, COMPUTE_BUFFER_FRACTION * info.weight_bytes))
    width = max(info.n_embd, info.n_ff or 0, 2 * (info.n_head or 0) * (info.key_length or 0))
    output = 4 * info.n_vocab + 16 * info.n_embd
    layers = _MASK_BYTES * ctx + _ACT_WIDTH * width + _ACT_EMBD * info.n_embd
    return int(n_ubatch * max(output, layers))


def _kind(drafter: "DrafterInfo | ModelInfo") -> str:
    return (drafter.drafter_kind or "model") if isinstance(drafter, ModelInfo) else drafter.kind


def drafter_parts(drafter: "DrafterInfo | ModelInfo", ctx: int, cache_type: str, n_ubatch: int,
                   on_gpu: bool) -> tuple[int, float, int, int]:
    """A separate drafter's weights, KV bytes per context token, and its context's compute buffer
    at no context and at ``ctx``. Its KV: none for a Gemma 4 assistant (it reads the target's
    cells), the NextN blocks' for an mtp-only head, every attention layer's for a draft model."""
    m = drafter if isinstance(drafter, ModelInfo) else drafter.info
    if m is None:  # a DrafterInfo made without its header summary: weights and a rough buffer
        return drafter.weight_bytes, 0.0, COMPUTE_BUFFER_MIN, COMPUTE_BUFFER_MIN
    weights = m.gpu_weight_bytes if on_gpu else m.weight_bytes
    if m.drafter_kind == "gemma4-assistant":
        kv = 0.0
    elif m.drafter_kind == "mtp-head":
        kv = m.mtp_kv_bytes_per_token(cache_type)
    else:
        kv = m.kv_bytes_per_token(cache_type)
    return weights, kv, compute_buffer_bytes(m, 0, n_ubatch), compute_buffer_bytes(m, ctx, n_ubatch)


def recurrent_state_bytes(info: ModelInfo) -> int:
    """Fixed-size DeltaNet/SSM state of one sequence, f32, as llama.cpp allocates it: per recurrent
    layer a convolution state of (conv_kernel - 1) x (inner + 2 x groups x state) values and a
    recurrent state of state x inner values. Without the ssm.* keys: a rough n_embd^2 / 8 floats."""
    if not info.n_recurrent:
        return 0
    if info.ssm_conv_kernel and info.ssm_state and info.ssm_inner:
        groups = info.ssm_groups or 0  # Mamba-1 has no groups
        conv = (info.ssm_conv_kernel - 1) * (info.ssm_inner + 2 * groups * info.ssm_state)
        return info.n_recurrent * (conv + info.ssm_state * info.ssm_inner) * 4
    if not info.n_embd:
        return 0
    return int(info.n_recurrent * info.n_embd * info.n_embd / 8 * 4)


# ------------------------------------------------------------------------------------------
# roofline


def bytes_per_token(info: ModelInfo, depth: int = 0, cache_type: str = "f16") -> float:
    """Bytes read to generate one token: all weights for dense models, shared + used experts for
    MoE (MTP block not counted: a baseline decode does not read it; of the input embedding only
    the token's row), plus the KV at ``depth``."""
    weights: float = info.weight_bytes - info.mtp_bytes
    if info.is_moe and info.expert_bytes and info.n_experts and info.n_experts_used:
        weights = weights - info.expert_bytes + info.expert_bytes * info.n_experts_used / info.n_experts
    if info.input_bytes and not info.tied_output and info.n_vocab:
        weights = weights - info.input_bytes + info.input_bytes / info.n_vocab  # one embedding row
    return weights + info.kv_bytes_per_token(cache_type) * depth


def ceiling_tok_s(info: ModelInfo, bandwidth_gbs: float | None, depth: int = 0) -> float | None:
    if not bandwidth_gbs:
        return None
    return bandwidth_gbs * 1e9 / bytes_per_token(info, depth)


@dataclasses.dataclass(frozen=True)
class FitSummary:
    """Baseline and MTP memory fit on this machine's best device, and the roofline ceiling."""

    target: str  # "NVIDIA ... " / "Apple ... unified memory" / "system RAM (no GPU)"
    fits: tuple[FitResult, ...]  # baseline first, then MTP when the model has heads
    bandwidth_gbs: float | None
    ceiling_tok_s: float | None


def fit_summary(m: ModelInfo, hw: HardwareSnapshot, *, ctx: int = 8192, cache_type: str = "f16", k: int = 3,
                drafter: "DrafterInfo | ModelInfo | None" = None,
                sized: Mapping[str, Sized | None] | None = None) -> FitSummary:
    """``hw`` is a hardware snapshot; the CLI's ``inspect`` and the window show this same summary.
    With a ``drafter``: a third fit, the target (without its own MTP heads) beside the drafter.
    ``sized``: llama.cpp's own sizes of each fit by its mode ("baseline", "mtp", "drafter"; None or
    absent: the header model sizes it), from app.core.session.memory.sized_fit_summary."""
    gpu = hw.gpus[0] if hw.gpus else None
    avail = (gpu.vram_free or gpu.vram_total) if gpu else hw.ram_available
    target = gpu.name if gpu else "system RAM (no GPU)"
    by = sized or {}
    fits = tuple(fit(m, avail, ctx=ctx, cache_type=cache_type, mtp=mtp, k=k, ram_available=hw.ram_available,
                     on_gpu=gpu is not None, sized=by.get("mtp" if mtp else "baseline"))
                 for mtp in (False, True) if mtp is False or m.has_mtp)
    if drafter is not None:
        fits += (fit(m, avail, ctx=ctx, cache_type=cache_type, k=k, ram_available=hw.ram_available,
                     on_gpu=gpu is not None, drafter=drafter, sized=by.get("drafter")),)
    bw = gpu.bandwidth_gbs if gpu else None
    return FitSummary(target, fits, bw, ceiling_tok_s(m, bw))


def format_fit(s: FitSummary, ctx: int, cache_type: str) -> str:
    lines = [f"memory fit on {s.target}, context {ctx}, KV {cache_type}:"]
    for f in s.fits:
        lines.append(f"  {f.mode:<8} needs {size(f.need_bytes, 2, 'GiB')}: {f.verdict}"
                     + (f" ({' '.join(f.flags)})" if f.flags else "") + f"; {f.explanation}")
    for f in s.fits[1:]:
        lines.append("  " + overhead_line(s.fits[0], f))
    lines.append("  " + sized_by_line(s))
    if s.ceiling_tok_s:
        lines.append(f"\nroofline: at most {s.ceiling_tok_s:.0f} tok/s at {s.bandwidth_gbs:.0f} GB/s")
    return "\n".join(lines)


def sized_by_line(s: FitSummary) -> str:
    """What sized the caches and compute buffers of the fits: "sized by llama.cpp's dry run, ..."
    (the same as the sweep's memory check), or the header model where the library could not."""
    names = list(dict.fromkeys(f.sized_by for f in s.fits))
    return "caches and compute buffers sized by " + "; ".join(
        n + ("" if len(names) == 1 else f" ({', '.join(f.mode for f in s.fits if f.sized_by == n)})") for n in names)


_PARTS = (("weights", "MTP block"), ("mtp_kv_cache", "its own KV"),
          ("recurrent_state", "recurrent-state snapshots"), ("compute_buffers", "its compute buffers"),
          ("kv_cache", "KV"))


def mtp_overhead_line(base: FitResult, mtp: FitResult) -> str:
    """What turning MTP on adds, part by part (users report 1-2.5 GB and are surprised by it)."""
    parts = [(label, mtp.breakdown[key] - base.breakdown[key]) for key, label in _PARTS]
    shown = ", ".join(f"{label} {size_text(d)}" for label, d in parts if d)
    return f"MTP adds {size_text(mtp.need_bytes - base.need_bytes)}" + (f" ({shown})" if shown else "")


_DRAFTER_PARTS = (("drafter_weights", "its weights"), ("drafter_kv_cache", "its own KV"),
                  ("drafter_compute_buffers", "its compute buffers"), ("recurrent_state", "recurrent-state snapshots"))


def overhead_line(base: FitResult, other: FitResult) -> str:
    """What MTP, or a separate drafter, adds to the baseline, part by part."""
    if "drafter_weights" not in other.breakdown:
        return mtp_overhead_line(base, other)
    parts = [(label, other.breakdown[key] - base.breakdown.get(key, 0)) for key, label in _DRAFTER_PARTS]
    shown = ", ".join(f"{label} {size_text(d)}" for label, d in parts if d)
    if not other.breakdown["drafter_kv_cache"]:
        shown += ("; " if shown else "") + "no KV cache of its own: it reads the target's"
    return f"the drafter adds {size_text(other.need_bytes - base.need_bytes)}" + (f" ({shown})" if shown else "")


def _amount(b: float) -> str:
    return size(b, 1) if b >= 2**30 else size(b)


def spread_line(f: FitResult, workers_free: Sequence[int]) -> str:
    """One fit spread over this machine and RPC workers (``--rpc``): llama.cpp splits the layers
    over every device in proportion to its free memory, so the model fits when it fits in all the
    free memory together; each worker's free memory is what it reported (``rpc check``)."""
    n, theirs = len(workers_free), sum(workers_free)
    who = f"{n} worker{'' if n == 1 else 's'} ({_amount(theirs)} free)"
    here = f.available_bytes
    if here is None:
        return (f"{f.mode}: needs {_amount(f.need_bytes)}; this machine's free memory is not known, "
                f"{who}")
    total = here + theirs
    if f.need_bytes > total:
        return (f"{f.mode}: does not fit across this machine ({_amount(here)} free) and {who}: needs "
                f"{_amount(f.need_bytes)}, {_amount(total)} free in all")
    local = f.need_bytes * here / total if total else 0.0
    return (f"{f.mode}: fits across this machine ({_amount(here)} free) and {who}: needs "
            f"{_amount(f.need_bytes)} of {_amount(total)}, about {_amount(local)} here and "
            f"{_amount(f.need_bytes - local)} on the workers")
