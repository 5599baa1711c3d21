"""Results files are outside input (issue 36, item 11). A hostile watch record (1e400, a 400-digit
integer, strings for numbers, a list for the address, missing fields, negative counts, nesting)
crashed card and compare: each is now left out with one warning naming its file and line, and the
good records around it are shown."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import cli, clear_sweep_file, replayed_watch, server_costs

from app.core.records.writer import append_line

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
