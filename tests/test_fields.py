"""The one per-cell field list: every rendering (text, CSV, JSON, Markdown, the window's table,
compare) shows the same cells in the same columns."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from app.core.analysis.analysis import analyze

from app.core.analysis.compare import compare
from app.core.analysis.fields import (CELL_COLUMNS, COMPARE_FIELDS, cell_rows, cells_csv, format_analysis,
                                      markdown_table, table, text_table)
from app.core.measure.plan import make_arms
from app.core.records.arm import Arm
from app.core.records.reader import load_records

DATA = Path(__file__).parent / "data"


def test_every_rendering_comes_from_the_one_list():
    a = analyze(load_records(DATA / "demo_sweep.jsonl", mtp_times=False))
    headers, rows = table(a.cells)
    assert headers[:5] == ["task", "arm", "runs", "tok/s", "speedup [95% CI]"] and len(rows) == len(a.cells)
    text = text_table(a.cells).splitlines()
    assert text[0].split()[:4] == ["task", "arm", "runs", "tok/s"] and set(text[1]) == {"-"}
    assert all(r[0] in line and r[1] in line for r, line in zip(rows, text[2:]))
    assert format_analysis(a).startswith(text_table(a.cells))
    data = cell_rows(a.cells)
    assert [tuple(d) for d in data] == [CELL_COLUMNS] * len(a.cells)
    parsed = list(csv.DictReader(io.StringIO(cells_csv(a.cells))))
    assert [p["arm"] for p in parsed] == [d["arm"] for d in data] == [r[1] for r in rows]
    md = markdown_table(a.cells).splitlines()
    assert md[0] == "| " + " | ".join(headers) + " |" and len(md) == len(a.cells) + 2
    base = next(d for d in data if d["arm"] == "baseline")
    assert base["k"] is None and base["p_min"] is None and base["speedup"] is None
    cmp_rows = compare(a, a)
    assert cell_rows(cmp_rows, COMPARE_FIELDS)[1]["b_over_a"] == 1.0
    assert "verdict" in text_table(cmp_rows, COMPARE_FIELDS, rule=False).splitlines()[0]


def test_one_arm_type_with_one_label():
    assert [a.label for a in make_arms([2], [0.0, 0.5])] == ["baseline", "K=2", "K=2 p=0.5"]
    a = analyze(load_records(DATA / "demo_sweep.jsonl", mtp_times=False))
    assert Arm() in a.arms and a.cell("code", Arm(2, 0.0)).arm.label == "K=2"
