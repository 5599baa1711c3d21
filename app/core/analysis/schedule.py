"""Where a sequential sweep's next pair goes: the line whose decision is nearest, and on it the arm
whose pairs that decision waits for.

The adaptive sweep decides each line (a task among its candidates, or the mix) on anytime
intervals (app.core.analysis.anytime): the sequence's width after n more pairs is known from the
pairs' spread, so for each decision a line can reach (app.core.analysis.decide: pays, no gain
worth having, slower) the pairs each arm needs before its bound crosses what that decision asks
can be estimated, the estimates held where they are now:

- *slower*: every arm's upper bound below 1;
- *no gain worth having*: every arm's upper bound below 1 + δ;
- *pays*: the pick's lower bound above 1 with ``MIN_PAIRS`` pairs of its own (and within
  ``precision`` of its estimate where another arm is close), and every other arm either tied
  with it (within ``tie``, as precise) or its upper bound at most the pick's estimate + ``tie``.

An arm whose estimate lies on the wrong side of a bound never gets there (that decision is out of
reach). A line's distance is its nearest decision's pairs, summed over the arms that still need
some, times the runs a repetition of it takes (its prompts). ``order`` ranks the lines nearest
first; the sweep measures the first that may run, one pair (baseline + one arm) at a time, and
looks again. A line with an arm that has no interval yet comes first (those pairs are needed
before any distance is known), its fewest-paired arm measured. On the nearest line the arm
measured is the one that decision waits for longest (the most pairs still needed): every arm
with pairs left must get them, and its interval moves the most per pair.

Only where pairs go is chosen here; every decision is still decide.decide_task's on the
sequence, which holds at every look however the pairs were allotted (each arm's sequence is
time-uniform over its own pairs). Pure: decisions and ratios in, an order out.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from app.core.analysis.decide import (MAX_MORE_REPS, MIN_GAIN, MIN_PAIRS, NO_GAIN, PAYS, PRECISION, SLOWER, TIE,
                                      TaskDecision, _half_after)
from app.core.analysis.stats import Ratio
from app.core.records.arm import Arm

NEVER = math.inf  # a bound an estimate lies on the wrong side of: out of reach


@dataclasses.dataclass(frozen=True)
class Next:
    """A line's next pair: ``task`` (the line), ``arm``, ``pairs`` the pairs its nearest decision
    is estimated to need (all arms together), ``runs`` those in runs of the line (distance),
    ``outcome`` that decision ("" while an arm has no interval yet)."""

    task: str
    arm: Arm
    pairs: float
    runs: float
    outcome: str


def pairs_until(r: Ratio, bound: float, upper: bool) -> float:
    """More pairs of ``r`` until its upper bound lies below ``bound`` (a log speedup; ``upper``
    False: its lower bound above it), the estimate and spread held as now: 0 when it already
    does, NEVER when the estimate is not past the bound or MAX_MORE_REPS pairs do not do it."""
    if r.log_mean is None or r.log_se is None:
        return NEVER
    room = (bound - r.log_mean) if upper else (r.log_mean - bound)
    if room <= 0:
        return NEVER

    def ok(extra: int) -> bool:
        return _half_after(r, extra) < room

    if ok(0):
        return 0.0
    if not ok(MAX_MORE_REPS):
        return NEVER
    lo, hi = 0, MAX_MORE_REPS  # ok(hi), not ok(lo): the width shrinks with the pairs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return float(hi)


def _precise_after(r: Ratio, precision: float) -> float:
    """More pairs until ``r``'s interval lies within ``precision`` of its estimate (both sides:
    the half-width under log(1 + precision) and -log(1 - precision))."""
    assert r.log_mean is not None
    room = min(math.log1p(precision), -math.log1p(-precision))
    return pairs_until(dataclasses.replace(r, log_mean=0.0), room, True)


def needs(ratios: Mapping[Arm, Ratio], pick: Arm | None, min_gain: float = MIN_GAIN,
          precision: float = PRECISION, tie: float = TIE) -> dict[str, dict[Arm, float]]:
    """Per decision within reach, the more pairs each arm needs for it (decide's three, see the
    module); a decision out of reach (some arm never gets there) is left out. ``pick``: the arm
    "pays" would name (the line's leader when None)."""
    est = {a: r for a, r in ratios.items() if r.log_mean is not None and r.log_se is not None}
    out: dict[str, dict[Arm, float]] = {}
    for outcome, bound in ((SLOWER, 0.0), (NO_GAIN, math.log1p(min_gain))):
        each = {a: pairs_until(r, bound, True) for a, r in est.items()}
        if each and all(math.isfinite(x) for x in each.values()):
            out[outcome] = each
    if not est:
        return out
    p = pick if pick in est else max(est, key=lambda a: est[a].log_mean or 0.0)
    pr = est[p]
    assert pr.log_mean is not None
    close = [a for a, r in est.items() if a != p and (r.log_mean or 0.0) >= pr.log_mean + math.log1p(-tie)]
    own = max(pairs_until(pr, 0.0, False), float(max(0, MIN_PAIRS - pr.n_pairs)),
              _precise_after(pr, precision) if close else 0.0)
    if not math.isfinite(own):
        return out
    lo_then = pr.log_mean - _half_after(pr, int(own))  # the pick's lower bound once it is clear
    each = {p: own}
    for a, r in est.items():
        if a == p:
            continue
        if a in close:  # tied with the pick: as precise as it
            each[a] = _precise_after(r, precision)
        else:  # clear of it: its upper bound under the pick's lower bound, or under its estimate + tie
            each[a] = pairs_until(r, max(lo_then, pr.log_mean + math.log1p(tie)), True)
    if all(math.isfinite(x) for x in each.values()):
        out[PAYS] = each
    return out


def next_pair(d: TaskDecision, ratios: Mapping[Arm, Ratio], runs_per_pair: int = 1, min_gain: float = MIN_GAIN,
              precision: float = PRECISION, tie: float = TIE) -> Next | None:
    """The line's next pair (see the module), None when it is decided or has nothing to measure.
    Where no decision is within reach at today's estimates (a near tie that never separates), or
    no ratios are given, the arm decide names (its widest contender), at the distance decide
    estimates."""
    if d.decided:
        return None
    bare = [a for a, r in ratios.items() if r.lo is None or r.hi is None or r.log_se is None]
    if bare:  # no interval yet: the fewest-paired arm, first of all lines
        arm = min(bare, key=lambda a: ratios[a].n_pairs)
        return Next(d.task, arm, 0.0, 0.0, "")
    reach = needs(ratios, d.pick, min_gain, precision, tie)
    if not reach:
        if d.needs is None:
            return None
        far = float(d.more_reps if d.more_reps is not None else MAX_MORE_REPS) * max(1, len(d.contenders))
        return Next(d.task, d.needs, far, far * runs_per_pair, "")
    outcome, each = min(reach.items(), key=lambda kv: sum(kv[1].values()))
    total = sum(each.values())
    waiting = {a: x for a, x in each.items() if x > 0}
    if not waiting:  # the estimate says decided where decide does not (a bound on its edge): decide's arm
        if d.needs is None:
            return None
        return Next(d.task, d.needs, 1.0, float(runs_per_pair), outcome)
    arm = max(waiting, key=lambda a: (waiting[a], _half_after(ratios[a], 0)))
    return Next(d.task, arm, total, total * runs_per_pair, outcome)


def order(lines: Sequence[tuple[TaskDecision, Mapping[Arm, Ratio], int]], min_gain: float = MIN_GAIN,
          precision: float = PRECISION, tie: float = TIE) -> list[Next]:
    """The undecided lines' next pairs, nearest decision first (fewest runs; of equals, the order
    given). ``lines``: each line's decision, the anytime ratios it was taken on, and the runs one
    repetition of it takes."""
    nexts = [n for d, rs, runs in lines if (n := next_pair(d, rs, runs, min_gain, precision, tie)) is not None]
    return sorted(nexts, key=lambda n: n.runs)
