"""Adaptive sweep: reach the exhaustive grid's pick with far less work.

1. Cost probe (or a given cost record): drop every K whose best case (all drafts accepted)
   cannot beat baseline on this machine.
2. Pilot: one short MTP run per task at the widest surviving K gives the per-token acceptance
   alpha per task; the break-even model then predicts each K's speedup for the task mix, and only
   the few K near the predicted best are measured (p_min values only for the best K).
3. Rounds of interleaved, paired repetitions (baseline + candidates); after each round, drop a
   candidate whose interval lies wholly below the leader's; stop when one is left, or intervals
   no longer overlap, or at ``max_reps``.

Events from the runner are passed through, so front ends show the same progress; an
``AdaptiveStage`` event says what the planner decided and why.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Generator, Mapping, Sequence

from app.core.analysis import breakeven
from app.core.analysis.analysis import analyze
from app.core.analysis.recommend import parse_mix
from app.core.analysis.stats import Ratio, combine_ratios
from app.core.common.cancel import CancelToken
from app.core.engines.base import Engine, EngineKind
from app.core.measure.plan import Plan
from app.core.measure.probe import run_probe
from app.core.measure.runner import RunFinished, run_sweep
from app.core.records.arm import Arm
from app.core.records.cost import DEFAULT_DEPTH, CostRecord
from app.core.records.schema import RunRecord, new_id
from app.core.records.writer import ResultsWriter
from app.core.session.events import AdaptiveResult, AdaptiveStage, Event


def _mix_ratio(records: Sequence[RunRecord], arm: Arm, mix: Mapping[str, float]) -> Ratio | None:
    a = analyze(records)
    parts: list[tuple[float, Ratio]] = []
    for task, w in mix.items():
        c = a.cell(task, arm)
        if c is None or c.ratio is None or c.ratio.estimate is None:
            return None
        parts.append((w, c.ratio))
    return combine_ratios(parts)


def _estimated(records: Sequence[RunRecord], arms: Sequence[Arm], mix: Mapping[str, float]) -> dict[Arm, Ratio]:
    """The mix's ratio of each arm that has an estimate."""
    out: dict[Arm, Ratio] = {}
    for a in arms:
        r = _mix_ratio(records, a, mix)
        if r is not None and r.estimate is not None:
            out[a] = r
    return out


def _est(r: Ratio) -> float:
    return r.estimate if r.estimate is not None else -math.inf


def _below(r: Ratio, lead: Ratio) -> bool:
    """``r``'s interval lies wholly below ``lead``'s."""
    return r.hi is not None and lead.lo is not None and r.hi < lead.lo


def adaptive_sweep(plan: Plan, engine: Engine, *, ks: Sequence[int] = tuple(range(1, 9)),
                   p_mins: Sequence[float] = (0.0,), mix: str | None = None, min_reps: int = 2,
                   max_reps: int = 6, max_candidates: int = 2, cost: CostRecord | None = None,
                   writer: ResultsWriter | None = None, cancel: CancelToken | None = None,
                   probe_rounds: int = 4) -> Generator[Event, None, None]:
    """Yields runner events and AdaptiveStage events; the last item is an AdaptiveResult. The
    caller owns the engine (and closes it)."""
    cancel = cancel or CancelToken()
    sweep_id = new_id()  # every round is part of one sweep in the results file
    records: list[RunRecord] = []
    tasks = tuple(dict.fromkeys(p.task for p in plan.prompts))
    weights = parse_mix(mix, tasks)
    # 1. costs
    if cost is None:
        # the probe at the sweep's (deepest) context depth
        for step in run_probe(plan.model, depth=max(DEFAULT_DEPTH, *plan.depths), max_batch=max(ks) + 1,
                              max_rounds=probe_rounds, min_rounds=min(probe_rounds, 3), cancel=cancel,
                              threads=engine.threads):
            if isinstance(step, CostRecord):
                cost = step
                if writer:
                    writer.append_line(step.to_json())
            else:
                yield AdaptiveStage("probe", step.message)
    costs = breakeven.Costs.from_probe(cost)
    viable = [k for k in ks if breakeven.predicted_speedup(1.0, k, costs) > 1.0]
    yield AdaptiveStage("probe", f"K that can pay on this machine at all: {viable or 'none'}")
    if not viable:
        yield AdaptiveResult(None, (), cost, 0)
        return
    # 2. pilot: acceptance per task at the widest viable K (one short run per task)
    k_pilot = max(viable)
    pilot_prompts = tuple({p.task: p for p in reversed(plan.prompts)}.values())
    pilot = dataclasses.replace(plan, arms=(Arm(k_pilot, 0.0),), prompts=pilot_prompts, reps=1,
                                n_predict=min(plan.n_predict, 48), rep_start=10_000)
    alphas: dict[str, float] = {}
    for ev in run_sweep(pilot, engine, None, cancel):
        if not isinstance(ev, RunFinished):
            yield ev
            continue
        if ev.record.draft_n:  # pilot runs are not measurements: reported, not recorded
            rate = (ev.record.draft_accepted or 0) / ev.record.draft_n
            alphas[ev.record.task] = breakeven.infer_alpha(rate, k_pilot)
            yield AdaptiveStage("pilot", f"{ev.record.task}: acceptance {100 * rate:.0f}% at "
                                f"K={k_pilot} -> alpha {alphas[ev.record.task]:.2f}")
    if not alphas:
        yield AdaptiveResult(None, (), cost, 0)
        return
    alpha_mix = {t: alphas.get(t, 0.0) for t in weights}

    def predicted(k: int) -> float:
        return math.exp(sum(w * math.log(max(1e-9, breakeven.predicted_speedup(alpha_mix[t], k, costs)))
                            for t, w in weights.items()))

    ranked = sorted(viable, key=predicted, reverse=True)
    best_pred = predicted(ranked[0])
    chosen_k = [k for k in ranked[:max_candidates] if predicted(k) >= 0.9 * best_pred]
    cands = [Arm(k, 0.0) for k in chosen_k]
    cands += [Arm(chosen_k[0], p) for p in p_mins if p > 0]
    yield AdaptiveStage("candidates", "predicted speedup for your mix: " + ", ".join(
        f"K={k} {predicted(k):.2f}x" for k in ranked) + f"; measuring {', '.join(a.label for a in cands)}",
        tuple(cands))
    # 3. rounds
    rep = 0
    while cands and rep < max_reps:
        cancel.check()
        n = min_reps if rep == 0 else 1
        # the in-process engine serves every arm from one warm context (the pilot warmed it);
        # llama-server arms each have their own cold server
        warm = plan.warmup if rep == 0 and engine.kind is not EngineKind.INPROCESS else 0
        rnd = dataclasses.replace(plan, arms=(Arm(),) + tuple(cands), reps=n, rep_start=rep, warmup=warm)
        for ev in run_sweep(rnd, engine, writer, cancel, sweep_id=sweep_id):
            yield ev
            if isinstance(ev, RunFinished):
                records.append(ev.record)
        rep += n
        ratios = _estimated(records, cands, weights)
        if not ratios:
            break
        leader = max(ratios, key=lambda a: _est(ratios[a]))
        lead = ratios[leader]
        keep = [a for a in cands if a in ratios and not _below(ratios[a], lead)]
        dropped = [a for a in cands if a not in keep]
        cands = keep
        yield AdaptiveStage("round", f"after {rep} repetitions: leader {leader.label} "
                            f"{_est(lead):.2f}x" + (f"; dropped {', '.join(a.label for a in dropped)}"
                                                      if dropped else ""), tuple(cands))
        separated = len(cands) == 1 or all(_below(ratios[a], lead) for a in cands if a != leader)
        if separated and rep >= min_reps + 1:
            break
    final = _estimated(records, cands, weights)
    pick = max(final, key=lambda a: _est(final[a])) if final else None
    if pick is not None and final[pick].verdict != "faster":
        yield AdaptiveStage("done", f"no candidate is reliably faster (best {pick.label} "
                            f"{_est(final[pick]):.2f}x, {final[pick].verdict}): leave MTP off")
        pick = None
    else:
        yield AdaptiveStage("done", f"pick: {pick.label}" if pick else "leave MTP off")
    yield AdaptiveResult(pick, tuple(records), cost, len(records))
