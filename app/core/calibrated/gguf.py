"""The calibrated model's GGUF writer: a qwen35 GGUF made from the design tables (see
app.core.calibrated.design), byte-identical for the same arguments; also the calibrated draft
model for ``--spec-type draft-simple`` (:func:`make_drafter`, :func:`make_pair`; see
app.core.calibrated.modes)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any
from pathlib import Path

import numpy as np

from app.core.common.atomic import atomic_path
from app.core.common.errors import UserError
from app.core.calibrated.design import (ALPHA, ARCH, CHAT_TEMPLATE, CONTENT_TEMPLATE, cycle_token_ids,
                                         design_tables, load_tables, N_VOCAB, Shape, SHAPES, SIZES, Tables,
                                         VARIANTS, write_tokenizer)
from app.core.calibrated.modes import drafter_tables

if TYPE_CHECKING:  # gguf loads only where a model is written (a heavy import)
    from gguf import GGUFWriter


def add_value(w: GGUFWriter, key: str, value: Any) -> None:
    """One metadata key/value into a gguf.GGUFWriter ``w``, typed by the value: a bool, an int (as
    uint32), a float (float32), a string, or a list (an array). The one writer of key/values (the
    tests' sparse GGUFs use it too)."""
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        w.add_array(key, list(value))
    else:
        w.add_uint32(key, int(value))


def _rms(x: np.ndarray) -> np.ndarray:
    scaled: np.ndarray = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6)
    return scaled


def _check_argmax(w: np.ndarray, u: np.ndarray, ids: np.ndarray, want: np.ndarray, what: str) -> float:
    logits = u[ids].astype(np.float64) @ w.astype(np.float64).T
    got = logits.argmax(axis=1)
    if not np.array_equal(got, want[ids]):
        bad = int(np.sum(got != want[ids]))
        raise RuntimeError(f"calibrated model construction failed: {bad} {what} argmax differ")
    top = logits[np.arange(len(ids)), got]
    logits[np.arange(len(ids)), got] = -np.inf
    return float(np.min(top - logits.max(axis=1)))


# What the demo's prompts ask for; the digit that ends each (its task's marker) is added.
DEMO_TEXTS = {
    "code": "Write a Python function that returns the weekday of an ISO date, with a test. Task",
    "tongue-twister": "Say it three times, fast: she sells sea shells by the sea shore. Task",
    "story": "Tell a short story about a lighthouse keeper who finds a letter in a bottle. Task",
}


def demo_prompt_list(task_p: dict[str, float]) -> list[dict[str, str]]:
    """One prompt per task, ending in the task's marker digit (see :func:`design_tables`)."""
    return [{"id": f"demo-{task}", "task": task, "lang": "en",
             "text": f"{DEMO_TEXTS.get(task, f'A {task} prompt. Task')} {i + 1}"}
            for i, task in enumerate(task_p)]


def make_model(out: str | os.PathLike[str], p_reject: float = 0.0, variant: str = "embedding",
               size: str = "tiny", seed: int = 0, mtp: bool = True,
               shape: Shape | None = None, task_p: dict[str, float] | None = None,
               chat_template: str | None = None, logit_scale: float = 1.0) -> Path:
    """Write a calibrated GGUF to ``out`` (atomically) and return its path.

    Deterministic: the same arguments give a byte-identical file. ``shape`` replaces the named
    size's layer shape (tests use it to give llama.cpp a real model with another KV layout).
    ``task_p`` gives each task its own share of wrong drafts (see :func:`design_tables`); the
    model then carries one demo prompt per task, and its chat template passes the user's text
    through unchanged, so a prompt's last token (its task's marker) decides where it goes.
    ``chat_template`` replaces the template (e.g. calibrated.THINKING_TEMPLATE, with a thinking switch).
    ``logit_scale`` (0 < s <= 1) scales the target's head, and so its margins: the argmax, the
    drafts and the greedy counts stay the same, but a sampler at temperature > 0 then picks
    other tokens than the table's, so sampled acceptance falls (1: the huge default margins).
    """
    if not 0.0 < logit_scale <= 1.0:
        raise UserError(f"logit_scale must be in (0, 1], got {logit_scale}")
    if not 0.0 <= p_reject <= 1.0:
        raise UserError(f"--p-reject must be between 0 and 1, got {p_reject}")
    if variant not in VARIANTS:
        raise UserError(f"--variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if size not in SIZES:
        raise UserError(f"--size must be one of {', '.join(SIZES)}, got {size!r}")
    sh = shape or SHAPES[size]
    tables, alias, _ = design_tables(p_reject, variant, seed, task_p)
    rng = np.random.default_rng(seed + 1)
    emb = rng.standard_normal((N_VOCAB, sh.n_embd)).astype(np.float32)[alias]
    u = _rms(emb).astype(np.float32)
    w_out, margin = _head(tables.next_token, u, sh, "target", logit_scale)
    w_mtp = None
    if mtp and (variant == "hidden" or tables.p_reject > 0):
        w_mtp, m2 = _head(tables.mtp_next_token, u, sh, "MTP")
        margin = min(margin, m2)
    what = "tasks-" + "-".join(f"{t}{p:g}" for t, p in task_p.items()) if task_p else f"p{p_reject:g}"
    kv: list[tuple[str, object]] = [
        ("synthetic.next_token", [int(x) for x in tables.next_token]),
        ("synthetic.mtp_next_token", [int(x) for x in tables.mtp_next_token]),
        ("synthetic.p_reject", float(tables.p_reject))]
    if task_p:
        kv += [("synthetic.task_p", json.dumps(task_p)),
               ("synthetic.demo_prompts", json.dumps(demo_prompt_list(task_p)))]
    kv += [("synthetic.seed", int(seed)), ("synthetic.variant", variant), ("synthetic.size", size),
           ("synthetic.min_margin", float(margin))]
    if logit_scale != 1.0:
        kv.append(("synthetic.logit_scale", float(logit_scale)))
    kv.append(("synthetic.description", "MTP Tuner calibrated model: pass-through blocks, bigram cycle; "
                                        "draft acceptance is known exactly (mtp-tuner simulator)."))
    name = f"mtp-tuner-calibrated-{size}-{variant}-{what}" + ("" if mtp else "-nomtp")
    return _write_gguf(Path(out), sh, name, emb, w_out, rng, kv, variant if mtp else None, w_mtp,
                       chat_template or (CONTENT_TEMPLATE if task_p else CHAT_TEMPLATE))


def make_drafter(out: str | os.PathLike[str], target: Tables | str | os.PathLike[str], p_wrong: float,
                 seed: int = 0, size: str = "tiny", shape: Shape | None = None) -> Path:
    """Write a calibrated *draft model* for ``--spec-type draft-simple`` and return its path.

    A plain qwen35 GGUF (no NextN block) with the target's vocabulary and tokenizer metadata, so
    llama.cpp's vocabulary check passes. ``target`` is the target's :class:`Tables` or its GGUF.
    Its greedy next token is the target's, except on a random subset of round(p_wrong * 771)
    cycle tokens (chosen with ``seed``), where it is the token after that ("skip-one", always
    wrong); see :func:`calibrated_modes.drafter_tables`. Deterministic in its arguments.
    """
    if not 0.0 <= p_wrong <= 1.0:
        raise UserError(f"p_wrong must be between 0 and 1, got {p_wrong}")
    if size not in SIZES:
        raise UserError(f"--size must be one of {', '.join(SIZES)}, got {size!r}")
    tt = target if isinstance(target, Tables) else load_tables(target)
    sh = shape or SHAPES[size]
    tables, alias, _ = drafter_tables(tt, p_wrong, seed)
    rng = np.random.default_rng(seed + 2)
    emb = rng.standard_normal((N_VOCAB, sh.n_embd)).astype(np.float32)[alias]
    u = _rms(emb).astype(np.float32)
    w_out, margin = _head(tables.next_token, u, sh, "drafter")
    nxt = [int(x) for x in tables.next_token]
    kv: list[tuple[str, object]] = [
        ("synthetic.next_token", nxt), ("synthetic.mtp_next_token", nxt),
        ("synthetic.target_next_token", [int(x) for x in tt.next_token]),
        ("synthetic.p_reject", float(tables.p_reject)), ("synthetic.seed", int(seed)),
        ("synthetic.role", "drafter"), ("synthetic.size", size), ("synthetic.min_margin", float(margin)),
        ("synthetic.description", "MTP Tuner calibrated draft model: the target's bigram cycle with a "
                                  "designed share of wrong next tokens (draft-simple acceptance is exact).")]
    return _write_gguf(Path(out), sh, f"mtp-tuner-calibrated-drafter-{size}-p{p_wrong:g}", emb, w_out,
                       rng, kv, None, None, CHAT_TEMPLATE)


def make_pair(folder: str | os.PathLike[str], p_wrong: float, seed: int = 0, size: str = "tiny",
              target_p_reject: float = 0.0, mtp: bool = True) -> tuple[Path, Path]:
    """Write a (target, drafter) pair into ``folder`` and return their paths.

    The target is :func:`make_model` (embedding variant, ``target_p_reject``, with an MTP block
    unless ``mtp`` is False, so draft-mtp and draft-simple can run on the same target); the
    drafter is :func:`make_drafter` of it with ``p_wrong``. Names: ``target-<...>.gguf`` and
    ``drafter-<...>.gguf``; an existing file of the same name is rewritten (same bytes)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"{size}-s{seed}"
    target = make_model(folder / f"target-{tag}-p{target_p_reject:g}{'' if mtp else '-nomtp'}.gguf",
                        target_p_reject, "embedding", size, seed, mtp)
    drafter = make_drafter(folder / f"drafter-{tag}-p{p_wrong:g}.gguf", target, p_wrong, seed, size)
    return target, drafter


def make_no_heads_pair(folder: str | os.PathLike[str], p_wrong: float = 0.0, seed: int = 0) -> tuple[Path, Path]:
    """A tiny target without MTP heads and a drafter of its vocabulary that is smaller (feed-forward
    width 64 against 256; its 4 layers kept, as llama-server needs the attention layer), so that a
    drafter search on disk (app.core.machine.drafter_search, which takes only drafters smaller than
    the target) pairs them: ``target-nomtp.gguf`` and ``drafter-ff64-p<p_wrong>.gguf`` in ``folder``."""
    import dataclasses

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = make_model(folder / "target-nomtp.gguf", 0.0, "embedding", seed=seed, mtp=False)
    drafter = make_drafter(folder / f"drafter-ff64-p{p_wrong:g}.gguf", target, p_wrong, seed,
                           shape=dataclasses.replace(SHAPES["tiny"], n_ff=64))
    return target, drafter


def _head(table: np.ndarray, u: np.ndarray, sh: Shape, what: str,
          scale: float = 1.0) -> tuple[np.ndarray, float]:
    """An LM head whose argmax from token t is table[t] (<= 2 terms a row), and its margin."""
    cyc = cycle_token_ids()
    w = np.zeros((N_VOCAB, sh.n_embd), np.float32)
    np.add.at(w, table[cyc], (scale * ALPHA / sh.n_embd) * u[cyc])
    wdt = np.float16 if sh.dtype == "f16" else np.float32
    return w, _check_argmax(w.astype(wdt), u, cyc, table, what)


def _write_gguf(out: Path, sh: Shape, name: str, emb: np.ndarray, w_out: np.ndarray,
                rng: np.random.Generator, kv: list[tuple[str, object]], mtp_variant: str | None,
                w_mtp: np.ndarray | None, chat_template: str) -> Path:
    """The qwen35 GGUF: pass-through blocks (random small weights drawn from ``rng``), plus a NextN
    block when ``mtp_variant`` is given ("embedding" or "hidden"); ``kv`` is written in order."""
    import gguf  # deferred: heavy import (only to write a model)

    d = sh.n_embd
    wdt = np.float16 if sh.dtype == "f16" else np.float32
    mtp = mtp_variant is not None
    n_blocks = sh.n_trunk + (1 if mtp else 0)
    with atomic_path(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), ARCH)
        w.add_name(name)
        w.add_file_type(1 if sh.dtype == "f16" else 0)
        a = ARCH
        w.add_uint32(f"{a}.context_length", 8192)
        w.add_uint32(f"{a}.embedding_length", d)
        w.add_uint32(f"{a}.block_count", n_blocks)
        if mtp:
            w.add_uint32(f"{a}.nextn_predict_layers", 1)
        w.add_uint32(f"{a}.feed_forward_length", sh.n_ff)
        w.add_uint32(f"{a}.attention.head_count", sh.n_head)
        w.add_uint32(f"{a}.attention.head_count_kv", sh.n_head_kv)
        w.add_uint32(f"{a}.attention.key_length", sh.head_dim)
        w.add_uint32(f"{a}.attention.value_length", sh.head_dim)
        w.add_uint32(f"{a}.rope.dimension_count", sh.n_rot)
        w.add_array(f"{a}.rope.dimension_sections", sh.rope_sections)
        w.add_float32(f"{a}.rope.freq_base", 1e7)
        w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
        w.add_uint32(f"{a}.ssm.conv_kernel", 4)
        w.add_uint32(f"{a}.ssm.inner_size", sh.ssm_inner)
        w.add_uint32(f"{a}.ssm.state_size", sh.ssm_state)
        w.add_uint32(f"{a}.ssm.time_step_rank", sh.ssm_rank)
        w.add_uint32(f"{a}.ssm.group_count", sh.ssm_groups)
        w.add_uint32(f"{a}.full_attention_interval", sh.attn_interval)
        write_tokenizer(w, chat_template)
        for key, value in kv:
            add_value(w, key, value)

        def mat(name: str, arr: np.ndarray) -> None:
            w.add_tensor(name, np.ascontiguousarray(arr.astype(wdt)))

        def vec(name: str, arr: np.ndarray) -> None:
            w.add_tensor(name, np.ascontiguousarray(arr.astype(np.float32)))

        def small(shape: tuple[int, ...], std: float = 0.02) -> np.ndarray:
            return (rng.standard_normal(shape) * std).astype(np.float32)

        ones = np.ones(d, np.float32)
        mat("token_embd.weight", emb)
        vec("output_norm.weight", ones)
        mat("output.weight", w_out)
        qkv = 2 * sh.ssm_state * sh.ssm_groups + sh.ssm_inner
        for i in range(n_blocks):
            p = f"blk.{i}"
            recurrent = i < sh.n_trunk and (i + 1) % sh.attn_interval != 0
            vec(f"{p}.attn_norm.weight", ones)
            vec(f"{p}.post_attention_norm.weight", ones)
            if recurrent:
                mat(f"{p}.attn_qkv.weight", small((qkv, d)))
                mat(f"{p}.attn_gate.weight", small((sh.ssm_inner, d)))
                vec(f"{p}.ssm_conv1d.weight", small((qkv, 4), 0.3))
                vec(f"{p}.ssm_dt.bias", np.zeros(sh.ssm_rank, np.float32))
                vec(f"{p}.ssm_a", -np.exp(rng.standard_normal(sh.ssm_rank) * 0.5))
                mat(f"{p}.ssm_beta.weight", small((sh.ssm_rank, d)))
                mat(f"{p}.ssm_alpha.weight", small((sh.ssm_rank, d)))
                vec(f"{p}.ssm_norm.weight", np.ones(sh.ssm_state, np.float32))
                mat(f"{p}.ssm_out.weight", np.zeros((d, sh.ssm_inner), np.float32))
            else:
                mat(f"{p}.attn_q.weight", small((2 * sh.head_dim * sh.n_head, d)))
                mat(f"{p}.attn_k.weight", small((sh.head_dim * sh.n_head_kv, d)))
                mat(f"{p}.attn_v.weight", small((sh.head_dim * sh.n_head_kv, d)))
                mat(f"{p}.attn_output.weight", np.zeros((d, sh.head_dim * sh.n_head), np.float32))
                vec(f"{p}.attn_q_norm.weight", np.ones(sh.head_dim, np.float32))
                vec(f"{p}.attn_k_norm.weight", np.ones(sh.head_dim, np.float32))
            mat(f"{p}.ffn_gate.weight", small((sh.n_ff, d)))
            mat(f"{p}.ffn_up.weight", small((sh.n_ff, d)))
            mat(f"{p}.ffn_down.weight", np.zeros((d, sh.n_ff), np.float32))
            if i == sh.n_trunk:  # the NextN block
                eh = np.zeros((d, 2 * d), np.float32)
                if mtp_variant == "embedding":
                    eh[:, :d] = np.eye(d)
                else:
                    eh[:, d:] = np.eye(d)
                mat(f"{p}.nextn.eh_proj.weight", eh)
                vec(f"{p}.nextn.enorm.weight", ones)
                vec(f"{p}.nextn.hnorm.weight", ones)
                vec(f"{p}.nextn.shared_head_norm.weight", ones)
                if w_mtp is not None:
                    mat(f"{p}.nextn.shared_head_head.weight", w_mtp)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return out
