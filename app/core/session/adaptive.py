"""Adaptive sweep: a decided verdict per task in far fewer runs than the exhaustive grid.

1. Cost probe (or a given cost record), with the engine the sweep runs on (in process, or
   through llama-server on the server's device: app.core.session.cost_probe): drop every K
   whose best case (all drafts accepted) cannot beat baseline on this machine.
2. Pilot: one short MTP run per task at the widest surviving K gives the acceptance per draft
   position of each task (app.core.analysis.positions; the i.i.d. alpha where a run has no
   per-position counts); with the probe's step costs that predicts every K for every task. Each
   task measures only the K whose prediction could still win (app.core.session.widths: its
   predicted best, the smallest K predicted within 3 % of it, others close to its best, at most
   ``max_candidates``), and, once measured, the leader's neighbours until each is worse (so the
   answer says which K). When the mix (several tasks) is
   predicted to pay at all, the mix's predicted best K (and the p_min values asked, only for that
   K) is measured on every task too, for the mix's own decision: on a task it is not a rival of
   the task's own candidates (were it one, three near-equal arms on a task would have to be told
   apart, which costs more repetitions than the grid runs: benchmarks/time_to_verdict).
3. A first round of ``min_reps`` paired repetitions (baseline + the task's candidates), then step
   by step: each undecided task gets one repetition (baseline + one arm) of the arm whose interval
   most needs to shrink (app.core.analysis.decide); the mix (a line of its own, ``MIX``) is
   decided by the same rule over its arms' weighted ratios, each repetition going to the task
   whose cell weighs most in the mix's variance. The sweep stops by itself when every task of
   the mix, and the mix, is decided, at the budget (seconds or generated tokens: app.core.session.budget;
   seconds from the flow's start, the probe and the pilot included; a sweep about to decide may
   use the budget's grace), or when no contender may run another repetition (``max_reps``, and
   ``GRACE_REPS`` more where they are estimated to decide it). The cap is said before the first
   run (a "plan" stage). A ``Decisions`` event after every step says where each task stands and
   about how long it needs.

Events from the runner are passed through, so front ends show the same progress; an
``AdaptiveStage`` event says what the planner decided and why. ``adaptive_sweep`` builds an
``AdaptiveSweep``, whose methods are these phases (costs, pilot, candidates, measure, decide) and
the loop (run), and runs it; the model is read once for all its steps.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Generator, Mapping, Sequence

from app.core.analysis import breakeven, positions, schedule
from app.core.analysis.anytime import anytime
from app.core.analysis.decide import MIN_GAIN, PRECISION, SLOWER, TaskDecision, decide_task, describe, task_ratios
from app.core.analysis.recommend import parse_mix
from app.core.analysis.stats import Ratio
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled
from app.core.engines.base import Engine, EngineKind
from app.core.measure import busy as busy_mod
from app.core.measure.plan import Plan
from app.core.measure.preflight import ModelFacts, read_model
from app.core.measure.quiet import QuietGate
from app.core.measure.runner import run_sweep
from app.core.records.arm import Arm
from app.core.records.cost import DEFAULT_DEPTH, CostRecord
from app.core.records.schema import RunRecord, new_id
from app.core.records.writer import ResultsWriter
from app.core.session.budget import GRACE_REPS, Budget, with_eta
from app.core.session.widths import CANDIDATE_MARGIN, by_alpha, by_positions, candidates, next_width
from app.core.session.cost_probe import probe_where
from app.core.session.mix_ratios import est_of, estimated, mix_of
from app.core.session.events import AdaptiveResult, AdaptiveStage, Decisions, Event, RunFinished, RunStarted

if TYPE_CHECKING:
    from app.core.machine.hardware import HardwareSnapshot

MIX = "mix"  # the mix's line among the task decisions (its arms' weighted ratio over the tasks)
BUDGET_MAX_REPS = 40  # with a budget, the budget ends the sweep: repetitions per arm up to this


@dataclasses.dataclass(frozen=True)
class AdaptiveRun:
    """How one adaptive sweep runs, besides its plan and engine: the one options object of
    ``adaptive_sweep`` and ``AdaptiveSweep``. ``budget_s`` / ``budget_tokens`` end the sweep early
    (wall time from ``started``, else its start, probe included; tokens generated, pilot
    included); with either, ``max_reps`` is at least BUDGET_MAX_REPS. ``clock``: for tests.
    ``gate``: the measured runs wait for quiet moments (app.core.measure.quiet), within the
    budget. ``sweep_id``: the sweep its rounds belong to (default: a new one)."""

    ks: Sequence[int] = tuple(range(1, 9))
    p_mins: Sequence[float] = (0.0,)
    mix: str | None = None
    min_reps: int = 2
    max_reps: int = 6
    max_candidates: int = 2
    cost: CostRecord | None = None
    writer: ResultsWriter | None = None
    cancel: CancelToken | None = None
    probe_rounds: int = 4
    budget_s: float | None = None
    budget_tokens: int | None = None
    precision: float = PRECISION
    clock: Callable[[], float] = time.monotonic
    hardware: HardwareSnapshot | None = None
    started: float | None = None
    gate: QuietGate | None = None
    sweep_id: str | None = None
    min_gain: float = MIN_GAIN  # δ: a gain under it is "no gain worth having" (app.core.analysis.decide)
    link: dict[str, Any] | None = None  # the RPC workers and their round trips at the start (run_sweep's)


def adaptive_sweep(plan: Plan, engine: Engine, options: AdaptiveRun | None = None,
                   **changes: Any) -> Generator[Event, None, None]:
    """Yields runner events, AdaptiveStage and Decisions events; the last item is an
    AdaptiveResult. The caller owns the engine (and closes it). ``options`` (AdaptiveRun), with
    ``changes`` to its fields (``max_reps=3``) when given."""
    yield from AdaptiveSweep(plan, engine, options, **changes).run()


class AdaptiveSweep:
    """One adaptive sweep (see the module), in the way of pyperf's WorkerTask: a method per phase,
    what the phases find out on self. ``costs``, ``pilot``, ``candidates``, then ``measure`` a
    task's arms and ``decide`` where each line stands, round after round; ``run`` is the loop
    that calls them. Phases that run the engine are generators of events (their findings on
    self); ``candidates`` and ``decide`` return their event."""

    def __init__(self, plan: Plan, engine: Engine, options: AdaptiveRun | None = None, **changes: Any) -> None:
        o = dataclasses.replace(options or AdaptiveRun(), **changes)
        ks, p_mins, mix, min_reps, max_reps = o.ks, o.p_mins, o.mix, o.min_reps, o.max_reps
        max_candidates, cost, writer, cancel, probe_rounds = o.max_candidates, o.cost, o.writer, o.cancel, o.probe_rounds
        budget_s, budget_tokens, precision, clock = o.budget_s, o.budget_tokens, o.precision, o.clock
        hardware, started, gate, sweep_id = o.hardware, o.started, o.gate, o.sweep_id
        self.plan, self.engine, self.writer = dataclasses.replace(plan, sequential=o.min_gain), engine, writer
        self.link, self.min_gain = o.link, o.min_gain
        self.ks, self.p_mins, self.min_reps, self.max_candidates = tuple(ks), tuple(p_mins), min_reps, max_candidates
        self.probe_rounds, self.precision, self.clock = probe_rounds, precision, clock
        self.cancel = cancel or CancelToken()
        self.budget = Budget(budget_s, budget_tokens, clock, clock() if started is None else started)
        self.gate = gate
        if gate is not None:  # its waits end with the budget (what is left of it, on the gate's clock)
            limit = self.budget.limit()
            left = None if limit is None else max(0.0, limit - self.budget.elapsed())
            gate.until(None if left is None else gate.clock() + left, budget_s)
        limited = budget_s is not None or budget_tokens is not None
        self.max_reps = max(max_reps, BUDGET_MAX_REPS) if limited else max_reps
        self.sweep_id = sweep_id or new_id()  # every round is part of one sweep in the results file
        self.records: list[RunRecord] = []  # the measured runs (the pilot's are not)
        self.weights = parse_mix(mix, tuple(dict.fromkeys(p.task for p in plan.prompts)))
        self.prompts = {t: tuple(p for p in plan.prompts if p.task == t) for t in self.weights}
        if hardware is None:
            from app.core.machine import hardware as hw_mod  # deferred: once per sweep, not per step

            hardware = hw_mod.snapshot()
        self.hardware = hardware
        self.model: ModelFacts | None = None  # read once, by the pilot; every step reuses it
        self.cost = cost
        self.step_costs: breakeven.Costs | None = None  # costs: the step costs at each K
        self.viable: list[int] = []  # costs: the K that can pay at all
        self.busy_probe = False  # the probe ran while other programs were busy (costs)
        self.predict: dict[str, Callable[[int], float]] = {}  # pilot: each task's predicted speedup by K
        self.own: dict[str, list[Arm]] = {}  # candidates: each task's own (its pick is decided among them)
        self.mix_arms: list[Arm] = []  # candidates: the mix's, measured on every task (none: mix off)
        self.per_task: dict[str, list[Arm]] = {}  # candidates: what each task measures
        self.cands: list[Arm] = []  # candidates: all of them
        self.next_rep = {t: 0 for t in self.weights}  # measure: each task's next repetition number
        self.reps: dict[tuple[str, Arm], int] = {}  # measure: repetitions of each arm on each task
        self.latest: dict[str, dict[Arm, Ratio]] = {}  # decide: the task ratios the last decisions read
        self.seq: dict[str, dict[Arm, Ratio]] = {}  # decide: each line's anytime ratios, as decided (step's order)
        self.stopped = "max_reps"  # why the measuring stopped (the pilot's cut: "budget")

    def run(self) -> Generator[Event, None, None]:
        """The loop: costs, pilot, candidates, the rounds of measuring and deciding, the result."""
        yield from self.costs()
        if not self.viable:  # the probe decides every task: leave it off
            off = Decisions(tuple(TaskDecision(t, True, None, None, reason="no draft width can pay on this machine",
                                               outcome=SLOWER)
                                  for t in self.weights), 0, 0, self.budget.elapsed(), 0.0, True, "decided")
            yield off
            yield AdaptiveResult(None, (), self.cost, 0, off)
            return
        yield from self.pilot()
        if not self.predict:  # the budget cut the pilot, or its runs failed: no task is predicted
            final = Decisions(tuple(TaskDecision(t, False, None, None, reason="no runs yet") for t in self.weights),
                              0, self.budget.spent_tokens, self.budget.elapsed(), None, True,
                              "budget" if self.stopped == "budget" else "pilot failed")
            yield final
            yield AdaptiveResult(None, (), self.cost, 0, final)
            return
        yield self.candidates()
        try:
            yield from self.rounds()
        except Cancelled:
            self.stopped = "cancelled"
        final = self.decide(True, self.stopped)
        yield final
        if self.stopped == "cancelled":
            raise Cancelled()
        yield from self.finish(final)

    def costs(self) -> Generator[Event, None, None]:
        """The step costs on this machine (``step_costs``): the cost record given, else a probe
        (its record written), and the K whose best case (every draft accepted) beats baseline
        (``viable``)."""
        plan, engine, ks, cancel, probe_rounds = self.plan, self.engine, self.ks, self.cancel, self.probe_rounds
        if self.cost is None:
            # the probe at the sweep's (deepest) context depth, with the engine the sweep runs on
            depth = max(DEFAULT_DEPTH, *plan.depths)
            # with the engine the sweep runs on; in process the whole step (as `mtp-tuner probe`): the
            # parts alone (verify pass, draft step) miss the catch-up and rollback and over-predict every
            # K, which put near-tied widths (and the mix's K) among the candidates and cost more runs
            # than the probe saves (benchmarks/time_to_verdict)
            probe = probe_where(engine, plan.model, depth=depth, max_k=max(ks), rounds=probe_rounds, cancel=cancel)
            monitor = busy_mod.make_monitor()  # a probe measured while others were busy prices steps wrong
            monitor.start()
            for step in probe:
                if isinstance(step, CostRecord):
                    self.cost = step
                else:
                    yield AdaptiveStage("probe", step.message)
            busy = monitor.stop()
            if busy.disturbed:  # kept for this sweep only (not written, so never reused), ruling no width out
                self.busy_probe = True
                yield AdaptiveStage("probe", f"the probe ran while other programs were busy ({busy.text()}): "
                                             "no width is ruled out by it, and it is not kept for later sweeps")
            elif self.writer and self.cost is not None:
                self.writer.append_line(self.cost.to_json())
        self.step_costs = breakeven.Costs.from_probe(self.cost)
        t1 = self.step_costs.t_ms.get(1)
        self.budget.token_s = t1 / 1000 if t1 else None  # a run's time before the first is measured
        self.viable = [k for k in ks if self.busy_probe or breakeven.predicted_speedup(1.0, k, self.step_costs) > 1.0]
        yield AdaptiveStage("probe", f"K that can pay on this machine at all: {self.viable or 'none'}")

    def pilot(self) -> Generator[Event, None, None]:
        """One short run per task at the widest viable K (reported, not recorded): the task's
        acceptance per draft position (the i.i.d. alpha where the run has no per-position counts)
        and, with the step costs, its predicted speedup at every K (``predict``). A budget spent
        meanwhile cuts it short. Reads the model for every step to come (``model``)."""
        plan, costs = self.plan, self.step_costs
        assert costs is not None  # costs ran first
        k_pilot = max(self.viable)
        pilot_prompts = tuple({p.task: p for p in reversed(plan.prompts)}.values())
        pilot = dataclasses.replace(plan, arms=(Arm(k_pilot, 0.0),), prompts=pilot_prompts, reps=1,
                                    n_predict=min(plan.n_predict, 48), rep_start=10_000)
        self.model = read_model(plan.model)
        pilot_runs = run_sweep(pilot, self.engine, None, self.cancel, hardware=self.hardware, model=self.model,
                               reruns=False, link=self.link)  # it counts drafts: a busy run counts them alike
        done: list[str] = []
        for ev in pilot_runs:
            if isinstance(ev, RunStarted) and not ev.warmup and not self.budget.fits(1, pilot.n_predict):
                pilot_runs.close()  # the budget is spent: the pilot is cut too, before its next run
                self.stopped = "budget"
                yield AdaptiveStage("pilot", "the budget is spent: the pilot stops"
                                    + (f" after {', '.join(done)}" if done else " before its first run"))
                break
            if not isinstance(ev, RunFinished):
                yield ev
                continue
            rec = ev.record
            self.budget.spent_tokens += rec.n_generated or 0
            done.append(rec.task)
            if not rec.draft_n:  # pilot runs are not measurements: reported, not recorded
                continue
            rate = (rec.draft_accepted or 0) / rec.draft_n
            counts = positions.pool([rec])
            model = positions.fit({k_pilot: counts}) if counts is not None else None
            if model is not None:
                self.predict[rec.task] = functools.partial(by_positions, model, costs)
                how = "acceptance per position " + "/".join(f"{100 * x:.0f}" for x in model.rates(k_pilot)) + " %"
            else:
                alpha = breakeven.infer_alpha(rate, k_pilot)
                self.predict[rec.task] = functools.partial(by_alpha, alpha, costs)
                how = f"alpha {alpha:.2f}"
            yield AdaptiveStage("pilot", f"{rec.task}: acceptance {100 * rate:.0f}% at K={k_pilot} -> {how}")

    def pred(self, task: str, k: int) -> float:
        """The pilot's predicted speedup of ``task`` at ``k`` (a task it could not predict: none)."""
        f = self.predict.get(task)
        return max(1e-9, f(k)) if f is not None else 1e-9

    def predicted(self, k: int) -> float:
        """The mix's predicted speedup at ``k``: the tasks' weighted geometric mean."""
        return math.exp(sum(w * math.log(self.pred(t, k)) for t, w in self.weights.items()))

    def candidates(self) -> AdaptiveStage:
        """What each task measures (``per_task``): its own candidates (``own``, _candidates) and,
        when the mix could turn speculation on, the mix's predicted best K with the p_min values
        asked (``mix_arms``), measured on every task for the mix's own decision; on a task they are
        not its rivals (a task whose own candidates hold them decides among them as among any)."""
        ranked = sorted(self.viable, key=self.predicted, reverse=True)
        mix_k = ranked[0]
        mix_on = self.predicted(mix_k) >= CANDIDATE_MARGIN and len(self.weights) > 1
        for t in self.weights:
            pred = functools.partial(self.pred, t)
            self.own[t] = [Arm(k, 0.0) for k in candidates(self.viable, pred, self.max_candidates, None)]
            if Arm(mix_k, 0.0) in self.own[t] and not mix_on:
                self.own[t] += [Arm(mix_k, p) for p in self.p_mins if p > 0]
        self.mix_arms = [Arm(mix_k, 0.0)] + [Arm(mix_k, p) for p in self.p_mins if p > 0] if mix_on else []
        self.per_task = {t: list(dict.fromkeys([*self.own[t], *self.mix_arms])) for t in self.weights}
        self.cands = list(dict.fromkeys(a for arms in self.per_task.values() for a in arms))
        return AdaptiveStage("candidates", "predicted speedup for your mix: " + ", ".join(
            f"K={k} {self.predicted(k):.2f}x" for k in ranked)
            + (f" (the mix is decided at K={mix_k} on its own)" if mix_on else
               " (off at every K: each task is measured at its own candidates only)")
            + "; measuring " + "; ".join(f"{t} {', '.join(a.label for a in arms)}" for t, arms in self.per_task.items()),
            tuple(self.cands))

    def rounds(self) -> Generator[Event, None, None]:
        """A first round for every task, then a step at a time where it is needed most, each
        followed by ``decide`` (and ``widen``), until every line is decided, the budget is spent
        (``stopped`` says which) or no contender may run another repetition."""
        yield from self.first_round()
        state = self.decide()
        yield state
        while self.stopped != "budget":
            if (yield from self.widen()):
                state = self.decide()
                yield state
                continue
            if state.decided:
                self.stopped = "decided"
                break
            if not (yield from self.step(state)):
                break
            state = self.decide()
            yield state

    def first_round(self) -> Generator[Event, None, None]:
        """``min_reps`` paired repetitions (baseline + the task's arms) of each task, one
        repetition of every task before the next of any (a budget cut leaves no task unmeasured),
        while the budget allows."""
        for _rep in range(self.min_reps):
            for t, arms in self.per_task.items():
                if not self.budget.fits((1 + len(arms)) * len(self.prompts[t]), self.plan.n_predict):
                    self.stopped = "budget"
                    return
                self.cancel.check()
                yield from self.measure(t, arms, 1)

    def widen(self) -> Generator[Event, None, bool]:
        """The leader's unmeasured neighbour on each task that pays (widths.next_width), ``min_reps``
        repetitions of it, while the budget allows: so the answer says which K, not only that one
        K pays. True when one was measured."""
        for t, arms in self.own.items():
            rs = self.latest.get(t, {})
            measured = {a.k: rs[a].estimate if a in rs else None for a in arms if a.k is not None and a.p_min == 0}
            k = next_width(measured, self.viable)
            if k is None or not self.budget.fits(2 * len(self.prompts[t]) * self.min_reps, self.plan.n_predict):
                continue
            arm = Arm(k, 0.0)
            self.own[t].append(arm)
            self.per_task[t].append(arm)
            self.cands = list(dict.fromkeys([*self.cands, arm]))
            yield AdaptiveStage("candidates", f"{t}: {arm.label} too, beside its leader, to say which K", (arm,))
            self.cancel.check()
            yield from self.measure(t, (arm,), self.min_reps)
            return True
        return False

    def step(self, state: Decisions) -> Generator[Event, None, bool]:
        """One pair (baseline + one arm, on each of a task's prompts) where a decision is nearest
        (app.core.analysis.schedule: the undecided line whose nearest decision needs the fewest runs,
        and on it the arm that decision waits for longest; a mix arm on the task where it shrinks the
        mix's interval most: mix_step). A line whose arm has run ``max_reps`` takes its next contender
        that may (else ``GRACE_REPS`` more where they would decide it; the budget's grace likewise);
        a line that can run nothing gives way to the next. False when none ran."""
        lines = [(d, self.seq.get(d.task, {}), len(self.prompts.get(d.task, ())) or self.longest())
                 for d in state.tasks if not d.decided]
        by_line = {d.task: d for d, _, _ in lines}
        for nxt in schedule.order(lines, self.min_gain, self.precision):
            d = by_line[nxt.task]
            task, arm = (d.task, nxt.arm) if d.task != MIX else self.mix_step(nxt.arm)
            if self.reps.get((task, arm), 0) >= self.max_reps:  # the widest is done: the next widest that may run
                near = d.more_reps is not None and d.more_reps <= GRACE_REPS  # then the cap's grace too
                rest = [a for cap in (self.max_reps, self.max_reps + GRACE_REPS * near) for a in [arm, *d.contenders]
                        if a is not None and self.reps.get((task, a), 0) < cap]
                if not rest:
                    continue
                arm = rest[0]
            runs = 2 * len(self.prompts[task])
            if not (self.budget.fits(runs, self.plan.n_predict)
                    or self.budget.finishes(state.eta_s, runs, self.plan.n_predict)):
                self.stopped = "budget"
                return False
            self.cancel.check()
            yield from self.measure(task, (arm,), 1)
            return True
        return False

    def longest(self) -> int:
        """The most prompts of any task (a mix repetition's runs, before mix_step names the task)."""
        return max(len(v) for v in self.prompts.values())

    def measure(self, task: str, arms: Sequence[Arm], n: int) -> Generator[Event, None, None]:
        """``n`` repetitions of ``task``'s prompts on baseline and ``arms``, recorded and counted
        against the budget (warmup before a task's first, on an engine that needs it)."""
        plan = self.plan
        warm = plan.warmup if self.next_rep[task] == 0 and self.engine.kind is not EngineKind.INPROCESS else 0
        rnd = dataclasses.replace(plan, arms=(Arm(),) + tuple(arms), prompts=self.prompts[task], reps=n,
                                  rep_start=self.next_rep[task], warmup=warm)
        t0, waited0 = self.clock(), self.gate.waited if self.gate is not None else 0.0
        done = 0
        runs = run_sweep(rnd, self.engine, self.writer, self.cancel, sweep_id=self.sweep_id, hardware=self.hardware,
                         model=self.model, gate=self.gate, link=self.link)
        for ev in runs:
            if isinstance(ev, RunStarted) and not ev.warmup and not self.budget.fits(1, plan.n_predict, grace=True):
                runs.close()  # a re-run or a wait took the time: the clock is kept, the round is cut
                self.stopped = "budget"
                break
            yield ev
            if isinstance(ev, RunFinished):
                self.records.append(ev.record)
                self.budget.spent_tokens += ev.record.n_generated or 0
                done += 1
        self.budget.runs += done  # a run's time without the quiet-moment waits before it (they end with the budget)
        self.budget.run_s += self.clock() - t0 - ((self.gate.waited - waited0) if self.gate is not None else 0.0)
        self.next_rep[task] += n
        for a in arms:
            self.reps[(task, a)] = self.reps.get((task, a), 0) + n

    def decide(self, final: bool = False, stopped: str = "") -> Decisions:
        """Where each task stands among its own candidates, and the mix (a line of its own,
        ``MIX``) among its arms' weighted ratios, by the same rule (app.core.analysis.decide) on
        anytime intervals (it looks every round: app.core.analysis.anytime), each with about how
        long it needs; the task ratios read are kept (``latest``, fixed-sample: the mix combines them)."""
        ratios = self.latest = task_ratios(self.records)
        per_run = self.budget.per_run()
        out = []
        for t, arms in self.own.items():
            rs = self.seq[t] = {a: anytime(ratios.get(t, {}).get(a, Ratio(0, None, None, None, None, None)))
                                for a in arms}
            out.append(with_eta(decide_task(t, rs, self.precision, min_gain=self.min_gain), len(self.prompts[t]),
                                per_run))
        if self.mix_arms:  # the mix's sequence: its combined spread over its fewest-paired cell's pairs (mix_of)
            rs = self.seq[MIX] = {a: anytime(mix_of(ratios, a, self.weights)) for a in self.mix_arms}
            out.append(with_eta(decide_task(MIX, rs, self.precision, min_gain=self.min_gain), self.longest(), per_run))
        etas = [d.eta_s for d in out]
        eta = None if any(e is None for e in etas) else sum(e for e in etas if e is not None)
        return Decisions(tuple(out), self.budget.runs, self.budget.spent_tokens, self.budget.elapsed(), eta,
                         final, stopped)

    def mix_step(self, arm: Arm) -> tuple[str, Arm]:
        """Where a repetition of a mix arm shrinks the mix's interval most (on the ratios the last
        decisions were taken on): the task whose cell has the fewest pairs (the mix's interval takes
        that cell's t quantile), of equals the one that weighs most in its variance (weight² · se²)."""

        def need(t: str) -> tuple[float, float]:
            r = self.latest.get(t, {}).get(arm)
            if r is None or r.log_se is None:
                return (math.inf, math.inf)
            return (-float(r.n_pairs), self.weights[t] ** 2 * r.log_se ** 2)

        return max(self.weights, key=need), arm

    def finish(self, final: Decisions) -> Generator[Event, None, None]:
        """Why the sweep stopped and where each line stands, the pick for the mix (the arm measured on
        every task with the best mix estimate, only when reliably faster), and the result."""
        lines = [describe(d, final=True) for d in final.tasks]
        why = {"decided": "every task (and the mix) is decided" if self.mix_arms else "every task is decided",
               "budget": "the budget is spent",
               "max_reps": f"the cap of {self.max_reps} repetitions of a candidate is reached"}.get(
            self.stopped, self.stopped)
        yield AdaptiveStage("done", f"stopped: {why} after {final.runs} runs, {final.tokens} tokens, "
                            f"{final.elapsed_s:.0f} s; " + "; ".join(lines), tuple(self.cands))
        common = [a for a in self.cands if all(a in self.per_task[t] for t in self.weights)]
        est = {a: anytime(r) for a, r in estimated(self.latest, common, self.weights).items()}  # as decided
        pick = max(est, key=lambda a: est_of(est[a])) if est else None
        if pick is not None and est[pick].verdict != "faster":
            yield AdaptiveStage("done", f"no candidate is reliably faster for the mix (best {pick.label} "
                                f"{est_of(est[pick]):.2f}x, {est[pick].verdict}): leave MTP off")
            pick = None
        else:
            yield AdaptiveStage("done", f"pick for the mix: {pick.label}" if pick else "leave MTP off")
        yield AdaptiveResult(pick, tuple(self.records), self.cost, len(self.records), final)
