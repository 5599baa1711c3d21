"""mtp-tuner bench: measure baseline vs MTP (and llama.cpp's other speculative modes) on prompt
suites (a plain or adaptive sweep, the demo, or a results file's sweep again)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Sequence

from app.cli.bench_resume import resume_request
from app.cli.bench_view import BenchView
from app.cli.common import EXIT_CANCELLED, PLAN_NAMES, load_sweep
from app.cli.options import (SAMPLER_VALUES, add_axes, add_drafter, add_engine, add_json, add_min_gain, add_ngl,
                             add_placements, add_rpc, add_sampler, add_server_bin, add_server_command, add_threads,
                             axes_of, duration, engine_settings_of, memory_size, min_gain_of, placements_of, rpc_of,
                             whole)
from app.core.calibrated.demo import DEMO_KS, DEMO_REPS, DEMO_TASK_P, DEMO_TOKENS, demo_model, demo_prompts
from app.core.common.cancel import CancelToken
from app.core.common.atomic import check_writable_dir
from app.core.common.errors import UserError
from app.core.common.spec_modes import MTP, needs_drafter, parts
from app.core.engines.base import EngineKind
from app.core.engines.chat_template import parse_thinking
from app.core.measure.depth import parse_depths
from app.core.measure.placements import placements_measured
from app.core.measure.plan import Plan, make_arms, parse_float_list, parse_int_list, plan_again, planned_counts
from app.core.measure.prompts import prompts_for
from app.core.records.arm import MODE_NAME
from app.core.records.schema import RunRecord
from app.core.records.sampler import Sampler, preset as sampler_preset
from app.core.session.clock import flow_clock, flow_estimate
from app.core.session.request import ADAPTIVE_KS, ADAPTIVE_MAX_REPS, AdaptiveOptions, SweepRequest
from app.core.session.sweep import prepare, run as session_run

DEFAULT_KS = "1,2,3,4"  # a plain sweep's draft widths (an adaptive one's: ADAPTIVE_KS)
PLAIN_REPS = 3  # a plain sweep's repetitions (an adaptive one runs until decided, at most ADAPTIVE_MAX_REPS)

NAME = "bench"
HELP = "measure baseline vs MTP (and the other speculative modes) on prompt suites"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="GGUF model file (the first part of a split GGUF)")
    src.add_argument("--demo", action="store_true",
                     help="make the tiny calibrated model and run a short sweep on it")
    p.add_argument("--again", metavar="RESULTS",
                   help="the sweep of that results file again (its arms, prompts, tokens, repetitions, "
                        "engine, and where drafting ran over RPC workers: name them with --rpc or --rpc-local), "
                        "e.g. after a llama.cpp update; then: mtp-tuner compare OLD NEW. "
                        "--model, --engine, --server-bin and --prompts still apply")
    p.add_argument("--resume", metavar="RESULTS",
                   help="finish that results file's sweep when the machine is quiet: its quiet runs are kept, "
                        "and only the runs that were disturbed, failed or missing are measured, into the same "
                        "file (--engine, --server-bin and --prompts still apply)")
    add_engine(p, None, help="inprocess: llama-cpp-python, one model load for the whole sweep (default); "
                             "server: a real llama-server process per configuration")
    add_server_bin(p)
    add_server_command(p)
    add_axes(p)
    add_placements(p)
    p.add_argument("--k", default=None,
                   help="draft widths K, e.g. 1,2,3,4 or 1-6 (default 1,2,3,4; with --adaptive 1-8)")
    p.add_argument("--p-min", default="0", help="draft p_min values, e.g. 0,0.5")
    p.add_argument("--modes", default=MTP,
                   help="speculative modes (llama.cpp --spec-type names), e.g. draft-mtp,ngram-mod or "
                        "draft-simple; modes joined by + run together (draft-mtp+ngram-mod: llama-server "
                        "--spec-type draft-mtp,ngram-mod); the draft-* modes run at each --k, the n-gram ones "
                        "once. Modes other than the model's own MTP heads run in llama-server")
    p.add_argument("--draft-sampling", default="greedy", metavar="greedy|probabilistic|greedy,probabilistic",
                   help="how the draft-* modes sample their drafts (llama-server's --spec-draft-sampling, b11368 "
                        "and later): probabilistic samples the draft and verifies by rejection sampling; "
                        "at temperature > 0 only; both: each K measured both ways (default greedy)")
    add_drafter(p)
    _prompt_arguments(p)
    add_sampler(p)
    _setting_arguments(p)
    _adaptive_arguments(p)


def _prompt_arguments(p: argparse.ArgumentParser) -> None:
    """Which prompts, how many tokens and runs."""
    p.add_argument("--tasks", default=None, help="task types, e.g. story,code,tongue-twister (the default) or edit "
                        "(text given in the prompt, repeated with a change: where n-gram modes pay)")
    p.add_argument("--prompts", help="your prompt file (JSON list or JSONL of {id, task, text})")
    p.add_argument("--replace-prompts", action="store_true",
                   help="use only the prompts of --prompts, not the built-in suites")
    p.add_argument("--per-task", type=whole(1), default=None, help="use the first N prompts of each task")
    p.add_argument("--raw", action="store_true", help="send prompt text as is (no chat template)")
    p.add_argument("--n-predict", type=whole(1), default=128, help="tokens to generate per run")
    p.add_argument("--reps", type=whole(1), default=None,
                   help=f"measured repetitions per prompt and arm (default {PLAIN_REPS}; --adaptive: the most "
                        f"repetitions of a candidate, default {ADAPTIVE_MAX_REPS}, said before it starts)")
    p.add_argument("--warmup", type=whole(0), default=1, help="unrecorded warmup runs per arm")


def _setting_arguments(p: argparse.ArgumentParser) -> None:
    """The thinking switch, the context, the engine's threads and layers, and where the results go."""
    p.add_argument("--thinking", default="default",
                   help="the chat template's thinking switch (enable_thinking): on, off, default (the "
                        "template's own) or on,off (both, a verdict each); where the template has one")
    p.add_argument("--depth", default="0",
                   help="context depth: tokens of neutral text before each prompt, e.g. 0,4096,16k (a "
                        "verdict per depth); --ctx-size grows to fit")
    p.add_argument("--ctx-size", type=whole(0), default=4096, help="context size (0: the model's own)")
    add_threads(p)
    add_ngl(p, help="llama-server -ngl (layers on the GPU)")
    add_rpc(p, local=True)
    p.add_argument("--memory-limit", type=memory_size, default=None, metavar="SIZE",
                   help="the memory an arm may take, e.g. 4GiB: an arm predicted to need more (weights, KV, "
                        "recurrent-state snapshots that grow with K, draft context, compute buffers) is left "
                        "out, with why, before it starts (default: the free GPU memory, or RAM)")
    p.add_argument("--out", help="results JSONL (default: a new file in the results folder)")
    add_json(p, help="print the summary as JSON")
    p.add_argument("--log-dir", help="keep llama-server logs here")


def _adaptive_arguments(p: argparse.ArgumentParser) -> None:
    """The adaptive sweep and when a sweep stops."""
    p.add_argument("--adaptive", action="store_true",
                   help="adaptive sweep over --k (default 1-8): probe, pilot, then repetitions only "
                        "where intervals still overlap")
    p.add_argument("--mix", help="task weights for --adaptive's pick, e.g. code=0.6,story=0.4 (without "
                   "--adaptive they matter only for recommend)")
    p.add_argument("--budget", type=duration, default=None,
                   help="--adaptive: stop after this much time (3m, 90s, 2m30s, 1h) even if a task is still "
                        "undecided, and say what is decided and what is not")
    p.add_argument("--budget-tokens", type=whole(1), default=None,
                   help="--adaptive: stop after this many generated tokens (the pilot's included)")
    p.add_argument("--reprobe", action="store_true",
                   help="--adaptive: probe the costs again even when a probe of the same model, build, threads "
                        "and depth was made on this machine in the last 24 h (in process only; llama-server "
                        "sweeps always probe)")
    p.add_argument("--until-decided", action="store_true",
                   help="a plain sweep in rounds of one repetition, stopping once every task is decided on "
                        "anytime intervals (pays: its pick's interval above 1 and clear of the others; no gain "
                        "worth having: no interval reaches 1 + --min-gain; slower: every interval below 1) "
                        "or at --reps")
    add_min_gain(p)


def make_plan(args: argparse.Namespace) -> tuple[Plan, str, int]:
    """(the plan, the model, its repetitions) from the options; every setting checked."""
    if args.again:
        if args.adaptive or args.demo:
            raise UserError("--again repeats the sweep of a results file; it does not combine with "
                            + ("--adaptive" if args.adaptive else "--demo"))
        if getattr(args, "modes", MTP) != MTP:
            raise UserError("--again repeats the sweep's own modes; --modes does not combine with it")
        if getattr(args, "sampler", None) or getattr(args, "temperatures", None) or any(
                getattr(args, k, None) is not None for k in SAMPLER_VALUES):
            raise UserError("--again repeats the sweep's own sampler settings; --sampler, --temperatures "
                            "and the sampler values do not combine with it")
        if getattr(args, "draft_sampling", "greedy") != "greedy":
            raise UserError("--again repeats the sweep's own draft sampling; --draft-sampling does not combine with it")
        if args.thinking != "default" or args.depth != "0":
            raise UserError("--again repeats the sweep's own thinking and depth settings; --thinking and "
                            "--depth do not combine with it")
        records = load_sweep(args.again, hint="--again on a file of one sweep", refuse=planned_counts)[0]
        again_placements(args, records)
        modes = list(dict.fromkeys(r.spec_type for r in records if r.spec_type and r.spec_type != "none")) or [MTP]
        plan = plan_again(records, model=args.model, prompt_file=args.prompts, engine=args.engine,
                          drafters=parse_drafters(getattr(args, "drafter", None) or [], modes), names=PLAN_NAMES)
        return plan, plan.model, plan.reps
    if args.demo:
        model = str(demo_model())
        tasks = args.tasks.split(",") if args.tasks else list(DEMO_TASK_P)
        unknown = [t for t in tasks if t not in DEMO_TASK_P]
        if unknown:
            raise UserError(f"--tasks: the demo has {', '.join(DEMO_TASK_P)}, not {unknown[0]!r}")
        per_task = 1
        ks, reps, n_predict = DEMO_KS, min(args.reps or PLAIN_REPS, DEMO_REPS), min(args.n_predict, DEMO_TOKENS)
        shares = ", ".join(f"{t} {100 * p:g} %" for t, p in DEMO_TASK_P.items() if t in tasks)
        print(f"demo: calibrated model {model}\n"
              f"      (synthetic: a known share of its drafts is made wrong on purpose, per task: {shares};\n"
              "      so acceptance is known exactly, and the speedup is measured here)", file=sys.stderr)
    else:
        if not args.model:
            raise UserError("bench needs --model FILE.gguf (or --demo)")
        model, tasks, per_task = args.model, (args.tasks.split(",") if args.tasks else None), args.per_task
        ks, reps, n_predict = args.k or DEFAULT_KS, args.reps or PLAIN_REPS, args.n_predict
    modes = [m.strip() for m in (getattr(args, "modes", None) or MTP).split(",") if m.strip()]
    samplings = [d.strip() for d in (getattr(args, "draft_sampling", None) or "greedy").split(",") if d.strip()]
    arms = make_arms(parse_int_list(ks, "--k"), parse_float_list(args.p_min, "--p-min"), modes=modes,
                     drafters=parse_drafters(getattr(args, "drafter", None) or [], modes), names=PLAN_NAMES,
                     draft_samplings=samplings)
    # the demo model's own prompts for its tasks (each leads into its task's region), suites for the rest
    prompts = prompts_for(tasks, (demo_prompts(model) or ()) if args.demo else (), args.prompts, per_task,
                          replace=args.replace_prompts)
    plan = Plan(model=model, arms=arms, prompts=tuple(prompts), engine=args.engine or EngineKind.INPROCESS,
                n_predict=n_predict, reps=reps, warmup=args.warmup, raw=args.raw,
                samplers=samplers_of(args, model), depths=parse_depths(args.depth, "--depth"),
                thinking=tuple(parse_thinking(t) for t in args.thinking.split(",")))
    return plan, model, reps


def samplers_of(args: argparse.Namespace, model: str) -> tuple[Sampler, ...]:
    """The sampler settings of bench's options: the preset (--sampler; custom when a value is
    given without one), the values given on top of it, and with --temperatures one setting per
    temperature (0: greedy)."""
    given: dict[str, Any] = {k: getattr(args, k) for k in SAMPLER_VALUES if getattr(args, k, None) is not None}
    name = getattr(args, "sampler", None) or ("custom" if given else "greedy")
    if name == "greedy" and given:
        raise UserError(f"--sampler greedy takes no --{next(iter(given)).replace('_', '-')}; use --sampler custom")
    base = sampler_preset(name, model, seed=getattr(args, "seed", 42), **(given if name == "custom" else {}))
    if name == "recommended" and given:  # the model's settings with the user's changes
        base = dataclasses.replace(base, **given, preset="custom", source=f"{base.source}; changed: "
                                   + ", ".join(k.replace("_", "-") for k in given))
    temps = getattr(args, "temperatures", None)
    if not temps:
        return (base,)
    ts = parse_float_list(temps, "--temperatures")
    bad = [t for t in ts if t < 0]
    if bad:
        raise UserError(f"--temperatures: {bad[0]:g} is negative")
    return tuple(dict.fromkeys(base.with_temperature(t) for t in ts))


def parse_drafters(values: list[str], modes: list[str]) -> dict[str, str]:
    """``--drafter`` values (``FILE`` or ``MODE=FILE``) -> drafter file per mode. A bare FILE goes
    to the modes in ``modes`` that cannot run without one (draft-simple, draft-eagle3,
    draft-dflash, draft-dspark, and combinations with them), else to draft-mtp and its
    combinations (a Gemma 4 assistant). Two drafters for one
    mode are an error (a sweep has one drafter per mode)."""
    out: dict[str, str] = {}
    for v in values:
        mode, sep, path = v.partition("=")
        if sep and MODE_NAME.fullmatch(mode.strip()) and not Path(v).exists():
            targets, path = [mode.strip()], path
        else:
            targets = [m for m in modes if needs_drafter(m)] or [m for m in modes if MTP in parts(m)]
            path = v
            if not targets:
                raise UserError(f"--drafter {v}: none of the modes ({', '.join(modes)}) takes a drafter model")
        for m in targets:
            if m in out and out[m] != path:
                raise UserError(f"--drafter: two drafters for {m} ({out[m]} and {path}); a sweep has one per mode")
            out[m] = path
    return out


def again_placements(args: argparse.Namespace, records: Sequence[RunRecord]) -> None:
    """--again over RPC workers: the placements the sweep measured (its records' server flags,
    app.core.measure.placements.placements_measured) measured again, as if given with --placements;
    the workers must be named again (a sweep's loopback workers are gone with it)."""
    measured = placements_measured(r.server_args for r in records)
    if not measured:
        return
    if getattr(args, "placements", None):
        raise UserError("--again repeats the sweep's own placements (" + ", ".join(measured) + "); --placements "
                        "does not combine with it")
    if not rpc_of(args) and not getattr(args, "rpc_local", 0):
        raise UserError("--again: this sweep measured where drafting runs over RPC workers (" + ", ".join(measured)
                        + "); name them again (--rpc HOST:PORT,... or --rpc-local N)")
    args.placements = ",".join(measured)  # read by request_of, as the option's text


def request_of(args: argparse.Namespace) -> SweepRequest:
    """The sweep the options ask for, checked (make_plan), as a session request."""
    if args.log_dir:
        check_writable_dir(args.log_dir, "--log-dir folder")
    if getattr(args, "resume", None):
        return resume_request(args)
    settings = engine_settings_of(args, ctx_size=args.ctx_size, log_dir=args.log_dir)
    plan, _model, reps = make_plan(args)
    adaptive = None
    budget_s, budget_tokens = getattr(args, "budget", None), getattr(args, "budget_tokens", None)
    until = getattr(args, "until_decided", False)
    if args.adaptive:
        if until:
            raise UserError("--until-decided is the plain sweep's; --adaptive always stops once decided")
        ks = tuple(parse_int_list(args.k, "--k")) if args.k else ADAPTIVE_KS
        adaptive = AdaptiveOptions(ks=ks, p_mins=tuple(parse_float_list(args.p_min, "--p-min")),
                                   max_reps=args.reps or ADAPTIVE_MAX_REPS,
                                   budget_s=budget_s, budget_tokens=budget_tokens,
                                   reprobe=bool(getattr(args, "reprobe", False)))
    elif getattr(args, "reprobe", False):
        raise UserError("--reprobe is --adaptive's (its cost probe); a plain sweep makes no probe")
    elif budget_s is not None or budget_tokens is not None:
        raise UserError("--budget and --budget-tokens end an --adaptive sweep; a plain sweep ends at --reps "
                        "(add --until-decided to stop it once decided)")
    if getattr(args, "min_gain", None) is not None and not (args.adaptive or until):
        raise UserError("--min-gain is for a sweep that stops once decided (--adaptive or --until-decided); "
                        "a plain sweep runs its --reps")
    return SweepRequest(plan, settings, adaptive, mix=args.mix, out=Path(args.out) if args.out else None,
                        min_gain=min_gain_of(args),
                        strict_modes=True, choose_engine=not args.engine and not args.again, until_decided=until,
                        memory_limit=getattr(args, "memory_limit", None),
                        axes=axes_of(args, settings), rpc_local=getattr(args, "rpc_local", 0),
                        placements=placements_of(args))


def run(args: argparse.Namespace) -> int:
    prepared = prepare(request_of(args))  # every check before anything is loaded or written
    for note in prepared.notes:
        print(note, file=sys.stderr)
    if args.mix and not args.adaptive:
        print("note: --mix weighs the tasks only for --adaptive's pick; this sweep measures every task "
              "alike (give the weights to `recommend` on its results file)", file=sys.stderr)
    view = BenchView(flow_clock(prepared.request, flow_estimate(prepared.request, None, [])))
    todo = prepared.request.resume
    if todo is not None:  # the verdict is the whole sweep's: the quiet runs kept, and the new ones
        view.records = [r for r in todo.earlier]
        print(f"resume: {todo.reused} quiet runs kept, {todo.runs} to measure again", file=sys.stderr)
    events = session_run(prepared.request, CancelToken())
    try:
        for ev in events:
            view.show(ev)
    except KeyboardInterrupt:
        events.close()  # closes the engine and the results file
        view.prog.line(f"cancelled; finished runs are saved in {prepared.request.out}", final=True)
        return EXIT_CANCELLED
    return view.report(args.json, prepared.request.plan.model, args.mix if args.adaptive else None,
                       prepared.request.engine.server_bin)
