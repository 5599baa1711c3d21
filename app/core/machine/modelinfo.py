"""What a GGUF is, from its header alone: architecture, sizes, quant mix, layers, attention vs
recurrent layers, KV shape, experts, MTP heads and their bytes. Memory fit and the roofline
ceiling are in app.core.machine.fit."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections import Counter
from typing import Any

from app.core.common.spec_modes import DRAFTER_MODES
from app.core.common.text import shown
from app.core.common.units import size
from app.core.machine.gguf_info import MTP_ARCHS, GGUFHeader, TensorInfo, check_gguf_file, read_header, split_parts

# bytes per element of KV cache types (llama.cpp block sizes: q8_0 34 B / 32, q4_0 18 B / 32 ...)
KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
            "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}


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
    # a separate drafter file (-md): "gemma4-assistant", "mtp-head" (NextN blocks without the
    # trunk), "eagle3", "dflash", "dspark"; None for an ordinary model (app.core.machine.drafter)
    drafter_kind: str | None = None
    n_embd_out: int | None = None  # <arch>.embedding_length_out: the target width an assistant reads

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
    from gguf.constants import GGMLQuantizationType  # deferred: the gguf package loads numpy (heavy)

    try:
        return GGMLQuantizationType(t).name
    except ValueError:
        return str(t)


def inspect(path: str | os.PathLike[str], header: GGUFHeader | None = None) -> ModelInfo:
    """``header``: the first part's header when the caller has read it already (read once)."""
    hdr = header if header is not None else check_gguf_file(path)
    parts = split_parts(path)
    tensors = list(hdr.tensors)
    size = hdr.file_size
    for extra in parts[1:]:
        h2 = read_header(extra, keep_arrays=False)
        tensors += list(h2.tensors)
        size += h2.file_size
    a = hdr.arch
    kv = hdr.metadata

    def g(key: str) -> Any:
        """A metadata value of the file's architecture (``{arch}.{key}``), or None."""
        return kv.get(f"{a}.{key}")

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
        note = f"llama.cpp has no MTP draft graph for {shown(a, 64)!r}"
    elif not has_mtp and nextn:
        note = hdr.mtp_problem()
    ft = kv.get("general.file_type")
    name = kv.get("general.name", "")
    return ModelInfo(
        # the name and the architecture are the file's words: one escaped line each, bounded
        path=str(path), parts=len(parts), file_size=size, arch=shown(a, 64),
        name=shown(name) if isinstance(name, str) else "",
        n_params=sum(t.n_elements for t in tensors), file_type=_file_type(ft, mix),
        quant_mix=dict(mix.most_common()), context_length=_int(g("context_length")), n_layers=trunk,
        n_full_attention=trunk - recurrent, n_recurrent=recurrent, n_head=n_head, n_head_kv=n_head_kv,
        key_length=k_len, value_length=v_len, n_embd=n_embd, n_experts=_int(g("expert_count")),
        n_experts_used=_int(g("expert_used_count")), has_mtp=has_mtp, nextn_layers=nextn,
        mtp_bytes=mtp_bytes, mtp_note=note, weight_bytes=sum(t.nbytes for t in tensors),
        expert_bytes=expert_bytes, ssm_conv_kernel=_int(g("ssm.conv_kernel")), ssm_state=_int(g("ssm.state_size")),
        ssm_inner=_int(g("ssm.inner_size")), ssm_groups=_int(g("ssm.group_count")), n_vocab=n_vocab, n_ff=n_ff,
        input_bytes=input_bytes, tied_output=tied, drafter_kind=drafter_kind(hdr, tensors, trunk),
        n_embd_out=_int(g("embedding_length_out")))


_BLOCK_RE = re.compile(r"blk\.(\d+)\.")


def drafter_kind(hdr: GGUFHeader, tensors: list[TensorInfo], trunk: int) -> str | None:
    """What kind of separate drafter a file is, from its architecture and tensors (llama.cpp's own
    tests: src/llama-arch.cpp's names; an mtp-only file has NextN blocks and no trunk block, as
    src/models/qwen35.cpp's ``mtp_only``); None for an ordinary model."""
    a = hdr.arch
    if a == "gemma4-assistant":
        return a
    if a == "eagle3":
        return "eagle3"
    if a == "dflash":  # a DSpark draft is a DFlash one with a Markov head
        return "dspark" if any(t.name == "markov_w1.weight" for t in tensors) else "dflash"
    if hdr.nextn_layers > 0 and trunk > 0:
        blocks = {int(m.group(1)) for t in tensors if (m := _BLOCK_RE.match(t.name))}
        if blocks and min(blocks) >= trunk:
            return "mtp-head"
    return None


def _num(x: Any) -> int | None:
    """A metadata number as an int; None for anything else (a text, an array, inf or NaN)."""
    if isinstance(x, int):
        return int(x)
    return int(x) if isinstance(x, float) and math.isfinite(x) else None


def _int(x: Any) -> int | None:
    if isinstance(x, (list, tuple)):
        vals = [n for n in map(_num, x) if n is not None]
        return max(vals) if vals else None
    return _num(x)


def _first_int(x: Any, default: int | None = None) -> int | None:
    if isinstance(x, (list, tuple)):
        vals = [n for n in map(_num, x) if n]
        return max(vals) if vals else default
    n = _num(x)
    return default if n is None else n


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


def _file_type(ft: Any, mix: Counter[str]) -> str:
    try:
        from gguf.constants import LlamaFileType  # deferred: the gguf package loads numpy (heavy)

        return LlamaFileType(int(ft)).name.replace("MOSTLY_", "").replace("ALL_", "")
    except Exception:
        return mix.most_common(1)[0][0] if mix else "unknown"


def format_info(m: ModelInfo) -> str:
    lines = [shown(m.path, 400) + (f" ({m.parts} parts)" if m.parts > 1 else ""),
             f"architecture: {m.arch}" + (f" ({m.name})" if m.name else ""),
             f"size: {size(m.file_size)}, {m.n_params / 1e9:.3f} B parameters, {m.file_type}",
             "quant mix: " + ", ".join(f"{t} {size(b)}" for t, b in list(m.quant_mix.items())[:5]),
             f"layers: {m.n_layers} ({m.n_full_attention} full attention, {m.n_recurrent} recurrent)",
             f"attention: {m.n_head} heads, {m.n_head_kv} KV heads x {m.key_length}+{m.value_length} dims; "
             f"KV {m.kv_bytes_per_token('f16') / 1024:.1f} KiB/token at f16, "
             f"{m.kv_bytes_per_token('q8_0') / 1024:.1f} KiB at q8_0",
             f"context: {m.context_length}"]
    if m.is_moe:
        lines.append(f"MoE: {m.n_experts} experts, {m.n_experts_used} used per token")
    lines.append(f"MTP heads: {'yes' if m.has_mtp else 'no'}"
                 + (f" ({m.nextn_layers} NextN block(s), {size(m.mtp_bytes)})" if m.has_mtp else ""))
    if m.mtp_note:
        lines.append(f"note: {m.mtp_note}")
    if m.drafter_kind:
        lines.append(f"drafter: {drafter_text(m)}")
    return "\n".join(lines)




def drafter_text(m: ModelInfo) -> str:
    """One line on what a drafter file drafts for, e.g. "gemma4-assistant drafter for a target of
    width 5376, vocabulary 262144 tokens (-md FILE --spec-type draft-mtp; shares the target's KV)"."""
    kind = m.drafter_kind or "model"
    width = m.n_embd_out if kind == "gemma4-assistant" else m.n_embd
    text = f"{kind} drafter"
    if kind == "mtp-head":
        text += f" for a {m.arch} target"
    if width and kind in ("gemma4-assistant", "mtp-head"):
        text += f" for a target of width {width}" if kind == "gemma4-assistant" else f" of width {width}"
    text += f", vocabulary {m.n_vocab} tokens" if m.n_vocab else ", vocabulary unknown"
    use = f"-md FILE --spec-type {DRAFTER_MODES.get(kind, DRAFTER_MODES['model'])[0]}"
    return text + f" ({use}" + ("; shares the target's KV cache)" if kind == "gemma4-assistant" else ")")


size_text = size  # the one size formatter (app.core.common.units), under the name its callers use
