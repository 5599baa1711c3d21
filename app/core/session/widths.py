"""Which draft widths K an adaptive sweep measures on a task, so that its answer says which K.

- Before the first run (``candidates``): the predicted best, and the smallest K predicted within
  ``TIE`` of it (the stopping rule picks the smaller of tied arms, so that is the pick if the
  prediction holds), then the next best within ``CANDIDATE_MARGIN``, up to ``most``; plus the
  mix's K when the mix is decided on its own.
- While it measures (``next_width``): a pick is only known to be the best width when both its
  neighbours (K-1 and K+1, where they can pay on this machine) were measured and are worse. So
  the measured leader's unmeasured neighbour is measured next, and when a neighbour turns out
  better it leads and its own neighbour follows, until the leader has a worse width on each side
  (or the edge of the widths that can pay). A task that does not pay at its best (the leader
  below 1) needs no neighbours: the answer is "leave it off" at every K.
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Sequence

from app.core.analysis import breakeven, positions
from app.core.analysis.decide import TIE

CANDIDATE_MARGIN = 0.95  # a K whose predicted speedup is within 5 % of the task's best is measured


def candidates(ks: Sequence[int], pred: Callable[[int], float], most: int, mix_k: int | None) -> list[int]:
    """The K a task measures first (see the module)."""
    own = sorted(ks, key=pred, reverse=True)
    best = pred(own[0])
    tied = min(k for k in ks if pred(k) >= (1 - TIE) * best)
    chosen = list(dict.fromkeys([own[0], tied]))
    chosen += [k for k in own if k not in chosen and pred(k) >= CANDIDATE_MARGIN * best][:max(0, most - len(chosen))]
    return list(dict.fromkeys([*sorted(chosen), *([mix_k] if mix_k is not None else [])]))


def next_width(measured: Mapping[int, float | None], viable: Collection[int]) -> int | None:
    """The width to measure next on a task, from its measured speedups by K (None: no estimate
    yet): an unmeasured neighbour of the leader among the ``viable`` widths, the narrower first
    (it drafts less, so it wins a near tie); None when every measured K has an estimate and the
    leader's neighbours are measured, or the leader is below 1 (leave it off)."""
    if not measured or any(v is None for v in measured.values()):
        return None
    lead = max(measured, key=lambda k: measured[k] or 0.0)
    if (measured[lead] or 0.0) <= 1.0:
        return None
    return next((k for k in (lead - 1, lead + 1) if k in viable and k not in measured), None)


def by_positions(model: positions.PositionModel, costs: breakeven.Costs, k: int) -> float:
    """A task's predicted speedup at ``k`` from the pilot's acceptance per draft position."""
    return model.speedup(k, costs)


def by_alpha(alpha: float, costs: breakeven.Costs, k: int) -> float:
    """A task's predicted speedup at ``k`` from the pilot's i.i.d. acceptance ``alpha``."""
    return breakeven.predicted_speedup(alpha, k, costs)
