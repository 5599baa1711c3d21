"""The in-process decode loop of one request: the prompt, then plain or speculative steps until
n_predict tokens. The MTP loop mirrors llama-server (common/speculative.cpp ``draft-mtp`` + the
server's verify/accept/rollback): the target's hidden state feeds the NextN head, up to K tokens
are drafted (stopping early when the draft's top probability is below p_min), all of them plus
one are verified in ONE target batch, the longest prefix the target's own samples match plus the
target's next sample is accepted and both contexts are rolled back, recurrent (DeltaNet) state
included. The target samples with llama.cpp's own sampler chain (sampler_chain), as the server
does. Drafted and accepted tokens are counted exactly as llama.cpp counts them.

Order of operations: llama-server's, as above; the pitfalls are noted at the steps they concern.
"""

from __future__ import annotations

import ctypes
import random
import time
from typing import Any, Generator, Iterable, Protocol, Sequence

import numpy as np

from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, EngineError
from app.core.engines.base import Generation, Progress, confounder_flags
from app.core.engines.llama_backend import decode_or_raise, fill_batch, llama, recent_log
from app.core.engines.loaded import LoadedModel
from app.core.engines.backend_truth import Placement
from app.core.engines.sampler_chain import SamplerChain
from app.core.records.sampler import Sampler

PROGRESS_EVERY_S = 0.05

# the one clock of a request's token times, baseline and speculative alike (a module name, so a
# test can put a recorded clock in its place: tests/test_fidelity.py)
clock = time.perf_counter


class DecodeHost(Protocol):
    """What a decode loop uses of the in-process engine that owns the contexts (InProcessEngine):
    its target and MTP contexts and batches, the hidden-row buffer, the prompt batch size, the
    target state snapshots and where its model runs."""

    _tgt: Any
    _dft: Any
    _tb: Any
    _db: Any
    _demb: np.ndarray | None
    n_batch: int
    placement: Placement | None

    def eog_tokens(self, m: LoadedModel) -> tuple[int, ...]: ...

    def target_state(self, partial: bool = True) -> bytes: ...

    def restore_target_state(self, blob: bytes, partial: bool = True) -> bool: ...


class DecodeLoop:
    """One request: prompt, then plain or speculative steps until n_predict tokens."""

    def __init__(self, eng: DecodeHost, m: LoadedModel, mtp: bool, k: int, p_min: float,
                 sampler: Sampler, ignore_eos: bool, synth_rates: Sequence[float] | None = None):
        self.L, self.X = llama()
        # benchmarking only (the cost probe), as llama.cpp's --spec-synth-rates: draft position i is
        # accepted with unconditional probability synth_rates[i] instead of by the target's sample
        # (the output is not valid); everything else (draft, verify, rollback, catch-up) runs as always
        self.synth = list(synth_rates)[:k] if synth_rates else None
        self._rng = random.Random(0)
        self.eng, self.m = eng, m
        self.mtp, self.k, self.p_min = mtp, k, p_min
        self.sampler = sampler
        self.chain: SamplerChain | None = None  # llama.cpp's own chain, made per request in run()
        self.ignore_eos = ignore_eos
        self.tgt, self.dft = eng._tgt, eng._dft
        self.mem_t = self.L.llama_get_memory(self.tgt)
        self.mem_d = self.L.llama_get_memory(self.dft) if mtp else None
        self.pending_h = np.zeros(m.n_embd, np.float32)
        self.draft_n = self.accepted = 0
        # as llama-server counts (server-context.cpp: n_draft_verif_steps, n_accepted_per_pos sized
        # n_max): one step per verified draft; position i when the first i + 1 drafts were accepted
        self.steps, self.per_pos = 0, [0] * k if mtp else []
        self.is_recurrent = bool(self.L.llama_model_is_hybrid(m.model) or self.L.llama_model_is_recurrent(m.model))
        self.use_ckpt = mtp and self.is_recurrent and self.L.llama_n_rs_seq(self.tgt) < k

    def _fill(self, b: Any, toks: Sequence[int], pos0: int, logits: Sequence[int],
              embs: Iterable[np.ndarray] | None = None) -> None:
        fill_batch(b, toks, pos0, logits, embs, self.eng._demb, self.m.n_embd)

    def _decode(self, ctx: Any, b: Any, what: str) -> None:
        decode_or_raise(self.L, ctx, b, what)

    def _logits(self, ctx: Any, i: int) -> np.ndarray:
        ptr = self.L.llama_get_logits_ith(ctx, i)
        if not ptr:
            raise EngineError(f"no logits for row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.m.n_vocab,))

    def _target_h(self, n: int) -> np.ndarray:
        ptr = self.X.llama_get_embeddings_nextn(self.tgt)
        if not ptr:
            raise EngineError("the target gave no hidden states for the MTP head")
        return np.ctypeslib.as_array(ptr, shape=(n, self.m.n_embd)).copy()

    def _sample(self, row: int) -> int:
        """The target's token from ``row`` of its last decode: llama.cpp's chain picks it and
        accepts it into its history (common_sampler_sample + common_sampler_accept)."""
        assert self.chain is not None
        self._logits(self.tgt, row)  # a row without logits: an EngineError here, not llama.cpp's abort
        return self.chain.sample(self.tgt, row)

    def _catch_up(self, toks: list[int], pos0: int, H: np.ndarray) -> None:
        """MTP context: token x_p at position p paired with the target h of position p-1."""
        rows = [self.pending_h] + [H[i - 1] for i in range(1, len(toks))]
        db = self.eng._db
        self._fill(db, toks, pos0, [0] * len(toks), rows)
        self._decode(self.dft, db, "the MTP catch-up")
        self.pending_h = H[-1].copy()

    def _is_eog(self, t: int) -> bool:
        return (not self.ignore_eos) and bool(self.L.llama_vocab_is_eog(self.m.vocab, t))

    def run(self, prompt: list[int], n_predict: int, cancel: CancelToken) -> Generator[Progress, None, Generation]:
        eog = self.eng.eog_tokens(self.m) if self.ignore_eos else ()
        self.chain = SamplerChain(self.L, self.m.vocab, self.m.n_vocab, self.sampler, prompt, eog)
        try:
            return (yield from self._run(prompt, n_predict, cancel))
        finally:
            self.chain.close()

    def _run(self, prompt: list[int], n_predict: int, cancel: CancelToken) -> Generator[Progress, None, Generation]:
        L, X = self.L, self.X
        L.llama_memory_clear(self.mem_t, True)
        if self.m.has_mtp:
            X.llama_set_embeddings_nextn(self.tgt, bool(self.mtp), False)
        if self.mtp:
            L.llama_memory_clear(self.mem_d, True)
        tb = self.eng._tb
        nb = max(self.eng.n_batch, 1)
        t0 = clock()
        # prompt, in chunks; catch-up after each chunk
        for start in range(0, len(prompt), nb):
            cancel.check()
            chunk = prompt[start:start + nb]
            last = start + len(chunk) == len(prompt)
            self._fill(tb, chunk, start, [0] * (len(chunk) - 1) + [1 if last else 0])
            self._decode(self.tgt, tb, "the prompt")
            if self.mtp:
                self._catch_up(chunk, start, self._target_h(len(chunk)))
        t_prompt = clock()
        first = self._sample(len(prompt) - 1 - (len(prompt) - 1) // nb * nb)
        out, times = [first], [clock() - t0]
        n_past, id_last = len(prompt), first
        last_emit = 0.0
        done = self._is_eog(first)
        while not done and len(out) < n_predict:
            if cancel.cancelled:
                raise Cancelled()
            budget = min(self.k, n_predict - len(out) - 1) if self.mtp else 0
            draft = self._draft(id_last, n_past, budget) if budget > 0 else []
            if not draft:
                ids = self._plain_step(id_last, n_past)
            else:
                ids = self._verify(id_last, n_past, draft)
            now = clock() - t0
            for t in ids:
                out.append(t)
                times.append(now)
                if self._is_eog(t):
                    done = True
                    break
            n_past += len(ids)
            id_last = ids[-1]
            if now - last_emit > PROGRESS_EVERY_S:
                last_emit = now
                yield Progress(len(out), now)
        dt_prompt = t_prompt - t0
        gen = Generation(
            tokens=tuple(out), token_times=tuple(times), prompt_tokens=tuple(prompt),
            text=self._detok(out), engine_tok_s=None, predicted_n=len(out),
            draft_n=self.draft_n if self.mtp else None, draft_accepted=self.accepted if self.mtp else None,
            prompt_n=len(prompt), prompt_ms=dt_prompt * 1000,
            prompt_tok_s=len(prompt) / dt_prompt if dt_prompt > 0 else None, speculative=self.mtp,
            engine_flags=confounder_flags(recent_log(500)), placement=self.eng.placement,
            accepted_per_pos=tuple(self.per_pos), draft_steps=self.steps if self.mtp else None)
        return gen

    def _plain_step(self, id_last: int, n_past: int) -> list[int]:
        tb = self.eng._tb
        self._fill(tb, [id_last], n_past, [1])
        self._decode(self.tgt, tb, "decoding")
        if self.mtp:
            self._catch_up([id_last], n_past, self._target_h(1))
        return [self._sample(0)]

    def _draft(self, id_last: int, n_past: int, budget: int) -> list[int]:
        L, X = self.L, self.X
        db = self.eng._db
        draft: list[int] = []
        self._fill(db, [id_last], n_past, [1], [self.pending_h])
        self._decode(self.dft, db, "drafting")
        while True:
            logits = self._logits(self.dft, 0)
            t = int(np.argmax(logits))
            if self.p_min > 0:
                top = np.partition(logits, -10)[-10:] if logits.size > 10 else logits
                e = np.exp(top - top.max())
                if e.max() / e.sum() < self.p_min:
                    break
            draft.append(t)
            if len(draft) >= budget:
                break
            hp = X.llama_get_embeddings_nextn_ith(self.dft, 0)
            if not hp:
                raise EngineError("the MTP context gave no hidden state")
            h = np.ctypeslib.as_array(hp, shape=(self.m.n_embd,)).copy()
            self._fill(db, [t], n_past + len(draft), [1], [h])
            self._decode(self.dft, db, "drafting")
        L.llama_memory_seq_rm(self.mem_d, 0, n_past, -1)
        self.draft_n += len(draft)
        return draft

    def _verify(self, id_last: int, n_past: int, draft: list[int]) -> list[int]:
        L = self.L
        tb = self.eng._tb
        toks = [id_last] + draft
        ckpt = self.eng.target_state() if self.use_ckpt else None
        self._fill(tb, toks, n_past, [1] * len(toks))
        self._decode(self.tgt, tb, "verification")  # ONE decode: recurrent snapshots need it
        H = self._target_h(len(toks))
        self._catch_up(toks, n_past, H)
        # common_sampler_sample_and_accept_n (common/sampling.cpp): row i sampled by the target's own
        # chain and accepted into it; the draft is kept while the sample equals it, and the first
        # sample that differs (or the one after a fully kept draft) is the step's own token
        ids: list[int] = []
        prev = 1.0
        for i, d in enumerate(draft):
            t = self._sample(i)
            if self.synth is not None:  # the synthetic decision (the row is sampled all the same)
                p = self.synth[i] / prev if prev > 0 and i < len(self.synth) else 0.0
                prev = self.synth[i] if i < len(self.synth) else 0.0
                if self._rng.random() < p:
                    t = d
                elif t == d:  # rejected: the step's own token differs from the draft
                    t = (d + 1) % self.m.n_vocab
            ids.append(t)
            if t != d:
                break
        else:
            ids.append(self._sample(len(draft)))
        n_acc = len(ids) - 1
        self.accepted += n_acc
        self.steps += 1
        for i in range(min(n_acc, len(self.per_pos))):
            self.per_pos[i] += 1
        self.pending_h = H[n_acc].copy()
        keep = n_past + 1 + n_acc
        if keep < n_past + len(toks):
            if not L.llama_memory_seq_rm(self.mem_t, 0, keep, -1):
                if ckpt is None:
                    raise EngineError("the target could not roll back its state after a rejected "
                                      "draft (recurrent-state snapshots too few)")
                self._restore_and_replay(ckpt, toks[:1 + n_acc], n_past)
            L.llama_memory_seq_rm(self.mem_d, 0, keep, -1)
        return ids

    def _restore_and_replay(self, ckpt: bytes, toks: list[int], n_past: int) -> None:
        L = self.L
        self.eng.restore_target_state(ckpt)
        if not L.llama_memory_seq_rm(self.mem_t, 0, n_past, -1):
            raise EngineError("the target could not restore its state checkpoint")
        X = self.X
        X.llama_set_embeddings_nextn(self.tgt, False, False)
        tb = self.eng._tb
        self._fill(tb, toks, n_past, [0] * len(toks))
        self._decode(self.tgt, tb, "the replay after a rejected draft")
        X.llama_set_embeddings_nextn(self.tgt, True, False)

    def _detok(self, toks: list[int]) -> str:
        L = self.L
        parts = []
        buf = ctypes.create_string_buffer(256)
        for t in toks:
            n = L.llama_token_to_piece(self.m.vocab, t, buf, len(buf), 0, False)
            if n > 0:
                parts.append(buf.raw[:n])
        return b"".join(parts).decode("utf-8", errors="replace")
