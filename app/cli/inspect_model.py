"""mtp-tuner inspect: what a GGUF is (architecture, sizes, MTP heads) and whether it fits."""

from __future__ import annotations

import argparse
import dataclasses
import json

from app.cli.common import EXIT_OK
from app.core.common.errors import UserError
from app.core.machine.hardware import snapshot
from app.core.machine.fit import fit_summary, format_fit
from app.core.machine.modelinfo import KV_BYTES, format_info, inspect


def run(args: argparse.Namespace) -> int:
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
