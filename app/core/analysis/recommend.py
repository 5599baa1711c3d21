"""A recommendation per task mix: the K and p_min with the best expected weighted throughput, or
"leave MTP off" when no arm is reliably faster; per task type too. Each comes with its reason in
one sentence and its interval."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from app.core.analysis.analysis import Analysis
from app.core.measure.plan import Arm
from app.core.common.errors import UserError
from app.core.analysis.stats import Ratio, combine_ratios

DEFAULT_TASKS = ("story", "code", "tongue-twister")


def parse_mix(text: str | None, tasks: tuple[str, ...]) -> dict[str, float]:
    """``code=0.6,story=0.2`` -> weights normalised to 1; default: equal over the measured tasks."""
    if not text:
        return {t: 1.0 / len(tasks) for t in tasks} if tasks else {}
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise UserError(f"--mix: expected task=weight pairs like code=0.6,story=0.4, got {part!r}")
        k, v = part.split("=", 1)
        try:
            w = float(v)
        except ValueError:
            raise UserError(f"--mix: {v!r} is not a number") from None
        if not math.isfinite(w):
            raise UserError(f"--mix: {v.strip()!r} is not a finite number ({part})")
        if w < 0:
            raise UserError(f"--mix: weights must not be negative ({part})")
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
    arm: Arm | None  # None = leave MTP off
    ratio: Ratio | None
    reason: str

    @property
    def mtp_on(self) -> bool:
        return self.arm is not None


def _fmt(r: Ratio | None) -> str:
    if r is None or r.estimate is None:
        return "no estimate"
    if r.lo is None:
        return f"{r.estimate:.2f}x (no interval: too few runs)"
    return f"{r.estimate:.2f}x, 95% CI {r.lo:.2f}-{r.hi:.2f}"


def _choose(scope: str, candidates: list[tuple[Arm, Ratio]]) -> Pick:
    if not candidates:
        return Pick(scope, None, None, f"{scope}: no MTP measurements, so leave MTP off.")
    faster = [(a, r) for a, r in candidates if r.verdict == "faster"]
    best_any = max(candidates, key=lambda ar: ar[1].estimate or 0)
    if not faster:
        a, r = best_any
        if r.verdict == "slower":
            why = f"every MTP setting is slower; the best, {a.label}, runs at {_fmt(r)}"
        elif r.verdict == "too few runs":
            why = f"too few paired runs to tell; the best estimate, {a.label}, is {_fmt(r)}"
        else:
            why = f"no MTP setting is reliably faster; the best, {a.label}, is within noise ({_fmt(r)})"
        return Pick(scope, None, r, f"{scope}: leave MTP off: {why}.")
    a, r = max(faster, key=lambda ar: ar[1].estimate or 0)
    return Pick(scope, a, r, f"{scope}: turn MTP on with {a.label}: {_fmt(r)} over baseline"
                + (f", the fastest of {len(faster)} reliably faster settings." if len(faster) > 1 else "."))


def recommend(a: Analysis, mix: Mapping[str, float]) -> tuple[Pick, list[Pick]]:
    """(the pick for the weighted mix, one pick per task)."""
    mtp_arms = [arm for arm in a.arms if arm.k is not None]
    per_task = []
    for t in a.tasks:
        cands = [(arm, c.ratio) for arm in mtp_arms if (c := a.cell(t, arm)) and c.ratio and c.ratio.estimate]
        per_task.append(_choose(t, cands))
    mix_cands = []
    for arm in mtp_arms:
        parts = []
        for t, w in mix.items():
            c = a.cell(t, arm)
            if c is None or c.ratio is None or c.ratio.estimate is None:
                break
            parts.append((w, c.ratio))
        else:
            if parts:
                mix_cands.append((arm, combine_ratios(parts)))
    label = "your task mix (" + ", ".join(f"{t} {100 * w:.0f}%" for t, w in mix.items()) + ")"
    return _choose(label, mix_cands), per_task
