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
class QuietWait:
    """The sweep holds before its next run (app.core.measure.quiet): other programs are busy
    (``why`` "busy": ``top`` and ``share``, its share of the CPU; with ``on`` "GPU", ``share`` is
    other programs' use of the GPU in use) or the baseline anchor drifted (``why`` "drift":
    ``share``, how much slower it runs than at the start); ``waited_s`` so far."""

    why: str
    waited_s: float
    top: str | None = None
    share: float | None = None
    on: str = "CPU"

    def text(self) -> str:
        """"waiting for a quiet moment: cc1plus 84 %" (the CLI's line, the window's label)."""
        if self.why == "drift":
            slower = f": the baseline runs {100 * (self.share or 0):.0f} % slower than at the start" \
                if self.share is not None else ""
            return f"waiting for the machine to settle{slower} ({self.waited_s:.0f} s)"
        if self.on == "GPU" and self.share is not None:
            return f"waiting for a quiet moment: other programs use the GPU {100 * self.share:.0f} % ({self.waited_s:.0f} s)"
        what = f"{self.top} {100 * self.share:.0f} %" if self.top and self.share is not None else (
            f"other programs {100 * self.share:.0f} %" if self.share is not None else "other programs busy")
        return f"waiting for a quiet moment: {what} ({self.waited_s:.0f} s)"


@dataclasses.dataclass(frozen=True)
class SweepFinished:
    sweep_id: str
    n_ok: int
    n_failed: int
    cancelled: bool
    results_path: str | None
    errors: tuple[str, ...] = ()


Event = (SweepStarted | RunStarted | TokenProgress | RunFinished | RunFailed | SweepWarning
         | SweepError | SweepFinished | QuietWait)


__all__ = ["Event", "SweepStarted", "RunStarted", "TokenProgress", "RunFinished", "RunFailed", "SweepWarning",
           "SweepError", "SweepFinished", "QuietWait"]
