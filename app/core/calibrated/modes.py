"""Calibrated models for two more llama.cpp speculative modes, with exact simulators.

``draft-simple`` (a classic draft model, ``-md drafter.gguf --spec-type draft-simple``)
    :func:`drafter_tables` designs a plain bigram *drafter* whose next token is the target's except
    on a random subset of the cycle (share ``p_wrong``), where it skips one (always wrong); the GGUF
    writer is :func:`calibrated_gguf.make_drafter`. :func:`simulate_draft_simple` replays
    llama-server's loop and gives its ``timings.draft_n`` / ``draft_n_accepted`` exactly.
``ngram-mod`` (``--spec-type ngram-mod``, no draft model)
    drafts by looking up the last ``n_match`` tokens in a hash table of the context's n-grams.
    :func:`ngram_prompt` makes a prompt that repeats a stretch of the target's chain, so the
    target's continuation is already in the table; :func:`simulate_ngram_mod` replays the table
    (same hash, same chunked updates and resets) and the server loop exactly. The table lives in
    the server for its whole life (shared by requests), so the simulator returns its state for the
    next request.

What both replays rely on (llama.cpp common/speculative.cpp, tools/server/server-context.cpp):
neither mode asks for recurrent-state snapshots (``need_n_rs_seq`` is 0 unless draft-mtp, eagle3,
dflash or dspark is on), so for a qwen35 (hybrid) target llama-server cannot cut a rejected tail
off and uses checkpoints: after a partly rejected draft it restores the state and *replays* the
accepted tokens plus the target's own token as a draft of their own (not counted as drafted;
``draft_n_accepted`` counts only the first ones), and that replay emits one more token than a
plain verify step. A fully accepted draft needs no replay.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from app.core.common.errors import UserError
from app.core.calibrated.design import N_VOCAB, SimResult, Tables, accepted_prefix, cycle_token_ids

# --------------------------------------------------------------------------------------------
# draft-simple


def drafter_tables(target: Tables, p_wrong: float, seed: int = 0) -> tuple[Tables, np.ndarray, np.ndarray]:
    """Return (drafter tables, alias, wrong-subset mask) for a drafter of ``target``.

    The drafter's next token is ``B(t)`` (the target's) except for round(p_wrong * 771) cycle tokens
    chosen with ``seed``, where it is ``B(B(t))``. A token outside the cycle behaves like the cycle
    token it aliases (the one with the same target next token)."""
    if not 0.0 <= p_wrong <= 1.0:
        raise UserError(f"p_wrong must be between 0 and 1, got {p_wrong}")
    cyc = cycle_token_ids()
    nxt = np.asarray(target.next_token, dtype=np.int64)
    inv = np.full(N_VOCAB, -1, dtype=np.int64)
    inv[nxt[cyc]] = cyc
    if len(nxt) != N_VOCAB or np.any(inv[cyc] < 0):
        raise UserError("the target's next-token table is not one cycle over the printable tokens")
    alias = np.arange(N_VOCAB)
    non_cycle = np.setdiff1d(np.arange(N_VOCAB), cyc)
    alias[non_cycle] = inv[nxt[non_cycle]]
    rng = np.random.default_rng(seed)
    bad = np.zeros(N_VOCAB, dtype=bool)
    n_bad = int(round(p_wrong * len(cyc)))
    if n_bad:
        bad[rng.choice(cyc, size=n_bad, replace=False)] = True
    bad[non_cycle] = bad[alias[non_cycle]]
    dnext = np.where(bad, nxt[nxt], nxt)
    return Tables(dnext, dnext, "embedding", float(bad[cyc].mean()), False), alias, bad


def _chain(nxt: np.ndarray, start: int, n: int) -> list[int]:
    out, t = [], int(start)
    for _ in range(n):
        t = int(nxt[t])
        out.append(t)
    return out


def simulate_draft_simple(target: Tables, drafter: Tables, prompt_tokens: Sequence[int], k: int,
                          n_predict: int, replay: bool = True, n_min: int = 0) -> SimResult:
    """Replay llama-server's greedy draft-simple loop (``--spec-draft-n-max k``) over the tables.

    The first token comes from the prompt. Each step drafts ``min(k, n_predict - n_gen - 1)``
    tokens greedily from the drafter, starting at the last token (a plain decode when that is 0 or
    below ``n_min``, --spec-draft-n-min; --spec-draft-p-min never cuts a draft here, the drafter's
    top token has p ~ 1), accepts the longest prefix that follows the target's chain and adds the
    target's token. With ``replay`` (a qwen35 target: checkpoints), a partly rejected draft is
    replayed, which adds one more target token.
    """
    if not prompt_tokens:
        raise ValueError("simulate_draft_simple needs at least one prompt token")
    if n_predict <= 0:
        return SimResult((), 0, 0, 0)
    nxt, dnx = target.next_token, drafter.next_token
    last = int(nxt[int(prompt_tokens[-1])])
    out = [last]
    draft_n = accepted = steps = 0
    while len(out) < n_predict:
        budget = min(k, n_predict - len(out) - 1) if k > 0 else 0
        if budget <= 0 or budget < n_min:
            last = int(nxt[last])
            out.append(last)
            continue
        drafts = _chain(dnx, last, budget)
        n_acc = accepted_prefix(nxt, last, drafts)
        steps += 1
        draft_n += budget
        accepted += n_acc
        emitted = _chain(nxt, last, n_acc + 1 + (1 if replay and n_acc < budget else 0))
        out.extend(emitted)
        last = emitted[-1]
    return SimResult(tuple(out), draft_n, accepted, steps)


# --------------------------------------------------------------------------------------------
# ngram-mod

NGRAM_MOD_SIZE = 4 * 1024 * 1024  # entries of common_ngram_mod (common/speculative.cpp)
_MUL = 6364136223846793005
_MASK = (1 << 64) - 1


@dataclasses.dataclass
class NgramModState:
    """llama-server's ngram-mod drafter: the hash table (shared by every request for the server's
    life), and the slot's bookkeeping. Defaults are llama.cpp's (--spec-ngram-mod-n-match/-n-min/-n-max)."""

    n_match: int = 24
    n_min: int = 48
    n_max: int = 64
    entries: dict[int, int] = dataclasses.field(default_factory=dict)
    i_last: int = 0
    n_draft_last: int = 0
    n_low: int = 0
    resets: int = 0  # table resets (low-acceptance streaks, occupancy)

    def _idx(self, tokens: Sequence[int]) -> int:
        res = 0
        for t in tokens[:self.n_match]:
            res = (res * _MUL + int(t)) & _MASK
        return res % NGRAM_MOD_SIZE

    def add(self, tokens: Sequence[int]) -> None:
        """Key tokens[:n], value tokens[n] (collisions overwrite, as in common_ngram_mod::add)."""
        self.entries[self._idx(tokens)] = int(tokens[self.n_match])

    def get(self, tokens: Sequence[int]) -> int | None:
        return self.entries.get(self._idx(tokens))

    def reset(self) -> None:
        self.entries.clear()
        self.resets += 1

    def begin(self, prompt: Sequence[int]) -> None:
        self.i_last = self.n_draft_last = 0  # n_low is kept across requests, as in llama.cpp
        n = self.n_match
        if len(prompt) < n:
            return
        for i in range(len(prompt) - n):
            self.add(prompt[i:i + n + 1])
        self.i_last = len(prompt) - n
        if len(self.entries) / NGRAM_MOD_SIZE > 0.25:
            self.reset()

    def draft(self, context: Sequence[int], id_last: int) -> list[int]:
        """The draft from ``context`` (tokens in the KV cache) and the last sampled token, before
        the server cuts it to its budget."""
        n = self.n_match
        self.n_draft_last = 0
        cur = len(context)
        if cur < n:
            return []
        if self.i_last + 32 < cur:  # new n-grams are added in chunks
            for i in range(self.i_last, cur - n):
                self.add(context[i:i + n + 1])
            self.i_last = cur - n
        key = list(context[cur - n + 1:]) + [int(id_last)]
        out: list[int] = []
        for i in range(self.n_max):
            tok = self.get(key)
            if tok is None:
                if i < self.n_min:
                    return []
                break
            out.append(tok)
            key = key[1:] + [tok]
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < 0.25:
                self.n_low += 1
                if self.n_low >= 5:
                    self.reset()
                    self.n_low = 0
                    self.i_last = 0
            else:
                self.n_low = 0


def simulate_ngram_mod(tables: Tables, prompt_tokens: Sequence[int], n_predict: int,
                       state: NgramModState | None = None, n_ctx: int = 1024,
                       replay: bool = True, mtp_k: int = 0) -> tuple[SimResult, NgramModState]:
    """Replay one greedy llama-server request with ``--spec-type ngram-mod`` over the target's tables.

    ``state`` is the drafter left by the server's earlier requests (None: a fresh server); it is
    updated in place and returned. ``n_ctx`` is the slot's context (``-c`` / ``-np``): a draft is
    cut to ``min(n_ctx - n_tokens - 2, n_remaining - 1)``. --spec-draft-n-max plays no part.
    ``mtp_k`` > 0: ``--spec-type draft-mtp,ngram-mod`` at ``--spec-draft-n-max mtp_k`` instead
    (simulate_mtp_ngram_mod).
    """
    if not prompt_tokens:
        raise ValueError("simulate_ngram_mod needs at least one prompt token")
    st = state if state is not None else NgramModState()
    st.begin(prompt_tokens)
    if n_predict <= 0:
        return SimResult((), 0, 0, 0), st
    nxt = tables.next_token
    context = [int(t) for t in prompt_tokens]
    last = int(nxt[context[-1]])
    out = [last]
    draft_n = accepted = steps = 0
    while len(out) < n_predict:
        budget = min(n_ctx - len(context) - 2, n_predict - len(out) - 1)
        drafts = st.draft(context, last)[:budget] if budget > 0 else []
        by_ngram = bool(drafts)
        if not drafts and mtp_k > 0 and budget > 0:  # the MTP head drafts only when ngram-mod has none
            drafts = _chain(tables.mtp_next_token, last, min(mtp_k, budget))
        if not drafts:
            context.append(last)
            last = int(nxt[last])
            out.append(last)
            continue
        n_acc = accepted_prefix(nxt, last, drafts)
        steps += 1
        draft_n += len(drafts)
        accepted += n_acc
        again = replay and n_acc < len(drafts)
        if by_ngram:  # only the mode that drafted hears how much was accepted
            st.accept(n_acc + 1 if again else n_acc)  # a replay reports its own (complete) verify
        emitted = _chain(nxt, last, n_acc + 1 + (1 if again else 0))
        context.append(last)
        context.extend(emitted[:-1])
        out.extend(emitted)
        last = emitted[-1]
    return SimResult(tuple(out), draft_n, accepted, steps), st


def simulate_mtp_ngram_mod(tables: Tables, prompt_tokens: Sequence[int], k: int, n_predict: int,
                           n_ctx: int = 4096) -> SimResult:
    """Replay one greedy request of a fresh llama-server with ``--spec-type draft-mtp,ngram-mod``
    and ``--spec-draft-n-max k`` over the target's tables (the embedding variant: an MTP draft
    follows the MTP table from the last token).

    llama.cpp asks ngram-mod first each step (common_speculative_init's order) and the MTP head only
    when ngram-mod has no draft (common_speculative_draft stops at the first draft); only the mode
    that drafted hears how much of it was accepted. draft-mtp makes the target keep recurrent-state
    snapshots, so a rejected tail is cut off with no replay, for either mode's draft."""
    if not prompt_tokens:
        raise ValueError("simulate_mtp_ngram_mod needs at least one prompt token")
    return simulate_ngram_mod(tables, prompt_tokens, n_predict, n_ctx=n_ctx, replay=False, mtp_k=k)[0]


def ngram_prompt(tables: Tables, start: int, length: int, repeat: int) -> list[int]:
    """A stretch ``S`` of the target's greedy chain (``start`` then ``length - 1`` more tokens),
    followed by its first ``repeat`` tokens again: greedy decoding then walks through ``S`` a
    second time, so ngram-mod finds the continuation in the prompt (and drafts it right until the
    generation reaches the end of ``S``, where the prompt's seam gives one wrong draft)."""
    if not 1 <= repeat < length:
        raise ValueError("ngram_prompt: need 1 <= repeat < length")
    s = [int(start)] + tables.chain(start, length - 1)
    return s + s[:repeat]
