"""The in-process cost probe's timed decodes: the llama.cpp calls the probe makes (clear a context,
decode a batch at a position, wait for the device, drop the positions again, read the MTP hidden
rows) behind a few methods, so that app.core.measure.probe times passes without touching
llama.cpp itself (no llama.cpp C call is made outside app.core.engines).

    dec = ProbeDecoder(engine, model, max_batch)   # loads the model, sizes the contexts
    dec.prompt_pass(tokens)                        # seconds to decode them from an empty context
    dec.fill_context(tokens)                       # the context every timed pass starts from
    dec.verify(tokens), dec.draft_step(token), dec.catchup(tokens)   # ms each, then back at the depth
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from app.core.common.errors import EngineError
from app.core.engines.inprocess import InProcessEngine, RawContexts
from app.core.engines.llama_backend import decode_or_raise, fill_batch


class ProbeDecoder:
    """Timed decodes on one loaded model's target context (and its MTP context when the model has
    MTP heads), each starting from the context ``fill_context`` decoded. The engine keeps owning
    the handles (valid until it is closed)."""

    def __init__(self, engine: InProcessEngine, model: str, max_batch: int):
        self._engine = engine
        self._raw: RawContexts = engine.raw_contexts(model, max_batch)
        self._L: Any = self._raw.L
        self._X: Any = self._raw.X
        self.has_mtp = bool(self._raw.model.has_mtp)
        self.n_vocab = int(self._raw.model.n_vocab)
        self._n_embd = int(self._raw.model.n_embd)
        self._mem_t = self._L.llama_get_memory(self._raw.target)
        self._mem_d = self._L.llama_get_memory(self._raw.draft) if self.has_mtp else None
        self._depth = 0
        self._h_last: np.ndarray | None = None  # the hidden row the MTP head drafts from at the depth
        self._full_state = b""

    def _fill(self, batch: object, toks: Sequence[int], pos0: int, logits: Sequence[int],
              rows: Sequence[np.ndarray] | None = None) -> None:
        fill_batch(batch, toks, pos0, logits, rows, self._raw.hidden_rows, self._n_embd)

    def _decode(self, ctx: object, batch: object) -> None:
        decode_or_raise(self._L, ctx, batch, "the probe")

    def prompt_pass(self, toks: Sequence[int]) -> float:
        """Seconds to decode ``toks`` into an empty target context (logits for the last only)."""
        self._L.llama_memory_clear(self._mem_t, True)
        self._fill(self._raw.target_batch, toks, 0, [0] * (len(toks) - 1) + [1])
        t0 = time.perf_counter()
        self._decode(self._raw.target, self._raw.target_batch)
        self._L.llama_synchronize(self._raw.target)
        return time.perf_counter() - t0

    def fill_context(self, toks: Sequence[int]) -> None:
        """Decode ``toks`` into an empty target context (and the MTP context through a catch-up of
        the target's hidden rows) and keep that state: every timed pass starts at their depth."""
        depth = len(toks)
        self._L.llama_memory_clear(self._mem_t, True)
        self._X.llama_set_embeddings_nextn(self._raw.target, self.has_mtp, False)
        self._fill(self._raw.target_batch, toks, 0, [0] * (depth - 1) + [1])
        self._decode(self._raw.target, self._raw.target_batch)
        if self.has_mtp:
            self._L.llama_memory_clear(self._mem_d, True)
            hidden = np.ctypeslib.as_array(self._X.llama_get_embeddings_nextn(self._raw.target),
                                           shape=(depth, self._n_embd)).copy()
            rows = [np.zeros(self._n_embd, np.float32)] + [hidden[i - 1] for i in range(1, depth)]
            self._fill(self._raw.draft_batch, toks, 0, [0] * depth, rows)
            self._decode(self._raw.draft, self._raw.draft_batch)
            self._h_last = hidden[-1].copy()
        self._depth = depth
        self._full_state = self._engine.target_state(partial=False)

    def verify(self, toks: Sequence[int]) -> float:
        """ms of one verify pass of ``toks`` at the depth (logits for every one), then the target
        back at the depth (its positions dropped, or the kept state put back)."""
        self._fill(self._raw.target_batch, toks, self._depth, [1] * len(toks))
        t0 = time.perf_counter()
        self._decode(self._raw.target, self._raw.target_batch)
        self._L.llama_synchronize(self._raw.target)
        ms = (time.perf_counter() - t0) * 1000
        if not self._L.llama_memory_seq_rm(self._mem_t, 0, self._depth, -1):
            self._L.llama_memory_seq_rm(self._mem_t, 0, -1, -1)
            if not self._engine.restore_target_state(self._full_state, partial=False):
                raise EngineError("could not restore the context between probe trials")
        return ms

    def draft_step(self, tok: int) -> float:
        """ms of one MTP draft step at the depth (the head's decode, its argmax and the hidden row
        the next step would draft from), then the MTP context back at the depth."""
        t0 = time.perf_counter()
        self._fill(self._raw.draft_batch, [tok], self._depth, [1], [self._mtp_row()])
        self._decode(self._raw.draft, self._raw.draft_batch)
        logits = np.ctypeslib.as_array(self._L.llama_get_logits_ith(self._raw.draft, 0), shape=(self.n_vocab,))
        int(np.argmax(logits))
        np.ctypeslib.as_array(self._X.llama_get_embeddings_nextn_ith(self._raw.draft, 0),
                              shape=(self._n_embd,)).copy()
        ms = (time.perf_counter() - t0) * 1000
        self._L.llama_memory_seq_rm(self._mem_d, 0, self._depth, -1)
        return ms

    def catchup(self, toks: Sequence[int]) -> float:
        """ms of the MTP context's catch-up over ``toks`` at the depth, then back at the depth."""
        row = self._mtp_row()
        self._fill(self._raw.draft_batch, toks, self._depth, [0] * len(toks), [row] * len(toks))
        t0 = time.perf_counter()
        self._decode(self._raw.draft, self._raw.draft_batch)
        self._L.llama_synchronize(self._raw.draft)
        ms = (time.perf_counter() - t0) * 1000
        self._L.llama_memory_seq_rm(self._mem_d, 0, self._depth, -1)
        return ms

    def _mtp_row(self) -> np.ndarray:
        if self._h_last is None:
            raise EngineError("the probe timed an MTP step on a model without MTP heads, or before its context")
        return self._h_last
