"""What every engine (llama-server, in-process) gives the runner: engine-neutral results."""

from __future__ import annotations

import dataclasses


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

    @property
    def decode_tok_s(self) -> float | None:
        """Decode tok/s from our own token timestamps, first token excluded."""
        if len(self.token_times) < 2:
            return None
        dt = self.token_times[-1] - self.token_times[0]
        return (len(self.token_times) - 1) / dt if dt > 0 else None
