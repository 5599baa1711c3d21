"""What an adaptive sweep has spent (wall time, generated tokens, measured runs) against its
budget, and whether more runs fit in what is left.

The time budget is a promise made before the start ("Quick: about 2 minutes"), so every part
of the flow counts against it, the cost probe and the pilot included, from ``t0`` (the flow's
start, which may be before the sweep's). Before the first measured run, a run's time is
estimated from the probe's plain decode step (``token_s``), so the pilot is cut too when its
next run would not fit. ``GRACE`` lets a sweep that is seconds from deciding finish instead of
stopping with "about 2 more seconds would decide it"; it stays within the 15 % a stated time
may be overrun by."""

from __future__ import annotations

import dataclasses
from typing import Callable

from app.core.analysis.decide import TaskDecision
from app.core.common.units import duration

GRACE = 0.10  # a sweep about to decide may run this share of its time budget longer
GRACE_REPS = 2  # past max_reps, a contender may run this many more where they are estimated to decide it
RUN_OVERHEAD = 1.3  # a run's time over its tokens' decode time (the prompt, sampling, the runner's own)


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
    token_s: float | None = None  # seconds per generated token, from the probe (before the first runs)

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def per_run(self, n_predict: int | None = None) -> float | None:
        """Seconds per measured run so far; before the first, the probe's estimate for a run of
        ``n_predict`` tokens (None: neither known)."""
        if self.runs:
            return self.run_s / self.runs
        if self.token_s is not None and n_predict:
            return self.token_s * n_predict * RUN_OVERHEAD
        return None

    def limit(self, grace: bool = False) -> float | None:
        """The time budget in seconds (with ``grace``: the share a sweep about to decide may add)."""
        if self.seconds is None:
            return None
        return self.seconds * (1 + GRACE) if grace else self.seconds

    def fits(self, n_runs: int, n_predict: int, grace: bool = False) -> bool:
        """Another ``n_runs`` runs of ``n_predict`` tokens fit in what is left (``grace``: in
        what is left of the budget and its grace)."""
        if self.tokens is not None and self.spent_tokens + n_runs * n_predict > self.tokens:
            return False
        limit = self.limit(grace)
        if limit is None:
            return True
        per_run, elapsed = self.per_run(n_predict), self.elapsed()
        if per_run is not None and elapsed + n_runs * per_run > limit:
            return False
        return elapsed < limit

    def finishes(self, eta_s: float | None, n_runs: int, n_predict: int) -> bool:
        """A sweep estimated to be decided in ``eta_s`` seconds gets there within the budget's
        grace, and the next ``n_runs`` runs fit in it too."""
        limit = self.limit(grace=True)
        if eta_s is None or limit is None or self.tokens is not None:
            return False
        return self.elapsed() + eta_s <= limit and self.fits(n_runs, n_predict, grace=True)


def with_eta(d: TaskDecision, runs_per_rep: int, per_run: float | None) -> TaskDecision:
    """``d`` with the time its estimated repetitions take (``eta_s``; 0 when decided): each
    repetition of a contender is one run of it and one of its paired baseline, per prompt."""
    if d.decided:
        return dataclasses.replace(d, eta_s=0.0)
    if d.more_reps is None or per_run is None:
        return d
    arms = max(1, sum(1 for a in d.contenders if a is not None))
    return dataclasses.replace(d, eta_s=d.more_reps * arms * 2 * runs_per_rep * per_run)


def stated_cap(max_reps: int, budget_s: float | None = None, budget_tokens: int | None = None) -> str:
    """What ends a sweep, said before it starts (the session's "plan" stage): every task decided,
    else its budget, else its repetitions (the plain sweep's --reps is no cap of it)."""
    head = "it runs until every task is decided"
    if budget_s is not None:
        return f"{head}, or for at most {duration(budget_s)} (the probe and the pilot included)"
    if budget_tokens is not None:
        return f"{head}, or until {budget_tokens} tokens are generated (the pilot's included)"
    return (f"{head}, at most {max_reps} repetitions of each candidate ({max_reps + GRACE_REPS} where they are "
            "estimated to decide it)")
