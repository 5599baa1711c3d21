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

The GGUF writer is in calibrated_gguf, the demo model and its settings in calibrated_demo; a
calibrated draft model (draft-simple) and ngram-mod prompts, with their simulators, in calibrated_modes.
No Qt here; numpy only (gguf in the writer).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Sequence

import numpy as np

from app.core.common.errors import UserError
from app.core.common import jsonsafe
from app.core.machine.gguf_info import read_header

if TYPE_CHECKING:  # gguf loads only where a model is written (a heavy import)
    from gguf import GGUFWriter

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
# A reasoning template's thinking switch (as Qwen3.5/3.6 write it): on (and by default) the
# generation prompt opens a <think> block, off it closes an empty one; an assistant turn's
# reasoning_content is rendered in the same markers (tests of the thinking setting).
THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' and message.reasoning_content is defined "
    "and message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
# Per-task models: the user's text as it is, so its last token is the prompt's last token.
CONTENT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
VARIANTS = ("embedding", "hidden")
SIZES = ("tiny", "demo", "mid", "bench")


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
    attn_interval: int = 4  # every this many trunk blocks, the last is full attention (the rest DeltaNet)

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
    # ~0.2 G parameters in F16 (~0.4 GB): between the two, the engines' fidelity check's second size
    # (benchmarks/engine_parity.py; issue 37 saw the engines disagree at this width and depth).
    "mid": Shape(n_embd=1536, n_trunk=12, n_ff=1536, n_head=12, n_head_kv=3, head_dim=128,
                 ssm_state=128, ssm_rank=12, ssm_groups=3, dtype="f16"),
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


def write_tokenizer(w: GGUFWriter, chat_template: str, vocab_offset: int = 0) -> None:
    """The vocabulary's tokenizer keys into a gguf writer ``w`` (every calibrated GGUF: the same
    tokens, so targets and drafters pair). ``vocab_offset`` rotates the token texts: a tokenizer of
    the same size that no longer matches (pair-check tests)."""
    tokens, types, merges = vocabulary()
    if vocab_offset:
        n = len(tokens)
        tokens = [tokens[(i + vocab_offset) % n] for i in range(n)]
        types = [types[(i + vocab_offset) % n] for i in range(n)]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen35")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", BOS_ID)
    w.add_uint32("tokenizer.ggml.eos_token_id", EOS_ID)
    w.add_uint32("tokenizer.ggml.padding_token_id", BOS_ID)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", chat_template)


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
    task_p: dict[str, float] | None = None  # {task: share of wrong drafts in its arc} for a per-task model

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
    # accepted drafts per draft position, K long (index 0: a step's first draft), as llama-server
    # counts them (spec_decode_num_accepted_tokens_per_pos); () without speculation
    accepted_per_pos: tuple[int, ...] = ()

    @property
    def acceptance(self) -> float | None:
        return self.draft_accepted / self.draft_n if self.draft_n else None


def accepted_prefix(nxt: np.ndarray, last: int, drafts: Sequence[int]) -> int:
    """How many of ``drafts`` (drafted after ``last``) greedy verification keeps: the longest prefix
    that follows the target's next-token table ``nxt``."""
    n_acc, cur = 0, last
    for d in drafts:
        if d != int(nxt[cur]):
            break
        n_acc += 1
        cur = d
    return n_acc


def simulate(tables: Tables, prompt_tokens: Sequence[int], k: int, n_predict: int) -> SimResult:
    """Replay llama.cpp's greedy draft/verify loop over the designed tables.

    ``k`` is the draft width (0 = no speculation). The first token comes from the prompt; then each
    step drafts ``min(k, n_predict - n_gen - 1)`` tokens (a plain decode when that is 0), accepts the
    longest prefix that matches the target chain and adds the target's own token. ``steps`` and
    ``accepted_per_pos`` count as llama-server does: a step per verified draft, position i when
    the step's first i + 1 drafts were accepted.
    """
    if not prompt_tokens:
        raise ValueError("simulate needs at least one prompt token")
    if n_predict <= 0:
        return SimResult((), 0, 0, 0, (0,) * max(k, 0))
    nxt, mtp = tables.next_token, tables.mtp_next_token
    prev = int(prompt_tokens[-1])
    last = int(nxt[prev])
    out = [last]
    draft_n = accepted = steps = 0
    per_pos = [0] * max(k, 0)
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
        n_acc = accepted_prefix(nxt, last, drafts)
        emitted = tables.chain(last, n_acc + 1)
        accepted += n_acc
        for i in range(n_acc):
            per_pos[i] += 1
        seq = [last] + emitted
        prev, last = seq[-2], seq[-1]
        out.extend(emitted)
    return SimResult(tuple(out), draft_n, accepted, steps, tuple(per_pos))


def closed_form_acceptance(p: float, k: int, variant: str = "embedding") -> float:
    """Long-run acceptance for the random pattern (i.i.d. approximation)."""
    q = 1.0 - p
    if variant == "hidden":
        return q / k
    if k == 1 or q == 1.0:
        return q
    return q * (1 - q ** k) / (k * (1 - q))


def load_tables(path: str | os.PathLike[str]) -> Tables:
    """Read the design tables back from a calibrated GGUF (raises UserError if it is not one)."""
    hdr = read_header(path)
    kv = hdr.metadata
    if "synthetic.next_token" not in kv:
        raise UserError(f"{path}: not an MTP Tuner calibrated model (no synthetic.next_token key)")
    nxt = np.asarray(kv["synthetic.next_token"], dtype=np.int64)
    mtp = np.asarray(kv["synthetic.mtp_next_token"], dtype=np.int64)
    task_p = jsonsafe.loads(kv["synthetic.task_p"]) if "synthetic.task_p" in kv else None
    return Tables(nxt, mtp, str(kv.get("synthetic.variant", "embedding")),
                  float(kv.get("synthetic.p_reject", 0.0)), hdr.has_mtp, task_p)
