"""mtp-tuner inspect: what a GGUF is (architecture, sizes, MTP heads, or what it drafts for) and
whether it fits; with --drafter, whether the pair works and what the drafter adds to the fit."""

from __future__ import annotations

import argparse
import dataclasses
import json

from app.cli.common import EXIT_OK
from app.cli.options import add_json, whole
from app.core.common.errors import UserError
from app.core.machine.drafter import check_pair, inspect_drafter
from app.core.machine.hardware import snapshot
from app.core.machine.fit import format_fit
from app.core.machine.modelinfo import KV_BYTES, format_info, inspect
from app.core.session.memory import sized_fit_summary

NAME = "inspect"
HELP = "what a GGUF is: architecture, sizes, MTP heads, memory fit"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="GGUF file (the first part of a split GGUF)")
    p.add_argument("--ctx", type=whole(1), default=8192, help="context length for the memory fit")
    p.add_argument("--cache-type", default="f16", help="KV cache type for the fit (f16, q8_0, ...)")
    p.add_argument("--k", type=whole(1, 64), default=3, help="draft width for the MTP memory figure")
    p.add_argument("--drafter", metavar="FILE", help="a drafter GGUF (-md) for this target: check the pair "
                   "(vocabulary, width, kind) and show the memory fit with it")
    add_json(p)


def run(args: argparse.Namespace) -> int:
    if args.cache_type not in KV_BYTES:
        raise UserError(f"--cache-type must be one of {', '.join(KV_BYTES)}")
    m = inspect(args.file)
    d = None
    if args.drafter:  # the pair is checked before anything else is shown: one line when it fails
        d = check_pair(m, args.drafter, inspect_drafter(args.drafter).modes[0])
    alone = m.drafter_kind is not None and d is None  # a drafter file by itself: no fit of its own
    s = None if alone else sized_fit_summary(m, snapshot(), ctx=args.ctx, cache_type=args.cache_type, k=args.k,
                                             drafter=d)
    if args.json:
        out = m.to_dict()
        if s is not None:
            out["fit"] = [dataclasses.asdict(f) for f in s.fits]
            out["fit_target"] = s.target
            out["ceiling_tok_s"] = s.ceiling_tok_s
        if d is not None:
            out["drafter"] = {**dataclasses.asdict(dataclasses.replace(d, info=None)), "mode": d.modes[0]}
            out["drafter"].pop("info")
        print(json.dumps(out, indent=2))
        return EXIT_OK
    print(format_info(m))
    if d is not None:
        print(f"\ndrafter {d.path}: {d.describe()}")
        print(f"pair: checked (vocabulary, width, kind): -m {m.path} -md {d.path} --spec-type {d.modes[0]}")
    if s is None:
        print("\nmemory: a drafter runs beside its target; inspect the target with --drafter FILE for the "
              "pair's fit")
    else:
        print("\n" + format_fit(s, args.ctx, args.cache_type))
    return EXIT_OK
