"""Results files and the app's other JSON files are outside input (issue 36, items 8 and 11).

A line nested deeper than any record (``[`` x 100,000) ended recommend, compare, card and bench
--again in RecursionError and kept the window from opening with it in the results folder: every
JSON read now goes through common.jsonsafe, and the line is left out with a warning as a cut line
is. A hostile watch record (1e400, a 400-digit integer, strings for numbers, a list for the
address, missing fields, negative counts, nesting) crashed card and compare: each is now left out
with one warning naming its file and line, and the good records around it are shown."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import cli, clear_sweep_file, replayed_watch, server_costs

from app.core.common.errors import UserError
from app.core.records.reader import load_cost_records, load_records, load_watch_records
from app.core.records.writer import append_line

DEEP = "[" * 100_000
RAW = "@@raw@@"
WATCH_COSTS = {1: 10.0, 2: 10.5, 3: 11.0, 4: 11.5, 5: 12.0, 6: 12.5}


def _no_traceback(r, rc: int = 0) -> None:
    assert r.returncode == rc, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stdout + r.stderr and "RecursionError" not in r.stderr, r.stderr[-2000:]


def _sweep_with(tmp_path: Path, *lines: str, name: str = "r.jsonl") -> tuple[Path, int]:
    """A sweep's results file with ``lines`` after its runs; the line number of the first."""
    path = tmp_path / name
    clear_sweep_file(path)
    first = len(path.read_text().splitlines()) + 1
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return path, first


# ---- a line nested 100,000 deep ---------------------------------------------------------------


def test_the_reader_leaves_a_deep_line_out_with_a_warning(tmp_path):
    path, n = _sweep_with(tmp_path, DEEP, '{"a": ' * 70 + "1" + "}" * 70, server_costs(WATCH_COSTS, 0.5).to_json())
    problems: list[str] = []
    assert len(load_records(path, problems)) == 36
    assert problems == [f"{path} line {n + i}: nested deeper than 64 levels, not a record; left out" for i in (0, 1)]
    assert [c.run_id for c in load_cost_records(path)] == ["c"] and load_watch_records(path) == []


@pytest.mark.parametrize("cmd", [("recommend", "F"), ("recommend", "F", "--json"), ("compare", "F", "F"),
                                 ("card", "F"), ("card", "F", "--json"), ("bench", "--again", "F")])
def test_recommend_compare_card_and_again_read_past_a_deep_line(tmp_path, cmd):
    path, n = _sweep_with(tmp_path, DEEP)
    r = cli(*[str(path) if a == "F" else a for a in cmd])
    _no_traceback(r, 2 if cmd[0] == "bench" else 0)
    said = f"line {n}: nested deeper than 64 levels"
    assert r.stderr.count(said) == (2 if cmd[0] == "compare" else 1), r.stderr  # each file read says it once
    if cmd[0] == "bench":  # read, then the sweep's model is not on this machine: one clean line
        assert "the sweep's model is not there" in r.stderr
    if "--json" in cmd:
        json.loads(r.stdout)


def test_the_window_opens_with_a_deep_line_and_hostile_records_in_the_results_folder(qtbot, tmp_path):
    pytest.importorskip("PySide6")
    from app.core.common.paths import results_dir
    from app.gui.main_window import MainWindow

    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    cost = json.loads(server_costs(WATCH_COSTS, 0.5).to_json())
    cost["step_ms"] = {"1": {"accept": {"median": "fast"}}}
    watch = json.loads(replayed_watch().record.to_json())
    watch["url"], watch["seconds"] = ["http://x"], "long"
    path, n = _sweep_with(folder, DEEP, json.dumps(cost), json.dumps(watch))
    (folder / "only-deep.jsonl").write_text(DEEP + "\n")
    (folder / "only-cost.jsonl").write_text(json.dumps(cost) + "\n")
    win = MainWindow(demo=True)
    win.quiet_errors = True
    qtbot.addWidget(win)
    win.show()
    res = win.results_tab
    res.refresh_history()
    listed = {res.history_box.itemData(i) for i in range(res.history_box.count())}
    assert str(path) in listed and str(folder / "only-deep.jsonl") in listed
    res.open_results(str(path))
    problems = list(res._file_problems)
    assert any(p.startswith(f"{path} line {n}: nested deeper") for p in problems), problems
    assert any(p.startswith(f"{path} line {n + 1}: not a valid cost-probe record") for p in problems), problems


def test_the_apps_other_json_files_refuse_deep_nesting(tmp_path, monkeypatch):
    from app.core.machine import runtime_store
    from app.core.machine.hub import load_catalog
    from app.core.measure.prompts import load_prompt_file
    from app.core.verdict.card import card_from_json

    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    with pytest.raises(UserError, match="not valid JSON"):
        load_prompt_file(deep)
    lines = tmp_path / "deep.jsonl"
    lines.write_text('{"id": "a", "task": "code", "text": "x"}\n' + DEEP + "\n")
    with pytest.raises(UserError, match="line 2: not valid JSON"):
        load_prompt_file(lines)
    with pytest.raises(UserError, match="not a result card"):
        card_from_json(DEEP)
    with pytest.raises(UserError, match="cannot read the model catalog"):
        load_catalog(deep)
    folder = tmp_path / "rt"
    folder.mkdir()
    (folder / runtime_store.META).write_text(DEEP)
    assert runtime_store.read_runtime(folder) is None
    monkeypatch.setattr(runtime_store, "_selected_file", lambda: deep)
    assert runtime_store.selected() is None


# ---- hostile watch records through card and compare ----------------------------------------------

# (id, key, value, raw JSON text in its place): each a record the watch never writes
HOSTILE_WATCH = [
    ("seconds-1e400", "seconds", None, "1e400"), ("generated-400-digits", "generated", None, "7" * 400),
    ("steps-a-string", "draft_steps", "247", None), ("url-a-list", "url", ["http://127.0.0.1:8080"], None),
    ("no-draft-steps", "draft_steps", ..., None), ("no-url", "url", ..., None),
    ("negative-position", "accepted_per_pos", [148, -124, 86], None), ("negative-steps", "draft_steps", -1, None),
    ("positions-a-string", "accepted_per_pos", "148,124,86", None), ("predicted-a-string", "predicted", "K=3", None),
    ("prediction-nan", "predicted", None, '[{"k": 1, "speedup": NaN, "lo": 1, "hi": 1, "extrapolated": false}]'),
    ("server-k-huge", "server_k", 10**12, None), ("time-a-number", "timestamp_utc", 5, None),
    ("modes-a-number", "spec_types", 5, None), ("host-a-number", "host", 5, None),
    ("nested-30", "predicted", None, "[" * 30 + "]" * 30),
    ("nested-100", "host", None, '{"a":' * 100 + "1" + "}" * 100),
]


def _hostile(good: dict, key: str, value, raw: str | None) -> str:
    d = dict(good)
    if value is ... and raw is None:
        del d[key]
    else:
        d[key] = RAW if raw is not None else value
    line = json.dumps(d)
    return line.replace(f'"{RAW}"', raw) if raw is not None else line


@pytest.fixture(scope="module")
def good_watch(tmp_path_factory) -> str:
    costs = tmp_path_factory.mktemp("costs") / "costs.jsonl"
    append_line(costs, server_costs(WATCH_COSTS, 0.5).to_json())
    return replayed_watch(costs).record.to_json()


@pytest.mark.parametrize("name, key, value, raw", HOSTILE_WATCH, ids=[h[0] for h in HOSTILE_WATCH])
def test_card_and_compare_leave_a_hostile_watch_record_out(tmp_path, good_watch, name, key, value, raw):
    path, n = _sweep_with(tmp_path, good_watch, _hostile(json.loads(good_watch), key, value, raw))
    other = tmp_path / "b.jsonl"
    shutil.copy(path, other)
    other.write_text("".join(other.read_text().splitlines(keepends=True)[:n]))  # the good watch record only
    said = f"{path} line {n + 1}: "
    for args in (("card", str(path)), ("compare", str(path), str(other)), ("card", str(path), "--json")):
        r = cli(*args)
        _no_traceback(r)
        assert r.stderr.count(said) == 1, (args, r.stderr)  # one warning, naming the file and line
        assert ("not a valid watch record" if name != "nested-100" else "nested deeper than 64") in r.stderr
        assert "calibrated-p0.3.gguf" in r.stdout  # the good record is shown
        if "--json" in args:
            assert len(json.loads(r.stdout)["watch"]) == 1
