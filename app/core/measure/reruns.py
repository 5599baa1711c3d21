"""Disturbed runs measured again: which runs go again, where in the queue, and within what limit."""

from __future__ import annotations

import dataclasses
import math

from app.core.measure import busy as busy_mod
from app.core.measure.plan import RunSpec
from app.core.records.arm import Arm


def _pair_key(spec: RunSpec) -> tuple[object, ...]:
    """What a speculative run and its baseline share: the prompt, repetition and setting."""
    return (spec.prompt.task, spec.prompt.id, spec.rep, spec.sampler, spec.thinking, spec.depth)


class Reruns:
    """Disturbed runs measured again, within busy.MAX_RERUN_SHARE of the sweep's runs: a disturbed
    speculative run goes again with a baseline of its prompt and setting before it; a disturbed
    baseline goes again with the speculative runs still to come that would pair with it (moved,
    not repeated). The group goes one block of arms later, so a passing disturbance can pass and
    the pair is measured back to back again."""

    def __init__(self, runs: list[RunSpec], arm_major: bool) -> None:
        self.limit = max(busy_mod.MIN_RERUNS, math.ceil(busy_mod.MAX_RERUN_SHARE * len(runs)))
        self.used = 0
        self.warned = False
        self.arm_major = arm_major
        self.baseline = next((r.arm for r in runs if r.arm.is_baseline), None)
        self.gap = max(1, len({r.arm for r in runs}))

    def requeue(self, spec: RunSpec, runs: list[RunSpec], at: int) -> bool:
        """Put ``spec`` (just run, at ``at`` - 1) in ``runs`` again, later; False when the limit
        does not allow it."""
        key = _pair_key(spec)
        moved: list[RunSpec] = []
        new: list[Arm]
        if self.arm_major or self.baseline is None:
            new = [spec.arm]
        elif spec.arm.is_baseline:
            new = [spec.arm]
            j = at
            while j < len(runs) and runs[j].arm.is_spec and _pair_key(runs[j]) == key:
                j += 1
            moved = runs[at:j]
        else:
            new = [self.baseline, spec.arm]
        if self.used + len(new) > self.limit:
            return False
        self.used += len(new)
        del runs[at:at + len(moved)]
        n = len(runs) + len(moved)  # every spec queued so far: the new ones are numbered after them
        again = [dataclasses.replace(spec, index=n + i, arm=arm) for i, arm in enumerate(new)] + moved
        where = min(len(runs), at + self.gap)
        runs[where:where] = again
        return True
