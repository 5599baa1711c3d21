"""The one clock of a flow: every front end (the Start page, the Sweep tab, the status bar,
``mtp-tuner tune`` and ``bench``) reads the same ``FlowClock``, fed the session's events, so the
time left is one number wherever it is shown.

Before the start (``flow_estimate``): the runs the flow needs, each at the whole wall time a
run takes on this machine (``run_wall_s``: the gaps between the last sweep's recorded run
times, so the prompt, the decode, the server starts before a run, the drafter's cost and the
quiet-moment waits all count), else at the measured decode speed with a run's overhead; plus
the cost probe when none is recorded; never more than the budget.

While it runs (``FlowClock.observe``): after each run, the mean whole wall time of this sweep's
runs so far (from the first run's start to the last one's end, so every server start, warmup and
wait between them counts) times the runs left (a plain sweep's plan; a sweep run until decided:
fewer when its ``Decisions`` say so; the adaptive sweep: its own ``Decisions`` estimate). Between
runs it counts down, never below what the runs after the current one take, so it never says
"finishing" with runs to go; it is never more than the budget leaves, and never below zero."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import statistics
import time
from typing import TYPE_CHECKING, Callable, Iterable

from app.core.common.paths import same_path
from app.core.common.units import duration
from app.core.measure.events import RunFailed, RunFinished, RunStarted
from app.core.records.cost import CostRecord
from app.core.records.schema import RunRecord
from app.core.session.events import Decisions

if TYPE_CHECKING:
    from app.core.session.request import SweepRequest

PILOT_TOKENS = 48  # the adaptive sweep's pilot: one short run per task
FIRST_REPS = 2  # the first round's repetitions (baseline and two widths per prompt)
PROBE_S = 45.0  # a cost probe on a CPU when none is recorded (the demo's, measured on 2 cores)
RUN_OVERHEAD = 1.3  # a run's time over its tokens' decode time (the prompt, sampling, the runner's own)
SERVER_START_S = 5.0  # a llama-server start, when no sweep of the model is recorded (SmolLM2 on 2 cores: 2-6 s)


def _last_sweep_times(model: str, records: Iterable[RunRecord]) -> list[float]:
    """The recorded times (``timestamp_utc``, seconds) of the runs of ``model``'s latest sweep, in order."""
    mine = [r for r in records if same_path(r.model_path, model)]
    if not mine:
        return []
    last = mine[-1].sweep_id
    return sorted(t for r in mine if r.sweep_id == last and (t := _when(r.timestamp_utc)) is not None)


def run_wall_s(model: str, records: Iterable[RunRecord]) -> float | None:
    """The whole wall time of one run of ``model`` here: the mean gap between consecutive
    recorded runs of its latest sweep (their ``timestamp_utc``: everything between one run's end
    and the next's, server starts, warmups and waits included: a median would leave out exactly
    those rare long gaps, and a demo Tune of 45 s read "about 12 s here"); None with fewer than
    two runs."""
    times = _last_sweep_times(model, records)
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (times[-1] - times[0]) / (len(times) - 1)


def last_sweep_s(model: str, records: Iterable[RunRecord]) -> float | None:
    """How long ``model``'s latest recorded sweep took here, its first run to its last plus one
    run more, when it was a sequential one (its runs record a ``min_gain``: an adaptive sweep, or
    one until decided); None: none such, or fewer than two runs recorded."""
    records = list(records)
    mine = [r for r in records if same_path(r.model_path, model)]
    if not mine or mine[-1].min_gain is None:
        return None
    times = _last_sweep_times(model, records)
    per_run = run_wall_s(model, records)
    return None if per_run is None else times[-1] - times[0] + per_run


def flow_estimate(request: SweepRequest, probe: CostRecord | None, records: Iterable[RunRecord]) -> float | None:
    """Seconds the flow of ``request`` is expected to take here (None: no sweep or speed of its
    model is known and it has no budget): its runs at ``run_wall_s`` (else at the decode speed,
    with a server start per arm on llama-server), the pilot and the probe for an adaptive
    sweep; at most its budget."""
    records = list(records)
    plan = request.plan
    budget = request_budget(request)[0]
    run_s = run_wall_s(plan.model, records)
    extra = 0.0
    if run_s is None:
        speed = tok_s_known(plan.model, probe, records)
        if speed is None:
            return budget
        run_s = plan.n_predict / speed[0] * RUN_OVERHEAD
        if plan.engine.value == "server":
            extra = SERVER_START_S * len(plan.arms)
    if request.adaptive is None:
        need = extra + ((planned_runs(request) or plan.total_runs) + plan.warmup * len(plan.arms)) * run_s
    else:
        tasks = len({p.task for p in plan.prompts})
        need = extra + (0.0 if probe is not None else PROBE_S) + tasks * run_s * PILOT_TOKENS / plan.n_predict
        need += 2 * FIRST_REPS * len(plan.prompts) * 3 * run_s  # a first round, and as much again to decide
        last = last_sweep_s(plan.model, records)  # the adaptive sweep of this model here took this long before
        need = max(need, last) if last is not None else need
    return min(need, budget) if budget else need


def estimate_source(model: str, probe: CostRecord | None, records: Iterable[RunRecord]) -> str | None:
    """What flow_estimate's time per run is from, in words (None: nothing known of ``model``)."""
    records = list(records)
    if run_wall_s(model, records) is not None:
        return "each run as long as the last sweep's here, server starts and waits included"
    speed = tok_s_known(model, probe, records)
    if speed is None:
        return None
    return f"at {speed[0]:.0f} tok/s, {speed[1]}, with each run's overhead and the warmups"


def planned_runs(request: SweepRequest) -> int | None:
    """The measured runs a request plans (None: known only as it goes: the adaptive sweep's, an
    axis sweep's settings'); a resumed sweep's: the runs it measures again."""
    if request.adaptive is not None or request.axes or request.placements:
        return None
    return request.resume.runs if request.resume is not None else request.plan.total_runs


def request_budget(request: SweepRequest) -> tuple[float | None, float | None]:
    """The time budget of ``request`` and the clock reading it counts from (None, None: none)."""
    if request.adaptive is not None:
        return request.adaptive.budget_s, request.adaptive.started
    return request.budget_s, request.started


def flow_clock(request: SweepRequest, estimate_s: float | None,
               clock: Callable[[], float] = time.monotonic) -> FlowClock:
    """The one clock of ``request``'s flow (``estimate_s``: flow_estimate's, before the start)."""
    budget, started = request_budget(request)
    return FlowClock(estimate_s, budget, planned=planned_runs(request), clock=clock, t0=started or 0.0)


@dataclasses.dataclass
class FlowClock:
    """One flow's counter and countdown (see the module). ``estimate_s``: the estimate before the
    start (None: unknown); ``budget_s``: the most the flow takes (None: until decided);
    ``planned``: the measured runs planned (None: unknown, the adaptive sweep)."""

    estimate_s: float | None
    budget_s: float | None
    planned: int | None = None
    clock: Callable[[], float] = time.monotonic
    t0: float = dataclasses.field(default=0.0)
    runs: int = 0  # runs started, every stage
    done: int = 0  # measured runs ended (finished or failed)
    walls: list[float] = dataclasses.field(default_factory=list)  # each ended run's whole wall time
    _left_s: float | None = None  # the latest estimate of what is left ...
    _at: float = 0.0  # ... and when it was made
    _floor_s: float = 0.0  # what the runs after the current one take at least (the countdown's floor)
    _mark: float | None = None  # when the last run ended (or the first one started)
    _eta: tuple[float, float] | None = None  # the sweep's own estimate to decide, and when it came
    _decided: bool = False

    def __post_init__(self) -> None:
        self.t0 = self.t0 or self.clock()
        self._left_s, self._at = self.estimate_s, self.t0
        if self.estimate_s and self.planned:
            self._floor_s = self.estimate_s / self.planned * (self.planned - 1)

    def observe(self, ev: object) -> None:
        """Learn from one session event: a run started or ended, the sweep's own ``Decisions``."""
        if isinstance(ev, RunStarted):
            if not ev.warmup:
                self.run_started()
        elif isinstance(ev, (RunFinished, RunFailed)):
            self.run_ended()
        elif isinstance(ev, Decisions):
            self._decided = ev.decided
            self.estimate(ev.eta_s)

    def run_started(self) -> int:
        """Count a run (any stage's); its number in the whole flow."""
        self.runs += 1
        if self._mark is None:
            self._mark = self.clock()
        return self.runs

    def run_ended(self) -> None:
        """A measured run ended: its whole wall time (since the previous one ended) is learned."""
        now = self.clock()
        self.walls.append(now - (self._mark if self._mark is not None else self.t0))
        self._mark = now
        self.done += 1
        self._reestimate(now)

    def estimate(self, eta_s: float | None) -> None:
        """The sweep's own estimate of the time to decide (a Decisions' eta_s; None: unknown)."""
        if eta_s is not None:
            self._eta = (eta_s, self.clock())
            self._reestimate(self._eta[1])

    def per_run(self) -> float | None:
        """The mean whole wall time of this sweep's runs so far (None: none ended)."""
        return statistics.fmean(self.walls) if self.walls else None

    def _reestimate(self, now: float) -> None:
        per_run = self.per_run()
        by_runs = None
        if self.planned is not None and per_run is not None:
            by_runs = max(0, self.planned - self.done) * per_run
        eta = None if self._eta is None else self._eta[0] - (now - self._eta[1])
        known = [x for x in (by_runs, eta) if x is not None]
        if not known:
            return
        left = min(known)
        self._left_s, self._at = left, now
        # the countdown's floor: what the runs after the current one take (none once decided)
        self._floor_s = 0.0 if self._decided else max(0.0, left - (per_run or left))

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float | None:
        """Seconds left, counted down since the latest estimate (never below what the runs after
        the current one take), at most what the budget leaves; never below zero (None: unknown)."""
        now = self.clock()
        left = None if self._left_s is None else max(self._left_s - (now - self._at), self._floor_s)
        if self.budget_s is not None:
            by_budget = self.budget_s - (now - self.t0)
            per_run = self.per_run()
            if self.planned is not None and per_run and self._mark is not None:
                # a plain sweep starts no run that would end past the budget: it stops after the runs that fit
                fit = int(max(0.0, self.budget_s - (self._mark - self.t0)) // per_run)
                by_budget = min(by_budget, self._mark + fit * per_run - now)
            left = by_budget if left is None else min(left, by_budget)
        return None if left is None else max(0.0, left)

    def line(self) -> str:
        """"run 23 of 54, 41 s, about 50 s left" (the last part once known; "finishing" at zero)."""
        left = self.left()
        of = f" of {max(self.planned, self.runs)}" if self.planned else ""
        head = f"run {self.runs}{of}, {duration(self.elapsed())}" if self.runs else duration(self.elapsed())
        if left is None:
            return head
        return f"{head}, " + (f"{duration(left, 'about')} left" if left >= 1 else "finishing")


def runs_left_s(done: int, total: int, elapsed_s: float) -> float | None:
    """A plain sweep's time left from its runs so far (None: none finished); never negative,
    also when re-runs of disturbed runs take it past the runs planned."""
    if not done:
        return None
    return max(0.0, elapsed_s / done * (max(total, done) - done))


def _when(stamp: str) -> float | None:
    try:
        return _dt.datetime.fromisoformat(stamp).timestamp()
    except (TypeError, ValueError):
        return None


def tok_s_known(model: str, probe: CostRecord | None, records: Iterable[RunRecord]) -> tuple[float, str] | None:
    """A decode speed for this model: the cost probe's single-token decode, else the median
    baseline of the last sweep of it; with where it came from. None when neither is known."""
    if probe is not None and same_path(probe.model_path, model) and 1 in probe.t_ms and probe.t_ms[1].median > 0:
        return 1000.0 / probe.t_ms[1].median, "the cost probe's speed"
    base = [r.tok_s for r in records if r.status == "ok" and r.arm_kind == "baseline" and r.tok_s
            and same_path(r.model_path, model)]
    if base:
        return statistics.median(base), "the last sweep's baseline speed"
    return None
