"""mtp-tuner compare: two sweeps side by side (what changed in the set-up, tok/s, speedups,
verdicts), drawn from the one field list (app.core.analysis.fields.COMPARE_FIELDS). A cell is
"changed" only where the 95 % interval of B/A excludes 1 (app.core.analysis.compare.difference)."""

from __future__ import annotations

import argparse
import json

from app.cli.common import EXIT_OK, load_sweep
from app.core.analysis.analysis import analyze
from app.core.analysis.compare import (builds, compare, format_builds, format_changes, format_summary,
                                       setting_changes, summary)
from app.core.analysis.fields import COMPARE_FIELDS, cell_rows, text_table
from app.core.analysis.settings import one_setting


def run(args: argparse.Namespace) -> int:
    recs = [one_setting(load_sweep(args.a, args.sweep_a, hint="--sweep-a ID")[0], args.setting_a, "A", "--setting-a"),
            one_setting(load_sweep(args.b, args.sweep_b, hint="--sweep-b ID")[0], args.setting_b, "B", "--setting-b")]
    changes = setting_changes(*recs)
    built = builds(*recs)
    rows = compare(analyze(recs[0]), analyze(recs[1]), recs[0], recs[1])
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "builds": built,
                          "changes": [{"what": w, "a": x, "b": y} for w, x, y in changes],
                          "summary": summary(rows),
                          "cells": cell_rows(rows, COMPARE_FIELDS)}, indent=2))
        return EXIT_OK
    print(f"A: {args.a}\nB: {args.b}\n{format_builds(built)}\n{format_changes(changes)}\n")
    print(text_table(rows, COMPARE_FIELDS, rule=False))
    print("\n" + format_summary(rows))
    return EXIT_OK
