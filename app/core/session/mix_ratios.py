"""The mix's ratios in an adaptive sweep: each arm's ratio over the task mix, from the tasks' own
(the stopping rule's mix line and the final pick)."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from app.core.analysis.stats import Ratio, combine_ratios
from app.core.records.arm import Arm


def mix_of(ratios: Mapping[str, Mapping[Arm, Ratio]], arm: Arm, mix: Mapping[str, float]) -> Ratio:
    """The mix's ratio of ``arm`` as the stopping rule reads it, from the tasks' ratios: their
    weighted combination (stats.combine_ratios), whose interval takes the t quantile of the
    fewest-paired cell, so that cell's pairs, not all of them, say how it shrinks. No estimate
    until every task of the mix has one for the arm."""
    cells = [ratios.get(t, {}).get(arm) for t in mix]
    if any(c is None or c.estimate is None for c in cells):
        return Ratio(0, None, None, None, None, None)
    parts = [(w, c) for w, c in zip(mix.values(), cells) if c is not None]
    return dataclasses.replace(combine_ratios(parts), n_pairs=min(c.n_pairs for _, c in parts))


def estimated(ratios: Mapping[str, Mapping[Arm, Ratio]], arms: Sequence[Arm],
               mix: Mapping[str, float]) -> dict[Arm, Ratio]:
    """The mix's ratio of each arm that has an estimate, from the tasks' ratios (mix_of)."""
    out = {a: mix_of(ratios, a, mix) for a in arms}
    return {a: r for a, r in out.items() if r.estimate is not None}


def est_of(r: Ratio) -> float:
    return r.estimate if r.estimate is not None else -math.inf
