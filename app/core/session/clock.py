"""The clock a front end shows while a flow runs, and the estimate it shows before: one run
counter over every stage (the pilot, the first round, the steps; a plain sweep's re-runs too),
and the time left, which only counts down and never goes below zero.

Before the start (``flow_estimate``): from this machine's measured decode speed (a recorded
cost probe's plain step, or the last sweep's baseline runs), the runs the flow needs at least
(the pilot, a first round of two repetitions), plus the probe when none is recorded, never
more than the budget. While it runs (``FlowClock``): the adaptive sweep's own estimate of the
time to decide (its ``Decisions``), else the estimate before the start, counted down from when
it was made; the budget bounds both."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Callable, Iterable

from app.core.common.units import duration
from app.core.records.cost import CostRecord
from app.core.records.schema import RunRecord

PILOT_TOKENS = 48  # the adaptive sweep's pilot: one short run per task
FIRST_REPS = 2  # the first round's repetitions (baseline and two widths per prompt)
PROBE_S = 45.0  # a cost probe on a CPU when none is recorded (the demo's, measured on 2 cores)
RUN_OVERHEAD = 1.3  # a run's time over its tokens' decode time (the prompt, sampling, the runner's own)


def flow_estimate(tasks: int, prompts: int, n_predict: int, tok_s: float | None, *, budget_s: float | None,
                  probe_recorded: bool) -> float | None:
    """Seconds the flow is expected to take on this machine (None: its speed is unknown and it
    has no budget): ``tasks`` with ``prompts`` prompts in all, runs of ``n_predict`` tokens at
    ``tok_s``; at most ``budget_s``."""
    if not tok_s:
        return budget_s
    run_s = n_predict / tok_s * RUN_OVERHEAD
    need = (0.0 if probe_recorded else PROBE_S) + tasks * PILOT_TOKENS / tok_s * RUN_OVERHEAD
    need += 2 * FIRST_REPS * prompts * 3 * run_s  # a first round, and as much again to decide
    return min(need, budget_s) if budget_s else need


@dataclasses.dataclass
class FlowClock:
    """One flow's counter and countdown (see the module). ``estimate_s``: the estimate before the
    start (None: unknown); ``budget_s``: the most the flow takes (None: until decided)."""

    estimate_s: float | None
    budget_s: float | None
    clock: Callable[[], float] = time.monotonic
    t0: float = dataclasses.field(default=0.0)
    runs: int = 0  # runs started, every stage
    _left_s: float | None = None  # the latest estimate of what is left ...
    _at: float = 0.0  # ... and when it was made

    def __post_init__(self) -> None:
        self.t0 = self.t0 or self.clock()
        self._left_s, self._at = self.estimate_s, self.t0

    def run_started(self) -> int:
        """Count a run (any stage's); its number in the whole flow."""
        self.runs += 1
        return self.runs

    def estimate(self, eta_s: float | None) -> None:
        """The sweep's own estimate of the time to decide (a Decisions' eta_s; None: unknown)."""
        if eta_s is not None:
            self._left_s, self._at = eta_s, self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float | None:
        """Seconds left, counted down since the latest estimate, at most what the budget leaves;
        never below zero (None: unknown)."""
        now = self.clock()
        left = None if self._left_s is None else self._left_s - (now - self._at)
        if self.budget_s is not None:
            by_budget = self.budget_s - (now - self.t0)
            left = by_budget if left is None else min(left, by_budget)
        return None if left is None else max(0.0, left)

    def line(self) -> str:
        """"run 23, 41 s, about 50 s left" (the last part once known; "finishing" at zero)."""
        left = self.left()
        head = f"run {self.runs}, {duration(self.elapsed())}" if self.runs else duration(self.elapsed())
        if left is None:
            return head
        return f"{head}, " + (f"{duration(left, 'about')} left" if left >= 1 else "finishing")


def runs_left_s(done: int, total: int, elapsed_s: float) -> float | None:
    """A plain sweep's time left from its runs so far (None: none finished); never negative,
    also when re-runs of disturbed runs take it past the runs planned."""
    if not done:
        return None
    return max(0.0, elapsed_s / done * (max(total, done) - done))


def tok_s_known(model: str, probe: CostRecord | None, records: Iterable[RunRecord]) -> tuple[float, str] | None:
    """A decode speed for this model: the cost probe's single-token decode, else the median
    baseline of the last sweep of it; with where it came from. None when neither is known."""
    def same(p: str) -> bool:
        try:
            return os.path.realpath(p) == os.path.realpath(model)
        except (OSError, ValueError):
            return p == model

    if probe is not None and same(probe.model_path) and 1 in probe.t_ms and probe.t_ms[1].median > 0:
        return 1000.0 / probe.t_ms[1].median, "the cost probe's speed"
    base = [r.tok_s for r in records if r.status == "ok" and r.arm_kind == "baseline" and r.tok_s
            and same(r.model_path)]
    if base:
        return statistics.median(base), "the last sweep's baseline speed"
    return None
