"""``bench --resume RESULTS``: a sweep finished when the machine is quiet, its quiet runs kept
(the core's one resume request, app.core.session.resume, which the window's "Finish when quiet"
uses too)."""

from __future__ import annotations

import argparse
import sys

from app.cli.common import PLAN_NAMES, warn_all
from app.cli.options import rpc_of
from app.core.common.errors import UserError
from app.core.engines.base import EngineSettings
from app.core.session.request import SweepRequest
from app.core.session.resume import resume_request as core_resume_request


def resume_request(args: argparse.Namespace) -> SweepRequest:
    """``--resume RESULTS``: that file's sweep, measuring only what it lacks quietly; what the core
    refuses (app.core.session.resume) is one line, as the window says it."""
    on = [f for f in ("again", "demo", "model", "adaptive", "until_decided", "axis", "placements")
          if getattr(args, f, None)]
    if on:
        raise UserError(f"--resume finishes the sweep of its results file; --{on[0].replace('_', '-')} does not "
                        "combine with it")
    own = getattr(args, "server_command", None) is not None or getattr(args, "server_command_file", None) is not None
    settings = EngineSettings(ctx_size=args.ctx_size, threads=args.threads, n_gpu_layers=args.ngl,
                              server_bin=args.server_bin, log_dir=args.log_dir, rpc=rpc_of(args),
                              user_args=() if own else None)  # given: refused (never read or run)
    request, planned = core_resume_request(args.resume, settings, prompt_file=args.prompts, engine=args.engine,
                                           warmup=args.warmup, rpc_local=getattr(args, "rpc_local", 0),
                                           names=PLAN_NAMES)
    warn_all(planned.problems)
    if planned.note:
        print(f"note: {planned.note} (choose with --resume on a file of one sweep)", file=sys.stderr)
    return request
