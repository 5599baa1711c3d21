"""``bench --resume RESULTS``: a sweep finished when the machine is quiet, its quiet runs kept
(app.core.measure.resume)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from app.cli.common import PLAN_NAMES, load_sweep
from app.cli.options import rpc_of
from app.core.common.errors import UserError
from app.core.engines.base import EngineSettings
from app.core.measure.plan import plan_again
from app.core.measure.resume import resume_of
from app.core.session.request import SweepRequest


def resume_request(args: argparse.Namespace) -> SweepRequest:
    """``--resume RESULTS``: that file's sweep, measuring only what it lacks quietly (app.core.measure.resume)."""
    on = [f for f in ("again", "demo", "model", "adaptive", "until_decided") if getattr(args, f, None)]
    if on:
        raise UserError(f"--resume finishes the sweep of its results file; --{on[0].replace('_', '-')} does not "
                        "combine with it")
    records = load_sweep(args.resume, hint="--resume on a file of one sweep")[0]
    if any(r.server_args is not None for r in records):  # its servers' flags are not carried over yet
        raise UserError("--resume finishes sweeps made with the tuner's own llama-server flags; this one ran with "
                        "your command's flags or --axis values: run it again with them instead")
    split, asked = any(r.rpc for r in records), bool(rpc_of(args) or getattr(args, "rpc_local", 0))
    if split != asked:  # a resumed sweep measures where the sweep did
        raise UserError("--resume: this sweep was split over RPC workers; name them again (--rpc or --rpc-local)"
                        if split else "--resume: this sweep ran on this machine only; --rpc and --rpc-local do not "
                        "combine with it")
    plan = dataclasses.replace(plan_again(records, prompt_file=args.prompts, engine=args.engine, names=PLAN_NAMES),
                               warmup=args.warmup)
    return SweepRequest(plan, EngineSettings(ctx_size=args.ctx_size, threads=args.threads, n_gpu_layers=args.ngl,
                                             server_bin=args.server_bin, log_dir=args.log_dir, rpc=rpc_of(args)),
                        out=Path(args.resume), strict_modes=True, resume=resume_of(records, plan),
                        rpc_local=getattr(args, "rpc_local", 0))
