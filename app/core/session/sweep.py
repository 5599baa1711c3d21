"""The one owner of a sweep: ``prepare`` runs every pre-check once, ``run`` makes the engine and
the results writer, runs the plain or the adaptive sweep and closes both. Front ends build a
``SweepRequest`` and render the events."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Generator, Iterable

from app.core.analysis.recommend import parse_mix
from app.core.common import spec_modes
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError
from app.core.engines.base import EngineKind, default_threads
from app.core.engines.factory import gpu_layers_count, make_engine
from app.core.measure.axes import axis_settings, engine_for as axis_engine
from app.core.measure.placements import PLACEMENTS_NEED_WORKERS, placement_axis
from app.core.measure.threads import choose_threads
from app.core.measure.depth import ctx_for
from app.core.measure.plan import check_drafters
from app.core.measure.quiet import make_gate
from app.core.measure.runner import default_results_path, run_sweep
from app.core.records.arm import Arm
from app.core.common.atomic import check_writable
from app.core.records.schema import new_id
from app.core.records.writer import ResultsWriter
from app.core.session.adaptive import AdaptiveRun, adaptive_sweep
from app.core.session.memory import fit_arms
from app.core.session.budget import stated_cap
from app.core.session.probes import reusable_probe
from app.core.session.until import rounds_until_decided
from app.core.session.events import (AdaptiveResult, AdaptiveStage, EngineReady, Event, RunFailed, RunFinished,
                                     SessionFinished, SweepError, SweepFinished, SweepWarning)
from app.core.session.request import MIN_PROMPT_ROOM, Prepared, SweepRequest
from app.core.session.resume import resume_lock
from app.core.session.rpc import RPC_ENGINE, checked_workers, link_of, local_workers


USER_COMMAND_ENGINE = ("engine: llama-server, for your own llama-server command (the in-process engine cannot "
                       "take its flags)")
AXES_ENGINE = "engine: llama-server, for the --axis flags (the in-process engine cannot take server flags)"


def engine_for(arms: Iterable[Arm]) -> tuple[EngineKind, str | None]:
    """The engine when none is chosen: in-process, unless an arm needs llama-server; then every arm
    runs there, so that each pair compares like with like. With the sentence that says so."""
    arms = list(arms)
    needs = spec_modes.server_only((a.mode, a.drafter) for a in arms)
    if any(a.probabilistic for a in arms):
        needs.append("probabilistic draft sampling")
    if not needs:
        return EngineKind.INPROCESS, None
    return EngineKind.SERVER, (f"engine: llama-server, for {', '.join(needs)} (the in-process engine runs only a "
                               "model's own MTP heads, drafting greedily); the baseline runs there too, so that "
                               "pairs compare like with like")


def prepare(request: SweepRequest) -> Prepared:
    """Every check before anything is loaded or written, each problem one line (UserError): the
    drafters against the model, the context for the tokens and depths, the GPU layers, the task mix,
    the adaptive sweep's arms, the engine for the modes, the results file, each arm's memory. Returns the request
    with its engine settings and destination fixed, and the notes to show."""
    plan = request.plan
    notes: list[str] = []
    check_drafters(plan)  # a drafter that does not pair with the model
    gpu_layers_count(request.engine.n_gpu_layers)  # a bad GPU layers text, for either engine
    asked_ctx = request.engine.ctx_size
    if asked_ctx and asked_ctx < plan.n_predict + MIN_PROMPT_ROOM:
        raise UserError(f"the context size {asked_ctx} is too small: {plan.n_predict} generated tokens plus a "
                        f"prompt need at least {plan.n_predict + MIN_PROMPT_ROOM}")
    ctx = ctx_for(asked_ctx, plan.depths, plan.n_predict)  # room for the deepest context
    if ctx != asked_ctx:
        notes.append(f"context size {ctx} (the context size {asked_ctx} is too small for depth {max(plan.depths)})")
    tasks = tuple(dict.fromkeys(p.task for p in plan.prompts))
    if request.mix:
        parse_mix(request.mix, tasks)
    if request.resume is not None and (request.adaptive is not None or request.until_decided):
        raise UserError("a resumed sweep measures again what its results file lacks; it is not adaptive")
    if request.resume is not None and (request.axes or request.placements):
        raise UserError("a resumed sweep measures again what its results file lacks, with the flags it ran with; "
                        "it takes no axes or placements")
    if request.budget_s is not None and (request.adaptive is not None or not request.until_decided):
        raise UserError("a time budget ends a sweep run until decided (an adaptive one takes its own)")
    if request.budget_s is not None and request.budget_s <= 0:
        raise UserError("the budget must be more than nothing (e.g. --budget 3m)")
    if request.adaptive is not None:
        if any(a.probabilistic for a in plan.arms):
            raise UserError("the adaptive sweep measures greedy draft sampling only; measure probabilistic "
                            "draft sampling with a plain sweep")
        if any(a.needs_server for a in plan.arms):
            raise UserError("the adaptive sweep measures the model's own MTP heads (draft-mtp) only; leave out "
                            "the other modes and the drafter")
        if not request.adaptive.ks:
            raise UserError("the adaptive sweep needs at least one draft width K")
        opts = request.adaptive
        if (opts.budget_s is not None and opts.budget_s <= 0) or (opts.budget_tokens is not None and opts.budget_tokens <= 0):
            raise UserError("the budget must be more than nothing (e.g. --budget 3m or --budget-tokens 10000)")
    if request.choose_engine:
        kind, note = engine_for(plan.arms)
        plan = dataclasses.replace(plan, engine=kind)
        if note:
            notes.append(note)
    if (request.engine.user_args is not None or request.axes) and plan.engine is not EngineKind.SERVER:
        plan = dataclasses.replace(plan, engine=EngineKind.SERVER)
        notes.append(USER_COMMAND_ENGINE if request.engine.user_args is not None else AXES_ENGINE)
    workers = checked_workers(request.engine, request.rpc_local)
    if request.placements and not (workers or request.rpc_local):  # with them, llama-server (RPC_ENGINE)
        raise UserError(PLACEMENTS_NEED_WORKERS)
    if (workers or request.rpc_local) and plan.engine is not EngineKind.SERVER:
        plan = dataclasses.replace(plan, engine=EngineKind.SERVER)
        notes.append(RPC_ENGINE)
    kind = plan.engine
    out = request.out
    if request.keep_results:
        # checked now; a file is written only once a run finishes (an unused default file is removed
        # when the writer closes)
        out = check_writable(Path(out)) if out is not None else default_results_path(plan.model)
    engine = dataclasses.replace(request.engine, kind=kind, ctx_size=ctx, rpc=workers,
                                 server_bin=request.engine.server_bin if kind is EngineKind.SERVER else None)
    adaptive = request.adaptive
    if not request.axes and not request.placements:  # an axis sweep fits each setting's arms with its own flags
        plan, adaptive = fit_arms(plan, engine, request.memory_limit, adaptive,  # before any arm starts
                                  server_args=request.engine.user_args or ())
    if engine.threads is None and default_threads() is None:  # the user chose none: the free cores
        threads, note = choose_threads()
        if threads is not None and note is not None:
            engine = dataclasses.replace(engine, threads=threads)
            notes.append(note)
    return Prepared(dataclasses.replace(request, plan=plan, engine=engine, out=out, adaptive=adaptive), tuple(notes))


def run(request: SweepRequest, cancel: CancelToken | None = None) -> Generator[Event, None, None]:
    """Run a prepared request: make the results writer and the engine, run the plain or the
    adaptive sweep, close both; yields the sweep's events, ``EngineReady`` first and
    ``SessionFinished`` last. A results file or engine that cannot be made is a UserError before
    any event; closing the generator early (a cancel, Ctrl+C) closes both too. RPC workers of our
    own (``rpc_local``) are started first and stopped last, however the sweep ends. A resumed
    sweep holds its results file's resume lock throughout (session.resume.resume_lock: a second
    resume of the file is a UserError before any event)."""
    cancel = cancel or CancelToken()
    with resume_lock(request), local_workers(request) as request:
        if request.placements:  # the workers are up: their devices can be named
            axis, left_out = placement_axis(request.placements, model=request.plan.model, rpc=request.engine.rpc,
                                            server_bin=request.engine.server_bin,
                                            drafter=any(a.drafter for a in request.plan.arms))
            for why in left_out:
                yield SweepWarning(why)
            request = dataclasses.replace(request, axes=(*request.axes, axis), placements=())
        if request.axes:
            yield from _each_axis_setting(request, cancel)
        else:
            yield from _session(request, cancel)


def _session(request: SweepRequest, cancel: CancelToken) -> Generator[Event, None, None]:
    """run's sweep with one setting of the engine; the RPC workers (if any) timed before its first
    server starts and after its engine closed (app.core.session.rpc)."""
    plan = request.plan
    writer = ResultsWriter(request.out) if request.keep_results and request.out is not None else None
    n_ok = n_failed = 0
    errors: list[str] = []
    cancelled = False
    result: AdaptiveResult | None = None
    sweep_id: str | None = None  # of the runs written, for the RPC workers' line after them
    try:
        link = link_of(request.engine)  # before any server holds the workers
        engine = make_engine(request.engine)
    except BaseException:
        if writer is not None:
            writer.close()
        raise
    field = link.field if link is not None else None  # the workers' round trips, for every run record
    with contextlib.closing(engine):
        try:
            if request.strict_modes:  # one line before any run (the window drops those arms instead)
                problem = next((p for a in plan.arms if a.needs_server and (p := engine.mode_problem(a))), None)
                if problem:
                    raise UserError(problem)
            yield EngineReady(engine.kind.value, engine.build, writer.path if writer else None, request.adaptive is not None)
            for why in plan.left_out:  # once, not per step of an adaptive sweep
                yield SweepWarning(why)
            gen: Generator[Event, None, None]
            if request.adaptive is not None:
                opts = request.adaptive
                yield AdaptiveStage("plan", stated_cap(max(opts.max_reps, 2), opts.budget_s, opts.budget_tokens))
                cost = None
                if not opts.reprobe:  # a recent probe of the same set-up: minutes saved on a CPU
                    left_out: list[str] = []  # cost records that are not (planted, damaged): said once each
                    cost, said, source = reusable_probe(plan, engine, opts.ks, problems=left_out,
                                                        extra=(request.out,) if request.out else ())
                    for why in left_out:
                        yield AdaptiveStage("probe", why)
                    if cost is not None:
                        if writer is not None and source != writer.path:  # the file prices its runs by itself
                            writer.append_line(cost.to_json())
                        yield AdaptiveStage("probe", said)
                gen = adaptive_sweep(dataclasses.replace(plan, arms=(plan.arms[0],)), engine, AdaptiveRun(
                    ks=opts.ks, p_mins=opts.p_mins, mix=request.mix, max_reps=max(opts.max_reps, 2), cost=cost,
                    writer=writer, cancel=cancel, budget_s=opts.budget_s, budget_tokens=opts.budget_tokens,
                    started=opts.started, gate=make_gate(), sweep_id=request.sweep_id, link=field,
                    min_gain=request.min_gain))
            elif request.until_decided:
                gen = rounds_until_decided(plan, engine, writer, cancel, request.mix, request.sweep_id, field,
                                           min_gain=request.min_gain, budget_s=request.budget_s,
                                           started=request.started)
            else:
                todo = request.resume
                gen = run_sweep(plan, engine, writer, cancel, gate=make_gate(),
                                sweep_id=todo.sweep_id if todo else request.sweep_id, only=todo.wanted if todo else None,
                                link=field)
            try:
                for ev in gen:
                    if isinstance(ev, RunFinished):
                        n_ok, sweep_id = n_ok + 1, ev.record.sweep_id
                    elif isinstance(ev, RunFailed):
                        n_failed, sweep_id = n_failed + 1, ev.record.sweep_id
                    elif isinstance(ev, SweepError):
                        errors.append(ev.message)
                    elif isinstance(ev, SweepFinished):
                        cancelled = cancelled or ev.cancelled
                    elif isinstance(ev, AdaptiveResult):
                        result = ev
                    yield ev
            except Cancelled:  # the adaptive planner's own checks between rounds
                cancelled = True
            finally:
                gen.close()
        finally:
            written = writer.count if writer is not None else 0
            if link is not None:  # timed again once the engine let the workers go: a line after the runs
                link.end(engine, writer if written else None, sweep_id)
            if writer is not None:
                writer.close()
    yield SessionFinished(writer.path if writer is not None and written else None, written, n_ok, n_failed,
                          cancelled or cancel.cancelled, tuple(errors), result)


def _each_axis_setting(request: SweepRequest, cancel: CancelToken) -> Generator[Event, None, None]:
    """The request once per setting of its axes, the reference first (measure.axes): each a whole
    session of the plan (its own baseline: the flag changes plain decoding too) on llama-server
    started with that setting's flags, its arms fitted in memory with them (an arm that would not
    fit is left out, said with the setting; a setting whose baseline does not fit is skipped), into
    the one results file and sweep; an adaptive sweep's budget shared equally by the settings. One
    ``SessionFinished`` at the end."""
    done: list[SessionFinished] = []
    settings = axis_settings(request.engine.user_args or (), request.axes)
    opts = request.adaptive
    if opts is not None:
        opts = dataclasses.replace(opts, started=None, budget_s=opts.budget_s and opts.budget_s / len(settings),
                                   budget_tokens=opts.budget_tokens and max(1, opts.budget_tokens // len(settings)))
    sweep_id = request.sweep_id or new_id()
    for args, label in settings:
        if cancel.cancelled:
            break
        engine = axis_engine(request.engine, args, request.axes)
        try:
            plan, adaptive = fit_arms(request.plan, engine, request.memory_limit, opts, server_args=args)
        except UserError as e:  # its baseline does not fit the memory given
            yield SweepWarning(f"{label}: skipped: {e}")
            continue
        plan = dataclasses.replace(plan, left_out=(*request.plan.left_out, *(
            f"{label}: {why}" for why in plan.left_out[len(request.plan.left_out):])))
        one = dataclasses.replace(request, plan=plan, axes=(), engine=engine, adaptive=adaptive, sweep_id=sweep_id)
        for ev in run(one, cancel):
            if isinstance(ev, SessionFinished):
                done.append(ev)
            else:
                yield ev
    path = next((d.results_path for d in done if d.results_path is not None), None)
    yield SessionFinished(path, sum(d.written for d in done), sum(d.n_ok for d in done),
                          sum(d.n_failed for d in done), cancel.cancelled or any(d.cancelled for d in done),
                          tuple(e for d in done for e in d.errors))
