"""mtp-tuner card: the result card of a sweep, to share: a Markdown row in the community's columns,
a JSON block and a PNG; with --community TABLE, where the result stands among that table's rows
(a plot against memory bandwidth or baseline tok/s). Watch summaries in the file (mtp-tuner watch
--out) come with it: "From your own use (watch)", the newest window per server and model (a file
with watch summaries only prints that section). What is printed is exactly what is shared:
no paths, no user or host names (app.core.verdict.card)."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import Sequence

from app.cli.common import EXIT_OK, NoRuns, load_sweep, warn_all
from app.cli.options import add_json, whole
from app.core.analysis.settings import one_setting
from app.core.analysis.community import Standing, load_table, place
from app.core.common.errors import UserError, os_reason
from app.core.analysis.watched import WatchSeen, format_seen
from app.core.records.reader import load_watch_records
from app.core.verdict.card import ALL_TASKS, Card, card_dict, card_json, card_of, card_watch, markdown_row, watch_text

NAME = "card"
HELP = ("the result card to share: a Markdown row in the community's columns, JSON, a PNG; --community TABLE "
        "places it among others' results")


def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", help="results JSONL from bench")
    p.add_argument("--sweep", help="the sweep when the file holds several (default: the latest)")
    p.add_argument("--model", help="the latest sweep of this model when the file holds several")
    p.add_argument("--setting", type=whole(1), default=None, help="the setting (1, 2, ...) when the sweep "
                   "measured several (sampler, thinking, depth): a card holds one")
    p.add_argument("--png", metavar="FILE", help="also write the card as a PNG")
    p.add_argument("--community", metavar="TABLE", help="a community results table (Markdown) to place the "
                   "result in; columns matched by their header names")
    p.add_argument("--placement-png", metavar="FILE", help="with --community: the plot of speedup against "
                   "memory bandwidth (or baseline tok/s), your point highlighted")
    p.add_argument("--axis", choices=["auto", "bandwidth", "baseline"], default="auto",
                   help="the placement's x axis (auto: memory bandwidth when known, else baseline tok/s)")
    add_json(p, help="print only the card's JSON")


def standing_of(card: Card, table_path: str, axis: str) -> Standing:
    """The card's best result over all tasks (or its one task) placed in the table at ``table_path``."""
    row = next((r for r in card.rows if r.task == ALL_TASKS), card.rows[0] if card.rows else None)
    if row is None or row.speedup is None:
        raise UserError("the sweep has no speculative arm with a speedup to place")
    label = f"you ({row.mode} K={row.n_max})" if row.n_max else f"you ({row.mode})"
    return place(load_table(table_path), row.speedup, row.baseline_tok_s, card.device, label, axis)


def run(args: argparse.Namespace) -> int:
    if args.placement_png and not args.community:
        raise UserError("--placement-png needs --community TABLE (the table to place the result in)")
    left_out: list[str] = []  # watch records that are not (records.watch): one warning each
    watch = load_watch_records(args.results, left_out)
    warn_all(left_out)
    try:
        runs = load_sweep(args.results, args.sweep, args.model)[0]
    except NoRuns as e:
        if not watch:
            raise
        if args.png or args.community:
            raise NoRuns(f"{e}: only watch summaries, and the card's picture and placement need a sweep's runs") \
                from None
        return _watch_only(args, card_watch(watch))
    card = card_of(one_setting(runs, args.setting, "the sweep", "--setting"), watch=watch)
    standing = standing_of(card, args.community, args.axis) if args.community else None
    if args.png or args.placement_png:
        write_pictures(card, standing, args.png, args.placement_png)
    if args.json:
        d = card_dict(card)
        if standing is not None:
            d["placement"] = {"axis": standing.axis, "above": standing.below, "of_unflagged": standing.reliable,
                              "text": standing.text}
        print(json.dumps(d, indent=2, ensure_ascii=False))
        return EXIT_OK
    print("Markdown (the community's columns; paste the rows under its table):\n")
    print(markdown_row(card))
    if card.watch:
        print("\n" + watch_text(card))
    print("\nJSON:\n")
    print(card_json(card))
    if standing is not None:
        print(f"\nAmong the table's rows ({standing.axis}):\n{standing.text}")
    return EXIT_OK


def write_pictures(card: Card, standing: Standing | None, png: str | None, placement_png: str | None) -> None:
    """--png (the card) and --placement-png (the standing: there when --community is, checked first)."""
    from app.drawing import card_png  # Qt loads only for the pictures

    drawings = [(png, functools.partial(card_png.render_card, card))]
    if standing is not None:
        drawings.append((placement_png, functools.partial(card_png.render_placement, standing)))
    for path, draw in drawings:
        if path:
            try:
                card_png.save_png(draw(), path)
            except OSError as e:
                raise UserError(f"{path}: cannot write the picture ({os_reason(e)})") from None
            print(f"wrote {path}", file=sys.stderr)


def _watch_only(args: argparse.Namespace, seen: Sequence[WatchSeen]) -> int:
    """A file with watch summaries and no sweep: its watch section alone."""
    print("note: no sweep in this file, only watch summaries: the card's row needs a sweep (mtp-tuner bench)",
          file=sys.stderr)
    if args.json:
        print(json.dumps({"watch": [s.to_dict() for s in seen]}, indent=2, ensure_ascii=False))
    else:
        print(format_seen(seen))
    return EXIT_OK
