"""mtp-tuner recommend: the verdict per task, each followed by its own llama-server command, then
the pick and command for the task mix (text, --json, and a Markdown --report), all from
app.core.verdict.judge (the one entry from results to a verdict); --for TASK (or mix): that one
verdict and its command. The commands carry the sampler the sweep measured only with
--with-sampler."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.cli.common import EXIT_FAILED, EXIT_OK, load_sweep, warn, warn_all
from app.cli.network import add_rtt
from app.cli.options import add_json, add_ngl, add_rpc, add_server_command, user_command_of, whole
from app.core.analysis.answer import MAX_TOKENS
from app.core.common.errors import UserError
from app.core.records.schema import RunRecord
from app.core.common.atomic import check_writable
from app.core.verdict import ExportOptions, markdown_report, verdict_dict, verdict_text, write_report
from app.core.verdict.judge import cost_records_of, find_server, judge, judgement_dict
from app.core.verdict.report import scope_dict, scope_text
from app.core.verdict.network import rtt_lines
from app.core.verdict.verdict import Verdict

NAME = "recommend"
HELP = "verdict per task, the pick for your task mix, and the llama-server command"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", help="results JSONL from bench")
    p.add_argument("--mix", help="task weights, e.g. code=0.6,story=0.2,tongue-twister=0.2 (default: equal)")
    p.add_argument("--shell", choices=["bash", "powershell", "cmd"], default="bash")
    p.add_argument("--server-bin", help="llama-server to check the flags against")
    add_server_command(p)
    p.add_argument("--probe", help="results file with a cost record (default: the results file)")
    p.add_argument("--ctx-size", type=whole(0), default=8192, help="-c for the command (0: the model's own context)")
    add_ngl(p, help="-ngl for the command (e.g. 999 for all on the GPU)")
    add_rpc(p, help="the RPC workers for the command's --rpc, each with its own command line to start it (default: "
                    "the workers the sweep was split over, or your command's --rpc)")
    p.add_argument("--fa", choices=["on", "off", "auto"], default=None, help="-fa for the command")
    p.add_argument("--cache-type-k", default=None)
    p.add_argument("--cache-type-v", default=None)
    p.add_argument("--sweep", help="the sweep to judge when the file holds several (its id, or a "
                   "unique start of it; default: the latest)")
    p.add_argument("--model", help="judge the latest sweep of this model when the file holds several")
    p.add_argument("--for", dest="for_task", metavar="TASK",
                   help="only this task's verdict and the command for its pick (e.g. code), or mix: your "
                        "task mix's (default: each task's verdict with its command, then the mix's)")
    p.add_argument("--with-sampler", action="store_true",
                   help="also write the sampler the sweep measured (--temp, --top-k, --top-p, --min-p, "
                        "--repeat-penalty, --seed) into the commands; off by default, since those flags "
                        "change every chat the server answers (temperature 0 makes it greedy)")
    p.add_argument("--answer-length", type=whole(1, MAX_TOKENS), metavar="TOKENS",
                   help="your answers' usual length in tokens: the verdict says what the pick gains on an answer "
                        "this long, beside 128 tokens (each request's first and last steps priced by the cost "
                        "probe; e.g. 1024)")
    p.add_argument("--verbose", action="store_true",
                   help="also print the break-even model check and the held-out widths")
    p.add_argument("--report", help="also write a Markdown report here")
    add_rtt(p)
    p.add_argument("--confirm", action="store_true",
                   help="run the pick once on a real llama-server (--server-bin, --ctx-size, --ngl) on a prompt "
                        "the sweep measured, and compare its speed with the sweep's")
    p.add_argument("--prompts", help="your prompt file, when the sweep used one (for --confirm)")
    add_json(p)


def run(args: argparse.Namespace) -> int:
    if args.report:
        check_writable(args.report, "report")  # before the work, not after it
    records, _sweep = load_sweep(args.results, args.sweep, args.model)
    command = user_command_of(args)
    base_argv, rpc, checked_by = None, args.rpc, args.server_bin
    if command is not None:  # the answer is the user's own command with the picked flags
        cmd, checked_by = command  # its --help is read once
        base_argv, rpc = cmd.base_argv(), rpc or cmd.rpc
        if Path(cmd.model).resolve() != Path(records[-1].model_path).resolve():
            warn(f"the command's model ({cmd.model}) is not the sweep's ({records[-1].model_path}); the command "
                 "keeps yours")
    costs, left_out = cost_records_of(args.results, args.probe)
    warn_all(left_out)
    options = ExportOptions(shell=args.shell, ctx_size=args.ctx_size, n_gpu_layers=args.ngl, flash_attn=args.fa,
                            cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v,
                            with_sampler=args.with_sampler, base_argv=base_argv, rpc=rpc)
    # one verdict per setting (sampler, thinking, depth) the sweep measured: runs pair only within one;
    # a sweep with --axis: the best joint setting too
    judged = judge(records, cost_records=costs, mix=args.mix, server=find_server(checked_by), options=options,
                   joint=not args.for_task, answer_tokens=args.answer_length)
    verdicts = [(s.label, s.verdict) for s in judged.settings]
    scope = args.for_task
    for _, v in verdicts:
        if scope:  # an unknown task: one error naming the sweep's tasks, before anything is printed
            v.command(scope)
        if v.export is None and not v.withheld:
            raise UserError(v.export_problem or "the command cannot be written")
    if args.report:
        path = write_report(args.report, "\n".join((f"## {label}\n\n" if label else "") + markdown_report(v)
                                                    for label, v in verdicts))
        print(f"report: {path}", file=sys.stderr)
    joint = judged.joint
    if args.json:
        def one(v: Verdict, label: str) -> dict[str, Any]:
            return scope_dict(v, scope) if scope else verdict_dict(v, label)

        out = judgement_dict(judged, one)
        if args.rtt:  # the network probe's lines at the sweep's acceptance (the first setting's)
            out["network"] = rtt_lines(verdicts[0][1], costs, args.rtt)
        print(json.dumps(out, indent=2))
    else:
        def text(v: Verdict) -> str:
            return scope_text(v, scope) if scope else verdict_text(v, verbose=args.verbose)

        print("\n\n".join((f"== {label} ==\n" if label else "") + text(v) for label, v in verdicts))
        if joint is not None:
            print("\n" + "\n".join(joint.lines()))
        if args.rtt:
            print("\n" + "\n".join(rtt_lines(verdicts[0][1], costs, args.rtt)))
    withheld = [v.withheld for _, v in verdicts if v.withheld]
    if withheld:  # the machine was busy: no verdict to confirm, and a failed status for scripts
        warn(withheld[0])
        return EXIT_FAILED
    provisional = [v.provisional_why for _, v in verdicts if v.provisional_why]
    if provisional:  # an answer all the same: said once more where scripts and people look
        warn(f"provisional answer: {provisional[0]}")
    if args.confirm:
        return confirm(verdicts[0][1], args)
    return EXIT_OK


def confirm(verdict: Verdict, args: argparse.Namespace) -> int:
    """recommend --confirm: the pick against the plain command on a real llama-server (the core's
    confirm request, the Export tab's too: strict modes, only the workers named again with --rpc),
    its progress on stderr as it goes, then what it timed and its speeds next to the sweep's (on
    stderr with --json, whose stdout stays the verdict)."""
    from app.core.engines.base import EngineKind, EngineSettings  # the session: only when asked
    from app.core.session.confirm import ConfirmProgress, confirm_headline, confirm_request, confirm_text
    from app.core.session.events import RunFailed, RunFinished, SweepError, dispatch
    from app.core.session.sweep import run as session_run
    from app.core.common.cancel import CancelToken

    task = args.for_task if args.for_task and args.for_task != "mix" else None
    settings = EngineSettings(kind=EngineKind.SERVER, ctx_size=args.ctx_size, n_gpu_layers=args.ngl,
                              server_bin=args.server_bin, rpc=args.rpc)
    c, request = confirm_request(verdict, settings, args.prompts, task)
    out = sys.stdout if not args.json else sys.stderr
    progress = ConfirmProgress(c, wait_every_s=10)  # a line per 10 s of waiting for a quiet moment
    print(f"\nconfirm: {c.arm.label} on {c.prompts_said} on llama-server, {progress.total} runs…", file=sys.stderr)
    got: list[RunRecord] = []
    errors: list[str] = []
    for ev in session_run(request, CancelToken()):
        dispatch(ev, {RunFinished: lambda e: got.append(e.record), RunFailed: lambda e: got.append(e.record),
                      SweepError: lambda e: errors.append(e.message)})
        line = progress.see(ev)
        if line is not None:
            print(f"confirm: {line}", file=sys.stderr)
    if errors and not got:
        raise UserError(errors[0])
    print(confirm_headline(c, got), file=out)
    print("confirm: " + confirm_text(c, got), file=out)
    return EXIT_OK if any(r.status == "ok" and r.measured_arm == c.arm for r in got) else EXIT_FAILED
