"""mtp-tuner compare: two sweeps side by side (what changed in the set-up, tok/s, speedups,
verdicts), drawn from the one field list (app.core.analysis.fields.COMPARE_FIELDS). A cell is
"changed" only where the 95 % interval of B/A excludes 1 (app.core.analysis.compare.difference).
Then the files' watch summaries (mtp-tuner watch): which file holds them and, for a model watched
in both, the recommendations and the acceptance by position side by side
(app.core.analysis.watched). Two files with watch summaries and no runs compare those alone."""

from __future__ import annotations

import argparse
import json

from app.cli.common import EXIT_OK, NoRuns, load_sweep, warn_all
from app.cli.options import add_json, whole
from app.core.analysis.analysis import analyze
from app.core.analysis.compare import (builds, compare, format_builds, format_changes, format_summary,
                                       setting_changes, summary)
from app.core.analysis.fields import COMPARE_FIELDS, cell_rows, text_table
from app.core.analysis.settings import one_setting
from app.core.analysis.watched import WatchSeen, format_pairs, newest, pairs_dict
from app.core.records.reader import load_watch_records

NAME = "compare"
HELP = ("two sweeps side by side (e.g. before and after a llama.cpp update): what changed in the set-up, tok/s, "
        "speedups, verdicts")


def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="results JSONL (before)")
    p.add_argument("b", help="results JSONL (after)")
    p.add_argument("--sweep-a", help="the sweep of A when its file holds several (default: the latest)")
    p.add_argument("--sweep-b", help="the sweep of B when its file holds several (default: the latest)")
    p.add_argument("--setting-a", type=whole(1), default=None, help="the setting of A (1, 2, ...) when its sweep "
                   "measured several (sampler, thinking, depth); never pooled")
    p.add_argument("--setting-b", type=whole(1), default=None, help="the same for B")
    add_json(p)


def run(args: argparse.Namespace) -> int:
    left_out: list[str] = []  # watch records that are not (records.watch): one warning each
    seen = [newest(load_watch_records(args.a, left_out)), newest(load_watch_records(args.b, left_out))]
    warn_all(left_out)
    try:
        recs = [one_setting(load_sweep(args.a, args.sweep_a, hint="--sweep-a ID")[0], args.setting_a, "A",
                            "--setting-a"),
                one_setting(load_sweep(args.b, args.sweep_b, hint="--sweep-b ID")[0], args.setting_b, "B",
                            "--setting-b")]
    except NoRuns as e:
        if not (seen[0] and seen[1]):
            raise
        return _watch_only(args, seen, str(e))
    changes = setting_changes(*recs)
    built = builds(*recs)
    rows = compare(analyze(recs[0]), analyze(recs[1]), recs[0], recs[1])
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "builds": built,
                          "changes": [{"what": w, "a": x, "b": y} for w, x, y in changes],
                          "summary": summary(rows),
                          "cells": cell_rows(rows, COMPARE_FIELDS),
                          "watch": pairs_dict(*seen)}, indent=2))
        return EXIT_OK
    print(f"A: {args.a}\nB: {args.b}\n{format_builds(built)}\n{format_changes(changes)}\n")
    print(text_table(rows, COMPARE_FIELDS, rule=False))
    print("\n" + format_summary(rows))
    if seen[0] or seen[1]:
        print("\n" + format_pairs(*seen))
    return EXIT_OK


def _watch_only(args: argparse.Namespace, seen: list[list[WatchSeen]], why: str) -> int:
    """Both files hold watch summaries and one has no runs: compare the watch summaries alone."""
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "watch": pairs_dict(*seen)}, indent=2))
        return EXIT_OK
    print(f"A: {args.a}\nB: {args.b}\n({why}: the watch summaries alone)\n")
    print(format_pairs(*seen))
    return EXIT_OK
