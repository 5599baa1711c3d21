"""mtp-tuner rpc check|build: the RPC workers a main machine would split a model onto (reachable,
round-trip time, devices and memory as each reports them, whether its llama.cpp build fits this
machine's), and whether this machine's llama.cpp can use workers at all."""

from __future__ import annotations

import argparse
import json

from app.cli.common import EXIT_FAILED, EXIT_OK
from app.cli.options import Parser, add_json, number
from app.core.common.errors import EngineError
from app.core.engines.server.binary import find_server_binary
from app.core.engines.server.rpc_check import (WorkerInfo, build_match, check_workers, devices_text, local_version,
                                                to_dict, version_text)
from app.core.common.workers import Workers
from app.core.engines.server.rpc_worker import find_worker, rpc_build_problem

NAME = "rpc"
HELP = "RPC workers: check the ones named (reachable, round trip, memory, build), or this llama.cpp's RPC"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="rpc_cmd", metavar="ACTION", parser_class=Parser, required=True)
    c = actions.add_parser("check", help="for each worker: reachable, round-trip time, devices and memory, "
                           "and whether its build matches this machine's")
    c.add_argument("workers", metavar="HOST:PORT[,...]", help="the workers, as llama-server's --rpc takes them")
    c.add_argument("--timeout", type=number(0.1, 60), default=3.0, help="seconds the whole check may take, all workers asked at once (default 3)")
    c.add_argument("--server-bin", help="this machine's llama-server (its build is compared with the workers'; "
                   "default: the selected runtime, then PATH)")
    add_json(c)
    b = actions.add_parser("build", help="can this machine's llama.cpp use RPC workers (--rpc, and the worker "
                           "binary beside it)?")
    b.add_argument("--server-bin", help="llama-server binary or release folder (default: the selected runtime, "
                   "then PATH)")


def _check(args: argparse.Namespace) -> int:
    endpoints = Workers.parse(args.workers).endpoints
    try:
        local = local_version(find_server_binary(args.server_bin))
    except EngineError:
        local = None  # no llama-server here: the workers are still checked, the match is unknown
    infos = check_workers(endpoints, timeout=args.timeout)
    if args.json:
        print(json.dumps({"this_machine_rpc_version": version_text(local) if local else None,
                          "workers": [to_dict(i, local) for i in infos]}, indent=2))
    else:
        _print(infos, local)
    return EXIT_OK if all(i.usable for i in infos) else EXIT_FAILED


def _print(infos: list[WorkerInfo], local: tuple[int, int, int] | None) -> None:
    for i in infos:
        if not i.reachable:
            print(f"{i.endpoint}  NOT reachable: {i.error}")
            continue
        if i.refused:
            print(f"{i.endpoint}  NOT usable: it answered HELLO (RPC {version_text(i.version)}), then {i.error}")
            continue
        rtt = f"round trip {i.rtt_ms:.2f} ms" if i.rtt_ms is not None else "round trip unknown"
        print(f"{i.endpoint}  reachable, {rtt}, RPC {version_text(i.version)}: {build_match(local, i.version)[1]}")
        print(f"    {devices_text(i.devices)}")
        if i.error:
            print(f"    note: {i.error}")


def _build(args: argparse.Namespace) -> int:
    server = find_server_binary(args.server_bin)
    problem = rpc_build_problem(server)
    if problem:
        print(f"RPC: not ready: {problem}")
        return EXIT_FAILED
    print(f"RPC: ready (llama-server {server} has --rpc; worker: {find_worker(server)})")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    return _check(args) if args.rpc_cmd == "check" else _build(args)
