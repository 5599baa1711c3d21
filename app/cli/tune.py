"""mtp-tuner tune: the Start page's "Tune for me" from the command line. The same flow (the core's
app.core.session.tune: which prompts, which modes and widths, Quick's budget) and the same
verdict (app.core.verdict.judge on the sweep's runs in its results file and its cost probe,
weighed by the uses declared) as the window, bench's summary and recommend, so it prints the same
answer and the same llama-server command per task."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from app.cli.bench_view import BenchView, decisions_json, decisions_text
from app.cli.common import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK
from app.cli.options import (add_drafter, add_engine, add_json, add_min_gain, add_ngl, add_rpc, add_server_bin,
                             add_server_command, add_threads, duration as duration_arg, engine_settings_of,
                             min_gain_of)
from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.common.units import duration
from app.core.common.spec_modes import MTP
from app.core.engines.base import EngineKind
from app.core.engines.devices import EngineChoice
from app.core.session.clock import flow_clock, flow_estimate
from app.core.session.request import SweepRequest
from app.core.session.sweep import prepare, run as session_run
from app.core.session.tune import QUICK_S, device_check, mix_text, parse_uses, tune_engine, tune_request
from app.core.session.tune_arms import tune_arms

NAME = "tune"
HELP = "the Start page's Tune for me: measure, then the answer and the llama-server command per task"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="GGUF model file (the first part of a split GGUF): with MTP heads, they are "
                                     "tuned; without, the n-gram modes and a drafter that pairs with it (--drafter, "
                                     "else found in the models folder or the model's own folder)")
    src.add_argument("--demo", action="store_true", help="the demo's calibrated model (made on first use)")
    p.add_argument("--for", dest="uses", default="code,story", metavar="USES",
                   help="what you use the model for: tasks, with weights if you like, e.g. code or code,story or "
                        "code=0.7,story=0.3 (default code,story)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--quick", nargs="?", const=QUICK_S, default=None, type=duration_arg, metavar="TIME",
                        help=f"the default: at most {duration(QUICK_S)} (or TIME: 90s, 3m) from the start, the probe "
                             "included, then say what is decided and what is not")
    length.add_argument("--thorough", action="store_true", help="run until every task is decided")
    p.add_argument("--ngram", action="store_true",
                   help="measure llama.cpp's n-gram modes (on llama-server) instead of the model's MTP heads "
                        "(a model without MTP heads: always)")
    add_engine(p, None, help="inprocess: llama-cpp-python; server: llama-server (default: the engine that runs on "
                             "this machine's GPU, as the Start page's device check chooses; llama-server for your "
                             "command, a drafter, the n-gram modes or RPC workers)")
    add_server_bin(p)
    add_server_command(p)
    add_drafter(p, help="drafter GGUF (-md), checked against the model by llama.cpp's pairing rule: FILE alone "
                        "drafts in its own mode (a small model of the same vocabulary: draft-simple; a Gemma 4 "
                        "assistant: draft-mtp); without it, a model without MTP heads gets the one found")
    add_rpc(p)
    add_threads(p)
    add_ngl(p, help="layers on the GPU (llama-server's -ngl), for the runs and the command")
    p.add_argument("--out", help="results JSONL (default: a new file in the results folder)")
    add_json(p, help="print the answer as JSON: per task its pick and command, and where the sweep stopped")
    add_min_gain(p)


def request_of(args: argparse.Namespace, started: float,
               check: Callable[[str | None], EngineChoice] = device_check) -> SweepRequest:
    """The Start page's request from the options: the model (--model, the demo's, or the one of
    the user's llama-server command), the user's set-up (app.cli.options.engine_settings_of), and
    the engine: the one named, else llama-server where the set-up needs it, else the device
    check's (``check``: the engine that runs on this machine's GPU), as the Start page chooses."""
    settings = engine_settings_of(args)  # the user's command: its model is args.model
    if args.demo:
        from app.core.calibrated.demo import demo_model

        model = str(demo_model())
        print(f"demo: calibrated model {model} (its drafts are wrong on purpose, per task)", file=sys.stderr)
    elif args.model:
        model = args.model
        if not Path(model).is_file():
            raise UserError(f"--model {model}: no such file")
    else:
        raise UserError("tune needs --model FILE.gguf, --demo or --server-command")
    from app.cli.bench import parse_drafters

    values = list(args.drafter or [])
    own = values[0] if len(values) == 1 and (Path(values[0]).exists() or "=" not in values[0]) else None
    drafters = parse_drafters(values, [MTP]) if own is None else {}  # MODE=FILE: as given
    arms = tune_arms(model, own)  # no MTP heads: the n-gram modes and a drafter (own, else found)
    for line in arms.lines(quick=not args.thorough):
        print(line, file=sys.stderr)
    engine = EngineKind(args.engine) if args.engine else None
    if engine is None and (args.ngram or drafters or arms.ngram or arms.drafters or settings.user_args is not None
                           or settings.rpc):
        engine = EngineKind.SERVER  # only llama-server takes them
    elif engine is None:  # the device check, as the Start page's
        choice = check(settings.server_bin)
        engine = tune_engine(choice)
        print(f"{choice.sentence(engine)} ({choice.reason})", file=sys.stderr)
    request = tune_request(model, parse_uses(args.uses), quick=not args.thorough, ngram=args.ngram,
                           engine=engine, settings=settings, quick_s=args.quick or QUICK_S,
                           started=started, drafters=drafters, min_gain=min_gain_of(args), arms=arms)
    return dataclasses.replace(request, out=Path(args.out)) if args.out else request


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()  # Quick's budget counts from here: making the demo model and the probe too
    weights = parse_uses(args.uses)
    request = request_of(args, started)
    model = request.plan.model
    prepared = prepare(request)
    for note in prepared.notes:
        print(note, file=sys.stderr)
    args.server_bin = prepared.request.engine.server_bin or args.server_bin  # the command's: its flags checked
    view = BenchView(flow_clock(prepared.request, flow_estimate(prepared.request, None, [])))
    events = session_run(prepared.request, CancelToken())
    try:
        for ev in events:
            view.show(ev)
    except KeyboardInterrupt:
        events.close()
        view.prog.line(f"cancelled; finished runs are saved in {prepared.request.out}", final=True)
        return EXIT_CANCELLED
    view.prog.line("", final=False)
    budget = view.clock.budget_s
    return answer(view, model, weights, args, time.monotonic() - started, budget)


def answer(view: BenchView, model: str, weights: dict[str, float], args: argparse.Namespace, elapsed: float,
           budget: float | None) -> int:
    """The verdict as the window builds it (the uses as the task mix when there are several), with
    a command per task, as text or JSON; the exit code."""
    from app.cli.bench_view import judged_runs
    from app.core.verdict import ExportOptions, verdict_text
    from app.core.verdict.judge import judgement_dict

    done = view.done
    assert done is not None  # the session's last event
    ok = [r for r in view.records if r.status == "ok"]
    dec = view.last_decisions
    head: dict[str, Any] = {"model": model, "uses": weights, "quick": not args.thorough, "budget_s": budget,
                            "elapsed_s": round(elapsed, 1), "results": str(view.path) if done.written else None,
                            "decisions": decisions_json(dec) if dec is not None else None}
    j = None
    if ok:
        # a task the time left unmeasured is said, and the mix weighs the ones measured
        measured = {t: w for t, w in weights.items() if any(r.task == t for r in ok)}
        head["not_measured"] = [t for t in weights if t not in measured]
        # the one entry bench's summary and recommend use: the file's runs and cost records
        j = judged_runs(view.records, view.path if done.written else None,
                        mix_text(measured) if len(measured) > 1 else None, view.sweep_id, args.server_bin,
                        options=ExportOptions(n_gpu_layers=args.ngl))
    probe_off = not ok and dec is not None and dec.decided  # the cost probe: no width can pay here
    if args.json:
        print(json.dumps({**head, "verdict": judgement_dict(j) if j is not None else None}, indent=2))
    else:
        took = f"{elapsed:.0f} s" + (f" of at most {duration(budget)}" if budget else "")
        print(("\n" + decisions_text(dec) if dec is not None else "") + f"\n\ntune: {took}")
        if j is not None:
            print("\n" + "\n\n".join((f"== {s.label} ==\n" if s.label else "") + verdict_text(s.verdict)
                                      for s in j.settings))
            if head.get("not_measured"):
                print(f"\nnot measured in the time: {', '.join(head['not_measured'])} (try --thorough)")
        elif probe_off:
            print("\nLeave MTP off: the cost probe says no draft width can pay on this machine.")
        else:
            print("\nNo measured run finished" + (" within the Quick budget: the probe and the first runs took "
                                                  "longer here; try --thorough, or close other programs"
                                                  if budget and elapsed >= budget else "") + ".")
    if done.cancelled:
        return EXIT_CANCELLED
    if j is None:
        return EXIT_OK if probe_off else EXIT_FAILED
    answered = all(not s.verdict.withheld or all(c.export is not None for c in s.verdict.task_commands)
                   for s in j.settings)
    return EXIT_OK if answered and not done.errors else EXIT_FAILED
