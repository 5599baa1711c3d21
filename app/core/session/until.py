"""The plain sweep run until decided: the plan's grid in rounds of one repetition (every arm on
every prompt, interleaved as run_sweep does), a ``Decisions`` event after each round, stopping
once every task of the mix is decided (app.core.analysis.decide), at the plan's repetitions, or
at its time budget (Quick's, on every path: counted from the flow's start; a run is not started
when the whole wall time of a run so far would take the sweep past it; ``stopped`` "budget")."""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable, Generator

from app.core.analysis.decide import MIN_GAIN, decide
from app.core.analysis.recommend import parse_mix
from app.core.common.cancel import CancelToken
from app.core.engines.base import Engine
from app.core.measure.plan import Plan
from app.core.measure.preflight import read_model
from app.core.measure.runner import run_sweep
from app.core.records.prompt import Prompt
from app.core.records.schema import RunRecord, new_id
from app.core.records.writer import ResultsWriter
from app.core.session.budget import Budget
from app.core.session.events import Decisions, Event, RunFailed, RunFinished, RunStarted, SweepFinished


def rounds_until_decided(plan: Plan, engine: Engine, writer: ResultsWriter | None, cancel: CancelToken,
                         mix: str | None = None, sweep_id: str | None = None,
                         link: dict[str, Any] | None = None,
                         min_gain: float = MIN_GAIN, budget_s: float | None = None, started: float | None = None,
                         clock: Callable[[], float] = time.monotonic) -> Generator[Event, None, None]:
    """run_sweep's events round by round (one sweep id, the model read once, ``link``: the RPC
    workers' round trips at the start), each round followed by ``Decisions`` (on anytime intervals:
    it looks every round; ``min_gain``: δ of "no gain worth having"); ``budget_s`` from ``started``
    (None: the sweep's start) ends it before a run that would not fit (see the module)."""
    sweep_id = sweep_id or new_id()
    # its records say so: the file is judged as this sweep is; a round takes the tasks in turn (c1, s1, c2,
    # s2), so that a round the budget cuts leaves no task unmeasured
    plan = dataclasses.replace(plan, sequential=min_gain, prompts=in_turn(plan.prompts))
    tasks = tuple(dict.fromkeys(p.task for p in plan.prompts))
    weights = parse_mix(mix, tasks)
    spec = [a for a in plan.arms if a.is_spec]
    records: list[RunRecord] = []
    t0 = clock()
    budget = Budget(budget_s, None, clock, t0 if started is None else started)
    first: float | None = None  # the first measured run's start: runs' whole wall time counts from it
    tokens = 0
    runs_per_round = max(1, plan.total_runs // max(1, plan.reps))  # a round measures every task
    state: Decisions | None = None
    stopped = "max_reps"
    model = read_model(plan.model)  # once: every round reuses it
    for rep in range(plan.reps):
        rnd = dataclasses.replace(plan, reps=1, rep_start=rep, warmup=plan.warmup if rep == 0 else 0)
        cancelled = cut = False
        runs = run_sweep(rnd, engine, writer, cancel, sweep_id=sweep_id, model=model, link=link)
        for ev in runs:
            if isinstance(ev, RunStarted) and not ev.warmup:
                if not budget.fits(1, plan.n_predict):  # the next run would end past the budget
                    runs.close()
                    cut = True
                    break
                first = clock() if first is None else first
            if isinstance(ev, (RunFinished, RunFailed)):
                budget.runs += 1  # each run's whole wall time: server starts and waits between runs too
                budget.run_s = clock() - (first if first is not None else t0)
            if isinstance(ev, RunFinished):
                records.append(ev.record)
                tokens += ev.record.n_generated or 0
            elif isinstance(ev, SweepFinished):
                cancelled = ev.cancelled
            yield ev
        elapsed = clock() - t0
        per_run = budget.per_run()  # a run's whole wall time so far
        found = decide(records, tuple(weights), {t: spec for t in weights}, min_gain=min_gain)
        found = tuple(dataclasses.replace(d, eta_s=0.0 if d.decided else (
            d.more_reps * runs_per_round * per_run if d.more_reps is not None and per_run is not None else None))
            for d in found)
        etas = [d.eta_s for d in found]
        eta = None if any(e is None for e in etas) else max((e for e in etas if e is not None), default=0.0)
        state = Decisions(found, len(records), tokens, elapsed, eta)
        if cancelled or cancel.cancelled:
            stopped = "cancelled"
            break
        if cut:
            stopped = "budget"
            break
        if state.decided:
            stopped = "decided"
            break
        yield state
    if state is not None:
        yield dataclasses.replace(state, final=True, stopped=stopped)


def in_turn(prompts: tuple[Prompt, ...]) -> tuple[Prompt, ...]:
    """``prompts`` with the tasks taken in turn: each task's first prompt, then each one's second, ..."""
    by_task: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_task.setdefault(p.task, []).append(p)
    return tuple(p for group in itertools.zip_longest(*by_task.values()) for p in group if p is not None)
