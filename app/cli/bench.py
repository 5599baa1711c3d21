"""mtp-tuner bench: measure baseline vs MTP (and llama.cpp's other speculative modes) on prompt
suites (a plain or adaptive sweep, the demo, or a results file's sweep again)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from app.cli.common import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, PLAN_NAMES, Progress, load_sweep
from app.core.analysis.adaptive import AdaptiveResult, AdaptiveStage, adaptive_sweep
from app.core.analysis.recommend import parse_mix
from app.core.analysis.analysis import analyze
from app.core.analysis.fields import format_analysis
from app.core.analysis.settings import setting_label, split_by_setting
from app.core.analysis.summary import summarize
from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.engines.chat_template import parse_thinking
from app.core.engines.base import EngineKind, EngineSettings
from app.core.calibrated.demo import DEMO_KS, DEMO_REPS, DEMO_TASK_P, DEMO_TOKENS, demo_model, demo_prompts
from app.core.engines.factory import make_engine
from app.core.measure import runner as R
from app.core.measure.depth import ctx_for, parse_depths
from app.core.measure.plan import Plan, check_drafters, make_arms, parse_float_list, parse_int_list, plan_again
from app.core.common.spec_types import NEEDS_DRAFTER
from app.core.records.arm import MODE_NAME
from app.core.measure.prompts import select_prompts
from app.core.records.sampler import Sampler, preset as sampler_preset
from app.core.records.writer import ResultsWriter

MIN_PROMPT_ROOM = 64  # context left for the prompt (and drafts) besides the generated tokens


def make_plan(args: argparse.Namespace) -> tuple[Plan, str, int]:
    """(the plan, the model, its repetitions) from the options; every setting checked."""
    if args.again:
        if args.adaptive or args.demo:
            raise UserError("--again repeats the sweep of a results file; it does not combine with "
                            + ("--adaptive" if args.adaptive else "--demo"))
        if getattr(args, "modes", "draft-mtp") != "draft-mtp":
            raise UserError("--again repeats the sweep's own modes; --modes does not combine with it")
        if getattr(args, "sampler", None) or getattr(args, "temperatures", None) or any(
                getattr(args, k, None) is not None for k in SAMPLER_VALUES):
            raise UserError("--again repeats the sweep's own sampler settings; --sampler, --temperatures "
                            "and the sampler values do not combine with it")
        if args.thinking != "default" or args.depth != "0":
            raise UserError("--again repeats the sweep's own thinking and depth settings; --thinking and "
                            "--depth do not combine with it")
        records = load_sweep(args.again, hint="--again on a file of one sweep")[0]
        modes = list(dict.fromkeys(r.spec_type for r in records if r.spec_type and r.spec_type != "none")) or ["draft-mtp"]
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
        ks, reps, n_predict = DEMO_KS, min(args.reps, DEMO_REPS), min(args.n_predict, DEMO_TOKENS)
        shares = ", ".join(f"{t} {100 * p:g} %" for t, p in DEMO_TASK_P.items() if t in tasks)
        print(f"demo: calibrated model {model}\n"
              f"      (synthetic: a known share of its drafts is made wrong on purpose, per task: {shares};\n"
              "      so acceptance is known exactly, and the speedup is measured here)", file=sys.stderr)
    else:
        if not args.model:
            raise UserError("bench needs --model FILE.gguf (or --demo)")
        model, tasks, per_task = args.model, (args.tasks.split(",") if args.tasks else None), args.per_task
        ks, reps, n_predict = args.k, args.reps, args.n_predict
    modes = [m.strip() for m in (getattr(args, "modes", None) or "draft-mtp").split(",") if m.strip()]
    arms = make_arms(parse_int_list(ks, "--k"), parse_float_list(args.p_min, "--p-min"), modes=modes,
                     drafters=parse_drafters(getattr(args, "drafter", None) or [], modes), names=PLAN_NAMES)
    if args.demo:  # the demo model's own prompts: each leads into its task's region
        prompts = [p for p in demo_prompts(model) if p.task in tasks]
    else:
        prompts = select_prompts(tasks, args.prompts, args.replace_prompts, per_task)
    if args.adaptive and any(a.is_spec and not a.own_heads for a in arms):
        raise UserError("--adaptive sweeps the model's own MTP heads (draft-mtp) only; drop --modes/--drafter")
    plan = Plan(model=model, arms=arms, prompts=tuple(prompts), engine=args.engine or engine_for(arms),
                n_predict=n_predict, reps=reps, warmup=args.warmup, raw=args.raw,
                samplers=samplers_of(args, model), depths=parse_depths(args.depth, "--depth"),
                thinking=tuple(parse_thinking(t) for t in args.thinking.split(",")))
    return plan, model, reps


SAMPLER_VALUES = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")


def samplers_of(args: argparse.Namespace, model: str) -> tuple[Sampler, ...]:
    """The sampler settings of bench's options: the preset (--sampler; custom when a value is
    given without one), the values given on top of it, and with --temperatures one setting per
    temperature (0: greedy)."""
    given = {k: getattr(args, k, None) for k in SAMPLER_VALUES if getattr(args, k, None) is not None}
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


def engine_for(arms) -> str:
    """The engine when --engine is not given: in-process, unless an arm needs llama-server (a mode
    other than the model's own MTP heads, or a drafter file); then every arm runs there, so that
    each pair compares like with like, and stderr says so."""
    server_only = sorted({a.mode + (" with a drafter" if a.drafter else "")
                          for a in arms if a.is_spec and not a.own_heads})
    if not server_only:
        return "inprocess"
    print(f"engine: llama-server, for {', '.join(server_only)} (the in-process engine runs only a model's own "
          "MTP heads); the baseline runs there too, so that pairs compare like with like", file=sys.stderr)
    return "server"


def parse_drafters(values: list[str], modes: list[str]) -> dict[str, str]:
    """``--drafter`` values (``FILE`` or ``MODE=FILE``) -> drafter file per mode. A bare FILE goes
    to the modes in ``modes`` that cannot run without one (draft-simple, draft-eagle3,
    draft-dflash, draft-dspark), else to draft-mtp (a Gemma 4 assistant). Two drafters for one
    mode are an error (a sweep has one drafter per mode)."""
    out: dict[str, str] = {}
    for v in values:
        mode, sep, path = v.partition("=")
        if sep and MODE_NAME.fullmatch(mode.strip()) and not Path(v).exists():
            targets, path = [mode.strip()], path
        else:
            targets = [m for m in modes if m in NEEDS_DRAFTER] or [m for m in modes if m == "draft-mtp"]
            path = v
            if not targets:
                raise UserError(f"--drafter {v}: none of the modes ({', '.join(modes)}) takes a drafter model")
        for m in targets:
            if m in out and out[m] != path:
                raise UserError(f"--drafter: two drafters for {m} ({out[m]} and {path}); a sweep has one per mode")
            out[m] = path
    return out


def run(args: argparse.Namespace) -> int:
    plan, model, reps = make_plan(args)
    check_drafters(plan)  # a drafter that does not pair with the model: one line, before any engine starts
    if args.ctx_size and args.ctx_size < plan.n_predict + MIN_PROMPT_ROOM:
        raise UserError(f"--ctx-size {args.ctx_size} is too small: {plan.n_predict} generated tokens plus "
                        f"a prompt need at least {plan.n_predict + MIN_PROMPT_ROOM}")
    if args.adaptive:  # every setting checked before anything is loaded or written
        ks_list = parse_int_list(args.k if args.k != "1,2,3,4" else "1-8", "--k")
        p_min_list = parse_float_list(args.p_min, "--p-min")
    if args.mix:
        parse_mix(args.mix, tuple(dict.fromkeys(p.task for p in plan.prompts)))  # checked either way
        if not args.adaptive:
            print("note: --mix weighs the tasks only for --adaptive's pick; this sweep measures every task "
                  "alike (give the weights to `recommend` on its results file)", file=sys.stderr)
    out = Path(args.out) if args.out else R.default_results_path(model)
    cancel = CancelToken()
    errors: list[str] = []
    records = []
    prog = Progress()
    finished = None
    adaptive_result = None
    # the destination is checked now; a file is written only once a run finishes (an unused
    # default file is removed when the writer closes)
    ctx = ctx_for(args.ctx_size, plan.depths, plan.n_predict)  # room for the deepest context
    if ctx != args.ctx_size:
        print(f"context size {ctx} (--ctx-size {args.ctx_size} is too small for --depth {max(plan.depths)})",
              file=sys.stderr)
    settings = EngineSettings(kind=EngineKind.parse(plan.engine), ctx_size=ctx, threads=args.threads,
                              n_gpu_layers=args.ngl, server_bin=args.server_bin, log_dir=args.log_dir)
    with ResultsWriter(out) as writer, contextlib.closing(make_engine(settings)) as engine:
        # a mode this engine cannot run (a typo, or a mode the binary does not list): one line,
        # before any run (the window goes on with the other arms instead)
        problem = next((p for a in plan.arms if a.is_spec and not a.own_heads and (p := engine.mode_problem(a))), None)
        if problem:
            raise UserError(problem)
        if args.adaptive:
            gen = adaptive_sweep(dataclasses.replace(plan, arms=(plan.arms[0],)), engine, ks=ks_list,
                                 p_mins=p_min_list, mix=args.mix,
                                 max_reps=max(reps, 2), writer=writer, cancel=cancel)
        else:
            gen = R.run_sweep(plan, engine, writer, cancel)
        try:
            for ev in gen:
                if isinstance(ev, R.SweepStarted):
                    prog.line(f"sweep {ev.sweep_id}: {ev.total_runs} runs, llama.cpp {engine.build}, "
                              f"results -> {out}", final=True)
                elif isinstance(ev, R.RunStarted):
                    what = "warmup" if ev.warmup else f"run {ev.index + 1}/{ev.total}"
                    prog.line(f"{what}: {ev.arm.label}, {ev.task}/{ev.prompt_id} rep {ev.rep + 1}")
                elif isinstance(ev, R.TokenProgress):
                    prog.line(f"run {ev.index + 1}: {ev.n_tokens}/{ev.n_predict} tokens, "
                              f"{ev.elapsed_s:.1f} s")
                elif isinstance(ev, (R.RunFinished, R.RunFailed)):
                    records.append(ev.record)
                elif isinstance(ev, R.SweepWarning):
                    prog.line(f"warning: {ev.message}", final=True)
                elif isinstance(ev, R.SweepError):
                    errors.append(ev.message)
                    prog.line(f"error: {ev.message}", final=True)
                elif isinstance(ev, R.SweepFinished):
                    if not args.adaptive:
                        finished = ev
                elif args.adaptive and isinstance(ev, AdaptiveStage):
                    prog.line(f"adaptive: {ev.message}", final=True)
                elif args.adaptive and isinstance(ev, AdaptiveResult):
                    adaptive_result = ev
        except KeyboardInterrupt:
            cancel.cancel()
            gen.close()
            prog.line("cancelled; finished runs are saved in " + str(out), final=True)
            return EXIT_CANCELLED
    prog.line("", final=False)
    if args.json:
        print(json.dumps({"results": str(out), "model": model, "llama_build": engine.build,
                          "errors": errors, "cells": summary_cells(records)}, indent=2))
    else:
        print(summary_text(records))
        if adaptive_result is not None:
            print(f"\nadaptive pick: {adaptive_result.pick.label if adaptive_result.pick else 'leave MTP off'}"
                  f" ({adaptive_result.runs} measured runs)")
        print(f"\nresults: {out}" if writer.count else "\nno run finished, so no results file was written")
    if finished is not None and finished.cancelled:
        return EXIT_CANCELLED
    if errors or (finished is not None and finished.n_failed):
        return EXIT_FAILED
    return EXIT_OK


def summary_cells(records: list) -> list[dict]:
    """bench --json's cells: the summary of one analysis per setting of the sweep (sampler,
    thinking, depth; runs pair only within one), each cell with its setting's label when the
    sweep has several."""
    out = []
    for runs in list(split_by_setting(records).values()) or [records]:
        label = setting_label(runs, records)
        out += [{**dataclasses.asdict(c), **({"setting": label} if label else {})}
                for c in summarize(runs, analyze(runs))]
    return out


def summary_text(records: list) -> str:
    """bench's table: the same per-cell table (one field list) and findings as `recommend`, from
    one analysis per setting of the sweep (a section per setting when it has several)."""
    parts = []
    for runs in list(split_by_setting(records).values()) or [records]:
        a = analyze(runs)
        label = setting_label(runs, records)
        if a.cells:
            parts.append((f"== {label} ==\n" if label else "") + format_analysis(a))
    return "\n\n".join(parts) if parts else "no finished runs"
