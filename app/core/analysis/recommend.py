"""A recommendation per task mix: the speculative mode, K and p_min with the best expected
weighted throughput, or "leave MTP off" ("leave speculative decoding off" when other modes were
measured) when no arm is reliably faster; per task type too. Each comes with its reason in one
sentence and its interval, and one of the three decisions of app.core.analysis.decide (``Pick.
outcome``: pays, no gain worth having, slower; "" while it is not decided). After a sweep that
stopped once decided (``anytime``), the intervals are the anytime ones it decided with
(app.core.analysis.anytime), labelled so."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from app.core.analysis.analysis import Analysis
from app.core.analysis.anytime import LABEL as ANYTIME_LABEL, anytime as anytime_ratio
from app.core.analysis.decide import MIN_GAIN, NO_GAIN, PAYS, SLOWER, TIE, at_most_words
from app.core.records.arm import Arm
from app.core.common.errors import UserError
from app.core.common.spec_modes import parts
from app.core.common.units import ratio
from app.core.analysis.stats import MIN_PAIRS, Ratio, combine_ratios

DEFAULT_TASKS = ("story", "code", "tongue-twister")


MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e6  # a weight is a share (0.6, 60, 3 of 5); 0 leaves a task out


def parse_mix(text: str | None, tasks: tuple[str, ...]) -> dict[str, float]:
    """``code=0.6,story=0.2`` -> weights normalised to 1; default: equal over the measured tasks.
    Each weight is 0 (the task left out) or a finite number from MIN_WEIGHT to MAX_WEIGHT, so
    that the sum neither overflows nor drowns a weight; the one parser of --mix and the window's."""
    if not text:
        return {t: 1.0 / len(tasks) for t in tasks} if tasks else {}
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise UserError(f"--mix: expected task=weight pairs like code=0.6,story=0.4, got {part!r}")
        k, v = part.split("=", 1)
        if k.strip() in out:
            raise UserError(f"--mix: task {k.strip()!r} is given twice ({text.strip()}); give each task once")
        if not v.strip().isascii():
            raise UserError(f"--mix: {v!r} is not a number (digits 0-9 only)")
        try:
            w = float(v)
        except ValueError:
            raise UserError(f"--mix: {v!r} is not a number") from None
        if not math.isfinite(w):
            raise UserError(f"--mix: {v.strip()!r} is not a finite number ({part})")
        if w < 0:
            raise UserError(f"--mix: weights must not be negative ({part})")
        if w > MAX_WEIGHT or 0 < w < MIN_WEIGHT:
            bound = f"more than the {MAX_WEIGHT:,.0f}" if w > MAX_WEIGHT else f"less than the {MIN_WEIGHT:f}"
            raise UserError(f"--mix: {v.strip()!r} is {bound} a weight may be ({part}); weights are shares, e.g. "
                            "code=0.6,story=0.4 or code=3,story=2, and 0 leaves a task out")
        out[k.strip()] = w
    missing = [t for t in out if t not in tasks and out[t] > 0]
    if missing:
        raise UserError(f"--mix: no measurements for task {missing[0]!r} (measured: {', '.join(tasks)})")
    tot = sum(out.values())
    if tot <= 0:
        raise UserError("--mix: the weights add up to zero")
    return {t: w / tot for t, w in out.items() if w > 0}


@dataclasses.dataclass(frozen=True)
class Pick:
    scope: str  # "mix" or a task name
    arm: Arm | None  # None = leave speculation off
    ratio: Ratio | None
    reason: str
    outcome: str = ""  # PAYS, NO_GAIN or SLOWER (app.core.analysis.decide); "": not decided
    # the whole answer's speedup of the setting the reason names (prompt processing, a drafter's
    # own prefill and the first token counted: CellStats.whole), when it is more than CLOCK_GAP
    # from ``ratio`` (decode alone), else None; the reason then says both (with_whole_answer), and
    # ``whole_words`` is that clause, which the window's verdict line puts after its own
    whole: Ratio | None = None
    whole_words: str | None = None

    @property
    def mtp_on(self) -> bool:
        return self.arm is not None

    @property
    def sure(self) -> bool:
        """Turned on on a decision of its own: its interval (the anytime one after a sequential sweep)
        above 1, over at least stats.MIN_PAIRS pairs of the pick itself (a neighbour's runs do not count)."""
        r = self.ratio
        return self.arm is not None and r is not None and r.lo is not None and r.lo > 1.0 \
            and r.n_pairs >= MIN_PAIRS


def _fmt(r: Ratio | None) -> str:
    if r is None or r.estimate is None:
        return "no estimate"
    if r.lo is None:
        return f"{ratio(r.estimate)} (no interval: too few runs)"
    return f"{ratio(r.estimate)}, {ANYTIME_LABEL if r.anytime else '95% CI'} {r.lo:.2f}-{r.hi:.2f}"


def _turn_on(a: Arm) -> str:
    """"turn MTP on with K=2", "turn on draft-simple K=3", "turn on ngram-mod"."""
    return f"turn MTP on with {a.label}" if a.is_mtp else f"turn on {a.label}"


def _choose(scope: str, candidates: list[tuple[Arm, Ratio]], what: str = "MTP", min_gain: float = MIN_GAIN) -> Pick:
    """``what``: "MTP" when only draft-mtp was measured, else "speculative decoding". The three
    decisions as app.core.analysis.decide takes them: slower (every interval below 1), no gain
    worth having (none reaches 1 + ``min_gain``), pays (the pick's interval above 1)."""
    setting = "MTP setting" if what == "MTP" else "speculative setting"
    if not candidates:
        return Pick(scope, None, None, f"{scope}: no {what} setting was measured on it (only the baseline ran), "
                                       f"so nothing says it pays: leave {what} off until one is.")
    faster = [(a, r) for a, r in candidates if r.verdict == "faster"]
    best_any = max(candidates, key=lambda ar: ar[1].estimate or 0)
    bounded = all(r.hi is not None for _, r in candidates)
    ceiling = max((r.hi or 0.0) for _, r in candidates)
    if bounded and 1.0 <= ceiling < 1.0 + min_gain:  # a real gain under δ is none worth having
        a, r = best_any
        return Pick(scope, None, r, f"{scope}: leave {what} off: {NO_GAIN}, {at_most_words(ceiling)} "
                    f"(the best, {a.label}, is {_fmt(r)}).", NO_GAIN)
    if not faster:
        return _off(scope, candidates, what, setting)
    top = max(faster, key=lambda ar: ar[1].estimate or 0)
    # a near tie (within TIE of the fastest) goes to the smallest K: it drafts less (app.core.analysis.decide);
    # at the same K, to the fewest modes (a single mode before a combination of it with another)
    tied = [ar for ar in faster if (ar[1].estimate or 0) >= (1 - TIE) * (top[1].estimate or 0)]
    a, r = min(tied, key=lambda ar: (ar[0].k or 0, ar[0].p_min, len(parts(ar[0].mode))))
    if a != top[0]:
        why = "the smaller K drafts less" if (a.k or 0) < (top[0].k or 0) else "the simpler setting is kept"
        return Pick(scope, a, r, f"{scope}: {_turn_on(a)}: {_fmt(r)} over baseline, it {PAYS}; {top[0].label} "
                    f"({ratio(top[1].estimate or 0)}) is within {100 * TIE:.0f} %, and {why}.", PAYS)
    return Pick(scope, a, r, f"{scope}: {_turn_on(a)}: {_fmt(r)} over baseline, it {PAYS}"
                + (f", the fastest of {len(faster)} reliably faster settings." if len(faster) > 1 else "."), PAYS)


def _off(scope: str, candidates: list[tuple[Arm, Ratio]], what: str, setting: str) -> Pick:
    """Leave it off, none being reliably faster, with the reason true of every setting: "every
    setting is slower" only when each interval lies below 1; else the best of those within noise
    (whose interval still reaches 1: the one a sweep's decisions call undecided), with its
    interval, and the speedup is its own."""
    best_any = max(candidates, key=lambda ar: ar[1].estimate or 0)
    noise = [ar for ar in candidates if ar[1].verdict == "within noise"]
    few = [ar for ar in candidates if ar[1].verdict == "too few runs"]
    a, r = best_any
    if r.verdict == "too few runs":
        why = f"too few paired runs to tell; the best estimate, {a.label}, is {_fmt(r)}"
    elif noise:
        a, r = max(noise, key=lambda ar: ar[1].estimate or 0)
        why = f"no {setting} is reliably faster; the best, {a.label}, is within noise ({_fmt(r)})"
        if best_any[0] != a:  # a higher estimate that is surely slower: said, not chosen
            why += f"; {best_any[0].label} ({_fmt(best_any[1])}) is slower"
    elif few:
        why = (f"no {setting} is reliably faster; the best, {a.label}, is slower ({_fmt(r)}), and "
               f"{', '.join(b.label for b, _ in few)} had too few paired runs to tell")
    else:
        why = f"every {setting} is {SLOWER}; the best, {a.label}, runs at {_fmt(r)}"
        return Pick(scope, None, r, f"{scope}: leave {what} off: {why}.", SLOWER)
    return Pick(scope, None, r, f"{scope}: leave {what} off: {why}.")


# how far (relative) the whole answer's speedup may lie from decode's before a pick says both
CLOCK_GAP = 0.05


def with_whole_answer(pick: Pick, whole: Ratio | None, drafter: bool = False) -> Pick:
    """``pick`` saying the whole answer's speedup beside decode's when they differ by more than
    CLOCK_GAP: long prompts weigh in the first, not in the second. ``drafter``: the setting drafts
    with a separate model, whose own prefill of the prompt is in the whole answer too."""
    r = pick.ratio
    if whole is None or whole.estimate is None or r is None or not r.estimate \
            or abs(whole.estimate / r.estimate - 1.0) <= CLOCK_GAP:
        return pick
    what = "prompt processing, the drafter's own included, and the first token" if drafter else \
        "prompt processing and the first token"
    words = f"counting the whole answer ({what}) it is {_fmt(whole)}"
    return dataclasses.replace(pick, reason=f"{pick.reason.rstrip('.')}. That is decoding alone; {words}.",
                               whole=whole, whole_words=words)


def _whole_of(pick: Pick, cands: list[tuple[Arm, Ratio]], wholes: Mapping[Arm, Ratio | None]) -> Pick:
    """with_whole_answer for the setting whose speedup ``pick`` shows (its arm, or the best of
    those left off: the candidate whose ratio it carries)."""
    shown = next((arm for arm, r in cands if r is pick.ratio), None)
    if shown is None:
        return pick
    return with_whole_answer(pick, wholes.get(shown), drafter=bool(shown.drafter))


def recommend(a: Analysis, mix: Mapping[str, float], anytime: bool = False,
              min_gain: float = MIN_GAIN) -> tuple[Pick, list[Pick]]:
    """(the pick for the weighted mix, one pick per task), among every speculative arm measured.
    ``anytime``: the runs are a sequential sweep's (it stopped once decided), so every interval is
    the anytime one; ``min_gain``: δ of the "no gain worth having" decision."""
    mtp_arms = [arm for arm in a.arms if arm.is_spec]
    what = "MTP" if all(arm.is_mtp for arm in mtp_arms) else "speculative decoding"
    per_task = []
    seq = anytime_ratio if anytime else (lambda r: r)
    for t in a.tasks:
        cands = [(arm, seq(c.ratio)) for arm in mtp_arms if (c := a.cell(t, arm)) and c.ratio and c.ratio.estimate]
        wholes = {arm: c.whole for arm in mtp_arms if (c := a.cell(t, arm))}
        per_task.append(_whole_of(_choose(t, cands, what, min_gain), cands, wholes))
    mix_cands = []
    mix_wholes: dict[Arm, Ratio | None] = {}
    for arm in mtp_arms:
        parts = []
        whole_parts = []
        for t, w in mix.items():
            c = a.cell(t, arm)
            if c is None or c.ratio is None or c.ratio.estimate is None:
                break
            parts.append((w, c.ratio))
            if c.whole is not None and c.whole.estimate is not None:
                whole_parts.append((w, c.whole))
        else:
            if parts:  # the mix's sequence over its fewest-paired cell's pairs, as the adaptive sweep decides it
                mixed = combine_ratios(parts)
                mix_wholes[arm] = combine_ratios(whole_parts) if len(whole_parts) == len(parts) else None
                mix_cands.append((arm, seq(dataclasses.replace(mixed, n_pairs=min(r.n_pairs for _, r in parts)))
                                  if anytime else mixed))
    label = "your task mix (" + ", ".join(f"{t} {100 * w:.0f}%" for t, w in mix.items()) + ")"
    if not mix_cands and any(p.ratio is not None for p in per_task):
        # e.g. an adaptive sweep that measured each task at its own widths (the mix was predicted to lose)
        return Pick(label, None, None, f"{label}: leave {what} off: no one setting was measured on every task of "
                    "the mix, so none can be judged for it (the adaptive sweep measures the mix's best width on "
                    "every task only when the mix is predicted to pay); each task's line says what pays for it."), \
            per_task
    return _whole_of(_choose(label, mix_cands, what, min_gain), mix_cands, mix_wholes), per_task
