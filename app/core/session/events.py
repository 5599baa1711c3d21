"""What a sweep tells its front ends: the runner's events, the adaptive planner's, and the
session's own (the engine is ready; the session is over), as one union, and ``dispatch``, which
hands an event to the handler for its type (instead of a chain of ``isinstance`` tests in every
front end)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping, Union

from app.core.analysis.decide import TaskDecision
from app.core.measure.events import (QuietWait, RunFailed, RunFinished, RunStarted, SweepError, SweepFinished,
                                     SweepStarted, SweepWarning, TokenProgress)
from app.core.records.arm import Arm
from app.core.records.cost import CostRecord
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class EngineReady:
    """The engine and the results file are open; the sweep starts."""

    engine: str  # its kind, as results files record it ("inprocess", "server")
    build: str  # the llama.cpp build it runs
    results_path: Path | None  # None: this session keeps no results file (a confirm run)
    adaptive: bool


@dataclasses.dataclass(frozen=True)
class AdaptiveStage:
    """What the adaptive planner decided, and why."""

    stage: str  # "probe", "pilot", "candidates", "round", "done"
    message: str
    candidates: tuple[Arm, ...] = ()


@dataclasses.dataclass(frozen=True)
class Decisions:
    """Progress toward a decision, per task (app.core.analysis.decide): after every measured step
    of an adaptive sweep, and after every round of a plain sweep run until decided. ``final``: the
    sweep stopped (``stopped`` says why: "decided", "budget", "max_reps", "cancelled");
    ``eta_s``: the time estimated to decide every task (None: unknown yet)."""

    tasks: tuple[TaskDecision, ...]
    runs: int  # measured runs so far
    tokens: int  # generated tokens so far (pilot runs included)
    elapsed_s: float
    eta_s: float | None = None
    final: bool = False
    stopped: str = ""

    @property
    def decided(self) -> bool:
        return bool(self.tasks) and all(t.decided for t in self.tasks)


@dataclasses.dataclass(frozen=True)
class AdaptiveResult:
    """The adaptive sweep's pick for the task mix (None: leave speculative decoding off)."""

    pick: Arm | None
    records: tuple[RunRecord, ...]
    cost: CostRecord | None
    runs: int
    decisions: Decisions | None = None  # per task, as the sweep stopped


@dataclasses.dataclass(frozen=True)
class SessionFinished:
    """The last event of a session: the engine and the results file are closed."""

    results_path: Path | None
    written: int  # records (runs and cost records) the results file holds from this session
    n_ok: int
    n_failed: int
    cancelled: bool
    errors: tuple[str, ...] = ()
    adaptive: AdaptiveResult | None = None

    @property
    def ok(self) -> bool:
        """Every arm ran and no run failed, and the session was not cancelled."""
        return not (self.cancelled or self.errors or self.n_failed)


Event = Union[SweepStarted, RunStarted, TokenProgress, RunFinished, RunFailed, SweepWarning, SweepError,
              SweepFinished, QuietWait, EngineReady, AdaptiveStage, Decisions, AdaptiveResult, SessionFinished]

Handlers = Mapping[type, Callable[[Any], object]]


def dispatch(event: object, handlers: Handlers, default: Callable[[Any], object] | None = None) -> bool:
    """Call the handler for ``event``'s type (or for the nearest of its base classes); events with
    none go to ``default`` if given. True when a handler took it."""
    for cls in type(event).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            handler(event)
            return True
    if default is not None:
        default(event)
        return True
    return False


__all__ = ["Event", "EngineReady", "AdaptiveStage", "Decisions", "TaskDecision", "AdaptiveResult", "SessionFinished", "dispatch", "Handlers",
           "SweepStarted", "RunStarted", "TokenProgress", "RunFinished", "RunFailed", "SweepWarning", "SweepError",
           "SweepFinished", "QuietWait"]
