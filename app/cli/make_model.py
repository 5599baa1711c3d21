"""mtp-tuner make-model: write a calibrated MTP GGUF, or a target and drafter pair (acceptance known
exactly)."""

from __future__ import annotations

import argparse

from app.cli.common import EXIT_OK
from app.cli.options import number, whole
from app.core.common.errors import UserError, os_reason
from app.core.calibrated import gguf as calibrated_gguf
from app.core.calibrated.design import SIZES

NAME = "make-model"
HELP = "write a calibrated MTP GGUF (acceptance known exactly)"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--p-reject", type=number(0.0, 1.0), default=0.0, help="share of drafts made wrong (0..1)")
    p.add_argument("--variant", choices=["embedding", "hidden", "chain"], default="embedding",
                   help="embedding: MTP predicts from the fed token; hidden: from the hidden state; chain "
                        "(--pair gemma4 only): the assistant's own hidden state carries to its next draft")
    p.add_argument("--size", choices=list(SIZES), default="tiny",
                   help="tiny: a few MB, for tests; demo: ~130 MB, the demo's; bench: ~0.9 GB, realistic "
                        "decode cost on CPU")
    p.add_argument("--tasks", help="per-task shares of wrong drafts instead of --p-reject, e.g. "
                   "code=0.05,story=0.9 (prompts ending in the digit 1, 2, ... lead into each task's region)")
    p.add_argument("--seed", type=whole(0, 2**32 - 1), default=0)
    p.add_argument("--no-mtp", action="store_true", help="write no MTP (NextN) block")
    p.add_argument("--pair", choices=["gemma4", "draft-simple"], default=None,
                   help="write a target and its drafter into the folder OUT instead: gemma4 (a tiny gemma4 "
                        "target and its gemma4-assistant, for -md with draft-mtp; --variant embedding, hidden "
                        "or chain) or draft-simple (a qwen35 target and a small draft model); --p-reject is "
                        "the drafter's share of wrong drafts")


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
    if getattr(args, "pair", None):
        return _pair(args)
    if args.variant == "chain":
        raise UserError("--variant chain is a Gemma 4 assistant's: use it with --pair gemma4")
    task_p = parse_task_shares(args.tasks) if args.tasks else None
    try:
        path = calibrated_gguf.make_model(args.out, args.p_reject, args.variant, args.size, args.seed,
                                     mtp=not args.no_mtp, task_p=task_p)
    except OSError as e:
        raise UserError(f"{args.out}: cannot write ({os_reason(e)})") from None
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return EXIT_OK


def _pair(args: argparse.Namespace) -> int:
    """make-model --pair: a target and its drafter written into the folder ``args.out``."""
    from app.core.calibrated import gemma4 as calibrated_gemma4  # deferred: the Gemma 4 writer only for --pair gemma4

    if args.tasks or args.no_mtp or args.size != "tiny":
        raise UserError("--pair writes tiny pairs with one --p-reject; --tasks, --no-mtp and --size do not apply")
    try:
        if args.pair == "gemma4":
            target, drafter = calibrated_gemma4.make_gemma4_pair(args.out, args.p_reject, args.variant, args.seed)
            how = "-md {d} --spec-type draft-mtp"
        else:
            if args.variant != "embedding":
                raise UserError("--pair draft-simple has one variant (embedding)")
            target, drafter = calibrated_gguf.make_pair(args.out, args.p_reject, args.seed)
            how = "-md {d} --spec-type draft-simple"
    except OSError as e:
        raise UserError(f"{args.out}: cannot write ({os_reason(e)})") from None
    print(f"wrote {target} ({target.stat().st_size:,} bytes)\nwrote {drafter} ({drafter.stat().st_size:,} bytes)"
          f"\nrun with: -m {target} " + how.format(d=drafter))
    return EXIT_OK
