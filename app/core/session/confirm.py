"""The confirm run: the verdict's pick against the plain command, paired, on a real llama-server
with the engine settings of the sweeps, at the setting the verdict judged (its sampler, thinking
switch and context depth), on the prompts of the task the sweep measured it on (at least
stats.MIN_PAIRS pairs, so that there is an interval); what it timed in words (``confirm_headline``:
the arm, the task, its speedup with its 95 % interval, beside the sweep's), its speeds beside the
sweep's (``confirm_text``), and its progress as it goes (``ConfirmProgress``): one source of
words for ``recommend --confirm`` and the Export tab's Confirm.

``confirm_request`` is the one request both front ends make (``recommend --confirm``, the Export
tab's Confirm): strict modes (a mode llama-server cannot run is one line before any run), and
the RPC workers the user names now, never those the results file names (session.resume's
where_problem refuses a split sweep whose workers are not named again)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

from app.core.analysis.analysis import analyze
from app.core.analysis.disturbed import is_disturbed
from app.core.analysis.findings import clock_off, untimed
from app.core.analysis.recommend import Pick
from app.core.analysis.stats import MIN_PAIRS, Ratio
from app.core.common.errors import UserError
from app.core.engines.base import EngineKind, EngineSettings
from app.core.common.text import shown
from app.core.measure.plan import Plan, known_prompts, planned_counts
from app.core.records.arm import Arm
from app.core.records.sampler import Sampler, greedy
from app.core.records.schema import RunRecord
from app.core.verdict.export import recorded_sampler
from app.core.session.events import EngineReady, QuietWait, RunFailed, RunFinished, RunStarted, SweepStarted
from app.core.session.request import SweepRequest
from app.core.session.resume import where_problem
from app.core.verdict.verdict import Verdict
from app.core.verdict.workers import recorded_workers

NO_PICK = "no recommendation yet: run a sweep or open one"
AGREE = 0.10  # within this share of the sweep's speed, llama-server runs it at the sweep's speed
MAX_PROMPTS = 3  # of the task's prompts the sweep measured, the confirm run times at most these


@dataclasses.dataclass(frozen=True)
class ConfirmPlan:
    """One run of the pick on llama-server, and what the sweep measured for it."""

    plan: Plan  # the plain command and the pick (the pick alone when it is to leave it off), paired
    arm: Arm
    task: str
    prompt_id: str  # the first of the prompts it times (``plan.prompts``)
    sweep_engine: EngineKind | str  # as the records say it ("inprocess", "server")
    sweep_tok_s: float  # the sweep's median speed of this arm on this prompt
    speedup: float | None = None  # the pick's measured speedup (None: leave it off, or no estimate)

    @property
    def prompts_said(self) -> str:
        """"the code prompts c1, c2" (the task's prompts it times)."""
        ids = [p.id for p in self.plan.prompts]
        return f"the {self.task} prompt{'s' if len(ids) > 1 else ''} {', '.join(shown(i, 40) for i in ids)}"


def confirm_plan(verdict: Verdict | None, prompt_file: str | None = None, task: str | None = None) -> ConfirmPlan:
    """The confirm run of ``verdict``'s pick for the mix (or for ``task``), on the task the mix
    weighs most, at the judged setting. A UserError when there is nothing to confirm."""
    if verdict is None:
        raise UserError(NO_PICK)
    if task is None:
        pick: Pick | None = verdict.pick
        task = max(verdict.mix, key=lambda t: verdict.mix[t])
    else:
        pick = next((p for p in verdict.per_task if p.scope == task), None)
    if pick is None:
        raise UserError(f"the sweep has no verdict for {task!r}")
    arm = pick.arm or Arm()
    swept = [r for r in verdict.records if r.status == "ok" and r.task == task and r.measured_arm == arm]
    if not swept:
        raise UserError(f"the sweep has no finished {arm.label} run on {task}")
    first = swept[0]
    too_many = planned_counts(first)  # the file's counts size the run: bounded first
    if too_many:
        raise UserError(f"the sweep's run {shown(first.run_id, 40)}: {too_many}; it is not confirmed")
    pid = first.prompt_id
    model = verdict.records[-1].model_path
    ids = list(dict.fromkeys(r.prompt_id for r in swept))[:MAX_PROMPTS]
    known = {q.id: q for q in known_prompts(model, prompt_file).values()}
    if pid not in known:
        raise UserError(f"prompt {pid!r} of the sweep is no longer in the suites")
    prompt = [known[i] for i in ids if i in known]
    # greedy for files from before the sampler settings
    sampler = recorded_sampler(verdict.records) or (
        Sampler.from_dict(first.sampling) if arm.probabilistic and "top_k" in (first.sampling or {})  # its own, > 0
        else greedy(int((first.sampling or {}).get("seed", 42))))
    arms = (Arm(), arm) if arm.is_spec else (arm,)  # the pick beside the plain command: a speedup of its own
    plan = Plan(model=model, arms=arms, prompts=tuple(prompt), engine=EngineKind.SERVER, n_predict=first.n_predict,
                reps=math.ceil(MIN_PAIRS / len(prompt)), warmup=1, samplers=(sampler,), thinking=(first.thinking,), depths=(first.depth,),
                raw=bool((first.sampling or {}).get("raw", False)))
    speeds = [r.tok_s for r in swept if r.prompt_id == pid and r.tok_s and not clock_off(r)]
    return ConfirmPlan(plan, arm, task, pid, first.engine, statistics.median(speeds) if speeds else 0.0,
                       pick.ratio.estimate if pick.arm is not None and pick.ratio is not None else None)


def confirm_request(verdict: Verdict | None, settings: EngineSettings, prompt_file: str | None = None,
                    task: str | None = None) -> tuple[ConfirmPlan, SweepRequest]:
    """The confirm run of ``verdict``'s pick (confirm_plan) as a prepared session request on
    llama-server with the user's ``settings`` (the workers in them are those named now), strict
    modes and no results file. A UserError when there is nothing to confirm, or the sweep was
    split over workers the user did not name again (or ran here and workers are named)."""
    from app.core.session.sweep import prepare  # the session's pre-checks (and engines): only when asked

    problem = (where_problem(recorded_workers(verdict.records), bool(settings.rpc), "confirm it")
               if verdict is not None else None)
    if problem:
        raise UserError(problem)
    c = confirm_plan(verdict, prompt_file, task)
    settings = dataclasses.replace(settings, kind=EngineKind.SERVER)
    return c, prepare(SweepRequest(c.plan, settings, keep_results=False, strict_modes=True)).request


def _timed(c: ConfirmPlan, records: Sequence[RunRecord]) -> tuple[Ratio | None, float | None, float | None]:
    """The confirm run's paired speedup of the pick (None: it timed no speculative arm) and the
    median speeds of the pick and of the plain command it timed (None: none finished)."""
    a = analyze([r for r in records if r.task == c.task])
    pick, plain = a.cell(c.task, c.arm), a.cell(c.task, Arm())
    return (pick.ratio if pick is not None else None, pick.tok_s.median if pick is not None else None,
            plain.tok_s.median if plain is not None and c.arm.is_spec else None)


def confirm_headline(c: ConfirmPlan, records: Sequence[RunRecord]) -> str:
    """What the confirm run timed, in one sentence, and nothing else: "llama-server timed K=2 on the
    code prompts c1, c2, c3: 1.29x, 95 % CI 1.20-1.38 (3 pairs against the plain command); the sweep
    measured 1.31x: within it". With too few pairs for an interval, it says so."""
    ratio, tok_s, _plain = _timed(c, records)
    what = f"llama-server timed {c.arm.label} on {c.prompts_said}"
    if tok_s is None:
        return f"llama-server could not time {c.arm.label} on {c.prompts_said}: {_why_none(records)}"
    if not c.arm.is_spec:  # to leave it off: the plain command's speed, no speedup to time
        sweep = f"; the sweep measured {c.sweep_tok_s:.1f} tok/s" if c.sweep_tok_s else ""
        return f"{what}: {tok_s:.1f} tok/s (no speedup timed: the pick is to leave it off){sweep}"
    sweep = f"the sweep measured {c.speedup:.2f}x" if c.speedup is not None else ""
    if ratio is None or ratio.estimate is None:
        return f"{what}: no pair of it and the plain command finished, so no speedup was timed"
    if ratio.lo is None or ratio.hi is None:
        return (f"{what}: {ratio.estimate:.2f}x on {ratio.n_pairs} pair against the plain command, too few runs "
                f"for an interval{'; ' + sweep if sweep else ''}")
    where = ""
    if c.speedup is not None:
        where = (": within it" if ratio.lo <= c.speedup <= ratio.hi
                 else ": above it" if c.speedup > ratio.hi else ": below it")
    return (f"{what}: {ratio.estimate:.2f}x, 95 % CI {ratio.lo:.2f}-{ratio.hi:.2f} ({ratio.n_pairs} pairs against "
            f"the plain command){'; ' + sweep + where if sweep else ''}")


def confirm_text(c: ConfirmPlan, records: Sequence[RunRecord]) -> str:
    """The confirm run's speeds next to the sweep's, and what they mean."""
    if not records:
        return "the confirmation run did not finish"
    ok = [r for r in map(untimed, records) if r.status == "ok" and r.tok_s]  # a burst's speed is none
    if not ok:
        return f"the llama-server run failed: {records[0].error or _why_none(records)}"
    _ratio, tok_s, plain = _timed(c, records)
    busy = [r.tok_s for r in ok if is_disturbed(r) and r.measured_arm == c.arm and r.tok_s]
    if tok_s is None and busy:  # its speeds all the same, marked, beside the sweep's
        return (f"llama-server ({ok[0].llama_build}) ran {c.arm.label} on {c.task} at {statistics.median(busy):.1f} "
                f"tok/s in disturbed runs (not counted); the sweep ({c.sweep_engine}) measured "
                f"{c.sweep_tok_s:.1f} tok/s on {c.task}/{c.prompt_id} (median)")
    if tok_s is None:
        failed = next((r for r in records if r.measured_arm == c.arm and r.status != "ok"), None)
        return f"the llama-server run of {c.arm.label} failed: {(failed.error if failed else None) or 'no speed measured'}"
    rec = next(r for r in ok if r.measured_arm == c.arm)
    acc = [r.acceptance for r in ok if r.measured_arm == c.arm and r.acceptance is not None]
    accs = f", acceptance {100 * statistics.median(acc):.1f} %" if acc else ""
    base = f" (the plain command {plain:.1f} tok/s)" if plain is not None else ""
    head = (f"llama-server ({rec.llama_build}), {c.arm.label} on {c.task}: {tok_s:.1f} tok/s{accs}{base}; the sweep "
            f"({c.sweep_engine}) measured {c.sweep_tok_s:.1f} tok/s on {c.task}/{c.prompt_id} (median)")
    if not c.sweep_tok_s:
        return head
    ratio = tok_s / c.sweep_tok_s
    if abs(ratio - 1) <= AGREE:
        what = "llama-server runs it at the sweep's speed: the measurement holds there"
    elif c.sweep_engine == EngineKind.SERVER:
        what = (f"llama-server ran it {ratio:.2f}x the sweep's speed this time: the machine's load or state changed "
                "since the sweep; run the sweep again if it stays so")
    else:
        what = (f"llama-server runs it at {ratio:.2f}x the in-process sweep's speed (another build, device or "
                "thread setting); the speedups were measured in process, so sweep on llama-server to price "
                "it there")
    return f"{head}. {what}"


def _why_none(records: Sequence[RunRecord]) -> str:
    """Why the confirm run timed nothing: its runs failed, or other programs disturbed them."""
    ok = [r for r in records if r.status == "ok" and r.tok_s]
    busy = [r for r in ok if is_disturbed(r)]
    burst = [r for r in records if r.status == "ok" and clock_off(r)]
    if burst:
        return (f"in {len(burst)} of {len(records)} runs the tokens arrived in bursts, so their speed timed the "
                "reading, not the decoding; close other programs and confirm again")
    if busy:
        return (f"{len(busy)} of {len(records)} runs were disturbed by other programs, so none counts; close them "
                "and confirm again")
    return "no run finished"


class ConfirmProgress:
    """The confirm run's progress in words, from its events ("llama-server: 3 of 6 runs"): ``see``
    returns the line to show for an event (None: nothing new)."""

    def __init__(self, c: ConfirmPlan, wait_every_s: float = 0.0) -> None:
        self.c = c
        self.total = c.plan.total_runs
        self.done = 0
        self.wait_every_s = wait_every_s  # a wait for a quiet moment said at most this often (a terminal's lines)
        self._waited: float | None = None

    def see(self, ev: object) -> str | None:
        c = self.c
        if isinstance(ev, EngineReady):
            return f"llama-server: starting, {c.arm.label} on {c.prompts_said}"
        if isinstance(ev, SweepStarted):
            self.total = ev.total_runs
            return None
        if isinstance(ev, RunStarted):
            if ev.warmup:
                return f"llama-server: warming up {ev.arm.label} ({self.done} of {self.total} runs)"
            return f"llama-server: {self.done} of {self.total} runs, now {ev.arm.label} on {ev.task}/{shown(ev.prompt_id, 40)}"
        if isinstance(ev, (RunFinished, RunFailed)):
            self.done += 1
            return f"llama-server: {self.done} of {self.total} runs"
        if isinstance(ev, QuietWait):
            if self._waited is not None and self._waited <= ev.waited_s < self._waited + self.wait_every_s:
                return None
            self._waited = ev.waited_s
            return f"llama-server: {self.done} of {self.total} runs; {ev.text()}"
        return None
