"""Adaptive sweep: a decided verdict per task in far fewer runs than the exhaustive grid.

1. Cost probe (or a given cost record), with the engine the sweep runs on (in process, or
   through llama-server on the server's device: app.core.session.cost_probe): drop every K
   whose best case (all drafts accepted) cannot beat baseline on this machine.
2. Pilot: one short MTP run per task at the widest surviving K gives the acceptance per draft
   position of each task (app.core.analysis.positions; the i.i.d. alpha where a run has no
   per-position counts); with the probe's step costs that predicts every K for every task. Each
   task measures only the K whose prediction could still win: its predicted best, the smallest K
   predicted within 3 % of it (the rule's pick of a near tie), then others within
   ``CANDIDATE_MARGIN`` of its best, at most ``max_candidates``. When the mix (several tasks) is
   predicted to pay at all, the mix's predicted best K (and the p_min values asked, only for that
   K) is measured on every task too, for the mix's own decision: on a task it is not a rival of
   the task's own candidates (were it one, three near-equal arms on a task would have to be told
   apart, which costs more repetitions than the grid runs: benchmarks/time_to_verdict).
3. A first round of ``min_reps`` paired repetitions (baseline + the task's candidates), then step
   by step: each undecided task gets one repetition (baseline + one arm) of the arm whose interval
   most needs to shrink (app.core.analysis.decide); the mix (a line of its own, ``MIX``) is
   decided by the same rule over its arms' weighted ratios, each repetition going to the task
   whose cell weighs most in the mix's variance. The sweep stops by itself when every task of
   the mix, and the mix, is decided, at the budget (seconds or generated tokens), or when no contender may run
   another repetition (``max_reps``). A ``Decisions`` event after every step says where each
   task stands and about how long it needs.

Events from the runner are passed through, so front ends show the same progress; an
``AdaptiveStage`` event says what the planner decided and why.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable, Generator, Mapping, Sequence

from app.core.analysis import breakeven, positions
from app.core.analysis.decide import PRECISION, TIE, TaskDecision, decide_task, describe, task_ratios
from app.core.analysis.recommend import parse_mix
from app.core.analysis.stats import Ratio, combine_ratios
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled
from app.core.engines.base import Engine, EngineKind
from app.core.measure.plan import Plan
from app.core.measure.runner import RunFinished, run_sweep
from app.core.records.arm import Arm
from app.core.records.cost import DEFAULT_DEPTH, CostRecord
from app.core.records.schema import RunRecord, new_id
from app.core.records.writer import ResultsWriter
from app.core.session.cost_probe import probe_where
from app.core.session.events import AdaptiveResult, AdaptiveStage, Decisions, Event

CANDIDATE_MARGIN = 0.95  # a K whose predicted speedup is within 5 % of the task's best is measured
MIX = "mix"  # the mix's line among the task decisions (its arms' weighted ratio over the tasks)
BUDGET_MAX_REPS = 40  # with a budget, the budget ends the sweep: repetitions per arm up to this


def _mix_of(ratios: Mapping[str, Mapping[Arm, Ratio]], arm: Arm, mix: Mapping[str, float]) -> Ratio:
    """The mix's ratio of ``arm`` as the stopping rule reads it, from the tasks' ratios: their
    weighted combination (stats.combine_ratios), whose interval takes the t quantile of the
    fewest-paired cell, so that cell's pairs, not all of them, say how it shrinks. No estimate
    until every task of the mix has one for the arm."""
    cells = [ratios.get(t, {}).get(arm) for t in mix]
    if any(c is None or c.estimate is None for c in cells):
        return Ratio(0, None, None, None, None, None)
    parts = [(w, c) for w, c in zip(mix.values(), cells) if c is not None]
    return dataclasses.replace(combine_ratios(parts), n_pairs=min(c.n_pairs for _, c in parts))


def _estimated(ratios: Mapping[str, Mapping[Arm, Ratio]], arms: Sequence[Arm],
               mix: Mapping[str, float]) -> dict[Arm, Ratio]:
    """The mix's ratio of each arm that has an estimate, from the tasks' ratios (_mix_of)."""
    out = {a: _mix_of(ratios, a, mix) for a in arms}
    return {a: r for a, r in out.items() if r.estimate is not None}


def _est(r: Ratio) -> float:
    return r.estimate if r.estimate is not None else -math.inf


def _by_positions(model: positions.PositionModel, costs: breakeven.Costs, k: int) -> float:
    return model.speedup(k, costs)


def _by_alpha(alpha: float, costs: breakeven.Costs, k: int) -> float:
    return breakeven.predicted_speedup(alpha, k, costs)


@dataclasses.dataclass
class _Budget:
    """What the sweep has spent, against its budget (None: no limit)."""

    seconds: float | None
    tokens: int | None
    clock: Callable[[], float]
    t0: float = 0.0
    spent_tokens: int = 0
    runs: int = 0  # measured runs
    run_s: float = 0.0  # their wall time

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def per_run(self, fallback: float) -> float:
        return self.run_s / self.runs if self.runs else fallback

    def fits(self, n_runs: int, n_predict: int) -> bool:
        """Another ``n_runs`` runs fit in what is left."""
        if self.tokens is not None and self.spent_tokens + n_runs * n_predict > self.tokens:
            return False
        if self.seconds is not None and self.runs and self.elapsed() + n_runs * self.per_run(0.0) > self.seconds:
            return False
        return not (self.seconds is not None and self.elapsed() >= self.seconds)


def _with_eta(d: TaskDecision, runs_per_rep: int, per_run: float | None) -> TaskDecision:
    if d.decided:
        return dataclasses.replace(d, eta_s=0.0)
    if d.more_reps is None or per_run is None:
        return d
    arms = max(1, sum(1 for a in d.contenders if a is not None))
    # each repetition of an arm is one run of it and one of its paired baseline, per prompt
    return dataclasses.replace(d, eta_s=d.more_reps * arms * 2 * runs_per_rep * per_run)


def _candidates(ks: Sequence[int], pred: Callable[[int], float], most: int, mix_k: int | None) -> list[int]:
    """The K a task measures: its predicted best, and the smallest K predicted within ``TIE`` of it
    (the stopping rule picks the smaller of tied arms, so that is the pick if the prediction holds),
    then the next best within ``CANDIDATE_MARGIN``, up to ``most``; plus the mix's K when given."""
    own = sorted(ks, key=pred, reverse=True)
    best = pred(own[0])
    tied = min(k for k in ks if pred(k) >= (1 - TIE) * best)
    chosen = list(dict.fromkeys([own[0], tied]))
    chosen += [k for k in own if k not in chosen and pred(k) >= CANDIDATE_MARGIN * best][:max(0, most - len(chosen))]
    return list(dict.fromkeys([*sorted(chosen), *([mix_k] if mix_k is not None else [])]))


def adaptive_sweep(plan: Plan, engine: Engine, *, ks: Sequence[int] = tuple(range(1, 9)),
                   p_mins: Sequence[float] = (0.0,), mix: str | None = None, min_reps: int = 2,
                   max_reps: int = 6, max_candidates: int = 2, cost: CostRecord | None = None,
                   writer: ResultsWriter | None = None, cancel: CancelToken | None = None,
                   probe_rounds: int = 4, budget_s: float | None = None, budget_tokens: int | None = None,
                   precision: float = PRECISION, clock: Callable[[], float] = time.monotonic,
                   hardware: object = None) -> Generator[Event, None, None]:
    """Yields runner events, AdaptiveStage and Decisions events; the last item is an
    AdaptiveResult. The caller owns the engine (and closes it). ``budget_s`` / ``budget_tokens``
    end the sweep early (wall time from its start, probe included; tokens generated, pilot
    included); with either, ``max_reps`` is at least BUDGET_MAX_REPS. ``clock``: for tests."""
    cancel = cancel or CancelToken()
    budget = _Budget(budget_s, budget_tokens, clock, clock())
    if budget_s is not None or budget_tokens is not None:
        max_reps = max(max_reps, BUDGET_MAX_REPS)
    sweep_id = new_id()  # every round is part of one sweep in the results file
    records: list[RunRecord] = []
    tasks = tuple(dict.fromkeys(p.task for p in plan.prompts))
    weights = parse_mix(mix, tasks)
    if hardware is None:
        from app.core.machine import hardware as hw_mod  # deferred: once per sweep, not per step

        hardware = hw_mod.snapshot()
    # 1. costs
    if cost is None:
        # the probe at the sweep's (deepest) context depth, with the engine the sweep runs on
        depth = max(DEFAULT_DEPTH, *plan.depths)
        # with the engine the sweep runs on; in process the whole step (as `mtp-tuner probe`): the parts
        # alone (verify pass, draft step) miss the catch-up and rollback and over-predict every K, which
        # put near-tied widths (and the mix's K) among the candidates and cost more runs than the probe
        # saves (benchmarks/time_to_verdict)
        probe = probe_where(engine, plan.model, depth=depth, max_k=max(ks), rounds=probe_rounds, cancel=cancel)
        for step in probe:
            if isinstance(step, CostRecord):
                cost = step
                if writer:
                    writer.append_line(step.to_json())
            else:
                yield AdaptiveStage("probe", step.message)
    costs = breakeven.Costs.from_probe(cost)
    viable = [k for k in ks if breakeven.predicted_speedup(1.0, k, costs) > 1.0]
    yield AdaptiveStage("probe", f"K that can pay on this machine at all: {viable or 'none'}")
    if not viable:  # the probe decides every task: leave it off
        off = Decisions(tuple(TaskDecision(t, True, None, None, reason="no draft width can pay on this machine")
                              for t in weights), 0, 0, budget.elapsed(), 0.0, True, "decided")
        yield off
        yield AdaptiveResult(None, (), cost, 0, off)
        return
    # 2. pilot: acceptance per draft position per task at the widest viable K (one short run per task)
    k_pilot = max(viable)
    pilot_prompts = tuple({p.task: p for p in reversed(plan.prompts)}.values())
    pilot = dataclasses.replace(plan, arms=(Arm(k_pilot, 0.0),), prompts=pilot_prompts, reps=1,
                                n_predict=min(plan.n_predict, 48), rep_start=10_000)
    predict: dict[str, Callable[[int], float]] = {}
    pilot_runs, piloted = run_sweep(pilot, engine, None, cancel, hardware=hardware), 0
    for ev in pilot_runs:
        if not isinstance(ev, RunFinished):
            yield ev
            continue
        rec = ev.record
        budget.spent_tokens += rec.n_generated or 0
        piloted += 1
        if not budget.fits(0, plan.n_predict) and piloted < len(pilot_prompts):
            pilot_runs.close()  # the budget is spent: the pilot is cut too (this run still counts)
            yield AdaptiveStage("pilot", f"the budget is spent: the pilot stops after {rec.task}")
        if not rec.draft_n:  # pilot runs are not measurements: reported, not recorded
            continue
        rate = (rec.draft_accepted or 0) / rec.draft_n
        counts = positions.pool([rec])
        model = positions.fit({k_pilot: counts}) if counts is not None else None
        if model is not None:
            predict[rec.task] = functools.partial(_by_positions, model, costs)
            how = "acceptance per position " + "/".join(f"{100 * x:.0f}" for x in model.rates(k_pilot)) + " %"
        else:
            alpha = breakeven.infer_alpha(rate, k_pilot)
            predict[rec.task] = functools.partial(_by_alpha, alpha, costs)
            how = f"alpha {alpha:.2f}"
        yield AdaptiveStage("pilot", f"{rec.task}: acceptance {100 * rate:.0f}% at K={k_pilot} -> {how}")
    if not predict:
        yield AdaptiveResult(None, (), cost, 0)
        return

    def pred(task: str, k: int) -> float:
        f = predict.get(task)
        return max(1e-9, f(k)) if f is not None else 1e-9

    def predicted(k: int) -> float:  # for the mix
        return math.exp(sum(w * math.log(pred(t, k)) for t, w in weights.items()))

    ranked = sorted(viable, key=predicted, reverse=True)
    mix_k = ranked[0]
    # the mix's best K is measured on every task only when the mix could turn speculation on
    mix_on = predicted(mix_k) >= CANDIDATE_MARGIN and len(weights) > 1
    own: dict[str, list[Arm]] = {}  # each task's own candidates: its pick is decided among them
    for t in weights:
        own[t] = [Arm(k, 0.0) for k in _candidates(viable, functools.partial(pred, t), max_candidates, None)]
        if Arm(mix_k, 0.0) in own[t] and not mix_on:
            own[t] += [Arm(mix_k, p) for p in p_mins if p > 0]
    # the mix's arms (its K, with the p_min values asked), measured on every task for the mix's own
    # decision; on a task they are not its rivals (a task whose own candidates hold them decides
    # among them as among any)
    mix_arms = [Arm(mix_k, 0.0)] + [Arm(mix_k, p) for p in p_mins if p > 0] if mix_on else []
    per_task = {t: list(dict.fromkeys([*own[t], *mix_arms])) for t in weights}  # what each task measures
    cands = list(dict.fromkeys(a for arms in per_task.values() for a in arms))
    yield AdaptiveStage("candidates", "predicted speedup for your mix: " + ", ".join(
        f"K={k} {predicted(k):.2f}x" for k in ranked)
        + (f" (the mix is decided at K={mix_k} on its own)" if mix_on else
           " (off at every K: each task is measured at its own candidates only)")
        + "; measuring " + "; ".join(f"{t} {', '.join(a.label for a in arms)}" for t, arms in per_task.items()),
        tuple(cands))
    # 3. a first round for every task, then a repetition at a time where it is needed most
    prompts = {t: tuple(p for p in plan.prompts if p.task == t) for t in weights}
    next_rep = {t: 0 for t in weights}
    reps: dict[tuple[str, Arm], int] = {}
    fallback_run_s = 1.0

    def measure(task: str, arms: Sequence[Arm], n: int) -> Generator[Event, None, None]:
        warm = plan.warmup if next_rep[task] == 0 and engine.kind is not EngineKind.INPROCESS else 0
        rnd = dataclasses.replace(plan, arms=(Arm(),) + tuple(arms), prompts=prompts[task], reps=n,
                                  rep_start=next_rep[task], warmup=warm)
        t0 = clock()
        done = 0
        for ev in run_sweep(rnd, engine, writer, cancel, sweep_id=sweep_id, hardware=hardware):
            yield ev
            if isinstance(ev, RunFinished):
                records.append(ev.record)
                budget.spent_tokens += ev.record.n_generated or 0
                done += 1
        budget.runs += done
        budget.run_s += clock() - t0
        next_rep[task] += n
        for a in arms:
            reps[(task, a)] = reps.get((task, a), 0) + n

    latest: dict[str, dict[Arm, Ratio]] = {}  # the task ratios the last decisions were taken on

    def decisions(final: bool = False, stopped: str = "") -> Decisions:
        ratios = task_ratios(records)
        latest.clear()
        latest.update(ratios)
        per_run = budget.per_run(fallback_run_s) if budget.runs else None
        out = []
        for t, arms in own.items():
            rs = {a: ratios.get(t, {}).get(a, Ratio(0, None, None, None, None, None)) for a in arms}
            out.append(_with_eta(decide_task(t, rs, precision), len(prompts[t]), per_run))
        if mix_arms:  # the mix: the same rule over each mix arm's weighted ratio across the tasks
            rs = {a: _mix_of(ratios, a, weights) for a in mix_arms}
            out.append(_with_eta(decide_task(MIX, rs, precision), max(len(v) for v in prompts.values()), per_run))
        etas = [d.eta_s for d in out]
        eta = None if any(e is None for e in etas) else sum(e for e in etas if e is not None)
        return Decisions(tuple(out), budget.runs, budget.spent_tokens, budget.elapsed(), eta, final, stopped)

    def _mix_step(arm: Arm) -> tuple[str, Arm]:
        """Where a repetition of a mix arm shrinks the mix's interval most (on the ratios the last
        decisions were taken on): the task whose cell has the fewest pairs (the mix's interval takes
        that cell's t quantile), of equals the one that weighs most in its variance (weight² · se²)."""

        def need(t: str) -> tuple[float, float]:
            r = latest.get(t, {}).get(arm)
            if r is None or r.log_se is None:
                return (math.inf, math.inf)
            return (-float(r.n_pairs), weights[t] ** 2 * r.log_se ** 2)

        return max(weights, key=need), arm

    stopped = "max_reps"
    try:
        for t, arms in per_task.items():
            if not budget.fits((1 + len(arms)) * len(prompts[t]) * min_reps, plan.n_predict):
                stopped = "budget"
                break
            cancel.check()
            yield from measure(t, arms, min_reps)
        state = decisions()
        yield state
        while stopped != "budget":
            if state.decided:
                stopped = "decided"
                break
            ran = False
            this_round: set[tuple[str, Arm]] = set()
            for d in state.tasks:
                if d.decided or d.needs is None:
                    continue
                task, arm = (d.task, d.needs) if d.task != MIX else _mix_step(d.needs)
                if (task, arm) in this_round:  # a task's own step measured the mix's cell this round
                    continue
                if reps.get((task, arm), 0) >= max_reps:  # the widest is done: the next widest that may run
                    rest = [a for a in d.contenders if a is not None and reps.get((task, a), 0) < max_reps]
                    if not rest:
                        continue
                    arm = rest[0]
                if not budget.fits(2 * len(prompts[task]), plan.n_predict):
                    stopped = "budget"
                    break
                cancel.check()
                yield from measure(task, (arm,), 1)
                this_round.add((task, arm))
                ran = True
            if not ran:
                break
            state = decisions()
            yield state
    except Cancelled:
        stopped = "cancelled"
    final = decisions(True, stopped)
    yield final
    if stopped == "cancelled":
        raise Cancelled()
    lines = [describe(d, final=True) for d in final.tasks]
    why = {"decided": "every task (and the mix) is decided" if mix_arms else "every task is decided",
           "budget": "the budget is spent", "max_reps": "the repetitions allowed are spent"}.get(stopped, stopped)
    yield AdaptiveStage("done", f"stopped: {why} after {final.runs} runs, {final.tokens} tokens, "
                        f"{final.elapsed_s:.0f} s; " + "; ".join(lines), tuple(cands))
    common = [a for a in cands if all(a in per_task[t] for t in weights)]
    est = _estimated(latest, common, weights)  # the final decisions' task ratios
    pick = max(est, key=lambda a: _est(est[a])) if est else None
    if pick is not None and est[pick].verdict != "faster":
        yield AdaptiveStage("done", f"no candidate is reliably faster for the mix (best {pick.label} "
                            f"{_est(est[pick]):.2f}x, {est[pick].verdict}): leave MTP off")
        pick = None
    else:
        yield AdaptiveStage("done", f"pick for the mix: {pick.label}" if pick else "leave MTP off")
    yield AdaptiveResult(pick, tuple(records), cost, len(records), final)
