"""The shape of a sweep that an engine prepares for (Engine.prepare): its widest draft K, its
thinking settings and its deepest context depth. The runner makes it from the plan and the arms it
will run."""

from __future__ import annotations

import dataclasses
from typing import Iterable

from app.core.records.arm import Arm


@dataclasses.dataclass(frozen=True)
class SweepShape:
    max_k: int | None = None  # the widest draft K of the arms (None: no arm drafts K tokens)
    thinking: tuple[bool | None, ...] = (None,)  # the chat template's thinking switch per setting
    deepest_depth: int = 0  # the most tokens of neutral context before a prompt

    @classmethod
    def of(cls, arms: Iterable[Arm], thinking: Iterable[bool | None] = (None,),
           depths: Iterable[int] = (0,)) -> "SweepShape":
        ks = [a.k for a in arms if a.k]
        return cls(max(ks) if ks else None, tuple(thinking) or (None,), max(depths, default=0))

    @property
    def explicit_thinking(self) -> bool:
        """Does any setting switch thinking on or off (not the template's default)?"""
        return any(t is not None for t in self.thinking)
