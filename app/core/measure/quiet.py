"""Measuring in the quiet moments: before a run the sweep waits until other programs have stayed
under busy.BUSY_SHARE for QUIET_S, instead of measuring a busy run and discarding it; and it
holds while its anchor, the baseline arm, runs much slower than it did at the start.

The anchor's readings are the sweep's own baseline runs (the plan puts a baseline before every
few speculative runs, so they cost nothing): a quiet baseline more than DRIFT_LIMIT slower than
the first quiet one of its prompt and setting makes the sweep hold, measuring that baseline again
(not recorded) in quiet moments until it is back within BACK_WITHIN. llama.cpp's Metal kernel
tuner does the same with a 10 % limit and 3 %. A hold lasts at most HOLD_S; after it the slower
speed is the new reference (the machine changed: a thermal limit, a power plan, or a machine
that jumps between two speeds, as a shared 2-core one between about 80 and 107 tok/s on
llama-bench), and the runs from then on are marked (``shifted``: the runner flags them
MODE_SHIFT) until the anchor is back within BACK_WITHIN of the speed the sweep started at
(``home``). A short jump is held out; a long one is measured, marked.

Every wait is bounded, never a hang:
- by the sweep's deadline (its time budget): past it the wait ends ``EXPIRED`` and the sweep
  stops measuring; the verdict then answers from what was measured (provisionally, when too many
  runs were busy: app.core.analysis.provisional);
- by an allowance of waiting over the whole sweep (MAX_WAIT_S, and at most WAIT_SHARE of a
  budget, so that a machine busy all along still measures something): once spent, the wait ends
  ``GAVE_UP`` and runs go on as before, judged by the busy monitor but no longer re-run when
  disturbed (``spent``: the machine was busy all along, so a re-run would be as busy; pairs
  measured back to back under one load answer provisionally instead).

    gate = make_gate()                        # None with MTP_TUNER_BUSY=off
    gate.until(deadline, budget_s)            # an adaptive sweep's budget
    outcome = yield from gate.wait(cancel)    # QuietWait events while it waits
    gate.saw(busy, seconds)                   # after each run: what the runner's monitor measured
    outcome = yield from gate.anchor(key, tok_s, remeasure, cancel)   # after a quiet baseline run

The gate reads the load through ``read`` and keeps time through ``clock`` and ``sleep``, all
injectable: its tests replay recorded loads on a fake clock.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Generator, Hashable

from app.core.common.cancel import CancelToken
from app.core.measure.busy import BUSY_ENV, Busy, BusyMonitor
from app.core.measure.events import QuietWait

QUIET, GAVE_UP, EXPIRED = "quiet", "gave up", "expired"  # how a wait ended
QUIET_S = 2.0  # others under the threshold this long before a run
FIRST_POLL_S = 1.0  # the first look at the load (a reading spans at least busy.MIN_WINDOW_S) ...
MAX_POLL_S = 3.0  # ... then less often while it stays busy (doubling up to this)
MAX_WAIT_S = 60.0  # waiting allowed over a whole sweep without a budget
WAIT_SHARE = 0.25  # with a budget: at most this share of it spent waiting (the rest measures)
DRIFT_LIMIT = 0.10  # a quiet baseline this much slower than the reference: hold
BACK_WITHIN = 0.03  # ... until the anchor is back within this
HOLD_S = 30.0  # the longest hold for one drift
MODE_SHIFT = "mode_shift"  # a run record's flag: measured after a hold gave up, the anchor off its first speed


class QuietGate:
    """Waits for quiet moments and holds on anchor drift, within the bounds above (see the module)."""

    def __init__(self, read: Callable[[], Busy], *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, quiet_s: float = QUIET_S,
                 max_wait_s: float = MAX_WAIT_S, hold_s: float = HOLD_S) -> None:
        self.read, self.clock, self.sleep = read, clock, sleep
        self.quiet_s, self.max_wait_s, self.hold_s = quiet_s, max_wait_s, hold_s
        self.deadline: float | None = None  # the budget's end on ``clock`` (None: no budget)
        self.quiet_for = 0.0  # seconds seen quiet, up to now
        self.last: Busy | None = None  # the last busy reading (the first event names its program)
        self.waited = 0.0  # seconds spent waiting and holding so far
        self.reference: dict[Hashable, float] = {}  # the anchor's quiet speed per prompt and setting
        self.home: dict[Hashable, float] = {}  # ... the speed the sweep started at (raised while not shifted)
        self.shifted: dict[Hashable, float] = {}  # anchors whose hold gave up: the speed they shifted to
        self.expired = False  # the deadline passed while waiting

    @property
    def spent(self) -> bool:
        """The allowance of waiting is used up: the machine stayed busy."""
        return self.waited >= self.max_wait_s

    @property
    def shift(self) -> bool:
        """A hold gave up and the anchor has not come back: runs measured now are marked MODE_SHIFT."""
        return bool(self.shifted)

    def until(self, deadline: float | None, budget_s: float | None) -> None:
        """Bound the waits by a budget: none past ``deadline``, at most WAIT_SHARE of ``budget_s``."""
        self.deadline = deadline
        if budget_s is not None:
            self.max_wait_s = min(self.max_wait_s, WAIT_SHARE * budget_s)

    def saw(self, busy: Busy, seconds: float) -> None:
        """A run measured ``busy`` over ``seconds``: quiet time goes on, or starts again."""
        if busy.disturbed:
            self.quiet_for, self.last = 0.0, busy
        elif busy.cpu is not None or busy.gpu is not None:
            self.quiet_for, self.last = self.quiet_for + seconds, None

    def _bound(self, start: float) -> str | None:
        """EXPIRED past the deadline, GAVE_UP when the allowance is spent, else None."""
        now = self.clock()
        if self.deadline is not None and now >= self.deadline:
            self.expired = True
            return EXPIRED
        return GAVE_UP if self.waited + (now - start) >= self.max_wait_s else None

    def wait(self, cancel: CancelToken | None = None) -> Generator[QuietWait, None, str]:
        """Until others have been quiet for ``quiet_s`` (at once when the last runs were): QUIET,
        or how the bound ended it. A QuietWait event after each busy reading."""
        if self.quiet_for >= self.quiet_s:
            return QUIET
        start = prev = self.clock()
        poll = FIRST_POLL_S
        try:
            if self.last is not None and self._bound(start) is None:  # the run before was busy: say so first
                yield _event(self.last, 0.0)
            self.read()  # a fresh window: the next reading covers the time from now
            while self.quiet_for < self.quiet_s:
                ended = self._bound(start)
                if ended is not None:
                    return ended
                if cancel is not None:
                    cancel.check()
                limit = self.deadline - self.clock() if self.deadline is not None else poll
                self.sleep(max(0.0, min(poll, limit)))
                b, now = self.read(), self.clock()
                if b.cpu is None and b.gpu is None:  # not measured: nothing to wait for
                    return QUIET
                if b.disturbed:
                    self.quiet_for, self.last, poll = 0.0, b, min(2 * poll, MAX_POLL_S)
                    yield _event(b, now - start)
                else:
                    # a calm reading counts a look's worth at most: after a busy one, quiet is two looks
                    self.quiet_for, poll = self.quiet_for + min(now - prev, FIRST_POLL_S), FIRST_POLL_S
                prev = now
            return QUIET
        finally:
            self.waited += self.clock() - start

    def anchor(self, key: Hashable, tok_s: float, remeasure: Callable[[], float | None],
               cancel: CancelToken | None = None) -> Generator[QuietWait, None, str]:
        """After a quiet baseline run of ``key`` (its prompt and setting) at ``tok_s``: the first
        (or a faster one, the reference having been slow) is the reference; one more than
        DRIFT_LIMIT slower holds: ``remeasure`` (a baseline run, not recorded: its tok/s) in quiet
        moments until back within BACK_WITHIN (QUIET), or the hold's bound (GAVE_UP: the slower
        speed is the new reference; EXPIRED)."""
        ref = self.reference.get(key)
        if key in self.shifted and tok_s >= self.home[key] * (1 - BACK_WITHIN):
            del self.shifted[key]  # back at the speed the sweep started at: the runs are no longer marked
        if ref is None or tok_s > ref * (1 + DRIFT_LIMIT):
            self.reference[key] = tok_s
            if key not in self.shifted:
                self.home[key] = max(tok_s, self.home.get(key, 0.0))
            return QUIET
        if tok_s >= ref * (1 - DRIFT_LIMIT):
            return QUIET
        start, waited0, speed = self.clock(), self.waited, tok_s
        try:
            while speed < ref * (1 - BACK_WITHIN):
                ended = self._bound(start)
                if ended is None and self.clock() - start >= self.hold_s:
                    ended = GAVE_UP
                if ended is not None:
                    self.reference[key] = speed  # the machine is slower now: measure from here, marked
                    self.shifted[key] = speed
                    return ended
                yield QuietWait("drift", self.clock() - start, None, 1 - speed / ref)
                self.quiet_for = 0.0  # a quiet moment of its own before each look: time to settle
                outcome = yield from self.wait(cancel)
                if outcome == EXPIRED:
                    return outcome
                again = remeasure()
                if again is None:  # the anchor could not run: no reading to hold on
                    return GAVE_UP
                speed = again
            return QUIET
        finally:
            self.waited = waited0 + self.clock() - start


def _event(b: Busy, waited_s: float) -> QuietWait:
    """A disturbed reading in an event: the GPU's share when others keep the GPU at least as busy
    as the CPU, else the CPU's top program's share, else all others' share of the CPU."""
    cpu = max((v for v in (b.cpu, b.cpu_peak) if v is not None), default=None)
    if b.gpu is not None and (cpu is None or b.gpu >= cpu):
        return QuietWait("busy", waited_s, None, b.gpu, on="GPU")
    top = b.top if b.top and b.top_cpu is not None else None
    return QuietWait("busy", waited_s, top, b.top_cpu if top else b.cpu)


def make_gate() -> QuietGate | None:
    """The sweep's gate, reading the load with a BusyMonitor of its own; None with MTP_TUNER_BUSY=off
    (nothing is measured, so there is nothing to wait for)."""
    if os.environ.get(BUSY_ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return None
    return QuietGate(BusyMonitor(tick_s=None).poll)


__all__ = ["QuietGate", "make_gate", "QUIET", "GAVE_UP", "EXPIRED", "QUIET_S", "DRIFT_LIMIT", "BACK_WITHIN",
           "MAX_WAIT_S", "WAIT_SHARE", "HOLD_S", "MODE_SHIFT"]
