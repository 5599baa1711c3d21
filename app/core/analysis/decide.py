"""When a sweep may stop: per task, whether its pick is decided, and which of three decisions.

A sweep that stops once decided looks after every round, so it decides on anytime-valid
intervals (app.core.analysis.anytime: a confidence sequence on the mean per-pair log speedup,
right at every look together); ``decide`` converts the ratios it reads, and a caller of
``decide_task`` passes them converted. The rule (one task, the arms measured on it, each with its
paired interval over baseline), with three decisions (``PAYS``, ``NO_GAIN``, ``SLOWER``):

- *slower*: every arm's interval lies below 1;
- *no gain worth having*: no arm's interval reaches 1 + ``min_gain`` (δ, 3 % by default: the
  CLI's ``--min-gain``, the window's sweep settings): leave it off, at most +X % (X: the highest
  upper bound). A real gain under δ is no reason to turn speculation on;
- *pays*: the pick's lower bound lies above 1, it has at least ``MIN_PAIRS`` pairs of its own (a
  neighbour's do not count), and no other arm can beat it: every arm whose interval overlaps the
  pick's is tied with it or cannot be more than 3 % faster (its interval ends below the pick's
  estimate + 3 %). Where another arm's interval overlaps, the pick's own interval must also lie
  within ``precision`` (±5 %) of its estimate (so the K it names is the right one);
- *near ties* (practical equivalence, ``tie`` = 3 %, the tolerance the benchmark holds a pick
  to): an arm whose estimate lies within 3 % of the leader's and whose own interval is as precise
  counts as tied with it, not as a rival, and of a tied group the smallest K is the pick (it drafts
  less, so it loses least where acceptance is lower than measured). Adjacent K often lie within a
  few percent; separating them would take far more repetitions than the grid runs, for a
  difference no user would notice;
- otherwise the task is undecided between its *contenders*: the pick so far, every arm whose interval
  overlaps it and is not tied with it, and "off" when its interval reaches down to 1. The contender
  whose interval is widest (relative) most needs another repetition; ``more_reps`` estimates how
  many repetitions of each contender would decide it, the intervals shrinking as the sequence's
  width does (the fixed interval's as 1/sqrt(n) with the t quantile, for fixed intervals).

Pure: ratios in, decisions out; the adaptive sweep and the plain sweep's ``--until-decided`` stop
on it, the front ends show it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping, Sequence

from app.core.common.units import duration
from app.core.analysis import anytime as seq
from app.core.analysis.analysis import analyze
from app.core.analysis.stats import Ratio, t95
from app.core.records.arm import Arm
from app.core.records.schema import RunRecord

PRECISION = 0.05  # a decided pick's interval lies within ±5 % of its estimate
TIE = 0.03  # practical equivalence: arms within 3 % are tied
MIN_GAIN = 0.03  # δ: a gain under 3 % does not turn speculation on ("no gain worth having")
MIN_PAIRS = 4  # a pick "pays" on at least this many pairs of its own
PAYS, NO_GAIN, SLOWER = "pays", "no gain worth having", "slower"  # the three decisions, in every front end's words
MAX_MORE_REPS = 200  # beyond this, "more repetitions than a sweep runs" (near ties never separate)


@dataclasses.dataclass(frozen=True)
class TaskDecision:
    """One task's state. ``pick``: the decided arm (None: leave speculation off), or while
    undecided the current leader (None: nothing measured above 1 so far). ``contenders``: the
    arms still in the running, best estimate first (None stands for "off"). ``needs``: the arm
    the next repetition should go to. ``more_reps``: repetitions of each contender estimated to
    decide it (0 when decided; None when unknown: too few runs for an interval). ``eta_s``: the
    time those would take, when the caller knows its time per run."""

    task: str
    decided: bool
    pick: Arm | None
    ratio: Ratio | None
    contenders: tuple[Arm | None, ...] = ()
    needs: Arm | None = None
    more_reps: int | None = None
    reason: str = ""
    eta_s: float | None = None
    tied: tuple[Arm, ...] = ()  # decided: the arms within ``TIE`` of the pick (the pick has the smallest K)
    outcome: str = ""  # decided: PAYS, NO_GAIN or SLOWER ("" while undecided)
    at_most: float | None = None  # NO_GAIN: the highest upper bound of any arm (1.02: "at most +2 %")

    @property
    def spread(self) -> float | None:
        """The leader's interval as a share of its estimate (the larger side): 0.04 is ±4 %."""
        r = self.ratio
        if r is None or r.estimate is None or r.lo is None or r.hi is None:
            return None
        return max(r.hi / r.estimate - 1.0, 1.0 - r.lo / r.estimate)


def _label(a: Arm | None) -> str:
    return "off" if a is None else a.label


def about(seconds: float) -> str:
    """"about 40 s", "about 2 min", "about 1.5 h" (units.duration's estimate)."""
    return duration(seconds, "about")


def about_more(seconds: float) -> str:
    """"about 40 more seconds", "about 2 more minutes", "about 1.5 more hours"."""
    return duration(seconds, "more")


def at_most_words(hi: float) -> str:
    """"at most +2 %" for an upper bound of 1.013 (the bound rounded up to a whole per cent)."""
    return f"at most +{max(0, math.ceil(100 * (hi - 1) - 1e-9)):.0f} %"


def gain_words(at_most: float) -> str:
    """"leave it off: at most +2 %": the "no gain worth having" decision in words."""
    return f"leave it off: {at_most_words(at_most)}"


def _interval(r: Ratio) -> str:
    """"[1.30, 1.46]", with ", anytime" where the interval is the sequence's."""
    return f"[{r.lo:.2f}, {r.hi:.2f}{', anytime' if r.anytime else ''}]"


def outcome_words(d: TaskDecision) -> str:
    """A decided task's decision in words: "pays: K=2 1.38x ±4 %", "no gain worth having: leave it off:
    at most +2 %", "slower: leave it off (best K=1 0.82x [0.75, 0.90])"."""
    r = d.ratio
    if d.pick is not None:
        sp = d.spread
        tied = f" ({', '.join(a.label for a in d.tied)} within {100 * TIE:.0f} %: the smaller K)" if d.tied else ""
        if r is None or r.estimate is None:
            return f"{PAYS}: {d.pick.label}"
        return f"{PAYS}: {d.pick.label} {r.estimate:.2f}x" + (f" ±{100 * sp:.0f} %" if sp is not None else "") + tied
    if d.outcome == NO_GAIN and d.at_most is not None:
        return f"{NO_GAIN}: {gain_words(d.at_most)}"
    best = (f" (best {r.estimate:.2f}x {_interval(r)})" if r and r.estimate and r.lo and r.hi
            else f" ({d.reason})" if r is None and d.reason else "")
    return f"{d.outcome or SLOWER}: leave it off{best}"


def describe(d: TaskDecision, final: bool = False) -> str:
    """One line: "code: decided, pays: K=2 1.38x ±4 %", "story: decided, no gain worth having: leave it
    off: at most +2 %", "story: decided, slower: leave it off (best 0.82x [0.75, 0.90])",
    "story: undecided, off vs K=1, about 1 min" (final: "... about 2 more minutes would decide it")."""
    r = d.ratio
    if d.decided:
        return f"{d.task}: decided, {outcome_words(d)}"
    names = [_label(a) for a in d.contenders] or ([_label(d.pick)] if d.pick else [])
    if d.reason == "no runs yet" or not names:  # a decision counts quiet runs only (a busy one's answer is provisional)
        what = "no quiet runs yet"
    elif d.more_reps is None:
        what = " vs ".join(names) + ", too few runs yet"
    else:
        what = " vs ".join(names) if len(names) > 1 else f"{names[0]} not yet precise"
    if final:
        what = f"undecided between {' and '.join(names)}" if len(names) > 1 and d.more_reps is not None \
            else "undecided, " + what
        now = f" (now {r.estimate:.2f}x {_interval(r)})" if r and r.estimate and r.lo and r.hi else ""
        if d.eta_s is not None:
            return f"{d.task}: {what}{now}; {about_more(d.eta_s)} would decide it"
        return f"{d.task}: {what}{now}; more repetitions would decide it"
    eta = f", {about(d.eta_s)}" if d.eta_s is not None else ""
    return f"{d.task}: undecided, {what}{eta}"


def _half(r: Ratio) -> float:
    """Half the interval's width in log space."""
    assert r.lo is not None and r.hi is not None
    return (math.log(r.hi) - math.log(r.lo)) / 2


def _half_after(r: Ratio, extra: int) -> float:
    """The log half-width after ``extra`` more pairs (se as 1/sqrt(n), the t quantile for n; an
    anytime interval's: the sequence's width at n + extra)."""
    assert r.log_se is not None
    if r.anytime:
        return seq.half_after(r, extra)
    n = max(r.n_pairs, 2)
    return t95(n + extra - 1) * r.log_se * math.sqrt(n / (n + extra))


def _more_reps(leader: Arm, ratios: Mapping[Arm, Ratio], rivals: Sequence[Arm], precision: float) -> int:
    """Repetitions of every contender estimated to decide the task: the leader's interval clear of
    1 (and within ``precision`` where rivals remain), each rival's interval clear of the leader's."""
    lead = ratios[leader]
    assert lead.estimate is not None
    target = math.log1p(precision)
    off_gap = abs(math.log(lead.estimate))
    for extra in range(0, MAX_MORE_REPS + 1):
        h = _half_after(lead, extra)
        if (rivals and h > target) or h >= off_gap:  # precise only where a rival overlaps
            continue
        ok = True
        for a in rivals:
            r = ratios[a]
            assert r.estimate is not None
            gap = math.log(lead.estimate) - math.log(r.estimate)
            if _half_after(r, extra) + h >= gap:
                ok = False
                break
        if ok:
            return extra
    return MAX_MORE_REPS


def _precise(r: Ratio, precision: float) -> bool:
    assert r.estimate is not None and r.lo is not None and r.hi is not None
    return r.hi <= r.estimate * (1 + precision) and r.lo >= r.estimate * (1 - precision)


def _smaller(a: Arm) -> tuple[int, float]:
    """The order a tied group is picked in: the smallest K (an n-gram mode, no K, first), then p_min."""
    return (a.k or 0, a.p_min)


def _more_reps_off(ratios: Mapping[Arm, Ratio], tie: float) -> int:
    """Repetitions of every arm estimated to bring each interval below 1 + ``tie`` (leave it off)."""
    for extra in range(0, MAX_MORE_REPS + 1):
        if all(math.log(r.estimate or 1e-9) + _half_after(r, extra) < math.log1p(tie) for r in ratios.values()):
            return extra
    return MAX_MORE_REPS


def decide_task(task: str, ratios: Mapping[Arm, Ratio], precision: float = PRECISION,
                tie: float = TIE, min_gain: float = MIN_GAIN, min_pairs: int = MIN_PAIRS) -> TaskDecision:
    """The rule (see the module) for one task's arms, each with its paired ratio over baseline."""
    est = {a: r for a, r in ratios.items() if r.estimate is not None}
    if not est:
        return TaskDecision(task, False, None, None, tuple(ratios), next(iter(ratios), None), None, "no runs yet")
    leader = max(est, key=lambda a: est[a].estimate or 0.0)
    lead = est[leader]
    assert lead.estimate is not None
    no_interval: list[Arm] = [a for a, r in est.items() if r.lo is None or r.hi is None or r.log_se is None]
    no_interval += [a for a in ratios if a not in est]
    if no_interval:
        fewest = min(no_interval, key=lambda a: ratios[a].n_pairs)
        order = sorted(est, key=lambda a: -(est[a].estimate or 0.0))
        ranked: tuple[Arm | None, ...] = tuple(order)
        return TaskDecision(task, False, leader, lead, ranked, fewest, None, "too few runs for an interval")
    top = max(r.hi or 0.0 for r in est.values())
    if top < 1.0:
        return TaskDecision(task, True, None, lead, (), None, 0, "every interval lies below 1", outcome=SLOWER)
    if top < 1.0 + min_gain:
        return TaskDecision(task, True, None, lead, (), None, 0,
                            f"no setting can be {100 * min_gain:.0f} % faster or more", outcome=NO_GAIN, at_most=top)
    assert lead.lo is not None and lead.hi is not None
    # the leader and the arms tied with it (within ``tie``, as precise); the smallest K is the pick
    group = [a for a, r in est.items() if (r.estimate or 0.0) >= lead.estimate * (1 - tie) and _precise(r, precision)]
    if leader not in group:
        group = [leader]
    pick = min(group, key=_smaller)
    pr = est[pick]
    assert pr.lo is not None and pr.hi is not None and pr.estimate is not None
    # a rival: an arm outside the group that may be more than ``tie`` faster than the pick (its
    # interval reaches above the pick's estimate + 3 %); one below that cannot make the pick a bad
    # choice even where it overlaps the pick's interval
    rivals = [a for a, r in est.items() if a not in group and r.hi is not None and r.hi >= pr.lo
              and r.hi > pr.estimate * (1 + tie)]
    # the K it names needs the pick precise only where another arm's interval overlaps it
    overlapped = any(r.hi is not None and r.lo is not None and r.hi >= pr.lo and r.lo <= pr.hi
                     for a, r in est.items() if a != pick)
    own = pr.n_pairs >= min_pairs
    if pr.lo > 1.0 and own and (_precise(pr, precision) or not overlapped) and not rivals:
        tied = tuple(sorted((a for a in group if a != pick), key=_smaller))
        return TaskDecision(task, True, pick, pr, (), None, 0,
                            "clear of 1 and of the others" + (", the others within 3 % tied" if tied else ""),
                            tied=tied, outcome=PAYS)
    points: list[tuple[float, Arm | None]] = [(est[a].estimate or 0.0, a) for a in [pick, *rivals]]
    if pr.lo <= 1.0:
        points.append((1.0, None))
    contenders = tuple(a for _, a in sorted(points, key=lambda p: -p[0]))
    needs = max([pick, *rivals], key=lambda a: _half(est[a]))
    why = ("intervals overlap" if rivals else "reaches down to 1" if pr.lo <= 1.0 else
           f"fewer than {min_pairs} pairs of its own" if not own else f"not yet within ±{100 * precision:.0f} %")
    more = max(_more_reps(pick, est, rivals if overlapped else [], precision), min_pairs - pr.n_pairs)
    if all((r.estimate or 0.0) < 1.0 + min_gain for r in est.values()):  # it may yet be decided off
        more = min(more, _more_reps_off(est, min_gain))
    return TaskDecision(task, False, pick if pr.estimate > 1.0 or pr.lo > 1.0 else None, pr, contenders,
                        needs, more, why)


def task_ratios(records: Iterable[RunRecord], arms: Sequence[Arm] | None = None,
                anytime: bool = False) -> dict[str, dict[Arm, Ratio]]:
    """Per task, each speculative arm's paired ratio (only ``arms``, if given); ``anytime``: with
    the anytime interval (app.core.analysis.anytime) in place of the fixed-sample one."""
    a = analyze(records)
    out: dict[str, dict[Arm, Ratio]] = {}
    for t in a.tasks:
        for arm in a.arms:
            if not arm.is_spec or (arms is not None and arm not in arms):
                continue
            c = a.cell(t, arm)
            if c is not None and c.ratio is not None:
                out.setdefault(t, {})[arm] = seq.anytime(c.ratio) if anytime else c.ratio
    return out


def decide(records: Iterable[RunRecord], tasks: Sequence[str], arms: Mapping[str, Sequence[Arm]] | None = None,
           precision: float = PRECISION, min_gain: float = MIN_GAIN) -> tuple[TaskDecision, ...]:
    """Each task's decision from a sweep's records on anytime intervals (per task only the arms
    in ``arms[task]``, if given); a task with no measured arm is undecided ("no runs yet")."""
    per = task_ratios(records, anytime=True)
    out = []
    for t in tasks:
        rs = per.get(t, {})
        if arms is not None and t in arms:
            rs = {a: rs.get(a, Ratio(0, None, None, None, None, None)) for a in arms[t]}
        out.append(decide_task(t, rs, precision, min_gain=min_gain))
    return tuple(out)
