"""What an adaptive sweep has spent (wall time, generated tokens, measured runs) against its
budget, and whether more runs fit in what is left."""

from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass
class Budget:
    """What the sweep has spent, against its budget (None: no limit)."""

    seconds: float | None
    tokens: int | None
    clock: Callable[[], float]
    t0: float = 0.0
    spent_tokens: int = 0
    runs: int = 0  # measured runs
    run_s: float = 0.0  # their wall time

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def per_run(self) -> float | None:
        """Seconds per measured run so far (None: none yet)."""
        return self.run_s / self.runs if self.runs else None

    def fits(self, n_runs: int, n_predict: int) -> bool:
        """Another ``n_runs`` runs fit in what is left."""
        if self.tokens is not None and self.spent_tokens + n_runs * n_predict > self.tokens:
            return False
        per_run = self.per_run()
        if self.seconds is not None and per_run is not None and self.elapsed() + n_runs * per_run > self.seconds:
            return False
        return not (self.seconds is not None and self.elapsed() >= self.seconds)
