"""Counting over a window: the deltas of llama-server's counters from the window's first reading
to its last. A server restart (a new Process-Start-Time-Unix) or a counter reset (any counter
going down) starts a new window counted from zero, since the new process counted from zero: it
is never a negative delta. Requests are those seen in ``/slots`` (a slot's task id changing):
at least this many ran, fewer when several finish between two readings."""

from __future__ import annotations

import dataclasses
from typing import Any

from app.core.watch.metrics import COUNTERS, Reading


@dataclasses.dataclass(frozen=True)
class Counts:
    seconds: float
    draft_steps: int
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...]  # the server's draft width long, once it has drafted
    generated: int
    gen_seconds: float
    requests: int
    restarts: int
    inexact: tuple[str, ...]

    @property
    def decode_tok_s(self) -> float | None:
        """Generated tokens per second of the server's own generation time over the window."""
        return self.generated / self.gen_seconds if self.gen_seconds > 0 and self.generated else None

    @property
    def rates(self) -> tuple[float, ...]:
        """Share of the steps accepting each position (and every one before it)."""
        return tuple(a / self.draft_steps for a in self.accepted_per_pos) if self.draft_steps else ()


class Tracker:
    """Feed it readings (``/metrics``) and ``/slots`` pages in time order; ``counts`` is the
    current window's."""

    def __init__(self) -> None:
        self.base: Reading | None = None  # the current window's first reading (zeros after a restart)
        self.last: Reading | None = None
        self.t0: float | None = None
        self.restarts = 0
        self.notes: list[str] = []
        self._tasks_before: set[tuple[int, int]] = set()  # (slot, task) already there when the window began
        self._tasks: set[tuple[int, int]] = set()
        self._slots_seen = False

    def feed(self, r: Reading) -> bool:
        """Take one reading; True when it started a new window (a restart or a reset)."""
        if self.last is None:
            self.base, self.last, self.t0 = r, r, r.t
            return False
        restarted = (r.start is not None and self.last.start is not None and r.start != self.last.start)
        reset = _went_down(self.last, r)
        self.last = r
        if restarted or reset:
            self.restarts += 1
            self.notes.append("the server restarted" if restarted else "the server's counters were reset")
            self.base = Reading(r.t, r.start, {k: 0.0 for k in COUNTERS}, {})
            self.t0 = r.t
            self._tasks_before, self._tasks, self._slots_seen = set(), set(), True
            return True
        return False

    def feed_slots(self, slots: Any) -> None:
        """Take one ``/slots`` page (a list of slots; anything else is ignored)."""
        if not isinstance(slots, list):
            return
        now: set[tuple[int, int]] = set()
        for s in slots:
            if isinstance(s, dict) and isinstance(s.get("id_task"), int) and isinstance(s.get("id"), int):
                if s["id_task"] >= 0:
                    now.add((s["id"], s["id_task"]))
        if not self._slots_seen:  # the first page of the window: those tasks ran before it
            self._slots_seen = True
            busy = {(s["id"], s["id_task"]) for s in slots if isinstance(s, dict) and s.get("is_processing")
                    and isinstance(s.get("id_task"), int) and isinstance(s.get("id"), int)}
            self._tasks_before = now - busy
        self._tasks |= now - self._tasks_before

    def counts(self) -> Counts | None:
        if self.base is None or self.last is None or self.t0 is None:
            return None
        b, a = self.base, self.last

        def d(name: str) -> float:
            x, y = a.get(name), b.get(name)
            return max(0.0, (x or 0.0) - (y or 0.0)) if x is not None else 0.0

        width = max(a.per_pos) + 1 if a.per_pos else 0
        per_pos = tuple(a.per_pos.get(i, 0) - b.per_pos.get(i, 0) for i in range(width))
        return Counts(seconds=a.t - self.t0, draft_steps=int(d("drafts")), draft_tokens=int(d("draft_tokens")),
                      accepted=int(d("accepted")), accepted_per_pos=per_pos, generated=int(d("generated")),
                      gen_seconds=d("gen_seconds"), requests=len(self._tasks), restarts=self.restarts,
                      inexact=a.inexact)

    @property
    def server_k(self) -> int | None:
        """The server's draft width: llama.cpp sizes the per-position series --spec-draft-n-max
        (None until its first speculative request finished)."""
        return max(self.last.per_pos) + 1 if self.last is not None and self.last.per_pos else None


def _went_down(before: Reading, after: Reading) -> bool:
    for name in COUNTERS:
        x, y = before.get(name), after.get(name)
        if x is not None and y is not None and y < x:
            return True
    return any(after.per_pos.get(i, 0) < n for i, n in before.per_pos.items())
