"""One cell shape: ``bench --json`` and ``recommend --json`` render their cells from one field list
through one function, with the same keys (and ``setting`` on each cell when the sweep has several)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from conftest import ROOT

from app.cli import bench_view as bench
from app.cli import main as cli_main
from app.core.analysis.fields import CELL_COLUMNS
from app.core.records.reader import load_records

DEMO = ROOT / "tests" / "data" / "demo_sweep.jsonl"


def _cli(*args):
    r = subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_bench_and_recommend_json_cells_have_the_same_keys(tmp_path):
    """The demo measured by bench (--json), then the same records through recommend --json."""
    out = tmp_path / "demo.jsonl"
    b = _cli("bench", "--demo", "--reps", "1", "--engine", "inprocess", "--out", str(out), "--json")
    r = _cli("recommend", str(out), "--json")
    bench_keys = {tuple(c) for c in b["cells"]}
    assert bench_keys == {tuple(c) for c in r["cells"]} == {CELL_COLUMNS}
    # the same records, the same analysis: the same cells, value for value
    assert b["cells"] == r["cells"]


def test_recorded_sweep_gives_the_same_cells_in_bench_and_recommend(capsys):
    assert cli_main(["recommend", str(DEMO), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert bench.summary_cells(load_records(DEMO)) == r["cells"]
    assert all("setting" not in c for c in r["cells"])  # one setting: no label


def test_a_sweep_of_several_settings_labels_each_cell_alike(tmp_path, capsys):
    recs = load_records(DEMO)
    deep = [dataclasses.replace(x, depth=2048, run_id=x.run_id + "-deep") for x in recs]
    path = tmp_path / "two.jsonl"
    path.write_text("".join(x.to_json() + "\n" for x in recs + deep))
    assert cli_main(["recommend", str(path), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    rec_cells = [c for s in r["settings"] for c in s["cells"]]
    bench_cells = bench.summary_cells(load_records(path))
    assert [c["setting"] for c in rec_cells] == [c["setting"] for c in bench_cells]
    labels = {c["setting"] for c in bench_cells}
    assert labels == {s["setting"] for s in r["settings"]} and len(labels) == 2 and "depth 2048" in labels
    assert {tuple(c) for c in bench_cells} == {tuple(c) for c in rec_cells} == {(*CELL_COLUMNS, "setting")}
    assert bench_cells == rec_cells
