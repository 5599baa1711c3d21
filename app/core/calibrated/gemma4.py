"""A tiny calibrated Gemma 4 pair: a ``gemma4`` target and a ``gemma4-assistant`` drafter GGUF.

llama.cpp drafts for Gemma 4 with a separate assistant (``-md assistant.gguf --spec-type
draft-mtp``). It has no K/V projections (its SWA layers read the target's KV of layer
``n_layer-2``, its full layers of ``n_layer-1``), embeds the token it is fed with the target's
``token_embd``, takes ``concat(that, h)`` through ``pre_projection``, predicts with its own tied
``token_embd``, and ``post_projection`` gives the ``h`` of its next draft step. All drafts of a
step sit at the same position (shared-KV mode).

Construction (the idea of the qwen35 model in app.core.calibrated.design, same vocabulary and
tables): every block of both files adds exactly zero to the residual stream (the post-attention,
post-FFN and per-layer post norms are zero; the kernels before them run on small random weights,
so a NaN would still show). The target is then the bigram ``softcap30(W_out . rmsnorm(E[t]))``
following the cycle ``B``, and the ``h`` it hands over is ``rmsnorm(E[t])``. Its embeddings are
``E[t] = Q^T c(t) + noise`` off ``Q`` (``n_embd_assistant x n_embd``, orthonormal rows), with
``c(t_j) = R^j c0`` at place ``j`` of the cycle (``R`` a block rotation of order 771: ``c(B(t)) =
R c(t)``). The target depends only on seed and shape: every variant fits it.
The assistant's state before its head is ``c(x)`` for one token ``x``; its head maps ``c(x)`` to
``mtp_next_token[x]`` (right, except on a corrupted subset of share ``p_reject``). Variants:

``embedding``
    ``pre_projection = [Q | 0]``, ``x`` = the token fed: draft ``j+1`` = ``mtp[draft j]``
    (``B``; corrupted ``B^2``, always wrong). Ignores ``h``.
``hidden``
    ``[0 | Q]``, ``post_projection = Q^T``: ``x`` = ``prev``, whose target ``h`` it gets (the token
    before the last); every draft of a step is ``mtp[prev]`` (``B^2``; corrupted ``B^3``). Draft 1
    is right only with the right hand-off of the target's ``h``; drafts 2..K are always wrong.
``chain``
    as ``hidden`` with ``post_projection = Q^T R``: its own ``h`` moves ``x`` one step along the
    cycle, draft ``j`` = ``mtp[B^(j-1)(prev)]``, so whole drafts are right, and drafts 2..K only
    with the right hand-off of its own ``h``.

:func:`simulate_pair` over :func:`pair_tables` gives llama-server's exact ``draft_n`` /
``draft_n_accepted`` and tokens (greedy, one slot). Exercised: loading both files (SWA pattern
with two head sizes, shared-KV layers, per-layer input embeddings, soft-capping, rope_freqs; the
assistant's cross-model KV share and the target's ``tok_embd``), the draft-mtp driver in shared-KV
mode, both ``h`` hand-offs, verification, rollback and the accounting. Not exercised: what
attention computes (blocks add zero: a wrong KV share or draft position gives the same tokens),
real speed, Gemma's own tokenizer."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from app.core.common.atomic import atomic_path
from app.core.common.errors import UserError
from app.core.calibrated.design import (ALPHA, CHAT_TEMPLATE, cycle_token_ids, design_tables, N_VOCAB, SimResult,
                                         simulate, Tables, write_tokenizer)

if TYPE_CHECKING:  # gguf loads only where a model is written (a heavy import)
    from gguf import GGUFWriter

TARGET_ARCH = "gemma4"
ASSISTANT_ARCH = "gemma4-assistant"
TARGET_FILE = "gemma4-tiny-target.gguf"
ASSISTANT_FILE = "mtp-gemma4-tiny-assistant.gguf"
VARIANTS = ("embedding", "hidden", "chain")
SOFTCAP = 30.0  # Gemma 4's final_logit_softcapping (also llama.cpp's default when the key is absent)
ALPHA_ASSISTANT = 80.0  # the assistant's head has no soft-capping: a larger scale, larger margins


@dataclasses.dataclass(frozen=True)
class Gemma4Shape:
    """Layer shape of the pair (the assistant's head sizes and KV heads must be the target's)."""

    n_embd: int = 128  # target (backbone) width
    swa: tuple[bool, ...] = (True, False, True, False)  # per layer; last full, the one before SWA
    n_kv_shared: int = 2  # the last layers reuse the KV of the last SWA / full layer that has one
    n_embd_per_layer: int = 8  # per-layer input embeddings (0: none)
    n_ff: int = 128
    n_head: int = 2
    n_head_kv: int = 1
    head_dim: int = 64  # full-attention layers
    head_dim_swa: int = 32
    n_swa: int = 128  # sliding window
    assistant_n_embd: int = 64  # even, smaller than n_embd (llama.cpp refuses equal widths)
    assistant_swa: tuple[bool, ...] = (True, False)
    assistant_n_ff: int = 64


SHAPE = Gemma4Shape()


def _check(p_reject: float, variant: str) -> None:
    if not 0.0 <= p_reject <= 1.0:
        raise UserError(f"p_reject must be between 0 and 1, got {p_reject}")
    if variant not in VARIANTS:
        raise UserError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")


def pair_tables(p_reject: float = 0.0, variant: str = "embedding", seed: int = 0) -> Tables:
    """The design tables of the pair :func:`make_gemma4_pair` writes with these arguments."""
    _check(p_reject, variant)
    tables = design_tables(p_reject, "embedding" if variant == "embedding" else "hidden", seed)[0]
    return dataclasses.replace(tables, variant=variant)


def simulate_pair(tables: Tables, prompt_tokens: Sequence[int], k: int, n_predict: int) -> SimResult:
    """llama-server's greedy draft/verify loop over the pair's tables (see the module doc).

    ``chain`` drafts ``mtp[B^(j-1)(prev)]``; up to the first wrong draft (all that counts) that is
    the ``embedding`` loop over ``m(x) = mtp[B^-1(x)]`` (``x`` = the last token, then each draft)."""
    if tables.variant == "chain":
        nxt, cyc = tables.next_token, cycle_token_ids()
        m = tables.mtp_next_token.copy()
        m[nxt[cyc]] = tables.mtp_next_token[cyc]
        tables = dataclasses.replace(tables, mtp_next_token=m, variant="embedding")
    return simulate(tables, prompt_tokens, k, n_predict)


# --------------------------------------------------------------------------------------------
# weights


def _rms(x: np.ndarray) -> np.ndarray:
    scaled: np.ndarray = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6)
    return scaled


@dataclasses.dataclass(frozen=True)
class _Design:
    emb: np.ndarray  # (N_VOCAB, n_embd): the target's token_embd
    q: np.ndarray  # (n_assistant, n_embd), orthonormal rows
    rot: np.ndarray  # (n_assistant, n_assistant): c(B(t)) = rot . c(t)
    c: np.ndarray  # (N_VOCAB, n_assistant): c(t) = Q E[t], rms 1


def _design(seed: int, d_b: int, d_a: int) -> _Design:
    """The structured embeddings (deterministic in seed and the two widths)."""
    tables, alias, _bad = design_tables(0.0, "embedding", seed)  # B and alias do not depend on p
    cyc = cycle_token_ids()
    n = len(cyc)
    place = np.zeros(N_VOCAB, np.int64)
    t = int(cyc[0])
    for j in range(n):
        place[t] = j
        t = int(tables.next_token[t])
    rng = np.random.default_rng(seed + 5)
    lags = np.arange(1, n)
    draws = [rng.choice(np.arange(1, n // 2 + 1), d_a // 2, replace=False) for _ in range(16)]
    # block frequencies with a low largest side-lobe (the first of equals)
    best = min(draws, key=lambda k: float(np.cos(2 * np.pi * np.outer(lags, k) / n).mean(axis=1).max()))
    theta = 2 * np.pi * best / n
    ang = np.outer(place, theta)  # (N_VOCAB, d_a/2)
    c = np.empty((N_VOCAB, d_a), np.float64)
    c[:, 0::2], c[:, 1::2] = np.cos(ang), np.sin(ang)
    c *= np.sqrt(2.0)
    c = c[alias]
    rot = np.zeros((d_a, d_a), np.float64)
    for b, th in enumerate(theta):
        rot[2 * b:2 * b + 2, 2 * b:2 * b + 2] = [[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]]
    basis, _ = np.linalg.qr(rng.standard_normal((d_b, d_b)))
    q, comp = basis[:, :d_a].T, basis[:, d_a:].T
    noise = rng.standard_normal((N_VOCAB, d_b - d_a))[alias]
    emb = (c @ q + noise @ comp).astype(np.float32)
    return _Design(emb, q.astype(np.float32), rot.astype(np.float32), c.astype(np.float32))


def _margin(w: np.ndarray, u: np.ndarray, ids: np.ndarray, want: np.ndarray, what: str,
            softcap: float = 0.0) -> float:
    logits = u[ids].astype(np.float64) @ w.astype(np.float64).T
    if softcap:
        logits = softcap * np.tanh(logits / softcap)
    got = logits.argmax(axis=1)
    if not np.array_equal(got, want[ids]):
        raise RuntimeError(f"gemma4 pair construction failed: {int(np.sum(got != want[ids]))} {what} argmax differ")
    top = logits[np.arange(len(ids)), got]
    logits[np.arange(len(ids)), got] = -np.inf
    return float(np.min(top - logits.max(axis=1)))


# --------------------------------------------------------------------------------------------
# GGUF


def _attention_keys(w: GGUFWriter, a: str, sh: Gemma4Shape, n_embd: int, n_ff: int, swa: tuple[bool, ...]) -> None:
    w.add_uint32(f"{a}.context_length", 8192)
    w.add_uint32(f"{a}.embedding_length", n_embd)
    w.add_uint32(f"{a}.block_count", len(swa))
    w.add_uint32(f"{a}.feed_forward_length", n_ff)
    w.add_uint32(f"{a}.attention.head_count", sh.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", sh.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", sh.head_dim)
    w.add_uint32(f"{a}.attention.value_length", sh.head_dim)
    w.add_uint32(f"{a}.attention.key_length_swa", sh.head_dim_swa)  # required by gemma4
    w.add_uint32(f"{a}.attention.value_length_swa", sh.head_dim_swa)
    w.add_uint32(f"{a}.rope.dimension_count", sh.head_dim)
    w.add_uint32(f"{a}.rope.dimension_count_swa", sh.head_dim_swa)  # else n_rot_swa = head_dim > head_dim_swa
    w.add_float32(f"{a}.rope.freq_base", 1e6)
    w.add_float32(f"{a}.rope.freq_base_swa", 1e4)
    w.add_uint32(f"{a}.attention.sliding_window", sh.n_swa)  # required
    w.add_array(f"{a}.attention.sliding_window_pattern", list(swa))  # required, one bool per block
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)


class _Tensors:
    def __init__(self, w: GGUFWriter, seed: int) -> None:
        self.w, self.rng = w, np.random.default_rng(seed)

    def add(self, name: str, arr: np.ndarray) -> None:
        self.w.add_tensor(name, np.ascontiguousarray(np.asarray(arr, dtype=np.float32)))

    def small(self, shape: tuple[int, ...], std: float = 0.02) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)


def _write(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _check_widths(d_b: int, d_a: int) -> None:
    if d_a == d_b:
        raise UserError("gemma4-assistant: its n_embd must differ from the target's (llama.cpp refuses equal widths)")
    if d_a > d_b or d_a % 2:
        raise UserError("gemma4-assistant: its n_embd must be even and smaller than the target's")


def make_gemma4_target(out: str | os.PathLike[str], seed: int = 0, shape: Gemma4Shape = SHAPE) -> Path:
    """Write the calibrated ``gemma4`` target to ``out`` (atomically; byte-identical for the same
    arguments) and return its path. Every assistant variant of the same seed and shape fits it."""
    import gguf  # deferred: heavy import (only to write a model)

    sh = shape
    n_layer = len(sh.swa)
    if n_layer < 2 or sh.swa[-1] or not sh.swa[-2]:
        raise UserError("gemma4 target: the last layer must be full attention and the one before SWA")
    n_kv_from = n_layer - sh.n_kv_shared
    if n_kv_from < 2 or sh.swa[n_kv_from - 1] or not sh.swa[n_kv_from - 2]:
        raise UserError("gemma4 target: the last layer with its own KV must be full, the one before SWA")
    _check_widths(sh.n_embd, sh.assistant_n_embd)
    tables = pair_tables(0.0, "embedding", seed)
    d, cyc = sh.n_embd, cycle_token_ids()
    emb = _design(seed, d, sh.assistant_n_embd).emb
    u = _rms(emb).astype(np.float32)
    w_out = np.zeros((N_VOCAB, d), np.float32)
    w_out[tables.next_token[cyc]] = (ALPHA / d) * u[cyc]
    margin = _margin(w_out, u, cyc, tables.next_token, "target", SOFTCAP)

    out = Path(out)
    with atomic_path(out) as tmp:
        a = TARGET_ARCH
        w = gguf.GGUFWriter(str(tmp), a)
        w.add_name("mtp-tuner-calibrated-gemma4-tiny-target")
        w.add_file_type(0)
        _attention_keys(w, a, sh, d, sh.n_ff, sh.swa)
        w.add_uint32(f"{a}.attention.shared_kv_layers", sh.n_kv_shared)
        w.add_uint32(f"{a}.embedding_length_per_layer_input", sh.n_embd_per_layer)  # required (0: none)
        w.add_float32(f"{a}.final_logit_softcapping", SOFTCAP)
        write_tokenizer(w, CHAT_TEMPLATE, 0)
        w.add_array("synthetic.next_token", [int(x) for x in tables.next_token])
        w.add_uint32("synthetic.seed", int(seed))
        w.add_float32("synthetic.min_margin", margin)
        w.add_string("synthetic.description",
                     "MTP Tuner calibrated Gemma 4 target: pass-through blocks, bigram cycle "
                     "(its drafter: a calibrated gemma4-assistant of the same seed).")

        t = _Tensors(w, seed + 3)
        ones, zeros = np.ones(d, np.float32), np.zeros(d, np.float32)
        t.add("token_embd.weight", emb)
        t.add("output.weight", w_out)  # untied: a tied head would map a token to itself
        t.add("output_norm.weight", ones)
        t.add("rope_freqs.weight", np.ones(sh.head_dim // 2, np.float32))  # required (full layers)
        pl = sh.n_embd_per_layer
        if pl:
            t.add("per_layer_token_embd.weight", t.small((N_VOCAB, pl * n_layer), 1.0))
            t.add("per_layer_model_proj.weight", t.small((pl * n_layer, d)))
            t.add("per_layer_proj_norm.weight", np.ones(pl, np.float32))
        for i in range(n_layer):
            p = f"blk.{i}"
            hd = sh.head_dim_swa if sh.swa[i] else sh.head_dim
            t.add(f"{p}.attn_norm.weight", ones)
            t.add(f"{p}.attn_q.weight", t.small((hd * sh.n_head, d)))
            t.add(f"{p}.attn_q_norm.weight", np.ones(hd, np.float32))
            if i < n_kv_from:  # shared-KV layers have no K/V (an extra tensor would be refused)
                t.add(f"{p}.attn_k.weight", t.small((hd * sh.n_head_kv, d)))
                t.add(f"{p}.attn_v.weight", t.small((hd * sh.n_head_kv, d)))
                t.add(f"{p}.attn_k_norm.weight", np.ones(hd, np.float32))
            t.add(f"{p}.attn_output.weight", t.small((d, hd * sh.n_head)))
            t.add(f"{p}.post_attention_norm.weight", zeros)  # the block adds zero
            t.add(f"{p}.ffn_norm.weight", ones)
            t.add(f"{p}.ffn_gate.weight", t.small((sh.n_ff, d)))
            t.add(f"{p}.ffn_up.weight", t.small((sh.n_ff, d)))
            t.add(f"{p}.ffn_down.weight", t.small((d, sh.n_ff)))
            t.add(f"{p}.post_ffw_norm.weight", zeros)
            t.add(f"{p}.layer_output_scale.weight", np.ones(1, np.float32))
            if pl:
                t.add(f"{p}.inp_gate.weight", t.small((pl, d)))
                t.add(f"{p}.proj.weight", t.small((d, pl)))
                t.add(f"{p}.post_norm.weight", zeros)
        _write(w)
    return out


def make_gemma4_assistant(out: str | os.PathLike[str], p_reject: float = 0.0, variant: str = "embedding",
                          seed: int = 0, shape: Gemma4Shape = SHAPE, *, target_n_embd: int | None = None,
                          vocab_offset: int = 0) -> Path:
    """Write the calibrated ``gemma4-assistant`` drafter to ``out`` and return its path.

    With the defaults it fits the target :func:`make_gemma4_target` writes with the same ``seed``
    and ``shape``. For pair-check tests: ``target_n_embd`` makes it for a backbone of another
    width (``embedding_length_out`` and the projections change; its head is built from the
    embeddings a target of that width would have), ``vocab_offset`` rotates its token texts by
    that many ids (same size, another vocabulary: its tokenizer no longer matches the target's)."""
    import gguf  # deferred: heavy import (only to write a model)

    _check(p_reject, variant)
    sh = shape
    d_b, d_a = int(target_n_embd or sh.n_embd), sh.assistant_n_embd
    _check_widths(d_b, d_a)
    tables = pair_tables(p_reject, variant, seed)
    cyc = cycle_token_ids()
    des = _design(seed, d_b, d_a)
    head = np.zeros((N_VOCAB, d_a), np.float32)
    np.add.at(head, tables.mtp_next_token[cyc], (ALPHA_ASSISTANT / d_a) * des.c[cyc])
    margin = _margin(head, des.c, cyc, tables.mtp_next_token, "assistant")
    pre = np.zeros((d_a, 2 * d_b), np.float32)
    if variant == "embedding":
        pre[:, :d_b] = des.q
    else:
        pre[:, d_b:] = des.q
    post = des.q.T @ des.rot if variant == "chain" else des.q.T

    out = Path(out)
    with atomic_path(out) as tmp:
        a = ASSISTANT_ARCH
        w = gguf.GGUFWriter(str(tmp), a)
        w.add_name(f"mtp-tuner-calibrated-gemma4-tiny-assistant-{variant}-p{p_reject:g}")
        w.add_file_type(0)
        _attention_keys(w, a, sh, d_a, sh.assistant_n_ff, sh.assistant_swa)
        w.add_uint32(f"{a}.embedding_length_out", d_b)  # the target's width (must differ from its own)
        w.add_uint32(f"{a}.nextn_predict_layers", len(sh.assistant_swa))  # must equal block_count
        write_tokenizer(w, CHAT_TEMPLATE, vocab_offset)
        w.add_array("synthetic.next_token", [int(x) for x in tables.next_token])
        w.add_array("synthetic.mtp_next_token", [int(x) for x in tables.mtp_next_token])
        w.add_float32("synthetic.p_reject", float(tables.p_reject))
        w.add_uint32("synthetic.seed", int(seed))
        w.add_string("synthetic.variant", variant)
        w.add_float32("synthetic.min_margin", margin)
        w.add_string("synthetic.description",
                     "MTP Tuner calibrated Gemma 4 assistant: pass-through blocks, designed head; "
                     "draft acceptance is known exactly (calibrated_gemma4.simulate_pair).")

        t = _Tensors(w, seed + 4)
        ones, zeros = np.ones(d_a, np.float32), np.zeros(d_a, np.float32)
        t.add("token_embd.weight", head)  # tied: the assistant's output head (input: the target's)
        t.add("output_norm.weight", ones)
        t.add("nextn.pre_projection.weight", pre)
        t.add("nextn.post_projection.weight", post)
        t.add("rope_freqs.weight", np.ones(sh.head_dim // 2, np.float32))
        for i, swa in enumerate(sh.assistant_swa):
            p = f"blk.{i}"
            hd = sh.head_dim_swa if swa else sh.head_dim
            t.add(f"{p}.attn_norm.weight", ones)
            t.add(f"{p}.attn_q.weight", t.small((hd * sh.n_head, d_a)))
            t.add(f"{p}.attn_q_norm.weight", np.ones(hd, np.float32))
            t.add(f"{p}.attn_output.weight", t.small((d_a, hd * sh.n_head)))
            t.add(f"{p}.post_attention_norm.weight", zeros)
            t.add(f"{p}.ffn_norm.weight", ones)
            t.add(f"{p}.ffn_gate.weight", t.small((sh.assistant_n_ff, d_a)))
            t.add(f"{p}.ffn_up.weight", t.small((sh.assistant_n_ff, d_a)))
            t.add(f"{p}.ffn_down.weight", t.small((d_a, sh.assistant_n_ff)))
            t.add(f"{p}.post_ffw_norm.weight", zeros)
            t.add(f"{p}.layer_output_scale.weight", np.ones(1, np.float32))  # required here
        _write(w)
    return out


def make_gemma4_pair(out_dir: str | os.PathLike[str], p_reject: float = 0.0, variant: str = "embedding",
                     seed: int = 0, shape: Gemma4Shape = SHAPE) -> tuple[Path, Path]:
    """Write TARGET_FILE and ASSISTANT_FILE into ``out_dir``, return (target, assistant);
    :func:`simulate_pair` over :func:`pair_tables` of the same arguments gives the exact counts."""
    out_dir = Path(out_dir)
    target = make_gemma4_target(out_dir / TARGET_FILE, seed, shape)
    assistant = make_gemma4_assistant(out_dir / ASSISTANT_FILE, p_reject, variant, seed, shape)
    return target, assistant
