"""mtp-tuner make-model: write a calibrated MTP GGUF (acceptance known exactly)."""

from __future__ import annotations

import argparse

from app.cli.common import EXIT_OK
from app.core.common.errors import UserError
from app.core.engines import calibrated_gguf


def parse_task_shares(text: str) -> dict[str, float]:
    """``code=0.05,story=0.9`` -> per-task shares of wrong drafts, each in [0, 1]."""
    task_p: dict[str, float] = {}
    for part in (x for x in text.split(",") if x.strip()):
        name, _, value = part.partition("=")
        try:
            task_p[name.strip()] = float(value)
        except ValueError:
            raise UserError(f"--tasks: expected task=share pairs like code=0.05,story=0.9, got {part!r}") \
                from None
        if not (0.0 <= task_p[name.strip()] <= 1.0) or not name.strip():
            raise UserError(f"--tasks: each share must be between 0 and 1 ({part})")
    return task_p


def run(args: argparse.Namespace) -> int:
    task_p = parse_task_shares(args.tasks) if args.tasks else None
    try:
        path = calibrated_gguf.make_model(args.out, args.p_reject, args.variant, args.size, args.seed,
                                     mtp=not args.no_mtp, task_p=task_p)
    except OSError as e:
        raise UserError(f"{args.out}: cannot write ({e.strerror or e})") from None
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return EXIT_OK
