"""What every engine (llama-server, in-process) gives the runner: engine-neutral results."""

from __future__ import annotations

import dataclasses
import os
import re

from app.core.common.errors import EngineError

THREADS_ENV = "MTP_TUNER_THREADS"


def default_threads() -> int | None:
    """CPU threads for an engine when the caller chose none: ``MTP_TUNER_THREADS`` when set
    (the test suite sets 1 so that a busy machine does not make llama.cpp's threads wait on each
    other), else None (each engine's own default)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise EngineError(f"{THREADS_ENV} must be a whole number of threads >= 1, got {raw!r}")
    return int(raw)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Tokens generated so far in the run in flight, and seconds since its request."""

    n_tokens: int
    elapsed_s: float


@dataclasses.dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]
    token_times: tuple[float, ...]  # seconds since the request, one per token, as they arrived
    prompt_tokens: tuple[int, ...]
    text: str
    engine_tok_s: float | None  # the engine's own decode speed (first token excluded)
    predicted_n: int | None
    draft_n: int | None  # None when the engine reported no drafting
    draft_accepted: int | None
    prompt_n: int | None
    prompt_ms: float | None
    prompt_tok_s: float | None
    speculative: bool | None  # engine says speculation is on (llama-server /slots)
    server_pid: int | None = None
    engine_flags: tuple[str, ...] = ()  # confounders the engine saw (see confounder_flags)

    @property
    def decode_tok_s(self) -> float | None:
        """Decode tok/s from our own token timestamps, first token excluded."""
        if len(self.token_times) < 2:
            return None
        dt = self.token_times[-1] - self.token_times[0]
        return (len(self.token_times) - 1) / dt if dt > 0 else None


_OFFLOAD_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def confounder_flags(log_lines, *, n_slots: int | None = None, cache_types: tuple[str | None, ...] = ()) -> tuple[str, ...]:
    """Confounders an engine's own log and settings reveal: more than one server slot, weights
    only partly on the GPU, Metal with a quantized KV cache."""
    flags = []
    if n_slots is not None and n_slots > 1:
        flags.append("multiple_slots")
    metal = False
    for ln in log_lines:
        m = _OFFLOAD_RE.search(ln)
        if m and 0 < int(m.group(1)) < int(m.group(2)):
            flags.append("partial_offload")
        if "ggml_metal" in ln or "using Metal" in ln or "MTL0" in ln:
            metal = True
    if metal and any(t and t.lower().startswith(("q", "iq")) for t in cache_types):
        flags.append("metal_quant_kv")
    return tuple(dict.fromkeys(flags))
