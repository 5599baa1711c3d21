"""llama.cpp's own sampler chain for one in-process request, built through llama-cpp-python's
low-level ``llama_sampler_*`` API exactly as llama-server builds it for a request:

- common_sampler_init (common/sampling.cpp): a logit bias first when there is one (the EOG
  tokens at -inf with ignore_eos, as the server's ``ignore_eos`` adds them, then the vocabulary's
  suppress tokens), then the default order penalties, dry, top_n_sigma, top_k, typ_p, top_p,
  min_p, xtc, temperature (temp_ext), and dist(seed) last;
- the server's slot start (server-context.cpp init_sampler): the sampler is reset and every
  prompt token is accepted into it (the penalties' history);
- every token the target samples is accepted (``llama_sampler_sample`` applies the chain and
  accepts the token it picked, as common_sampler_sample + common_sampler_accept do).

What llama.cpp leaves a no-op by default (dry, top_n_sigma, typical, xtc) is built all the same,
at llama.cpp's defaults (records.sampler.FIXED), so the chain is the server's step for step.
A llama-cpp-python without one of these functions is refused, never approximated.
"""

from __future__ import annotations

import ctypes
import math
from types import ModuleType
from typing import Any

from app.core.common.errors import EngineError
from app.core.records.sampler import DRY_BREAKERS, FIXED, Sampler

NEEDED = ("llama_sampler_chain_init", "llama_sampler_chain_add", "llama_sampler_init_logit_bias",
          "llama_sampler_init_penalties", "llama_sampler_init_dry", "llama_sampler_init_top_n_sigma",
          "llama_sampler_init_top_k", "llama_sampler_init_typical", "llama_sampler_init_top_p",
          "llama_sampler_init_min_p", "llama_sampler_init_xtc", "llama_sampler_init_temp_ext",
          "llama_sampler_init_dist", "llama_sampler_sample", "llama_sampler_accept", "llama_sampler_free",
          "llama_vocab_get_suppress_tokens")


def eog_tokens(L: ModuleType, vocab: Any, n_vocab: int) -> tuple[int, ...]:
    """The vocabulary's end-of-generation tokens (what the server biases to -inf for ignore_eos)."""
    return tuple(t for t in range(n_vocab) if L.llama_vocab_is_eog(vocab, t))


class SamplerChain:
    """One request's chain. :meth:`sample` applies it to row ``idx`` of a context's last decode and
    accepts the token it picked; :meth:`close` frees it (the chain owns its samplers)."""

    def __init__(self, L: ModuleType, vocab: Any, n_vocab: int, sampler: Sampler, prompt: list[int],
                 eog: tuple[int, ...] = ()):
        missing = [n for n in NEEDED if not hasattr(L, n)]
        if missing:
            raise EngineError(f"this llama-cpp-python has no {missing[0]}, so the in-process engine cannot "
                              "build llama.cpp's sampler chain; update llama-cpp-python or use llama-server")
        self.L = L
        self.sampler = sampler
        self._keep: list[ctypes.Array[Any]] = []  # ctypes buffers the samplers were made from
        self.chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if not self.chain:
            raise EngineError("llama.cpp could not create a sampler chain")
        try:
            self._build(vocab, n_vocab, sampler, eog)
            for t in prompt:  # the server's init_sampler: the prompt is the penalties' history
                L.llama_sampler_accept(self.chain, t)
        except BaseException:
            self.close()
            raise

    def _add(self, smpl: Any, what: str) -> None:
        if not smpl:
            raise EngineError(f"llama.cpp could not create the {what} sampler")
        self.L.llama_sampler_chain_add(self.chain, smpl)

    def _build(self, vocab: Any, n_vocab: int, s: Sampler, eog: tuple[int, ...]) -> None:
        L, F = self.L, FIXED
        biases = [(t, -math.inf) for t in eog]
        n_sup = ctypes.c_int32(0)
        sup = L.llama_vocab_get_suppress_tokens(vocab, ctypes.byref(n_sup))
        biases += [(int(sup[i]), -math.inf) for i in range(n_sup.value)] if sup else []
        if biases:
            arr = (L.llama_logit_bias * len(biases))(*[L.llama_logit_bias(t, b) for t, b in biases])
            self._keep.append(arr)
            self._add(L.llama_sampler_init_logit_bias(n_vocab, len(biases), arr), "logit bias")
        self._add(L.llama_sampler_init_penalties(n_vocab, F["repeat_last_n"], s.repeat_penalty,
                                                 F["frequency_penalty"], F["presence_penalty"]), "penalties")
        brk = (ctypes.c_char_p * len(DRY_BREAKERS))(*[b.encode() for b in DRY_BREAKERS])
        self._keep.append(brk)
        self._add(L.llama_sampler_init_dry(vocab, F["dry_multiplier"], F["dry_base"], F["dry_allowed_length"],
                                           F["dry_penalty_last_n"], ctypes.cast(brk, ctypes.POINTER(ctypes.c_char_p)),
                                           len(DRY_BREAKERS)), "dry")
        self._add(L.llama_sampler_init_top_n_sigma(F["top_n_sigma"]), "top-n-sigma")
        self._add(L.llama_sampler_init_top_k(s.top_k), "top-k")
        self._add(L.llama_sampler_init_typical(F["typical_p"], F["min_keep"]), "typical")
        self._add(L.llama_sampler_init_top_p(s.top_p, F["min_keep"]), "top-p")
        self._add(L.llama_sampler_init_min_p(s.min_p, F["min_keep"]), "min-p")
        self._add(L.llama_sampler_init_xtc(F["xtc_probability"], F["xtc_threshold"], F["min_keep"], s.seed), "xtc")
        self._add(L.llama_sampler_init_temp_ext(s.temperature, F["dynatemp_range"], F["dynatemp_exponent"]),
                  "temperature")
        self._add(L.llama_sampler_init_dist(s.seed), "dist")

    def names(self) -> list[str]:
        """The chain's steps as llama.cpp names them (llama_sampler_name), in order."""
        L = self.L
        return [L.llama_sampler_name(L.llama_sampler_chain_get(self.chain, i)).decode()
                for i in range(L.llama_sampler_chain_n(self.chain))]

    def sample(self, ctx: Any, idx: int) -> int:
        """The token the chain picks from row ``idx`` of ``ctx``'s last decode, accepted into it."""
        return int(self.L.llama_sampler_sample(self.chain, ctx, idx))

    def close(self) -> None:
        if self.chain:
            self.L.llama_sampler_free(self.chain)
            self.chain = None
        self._keep.clear()
