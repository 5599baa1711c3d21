"""Calibrated MTP model: a qwen35 GGUF whose greedy draft acceptance is known by construction.

Every block of the model adds exactly zero to the residual stream (its output projections are
zero), so the target is a pure bigram model ``logits(t) = W_out . rmsnorm(E[t])``: the greedy
chain follows a random permutation cycle ``B`` over the printable tokens. The single NextN (MTP)
block is built the same way, with its own head, so that the draft it makes from a token is known
exactly; a knob ``p_reject`` makes a random subset of drafts wrong. :func:`simulate` replays the
draft/verify loop of llama.cpp over the stored tables and returns the exact ``draft_n``,
``draft_accepted`` and tokens.

Two variants:

``embedding``
    ``eh_proj = [I | 0]``: the MTP predicts from the token it is fed. Draft ``j+1`` comes from draft
    ``j``; a draft fed a token in the rejected subset is wrong.
``hidden``
    ``eh_proj = [0 | I]``: the MTP keeps only the hidden state ``h`` it is given and predicts the
    token two steps ahead of the position ``h`` belongs to. Only the right hand-off (the target's
    ``h`` of the position before the last token) gives accepted drafts, so a wrong hand-off shows.

No Qt here; numpy and gguf only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from app.core.common.atomic import atomic_path
from app.core.common.errors import UserError

ARCH = "qwen35"
N_PRINTABLE_BYTES = 95  # ASCII 32..126
LETTERS = "abcdefghijklmnopqrstuvwxyz"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ALPHA = 40.0
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Per-task models: the user's text as it is, so its last token is the prompt's last token.
CONTENT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
VARIANTS = ("embedding", "hidden")
SIZES = ("tiny", "demo", "bench")


@dataclasses.dataclass(frozen=True)
class Shape:
    n_embd: int
    n_trunk: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ssm_state: int
    ssm_rank: int  # time_step_rank (number of value heads)
    ssm_groups: int
    dtype: str  # "f32" or "f16" for 2-D matrices

    @property
    def n_rot(self) -> int:
        return self.head_dim // 4

    @property
    def rope_sections(self) -> list[int]:
        half = self.n_rot // 2
        a = (half * 3 + 7) // 8
        b = a
        return [a, b, half - a - b, 0]

    @property
    def ssm_inner(self) -> int:
        return self.ssm_state * self.ssm_rank


SHAPES = {
    "tiny": Shape(n_embd=128, n_trunk=4, n_ff=256, n_head=2, n_head_kv=1, head_dim=64,
                  ssm_state=32, ssm_rank=4, ssm_groups=2, dtype="f32"),
    # ~65 M parameters in F16 (~130 MB): big enough that decode cost, not per-step overhead, decides
    # on a CPU, small enough for a demo sweep within a minute on 2 cores (benchmarks/demo_story.py).
    "demo": Shape(n_embd=1024, n_trunk=8, n_ff=1024, n_head=8, n_head_kv=2, head_dim=128,
                  ssm_state=128, ssm_rank=8, ssm_groups=2, dtype="f16"),
    # ~0.47 G parameters in F16 (~0.9 GB): decode cost on a CPU is bandwidth-bound, like a real model.
    "bench": Shape(n_embd=2048, n_trunk=16, n_ff=2048, n_head=16, n_head_kv=4, head_dim=128,
                   ssm_state=128, ssm_rank=16, ssm_groups=4, dtype="f16"),
}


# --------------------------------------------------------------------------------------------
# vocabulary


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (what BPE vocabularies store)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens (id == byte for 0..255, then the 676 lowercase pairs, then 3 specials), types, merges."""
    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = []
    for a in LETTERS:
        for b in LETTERS:
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    tokens.extend(SPECIALS)
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    return tokens, types, merges


def cycle_token_ids() -> np.ndarray:
    """The 771 printable tokens: ASCII 32..126 and the 676 letter pairs."""
    return np.array(list(range(32, 127)) + list(range(256, 256 + 26 * 26)), dtype=np.int64)


N_VOCAB = 256 + 26 * 26 + len(SPECIALS)
BOS_ID = N_VOCAB - 3
EOS_ID = N_VOCAB - 1


# --------------------------------------------------------------------------------------------
# tables


@dataclasses.dataclass(frozen=True)
class Tables:
    """The designed behaviour, as stored in the GGUF (``synthetic.*`` keys)."""

    next_token: np.ndarray  # B(t) for every token id (aliases included)
    mtp_next_token: np.ndarray  # what the MTP head predicts from its input (see module doc)
    variant: str
    p_reject: float
    has_mtp: bool
    task_p: dict | None = None  # {task: share of wrong drafts in its arc} for a per-task model

    def chain(self, start: int, n: int) -> list[int]:
        out, t = [], int(start)
        for _ in range(n):
            t = int(self.next_token[t])
            out.append(t)
        return out


def task_marker(i: int) -> int:
    """The token a task's demo prompts end with: the digit ``i + 1`` ('1', '2', ...)."""
    return ord("1") + i


def design_tables(p_reject: float, variant: str, seed: int,
                  task_p: dict[str, float] | None = None) -> tuple[Tables, np.ndarray, np.ndarray]:
    """Return (tables, alias, rejected-subset mask) for the given knob; deterministic in seed.

    With ``task_p`` ({task: share of wrong drafts}) the cycle is cut into one arc per task, each
    with its own share of wrong drafts, and the token just before task i's arc is the digit
    ``i + 1``: a prompt ending in that digit makes the greedy chain (and the drafts) run through
    that task's arc, so each task has its own acceptance, still known exactly."""
    rng = np.random.default_rng(seed)
    cyc = cycle_token_ids()
    order = rng.permutation(cyc)
    arcs: list[tuple[int, int, float]] = []
    if task_p:
        n, m = len(order), len(task_p)
        if m > 9:
            raise UserError("a calibrated model has at most 9 task regions")
        length = n // m
        for i, p in enumerate(task_p.values()):
            if not 0.0 <= p <= 1.0:
                raise UserError(f"a task's share of wrong drafts must be between 0 and 1, got {p}")
            pos, j = (i * length - 1) % n, int(np.flatnonzero(order == task_marker(i))[0])
            order[[pos, j]] = order[[j, pos]]  # the marker sits just before the arc
            arcs.append((i * length, n if i == m - 1 else (i + 1) * length, float(p)))
    nxt = np.full(N_VOCAB, -1, dtype=np.int64)
    nxt[order] = np.roll(order, -1)
    alias = np.arange(N_VOCAB)
    non_cycle = np.setdiff1d(np.arange(N_VOCAB), cyc)
    alias[non_cycle] = rng.choice(cyc, size=len(non_cycle))
    nxt[non_cycle] = nxt[alias[non_cycle]]
    bad = np.zeros(N_VOCAB, dtype=bool)
    if arcs:
        for lo, hi, p in arcs:
            n_bad = int(round(p * (hi - lo)))
            if n_bad:
                bad[rng.choice(order[lo:hi], size=n_bad, replace=False)] = True
        p_reject = float(bad[cyc].mean())
    else:
        n_bad = int(round(p_reject * len(cyc)))
        if n_bad:
            bad[rng.choice(cyc, size=n_bad, replace=False)] = True
    bad[non_cycle] = bad[alias[non_cycle]]
    if variant == "embedding":
        mtp = np.where(bad, nxt[nxt], nxt)
    else:
        mtp = np.where(bad, nxt[nxt[nxt]], nxt[nxt])
    return Tables(nxt, mtp, variant, float(p_reject), True, dict(task_p) if task_p else None), alias, bad


# --------------------------------------------------------------------------------------------
# simulator


@dataclasses.dataclass(frozen=True)
class SimResult:
    tokens: tuple[int, ...]
    draft_n: int
    draft_accepted: int
    steps: int  # verification steps (drafts made)

    @property
    def acceptance(self) -> float | None:
        return self.draft_accepted / self.draft_n if self.draft_n else None


def simulate(tables: Tables, prompt_tokens: Sequence[int], k: int, n_predict: int) -> SimResult:
    """Replay llama.cpp's greedy draft/verify loop over the designed tables.

    ``k`` is the draft width (0 = no speculation). The first token comes from the prompt; then each
    step drafts ``min(k, n_predict - n_gen - 1)`` tokens (a plain decode when that is 0), accepts the
    longest prefix that matches the target chain and adds the target's own token.
    """
    if not prompt_tokens:
        raise ValueError("simulate needs at least one prompt token")
    if n_predict <= 0:
        return SimResult((), 0, 0, 0)
    nxt, mtp = tables.next_token, tables.mtp_next_token
    prev = int(prompt_tokens[-1])
    last = int(nxt[prev])
    out = [last]
    draft_n = accepted = steps = 0
    while len(out) < n_predict:
        budget = min(k, n_predict - len(out) - 1) if k > 0 else 0
        if budget <= 0:
            prev, last = last, int(nxt[last])
            out.append(last)
            continue
        if tables.variant == "hidden":
            drafts = [int(mtp[prev])] * budget
        else:
            drafts, t = [], last
            for _ in range(budget):
                t = int(mtp[t])
                drafts.append(t)
        steps += 1
        draft_n += budget
        n_acc, cur = 0, last
        for d in drafts:
            if d != int(nxt[cur]):
                break
            n_acc += 1
            cur = d
        emitted = tables.chain(last, n_acc + 1)
        accepted += n_acc
        seq = [last] + emitted
        prev, last = seq[-2], seq[-1]
        out.extend(emitted)
    return SimResult(tuple(out), draft_n, accepted, steps)


def closed_form_acceptance(p: float, k: int, variant: str = "embedding") -> float:
    """Long-run acceptance for the random pattern (i.i.d. approximation)."""
    q = 1.0 - p
    if variant == "hidden":
        return q / k
    if k == 1 or q == 1.0:
        return q
    return q * (1 - q ** k) / (k * (1 - q))


# --------------------------------------------------------------------------------------------
# GGUF writer


def _rms(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6)


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


def make_model(out: str | os.PathLike, p_reject: float = 0.0, variant: str = "embedding",
               size: str = "tiny", seed: int = 0, mtp: bool = True,
               shape: Shape | None = None, task_p: dict[str, float] | None = None) -> Path:
    """Write a calibrated GGUF to ``out`` (atomically) and return its path.

    Deterministic: the same arguments give a byte-identical file. ``shape`` replaces the named
    size's layer shape (tests use it to give llama.cpp a real model with another KV layout).
    ``task_p`` gives each task its own share of wrong drafts (see :func:`design_tables`); the
    model then carries one demo prompt per task, and its chat template passes the user's text
    through unchanged, so a prompt's last token (its task's marker) decides where it goes.
    """
    import gguf  # deferred: heavy import

    if not 0.0 <= p_reject <= 1.0:
        raise UserError(f"--p-reject must be between 0 and 1, got {p_reject}")
    if variant not in VARIANTS:
        raise UserError(f"--variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if size not in SIZES:
        raise UserError(f"--size must be one of {', '.join(SIZES)}, got {size!r}")
    sh = shape or SHAPES[size]
    tables, alias, bad = design_tables(p_reject, variant, seed, task_p)
    rng = np.random.default_rng(seed + 1)
    d = sh.n_embd
    cyc = cycle_token_ids()
    wdt = np.float16 if sh.dtype == "f16" else np.float32

    emb = rng.standard_normal((N_VOCAB, d)).astype(np.float32)
    emb = emb[alias]
    u = _rms(emb).astype(np.float32)
    w_out = np.zeros((N_VOCAB, d), np.float32)
    w_out[tables.next_token[cyc]] = (ALPHA / d) * u[cyc]
    margin = _check_argmax(w_out.astype(wdt), u, cyc, tables.next_token, "target")
    w_mtp = None
    if mtp and (variant == "hidden" or tables.p_reject > 0):
        w_mtp = np.zeros((N_VOCAB, d), np.float32)
        np.add.at(w_mtp, tables.mtp_next_token[cyc], (ALPHA / d) * u[cyc])
        margin = min(margin, _check_argmax(w_mtp.astype(wdt), u, cyc, tables.mtp_next_token, "MTP"))

    n_blocks = sh.n_trunk + (1 if mtp else 0)
    out = Path(out)
    with atomic_path(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), ARCH)
        what = "tasks-" + "-".join(f"{t}{p:g}" for t, p in task_p.items()) if task_p else f"p{p_reject:g}"
        w.add_name(f"mtp-tuner-calibrated-{size}-{variant}-{what}" + ("" if mtp else "-nomtp"))
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
        w.add_uint32(f"{a}.full_attention_interval", 4)
        tokens, types, merges = vocabulary()
        w.add_string("tokenizer.ggml.model", "gpt2")
        w.add_string("tokenizer.ggml.pre", "qwen35")
        w.add_array("tokenizer.ggml.tokens", tokens)
        w.add_array("tokenizer.ggml.token_type", types)
        w.add_array("tokenizer.ggml.merges", merges)
        w.add_uint32("tokenizer.ggml.bos_token_id", BOS_ID)
        w.add_uint32("tokenizer.ggml.eos_token_id", EOS_ID)
        w.add_uint32("tokenizer.ggml.padding_token_id", BOS_ID)
        w.add_bool("tokenizer.ggml.add_bos_token", False)
        w.add_string("tokenizer.chat_template", CONTENT_TEMPLATE if task_p else CHAT_TEMPLATE)
        w.add_array("synthetic.next_token", [int(x) for x in tables.next_token])
        w.add_array("synthetic.mtp_next_token", [int(x) for x in tables.mtp_next_token])
        w.add_float32("synthetic.p_reject", float(tables.p_reject))
        if task_p:
            w.add_string("synthetic.task_p", json.dumps(task_p))
            w.add_string("synthetic.demo_prompts", json.dumps(demo_prompt_list(task_p)))
        w.add_uint32("synthetic.seed", int(seed))
        w.add_string("synthetic.variant", variant)
        w.add_string("synthetic.size", size)
        w.add_float32("synthetic.min_margin", float(margin))
        w.add_string("synthetic.description",
                     "MTP Tuner calibrated model: pass-through blocks, bigram cycle; "
                     "draft acceptance is known exactly (mtp-tuner simulator).")

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
            recurrent = i < sh.n_trunk and (i + 1) % 4 != 0
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
                if variant == "embedding":
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


def load_tables(path: str | os.PathLike) -> Tables:
    """Read the design tables back from a calibrated GGUF (raises UserError if it is not one)."""
    from app.core.machine.gguf_info import read_header

    hdr = read_header(path)
    kv = hdr.metadata
    if "synthetic.next_token" not in kv:
        raise UserError(f"{path}: not an MTP Tuner calibrated model (no synthetic.next_token key)")
    nxt = np.asarray(kv["synthetic.next_token"], dtype=np.int64)
    mtp = np.asarray(kv["synthetic.mtp_next_token"], dtype=np.int64)
    task_p = json.loads(kv["synthetic.task_p"]) if "synthetic.task_p" in kv else None
    return Tables(nxt, mtp, str(kv.get("synthetic.variant", "embedding")),
                  float(kv.get("synthetic.p_reject", 0.0)), hdr.has_mtp, task_p)


def demo_prompts(path: str | os.PathLike) -> list | None:
    """The demo prompts a per-task calibrated model carries (as Prompt objects), or None."""
    from app.core.machine.gguf_info import read_header
    from app.core.records.prompt import Prompt

    try:
        kv = read_header(path).metadata
    except UserError:
        return None
    raw = kv.get("synthetic.demo_prompts")
    if not raw:
        return None
    return [Prompt(d["id"], d["task"], d["text"], d.get("lang", "")) for d in json.loads(raw)]


# The demo: per-task shares of wrong drafts, so code pays, story loses and tongue-twisters sit
# near break-even (sized in benchmarks/demo_story.py on a 2-core CPU).
DEMO_TASK_P = {"code": 0.05, "tongue-twister": 0.4, "story": 0.9}
DEMO_KS, DEMO_TOKENS, DEMO_REPS = "1,2,3", 64, 3  # the demo sweep, one prompt per task: within a minute
DEMO_SIZE_ENV = "MTP_TUNER_DEMO_SIZE"  # "tiny" makes the demo model small (the GUI unit tests)


def demo_model(size: str | None = None) -> Path:
    """The demo's per-task calibrated model in the per-user cache (made once, deterministic)."""
    from app.core.common.paths import cache_dir

    size = size or os.environ.get(DEMO_SIZE_ENV) or "demo"
    if size not in SIZES:
        raise UserError(f"{DEMO_SIZE_ENV}: the demo size must be one of {', '.join(SIZES)}, got {size!r}")
    tag = "-".join(f"{t}{p:g}" for t, p in DEMO_TASK_P.items())
    path = cache_dir() / "models" / f"calibrated-{size}-embedding-{tag}.gguf"
    if not path.exists():
        make_model(path, 0.0, "embedding", size, 0, task_p=DEMO_TASK_P)
    return path
