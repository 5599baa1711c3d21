"""What a GGUF is, from its header alone: architecture, sizes, quant mix, layers, attention vs
recurrent layers, KV shape, experts, MTP heads and their bytes; memory fit with MTP's overhead
counted; the roofline ceiling of decode speed."""

from __future__ import annotations

import dataclasses
import math
import os
from collections import Counter
from typing import Any

from app.core.machine.gguf_info import MTP_ARCHS, GGUFHeader, split_parts, validate_model, read_header

# bytes per element of KV cache types (llama.cpp block sizes: q8_0 34 B / 32, q4_0 18 B / 32 ...)
KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
            "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
COMPUTE_BUFFER_FRACTION = 0.03  # compute buffers when the header lacks the vocabulary size (rough)
COMPUTE_BUFFER_MIN = 300 * 2**20
N_UBATCH = 512  # llama.cpp's default physical batch (-ub): the compute buffers scale with it
DEVICE_MARGIN = 1024 * 2**20  # what llama.cpp's own --fit keeps free per GPU (-fitt default): driver,
#                               CUDA/Metal context, fragmentation


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    path: str
    parts: int
    file_size: int
    arch: str
    name: str
    n_params: int
    file_type: str
    quant_mix: dict[str, int]  # ggml type -> bytes
    context_length: int | None
    n_layers: int  # trunk layers (block_count - nextn)
    n_full_attention: int
    n_recurrent: int
    n_head: int | None
    n_head_kv: int | None
    key_length: int | None
    value_length: int | None
    n_embd: int | None
    n_experts: int | None
    n_experts_used: int | None
    has_mtp: bool
    nextn_layers: int
    mtp_bytes: int
    mtp_note: str | None
    weight_bytes: int
    expert_bytes: int  # bytes of routed-expert tensors (MoE)
    # recurrent (DeltaNet/Mamba) layers: llama.cpp's ssm.* keys, None when the file has none
    ssm_conv_kernel: int | None = None
    ssm_state: int | None = None
    ssm_inner: int | None = None
    ssm_groups: int | None = None
    n_vocab: int | None = None
    n_ff: int | None = None  # feed-forward width a token passes through (MoE: expert width x used)
    input_bytes: int = 0  # token embedding tables: llama.cpp always keeps them in system RAM
    tied_output: bool = False  # no output.weight: the embedding is also the output head (on the GPU)

    @property
    def gpu_weight_bytes(self) -> int:
        """Weights that go to the GPU with everything offloaded (-ngl 999): all but the input
        embedding, which llama.cpp keeps on the CPU ("very little benefit to offloading the input
        layer"), unless it doubles as the output head."""
        return self.weight_bytes - (0 if self.tied_output else self.input_bytes)

    @property
    def is_moe(self) -> bool:
        return bool(self.n_experts and self.n_experts > 1)

    def kv_bytes_per_token(self, cache_type: str = "f16") -> float:
        """KV cache bytes per context token (target context, full-attention layers only)."""
        if not self.n_head_kv or not self.key_length or not self.value_length:
            return 0.0
        per = self.n_head_kv * (self.key_length + self.value_length) * KV_BYTES[cache_type]
        return self.n_full_attention * per

    def mtp_kv_bytes_per_token(self, cache_type: str = "f16") -> float:
        if not self.has_mtp or not self.n_head_kv or not self.key_length or not self.value_length:
            return 0.0
        return self.nextn_layers * self.n_head_kv * (self.key_length + self.value_length) * KV_BYTES[cache_type]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kv_bytes_per_token_f16"] = self.kv_bytes_per_token("f16")
        d["kv_bytes_per_token_q8_0"] = self.kv_bytes_per_token("q8_0")
        return d


def _type_name(t: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(t).name
    except ValueError:
        return str(t)


def inspect(path: str | os.PathLike) -> ModelInfo:
    hdr = validate_model(path)
    parts = split_parts(path)
    tensors = list(hdr.tensors)
    size = hdr.file_size
    for extra in parts[1:]:
        h2 = read_header(extra, keep_arrays=False)
        tensors += list(h2.tensors)
        size += h2.file_size
    a = hdr.arch
    kv = hdr.metadata
    g = lambda k, d=None: kv.get(f"{a}.{k}", d)  # noqa: E731
    blocks = hdr.block_count
    nextn = hdr.nextn_layers
    trunk = max(0, blocks - nextn)
    recurrent = _recurrent_layers(hdr, trunk)
    n_head = _first_int(g("attention.head_count"))
    n_head_kv = _first_int(g("attention.head_count_kv"), n_head)
    n_embd = _int(g("embedding_length"))
    k_len = _int(g("attention.key_length")) or (n_embd // n_head if n_embd and n_head else None)
    v_len = _int(g("attention.value_length")) or k_len
    n_vocab = None
    for t in tensors:
        if t.name in ("token_embd.weight", "output.weight") and len(t.shape) == 2:
            n_vocab = int(t.shape[1])
            break
    if n_vocab is None:
        toks = kv.get("tokenizer.ggml.tokens")
        n_vocab = len(toks) if isinstance(toks, (list, tuple)) and toks else None
    n_ff = _first_int(g("feed_forward_length"))
    exp_ff, n_used = _int(g("expert_feed_forward_length")), _int(g("expert_used_count"))
    if exp_ff and n_used:
        n_ff = max(n_ff or 0, exp_ff * n_used)
    input_bytes = sum(t.nbytes for t in tensors
                      if t.name == "token_embd.weight" or t.name.startswith("per_layer_token_embd"))
    tied = not any(t.name == "output.weight" for t in tensors)
    mix: Counter[str] = Counter()
    mtp_bytes = 0
    expert_bytes = 0
    mtp_prefixes = tuple(f"blk.{i}." for i in range(trunk, blocks))
    for t in tensors:
        mix[_type_name(t.ggml_type)] += t.nbytes
        if nextn and (t.name.startswith(mtp_prefixes) or ".nextn." in t.name):
            mtp_bytes += t.nbytes
        elif "_exps" in t.name:
            expert_bytes += t.nbytes
    has_mtp = hdr.has_mtp
    note = None
    if a == "gemma4":
        note = "Gemma 4 drafts with a separate gemma4-assistant GGUF (-md ... --spec-type draft-mtp)"
    elif has_mtp and a not in MTP_ARCHS:
        note = f"llama.cpp has no MTP draft graph for {a!r}"
    elif not has_mtp and nextn:
        note = hdr.mtp_problem()
    ft = kv.get("general.file_type")
    return ModelInfo(
        path=str(path), parts=len(parts), file_size=size, arch=a, name=str(kv.get("general.name", "")),
        n_params=sum(t.n_elements for t in tensors), file_type=_file_type(ft, mix),
        quant_mix=dict(mix.most_common()), context_length=_int(g("context_length")), n_layers=trunk,
        n_full_attention=trunk - recurrent, n_recurrent=recurrent, n_head=n_head, n_head_kv=n_head_kv,
        key_length=k_len, value_length=v_len, n_embd=n_embd, n_experts=_int(g("expert_count")),
        n_experts_used=_int(g("expert_used_count")), has_mtp=has_mtp, nextn_layers=nextn,
        mtp_bytes=mtp_bytes, mtp_note=note, weight_bytes=sum(t.nbytes for t in tensors),
        expert_bytes=expert_bytes, ssm_conv_kernel=_int(g("ssm.conv_kernel")), ssm_state=_int(g("ssm.state_size")),
        ssm_inner=_int(g("ssm.inner_size")), ssm_groups=_int(g("ssm.group_count")), n_vocab=n_vocab, n_ff=n_ff,
        input_bytes=input_bytes, tied_output=tied)


def _int(x: Any) -> int | None:
    if isinstance(x, (list, tuple)):
        x = max(x) if x else None
    return int(x) if isinstance(x, (int, float)) else None


def _first_int(x: Any, default: int | None = None) -> int | None:
    if isinstance(x, (list, tuple)):
        vals = [v for v in x if v]
        return int(max(vals)) if vals else default
    return int(x) if isinstance(x, (int, float)) else default


def _recurrent_layers(hdr: GGUFHeader, trunk: int) -> int:
    kv = hdr.metadata
    a = hdr.arch
    rl = kv.get(f"{a}.attention.recurrent_layers")
    if isinstance(rl, list) and rl:
        return sum(1 for v in rl[:trunk] if v)
    interval = kv.get(f"{a}.full_attention_interval")
    if a in ("qwen35", "qwen35moe", "qwen3next") or interval:
        iv = int(interval or 4)
        return sum(1 for i in range(trunk) if (i + 1) % iv != 0)
    if kv.get(f"{a}.ssm.state_size") and a in ("mamba", "mamba2", "rwkv6", "rwkv7"):
        return trunk
    hkv = kv.get(f"{a}.attention.head_count_kv")
    if isinstance(hkv, list):  # hybrid models mark recurrent layers with 0 KV heads
        return sum(1 for v in hkv[:trunk] if not v)
    return 0


def _file_type(ft: Any, mix: Counter) -> str:
    try:
        from gguf.constants import LlamaFileType

        return LlamaFileType(int(ft)).name.replace("MOSTLY_", "").replace("ALL_", "")
    except Exception:
        return mix.most_common(1)[0][0] if mix else "unknown"


# ------------------------------------------------------------------------------------------
# memory fit


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


def fit(info: ModelInfo, available: int | None, *, ctx: int = 8192, cache_type: str = "f16",
        mtp: bool = False, k: int = 3, draft_cache_type: str = "f16", ram_available: int | None = None,
        on_gpu: bool = True, n_ubatch: int = N_UBATCH) -> FitResult:
    """Does the model fit ``available`` bytes (GPU free memory or the Apple usable share; system
    RAM when ``on_gpu`` is False, where no offload flags apply)?"""
    host = info.input_bytes if (on_gpu and not info.tied_output) else 0  # embeddings stay in RAM
    weights = info.weight_bytes - (0 if mtp else info.mtp_bytes) - host
    kv = info.kv_bytes_per_token(cache_type) * ctx
    mtp_kv = info.mtp_kv_bytes_per_token(draft_cache_type) * ctx if mtp else 0.0
    rec = _recurrent_state_bytes(info) * ((1 + k) if (mtp and info.n_recurrent) else 1)
    contexts = 2 if mtp else 1  # the MTP context has its own compute buffers, about the target's
    compute = compute_buffer_bytes(info, ctx, n_ubatch) * contexts
    margin = DEVICE_MARGIN if on_gpu else 0
    breakdown = {"weights": int(weights), "kv_cache": int(kv), "mtp_kv_cache": int(mtp_kv),
                 "recurrent_state": int(rec), "compute_buffers": int(compute), "device_margin": margin}
    need = int(sum(breakdown.values()))
    mode = "mtp" if mtp else "baseline"
    if available is None:
        return FitResult(mode, need, None, "unknown", (), None, breakdown,
                         "free GPU memory unknown: cannot judge the fit")
    fixed = weights + rec + compute_buffer_bytes(info, 0, n_ubatch) * contexts + margin
    per_tok = (info.kv_bytes_per_token(cache_type) + (info.mtp_kv_bytes_per_token(draft_cache_type) if mtp else 0)
               + _MASK_BYTES * n_ubatch * contexts)
    max_ctx = int((available - fixed) // per_tok) if per_tok and available > fixed else (None if per_tok else None)
    if max_ctx is not None and info.context_length:
        max_ctx = min(max_ctx, info.context_length)
    if need <= available:
        if not on_gpu:
            return FitResult(mode, need, available, "fits", ("-c", str(ctx)), max_ctx, breakdown,
                             f"fits in system RAM with {ctx} context (CPU only: decode is RAM-bound)")
        return FitResult(mode, need, available, "fits", ("-ngl", "999", "-c", str(ctx)), max_ctx, breakdown,
                         f"everything on the GPU with {ctx} context, {(available - need) / 2**30:.1f} GiB to "
                         f"spare beyond the {DEVICE_MARGIN / 2**30:.0f} GiB llama.cpp keeps free"
                         + (f"; the token embeddings ({host / 2**30:.2f} GiB) stay in system RAM" if host else ""))
    if not on_gpu:
        return FitResult(mode, need, available, "does not fit", (), max_ctx, breakdown,
                         f"needs {need / 2**30:.1f} GiB, {available / 2**30:.1f} GiB of RAM available")
    over = need - available
    if info.is_moe and info.expert_bytes:
        per_layer = info.expert_bytes / max(1, info.n_layers + (info.nextn_layers if mtp else 0))
        n = math.ceil(over / per_layer) if per_layer else None
        if n is not None and n <= info.n_layers and (ram_available is None or n * per_layer < ram_available):
            return FitResult(mode, need, available, "fits with flags",
                             ("-ngl", "999", "--n-cpu-moe", str(n), "-c", str(ctx)), max_ctx, breakdown,
                             f"keep the experts of the first {n} layers in system RAM (--n-cpu-moe {n}); "
                             "attention, shared weights and the MTP block stay on the GPU")
    per_layer = weights / max(1, info.n_layers + (info.nextn_layers if mtp else 0) + 1)
    on_gpu = int((available - kv - mtp_kv - rec - compute - margin) // per_layer) if per_layer else 0
    if on_gpu >= 1:
        return FitResult(mode, need, available, "fits with flags", ("-ngl", str(on_gpu), "-c", str(ctx)),
                         max_ctx, breakdown, f"only {on_gpu} layers fit on the GPU (-ngl {on_gpu}); "
                         "the rest run from system RAM, much slower")
    return FitResult(mode, need, available, "does not fit", (), max_ctx, breakdown,
                     f"needs {need / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available")


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


def _recurrent_state_bytes(info: ModelInfo) -> int:
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
    weights = info.weight_bytes - info.mtp_bytes
    if info.is_moe and info.expert_bytes and info.n_experts and info.n_experts_used:
        weights = weights - info.expert_bytes + info.expert_bytes * info.n_experts_used / info.n_experts
    if info.input_bytes and not info.tied_output and info.n_vocab:
        weights = weights - info.input_bytes + info.input_bytes / info.n_vocab  # one embedding row
    return weights + info.kv_bytes_per_token(cache_type) * depth


def ceiling_tok_s(info: ModelInfo, bandwidth_gbs: float | None, depth: int = 0) -> float | None:
    if not bandwidth_gbs:
        return None
    return bandwidth_gbs * 1e9 / bytes_per_token(info, depth)


def format_info(m: ModelInfo) -> str:
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    lines = [f"{m.path}" + (f" ({m.parts} parts)" if m.parts > 1 else ""),
             f"architecture: {m.arch}" + (f" ({m.name})" if m.name else ""),
             f"size: {gib(m.file_size)}, {m.n_params / 1e9:.3f} B parameters, {m.file_type}",
             "quant mix: " + ", ".join(f"{t} {gib(b)}" for t, b in list(m.quant_mix.items())[:5]),
             f"layers: {m.n_layers} ({m.n_full_attention} full attention, {m.n_recurrent} recurrent)",
             f"attention: {m.n_head} heads, {m.n_head_kv} KV heads x {m.key_length}+{m.value_length} dims; "
             f"KV {m.kv_bytes_per_token('f16') / 1024:.1f} KiB/token at f16, "
             f"{m.kv_bytes_per_token('q8_0') / 1024:.1f} KiB at q8_0",
             f"context: {m.context_length}"]
    if m.is_moe:
        lines.append(f"MoE: {m.n_experts} experts, {m.n_experts_used} used per token")
    lines.append(f"MTP heads: {'yes' if m.has_mtp else 'no'}"
                 + (f" ({m.nextn_layers} NextN block(s), {gib(m.mtp_bytes)})" if m.has_mtp else ""))
    if m.mtp_note:
        lines.append(f"note: {m.mtp_note}")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class FitSummary:
    """Baseline and MTP memory fit on this machine's best device, and the roofline ceiling."""

    target: str  # "NVIDIA ... " / "Apple ... unified memory" / "system RAM (no GPU)"
    fits: tuple[FitResult, ...]  # baseline first, then MTP when the model has heads
    bandwidth_gbs: float | None
    ceiling_tok_s: float | None


def fit_summary(m: ModelInfo, hw, *, ctx: int = 8192, cache_type: str = "f16", k: int = 3) -> FitSummary:
    """``hw`` is a hardware snapshot; the CLI's ``inspect`` and the window show this same summary."""
    gpu = hw.gpus[0] if hw.gpus else None
    avail = (gpu.vram_free or gpu.vram_total) if gpu else hw.ram_available
    target = gpu.name if gpu else "system RAM (no GPU)"
    fits = tuple(fit(m, avail, ctx=ctx, cache_type=cache_type, mtp=mtp, k=k, ram_available=hw.ram_available,
                     on_gpu=gpu is not None) for mtp in (False, True) if mtp is False or m.has_mtp)
    bw = gpu.bandwidth_gbs if gpu else None
    return FitSummary(target, fits, bw, ceiling_tok_s(m, bw))


def format_fit(s: FitSummary, ctx: int, cache_type: str) -> str:
    lines = [f"memory fit on {s.target}, context {ctx}, KV {cache_type}:"]
    for f in s.fits:
        lines.append(f"  {f.mode:<8} needs {f.need_bytes / 2**30:.2f} GiB: {f.verdict}"
                     + (f" ({' '.join(f.flags)})" if f.flags else "") + f"; {f.explanation}")
    if len(s.fits) == 2:
        lines.append("  " + mtp_overhead_line(s.fits[0], s.fits[1]))
    if s.ceiling_tok_s:
        lines.append(f"\nroofline: at most {s.ceiling_tok_s:.0f} tok/s at {s.bandwidth_gbs:.0f} GB/s")
    return "\n".join(lines)


_PARTS = (("weights", "MTP block"), ("mtp_kv_cache", "its own KV"),
          ("recurrent_state", "recurrent-state snapshots"), ("compute_buffers", "its compute buffers"),
          ("kv_cache", "KV"))


def size_text(b: float) -> str:
    """Bytes for people: GiB from 1 GiB up, MiB below (a tiny model's parts are not all "0.00 GiB")."""
    if abs(b) >= 2**30:
        return f"{b / 2**30:.2f} GiB"
    return f"{b / 2**20:.1f} MiB" if abs(b) < 10 * 2**20 else f"{b / 2**20:.0f} MiB"


def mtp_overhead_line(base: FitResult, mtp: FitResult) -> str:
    """What turning MTP on adds, part by part (users report 1-2.5 GB and are surprised by it)."""
    parts = [(label, mtp.breakdown[key] - base.breakdown[key]) for key, label in _PARTS]
    shown = ", ".join(f"{label} {size_text(d)}" for label, d in parts if d)
    return f"MTP adds {size_text(mtp.need_bytes - base.need_bytes)}" + (f" ({shown})" if shown else "")
