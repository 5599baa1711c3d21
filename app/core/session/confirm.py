"""The confirm run: the verdict's pick, once, on a real llama-server with the engine settings of
the sweeps, at the setting the verdict judged (its sampler, thinking switch and context depth) and
on a prompt the sweep measured; and what its speed says next to the sweep's.

``confirm_request`` is the one request both front ends make (``recommend --confirm``, the Export
tab's Confirm): strict modes (a mode llama-server cannot run is one line before any run), and
the RPC workers the user names now, never those the results file names (session.resume's
where_problem refuses a split sweep whose workers are not named again)."""

from __future__ import annotations

import dataclasses
import statistics

from app.core.analysis.recommend import Pick
from app.core.common.errors import UserError
from app.core.engines.base import EngineKind, EngineSettings
from app.core.common.text import shown
from app.core.measure.plan import Plan, known_prompts, planned_counts
from app.core.records.arm import Arm
from app.core.records.sampler import Sampler, greedy
from app.core.records.schema import RunRecord
from app.core.verdict.export import recorded_sampler
from app.core.session.request import SweepRequest
from app.core.session.resume import where_problem
from app.core.verdict.verdict import Verdict
from app.core.verdict.workers import recorded_workers

NO_PICK = "no recommendation yet: run a sweep or open one"
AGREE = 0.10  # within this share of the sweep's speed, llama-server confirms it


@dataclasses.dataclass(frozen=True)
class ConfirmPlan:
    """One run of the pick on llama-server, and what the sweep measured for it."""

    plan: Plan
    arm: Arm
    task: str
    prompt_id: str
    sweep_engine: EngineKind | str  # as the records say it ("inprocess", "server")
    sweep_tok_s: float  # the sweep's median speed of this arm on this prompt
    speedup: float | None = None  # the pick's measured speedup (None: leave it off, or no estimate)


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
    prompt = [q for q in known_prompts(model, prompt_file).values() if q.id == pid]
    if not prompt:
        raise UserError(f"prompt {pid!r} of the sweep is no longer in the suites")
    # greedy for files from before the sampler settings
    sampler = recorded_sampler(verdict.records) or (
        Sampler.from_dict(first.sampling) if arm.probabilistic and "top_k" in (first.sampling or {})  # its own, > 0
        else greedy(int((first.sampling or {}).get("seed", 42))))
    plan = Plan(model=model, arms=(arm,), prompts=tuple(prompt), engine=EngineKind.SERVER, n_predict=first.n_predict,
                reps=1, warmup=1, samplers=(sampler,), thinking=(first.thinking,), depths=(first.depth,),
                raw=bool((first.sampling or {}).get("raw", False)))
    speeds = [r.tok_s for r in swept if r.prompt_id == pid and r.tok_s]
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


def confirm_headline(c: ConfirmPlan, record: RunRecord | None) -> str:
    """The confirm run in one sentence: whether llama-server confirms the sweep's measurement."""
    if record is None or record.status != "ok" or not record.tok_s or not c.sweep_tok_s:
        return "llama-server could not confirm it: the run did not finish"
    ratio = record.tok_s / c.sweep_tok_s
    what = (f"{c.speedup:.2f}x faster with these flags" if c.speedup is not None and c.arm.is_spec
            else "the plain command's speed")
    if abs(ratio - 1) <= AGREE:
        return f"llama-server confirms: {what}, as measured"
    return (f"llama-server does not confirm {what}: it ran {c.arm.label} at {ratio:.2f}x the sweep's speed "
            f"({record.tok_s:.1f} vs {c.sweep_tok_s:.1f} tok/s)")


def confirm_text(c: ConfirmPlan, record: RunRecord | None) -> str:
    """The confirm run's result next to the sweep's, and what it means."""
    if record is None:
        return "the confirmation run did not finish"
    if record.status != "ok" or not record.tok_s:
        return f"the llama-server run failed: {record.error or 'no speed measured'}"
    acc = f", acceptance {100 * record.acceptance:.1f} %" if record.acceptance is not None else ""
    head = (f"llama-server ({record.llama_build}), {c.arm.label} on {c.task}/{c.prompt_id}: {record.tok_s:.1f} tok/s"
            f"{acc}; the sweep ({c.sweep_engine}) measured {c.sweep_tok_s:.1f} tok/s (median)")
    if not c.sweep_tok_s:
        return head
    ratio = record.tok_s / c.sweep_tok_s
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
