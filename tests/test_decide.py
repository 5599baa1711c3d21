"""The stopping rule (app.core.analysis.decide) on recorded runs: a task's pick is decided when
its interval is within ±5 % and clear of every other arm's that is not tied with it (within 3 %,
as precise: the smaller K is picked); "leave it off" when no interval reaches 1.03; otherwise
undecided between its contenders, with the repetitions still needed."""

from __future__ import annotations

import math

from app.core.analysis.anytime import anytime
from app.core.analysis.decide import (MIN_PAIRS, NO_GAIN, PAYS, SLOWER, TaskDecision, about, about_more, decide,
                                      decide_task, describe)
from app.core.analysis.stats import paired_ratio
from app.core.records.arm import Arm
from tests.helpers import make_record

BASE = Arm()


def sweep(task: str, speeds: dict[Arm, list[float]], base: list[float], t0: int = 0) -> list:
    """Recorded runs of one task: a baseline then each arm, back to back, per repetition (one
    prompt), with the tok/s given (the baseline's per repetition)."""
    out = []
    sec = t0
    for rep, b in enumerate(base):
        for arm, tok_s in [(BASE, b)] + [(a, v[rep]) for a, v in speeds.items()]:
            sec += 1
            out.append(make_record(arm, run_id=f"{task}{arm.label}{rep}", task=task, prompt_id=f"{task}-p", rep=rep,
                                   tok_s=tok_s, timestamp_utc=f"2026-01-01T00:{sec // 60:02d}:{sec % 60:02d}Z"))
    return out


K1, K2, K3 = Arm(1, 0.0), Arm(2, 0.0), Arm(3, 0.0)
BASE_TOK = [40.0, 40.4, 39.8, 40.2, 40.1, 39.9]


def test_a_precise_leader_clear_of_the_others_is_decided():
    # K=2 at 1.38x with 1 % noise, K=1 at 1.15x: separated and within ±5 %
    recs = sweep("code", {K1: [b * 1.15 * (1 + 0.01 * (-1) ** i) for i, b in enumerate(BASE_TOK)],
                          K2: [b * 1.38 * (1 + 0.008 * (-1) ** (i + 1)) for i, b in enumerate(BASE_TOK)]}, BASE_TOK)
    [d] = decide(recs, ("code",))
    assert d.decided and d.pick == K2 and d.more_reps == 0
    assert 1.36 < d.ratio.estimate < 1.40 and d.spread < 0.05
    line = describe(d)
    assert line.startswith("code: decided, pays: K=2 1.38x ±") and line.endswith(" %")


def test_overlapping_intervals_are_undecided_between_the_contenders():
    # K=2 at 1.30x with 4 % noise, K=3 at 1.24x with 12 %: the intervals overlap, K=3 is no tie
    # (5 % below, imprecise) and may yet be more than 3 % faster than K=2 (its interval reaches past 1.34)
    noise = [0.04, -0.03, 0.035, -0.04, 0.02, -0.025]
    recs = sweep("code", {K2: [b * 1.30 * (1 + n) for b, n in zip(BASE_TOK, noise)],
                          K3: [b * 1.24 * (1 - 3 * n) for b, n in zip(BASE_TOK, noise)]}, BASE_TOK)
    [d] = decide(recs, ("code",))
    assert not d.decided and d.pick == K2
    assert d.contenders[:2] == (K2, K3) and None not in d.contenders  # both clear of 1
    assert d.needs in (K2, K3)
    assert d.more_reps is not None and d.more_reps > 0
    assert "code: undecided, K=2 vs K=3" == describe(d)
    with_eta = describe(TaskDecision(**{**d.__dict__, "eta_s": 65.0}))
    assert with_eta == "code: undecided, K=2 vs K=3, about 1 min"


def test_a_near_tie_is_decided_for_the_smaller_k():
    # K=3 at 1.69x, K=2 at 1.66x (2 % below), K=1 at 1.40x, 1.5 % noise: the intervals of K=2 and
    # K=3 overlap, yet both are within ±5 % and 3 % apart: tied, and K=2 drafts less
    noise = [0.015, -0.01, 0.012, -0.015, 0.008, -0.01]
    recs = sweep("code", {K1: [b * 1.40 * (1 + n) for b, n in zip(BASE_TOK, noise)],
                          K2: [b * 1.66 * (1 - n) for b, n in zip(BASE_TOK, noise)],
                          K3: [b * 1.69 * (1 + n) for b, n in zip(BASE_TOK, noise)]}, BASE_TOK)
    [d] = decide(recs, ("code",))
    r2, r3 = d.ratio, decide_task("code", {K3: paired_ratio([(v, b) for v, b in zip(
        [b * 1.69 * (1 + n) for b, n in zip(BASE_TOK, noise)], BASE_TOK)])}).ratio
    assert r2.hi >= r3.lo  # they overlap: the rule alone would never stop
    assert d.decided and d.pick == K2 and d.tied == (K3,) and d.more_reps == 0
    assert describe(d).startswith("code: decided, pays: K=2 1.66x ±") and describe(d).endswith("(K=3 within 3 %: the smaller K)")
    # the same gap while K=3 is still imprecise (8 % noise over 5 pairs) is no tie: undecided
    wide = [0.08, -0.08, 0.06, -0.07, 0.05]
    recs = sweep("code", {K2: [b * 1.66 * (1 + n / 8) for b, n in zip(BASE_TOK, wide)],
                          K3: [b * 1.69 * (1 + n) for b, n in zip(BASE_TOK, wide)]}, BASE_TOK[:5])
    [e] = decide(recs, ("code",))
    assert not e.decided and e.pick == K3 and e.needs == K3 and e.reason.startswith("not yet within")


def test_an_arm_that_cannot_beat_the_pick_by_3_percent_does_not_hold_it_up():
    # K=3 at 2.00x (1.5 % noise), K=2 at 1.92x with 3 %: their (anytime) intervals overlap, but K=2's
    # ends below 2.06 (the pick + 3 %): it cannot make K=3 a worse choice by more than 3 %
    noise = [0.015, -0.01, 0.012, -0.015, 0.008, -0.01]
    recs = sweep("code", {K2: [b * 1.92 * (1 - 2.0 * n) for b, n in zip(BASE_TOK, noise)],
                          K3: [b * 2.00 * (1 + n) for b, n in zip(BASE_TOK, noise)]}, BASE_TOK)
    [d] = decide(recs, ("code",))
    k2 = anytime(paired_ratio([(b * 1.92 * (1 - 2.0 * n), b) for b, n in zip(BASE_TOK, noise)]))
    assert k2.hi >= d.ratio.lo and k2.hi <= d.ratio.estimate * 1.03  # overlapping, yet no threat
    assert d.decided and d.pick == K3 and d.tied == ()
    # a K=2 that may be well faster (a wide interval past 2.06) holds it up
    wide = sweep("code", {K2: [b * 1.92 * (1 - 8 * n) for b, n in zip(BASE_TOK, noise)],
                          K3: [b * 2.00 * (1 + n) for b, n in zip(BASE_TOK, noise)]}, BASE_TOK)
    [e] = decide(wide, ("code",))
    assert not e.decided and K2 in e.contenders


def test_a_gain_under_three_percent_is_decided_off():
    # K=1 at 1.01x within ±1.5 %: surely no more than 3 % faster: no gain worth having
    noise = [0.008, -0.008, 0.006, -0.006, 0.008, -0.008]
    recs = sweep("tongue-twister", {K1: [b * 1.01 * (1 + n) for b, n in zip(BASE_TOK, noise)]}, BASE_TOK)
    [d] = decide(recs, ("tongue-twister",))
    assert d.ratio.anytime and d.ratio.hi > 1.0 and d.ratio.hi < 1.03
    assert d.decided and d.pick is None and d.reason == "no setting can be 3 % faster or more"
    assert d.outcome == NO_GAIN and d.at_most == d.ratio.hi
    assert describe(d) == "tongue-twister: decided, no gain worth having: leave it off: at most +3 %"
    # with δ = 2 % (--min-gain 2) the same runs are undecided: the bound reaches 1.02
    [e] = decide(recs, ("tongue-twister",), min_gain=0.02)
    assert not e.decided


def test_every_interval_below_one_decides_leave_it_off():
    recs = sweep("story", {K1: [b * 0.82 * (1 + 0.01 * (-1) ** i) for i, b in enumerate(BASE_TOK)],
                           K2: [b * 0.70 * (1 + 0.01 * (-1) ** i) for i, b in enumerate(BASE_TOK)]}, BASE_TOK)
    [d] = decide(recs, ("story",))
    assert d.decided and d.pick is None and d.reason == "every interval lies below 1" and d.outcome == SLOWER
    assert describe(d).startswith("story: decided, slower: leave it off (best 0.82x [") and "anytime]" in describe(d)


def test_an_interval_across_one_is_undecided_between_off_and_the_arm():
    noise = [0.06, -0.05, 0.04, -0.06]
    recs = sweep("story", {K1: [b * 0.99 * (1 + n) for b, n in zip(BASE_TOK, noise)]}, BASE_TOK[:4])
    [d] = decide(recs, ("story",))
    assert not d.decided and set(d.contenders) == {None, K1} and d.needs == K1
    assert describe(d).startswith("story: undecided, ") and " vs " in describe(d) and "off" in describe(d)
    final = describe(TaskDecision(**{**d.__dict__, "eta_s": 125.0}), final=True)
    assert final.startswith("story: undecided between ") and final.endswith("; about 2 more minutes would decide it")
    # 0.99x with 5 % noise: bringing its interval under 1.03 (leave it off) takes several more
    assert 3 <= d.more_reps < 30


def test_a_clear_leader_pays_without_being_precise():
    # 1.5x, 6 % noise over 5 pairs: its anytime interval is wider than ±5 %, but it is clear of
    # K=1 and of 1: it pays (the K it names is not in doubt)
    noise = [0.06, -0.05, 0.02, -0.04, 0.03]
    recs = sweep("code", {K1: [b * 1.1 * (1 + n / 6) for b, n in zip(BASE_TOK, noise)],
                          K2: [b * 1.5 * (1 + n) for b, n in zip(BASE_TOK, noise)]}, BASE_TOK[:5])
    [d] = decide(recs, ("code",))
    assert d.spread > 0.05 and d.decided and d.pick == K2 and d.outcome == PAYS
    # on 3 pairs the sequence has no bound yet: too few runs, K=2 needs more of itself
    [e] = decide(recs[:9], ("code",))
    assert not e.decided and e.reason == "too few runs for an interval" and describe(e) == "code: undecided, K=2 vs K=1, too few runs yet"


def test_a_pick_needs_pairs_of_its_own():
    # K=2 clear of 1 on 3 pairs of a fixed interval: short of MIN_PAIRS, so undecided however clear
    r = paired_ratio([(40 * 1.5 * (1 + n), 40.0) for n in (0.01, -0.01, 0.005)])
    d = decide_task("code", {K2: r})
    assert r.lo > 1.0 and not d.decided and d.reason == f"fewer than {MIN_PAIRS} pairs of its own"
    assert d.more_reps >= MIN_PAIRS - 3


def test_too_few_runs_and_no_runs():
    recs = sweep("code", {K2: [60.0]}, [40.0])
    [d] = decide(recs, ("code",))
    assert not d.decided and d.more_reps is None and d.needs == K2 and "too few" in d.reason
    [e] = decide([], ("story",), {"story": [K1]})
    assert not e.decided and e.pick is None and e.needs == K1 and describe(e) == "story: undecided, no quiet runs yet"
    assert describe(d) == "code: undecided, K=2, too few runs yet"


def test_more_reps_shrinks_as_the_runs_come_in():
    """The estimate of repetitions still needed follows 1/sqrt(n): the same noise over more pairs
    needs fewer more."""
    noise = [0.03, -0.03, 0.02, -0.02, 0.03, -0.03]
    r3 = paired_ratio([(40 * 1.2 * (1 + n), 40.0) for n in noise[:3]])
    r6 = paired_ratio([(40 * 1.2 * (1 + n), 40.0) for n in noise])
    d3, d6 = decide_task("code", {K1: r3}), decide_task("code", {K1: r6})
    assert not d3.decided and d3.more_reps > d6.more_reps >= 0
    assert math.isclose(d3.ratio.estimate, d6.ratio.estimate, rel_tol=0.01)


def test_time_words():
    assert about(8) == "about 8 s" and about(44) == "about 40 s" and about(65) == "about 1 min"
    assert about(7200) == "about 2.0 h"
    assert about_more(125) == "about 2 more minutes" and about_more(61) == "about 1 more minute"
    assert about_more(30) == "about 30 more seconds"
