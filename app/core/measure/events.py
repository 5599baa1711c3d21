"""What the sweep runner tells its caller, one typed event at a time (``Event`` is their union).

Front ends import these from ``app.core.session.events``, the union of every event a session
yields; the core's own loops (the session, the self-test) take them from here.
"""

from __future__ import annotations

import dataclasses

from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class SweepStarted:
    sweep_id: str
    plan: Plan
    total_runs: int
    results_path: str | None


@dataclasses.dataclass(frozen=True)
class RunStarted:
    index: int
    total: int
    arm: Arm
    prompt_id: str
    task: str
    rep: int
    warmup: bool = False


@dataclasses.dataclass(frozen=True)
class TokenProgress:
    index: int
    n_tokens: int
    n_predict: int
    elapsed_s: float


@dataclasses.dataclass(frozen=True)
class RunFinished:
    record: RunRecord


@dataclasses.dataclass(frozen=True)
class RunFailed:
    record: RunRecord


@dataclasses.dataclass(frozen=True)
class SweepWarning:
    message: str


@dataclasses.dataclass(frozen=True)
class SweepError:
    """A problem that stops part of the sweep (e.g. an arm that cannot run); the rest goes on."""

    message: str
    arm: Arm | None = None


@dataclasses.dataclass(frozen=True)
class SweepFinished:
    sweep_id: str
    n_ok: int
    n_failed: int
    cancelled: bool
    results_path: str | None
    errors: tuple[str, ...] = ()


Event = (SweepStarted | RunStarted | TokenProgress | RunFinished | RunFailed | SweepWarning
         | SweepError | SweepFinished)


__all__ = ["Event", "SweepStarted", "RunStarted", "TokenProgress", "RunFinished", "RunFailed", "SweepWarning",
           "SweepError", "SweepFinished"]
