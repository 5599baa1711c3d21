"""Hostile numbers: a community table whose cells hold a 400-digit, a 40,000-digit or a 10 MB
number, a table "file" that is /dev/zero, a FIFO or a folder, a results file with a tok/s of
1e308, and --mix weights that overflow. Each is refused with one message naming the file and
line (or the setting), never a traceback, a hang, runaway memory or a crash of Qt. Real files
and real processes; the hang guards are pytest-timeout's (a quadratic parse ran for minutes)."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.analysis.community import TableError, load_table, parse_table
from app.core.analysis.recommend import parse_mix
from app.core.common.errors import UserError
from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter
from conftest import ROOT
from tests.helpers import clean_error, make_record, two_model_file

DATA = ROOT / "tests" / "data"
RESULTS = DATA / "compare_before.jsonl"  # a sweep the card is made of
HEAD = "| GPU | Baseline tok/s | MTP tok/s | Speedup | Acceptance |\n|---|---|---|---|---|\n"
GOOD = ["RTX 3090", "30.9", "46.4", "1.50x", "0.78"]
COLUMN = {"baseline": 1, "spec": 2, "speedup": 3, "acceptance": 4}


def table(column: str, cell: str) -> str:
    """A table of one good row (line 3) and one row (line 4) with ``cell`` in ``column``."""
    bad = list(GOOD)
    bad[COLUMN[column]] = cell
    return HEAD + "| " + " | ".join(GOOD) + " |\n| " + " | ".join(bad) + " |\n"


def run_cli(*args: str, memory: int = 4 * 2**30, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m app ...`` with its address space limited (a runaway read fails at the limit
    instead of taking the machine's memory)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=limit)


# ------------------------------------------------------------------------------------------
# the community table: numbers with a length cap, finite and plausible, each a message naming the line


@pytest.mark.timeout(60)
@pytest.mark.parametrize("column, cell, words", [
    ("baseline", "1" * 400, "a number of 400 characters"),
    ("spec", "9" * 400, "a number of 400 characters"),
    ("speedup", "1" * 400, "a number of 400 characters"),
    ("acceptance", "1" * 400, "a number of 400 characters"),
    ("speedup", "1" * 40_000, "40,000 characters"),
    ("acceptance", "1" * 40_000, "40,000 characters"),
    ("baseline", "1" * 40_000, "40,000 characters"),
    ("baseline", "1e400", "inf tok/s is out of the plausible range"),
    ("spec", "20000000", "out of the plausible range"),
    ("speedup", "5000x", "5000x is out of the plausible range"),
    ("speedup", "-150%", "-0.5x is out of the plausible range"),
    ("acceptance", "150 %", "above 100 %"),
])
def test_a_hostile_number_is_refused_naming_the_line(column, cell, words):
    with pytest.raises(TableError) as e:
        parse_table(table(column, cell), "t.md")
    msg = str(e.value)
    assert e.value.line == 4 and msg.startswith("t.md, line 4: ") and words in msg, msg
    assert len(msg) < 300  # the cell is quoted shortened, not repeated whole


@pytest.mark.timeout(60)
def test_a_long_line_and_a_big_file_are_refused(tmp_path):
    # a 1 MiB cell under the file's limit: the line is refused, naming it
    with pytest.raises(TableError) as e:
        parse_table(table("speedup", "1" * 2**20), "t.md")
    assert e.value.line == 4 and "more than the 65,536 a table line may have" in str(e.value)
    # a 10 MB line: the file is refused before it is parsed, and so is the same text pasted
    big = tmp_path / "big.md"
    big.write_text(table("acceptance", "7" * 10 * 2**20))
    with pytest.raises(UserError, match=r"big\.md: 10,485,9\d\d bytes, more than the 4 MiB a community table"):
        load_table(str(big))
    with pytest.raises(UserError, match="more than the 4 MiB a community table may have"):
        parse_table(big.read_text(), "the pasted table")


@pytest.mark.timeout(60)
def test_a_cell_too_long_to_be_a_figure_is_refused_before_its_markup_is_read():
    """Unclosed markup makes the tag and link patterns backtrack over the whole cell, from each
    of its positions; a cell over the limit is refused before they run."""
    for cell in ("<" * 60_000, "[" * 60_000, "1" + " " * 60_000 + "x"):
        with pytest.raises(TableError, match="line 4: the 'baseline tok/s' cell has 60,00[0-2] characters, more "
                           "than the 1024"):
            parse_table(table("baseline", cell), "t.md")


def test_the_good_rows_around_still_parse():
    t = parse_table(HEAD + "| " + " | ".join(GOOD) + " |\n| RTX 4090 | 1.5e2 | 300 | 2x | 78 % |\n")
    assert [(r.baseline, r.spec, r.speedup, r.acceptance) for r in t.rows] == [(30.9, 46.4, 1.5, 0.78),
                                                                                (150.0, 300.0, 2.0, 0.78)]


@pytest.mark.timeout(120)
def test_a_community_path_that_is_not_a_file_is_one_message(tmp_path):
    fifo = tmp_path / "table.fifo"
    os.mkfifo(fifo)  # no writer: reading it would wait for ever
    for path, kind in (("/dev/zero", "a device"), (str(fifo), "a FIFO"), (str(tmp_path), "a folder")):
        r = run_cli("card", str(RESULTS), "--community", path, memory=2 * 2**30, timeout=100)
        clean_error(r, f"{path}: is {kind}", "the community table must be a file")
        assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.timeout(300)
def test_the_placement_png_of_a_400_digit_table_is_one_message_not_a_crash(tmp_path):
    bad = tmp_path / "t.md"
    bad.write_text(table("baseline", "9" * 400))
    out = tmp_path / "p.png"
    r = run_cli("card", str(RESULTS), "--community", str(bad), "--placement-png", str(out), "--axis", "baseline")
    clean_error(r, f"{bad}, line 4: 'baseline tok/s' is '999", "a number of 400 characters")
    assert not out.exists()


def test_the_plot_draws_only_plausible_points():
    """Whatever builds a Standing, render_placement draws it: an infinite, NaN or absurd point
    is left out of the picture instead of breaking the axis."""
    pytest.importorskip("PySide6")
    from app.drawing import card_png
    from app.core.analysis.community import Standing

    for x, y in ((float("inf"), 1.5), (30.0, float("nan")), (1e300, 1e300), (-5.0, 2.0)):
        s = Standing("baseline tok/s", ((30.0, 1.4, True, "a"), (x, y, False, "b")), (x, y, "you"), 0, 1, "two rows")
        assert card_png.png_bytes(card_png.render_placement(s))[:4] == b"\x89PNG"


@pytest.mark.timeout(120)
def test_the_card_dialog_refuses_a_pasted_or_loaded_hostile_table(state, tmp_path):
    from app.gui.tabs.results.card import CardDialog

    dlg = CardDialog(state, load_records(RESULTS))
    assert dlg.place_text(table("baseline", "1" * 400)) is None
    assert "the pasted table, line 4: 'baseline tok/s'" in state.errors[-1]
    assert dlg.place_text(table("speedup", "3" * 10 * 2**20)) is None
    assert "more than the 4 MiB" in state.errors[-1]
    bad = tmp_path / "t.md"
    bad.write_text(table("spec", "9" * 400))
    dlg.load_table(str(bad))
    assert f"{bad}, line 4: 'mtp tok/s'" in state.errors[-1]
    fifo = tmp_path / "t.fifo"
    os.mkfifo(fifo)
    dlg.load_table(str(fifo))
    assert state.errors[-1] == f"{fifo}: is a FIFO (named pipe), not a regular file: the community table must be a file"
    assert dlg.place_text((DATA / "community_table.md").read_text()) is not None  # a good table still places
    dlg.close()


# ------------------------------------------------------------------------------------------
# a results file: a speed that would overflow the statistics is refused at read time


def _with_huge_speed(path: Path) -> int:
    """two_model_file with runs of tok/s 1e308 (and other speeds and counts too large for the
    statistics: a JSON integer may have 400 digits) in the latest sweep; the first one's line."""
    two_model_file(path)
    line = len(path.read_text().splitlines()) + 1
    with ResultsWriter(path) as w:
        for i, kw in enumerate((dict(tok_s=1e308), dict(tok_s=1.7e308, rep=1), dict(prompt_tok_s=1e300, rep=2),
                                dict(tok_s_engine=10**400, rep=3), dict(draft_n=10**400, draft_accepted=1, rep=4))):
            w.append(make_record(run_id=f"huge{i}", sweep_id="new222", model_path="/models/B-Q4_0.gguf",
                                 timestamp_utc="2026-01-01T00:59:00+00:00", **kw))
    return line


def test_a_speed_beyond_any_real_one_is_a_warning_naming_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    line = _with_huge_speed(path)
    problems: list[str] = []
    runs = load_records(path, problems)
    assert not [r for r in runs if r.run_id.startswith("huge")]
    assert [p.split(": ", 1)[0] for p in problems] == [f"{path} line {line + i}" for i in range(5)]
    assert "tok_s is 1e+308, more than any run measures" in problems[0] and "prompt_tok_s is 1e+300" in problems[2]
    assert "tok_s_engine is about 10^400" in problems[3] and "draft_n is about 10^400" in problems[4]
    assert all("left out of the statistics" in p for p in problems)


@pytest.mark.parametrize("cmd", [("recommend",), ("recommend", "--json"), ("compare", "SELF"), ("card",),
                                 ("card", "--json")])
def test_recommend_compare_and_card_warn_and_go_on(cmd, tmp_path):
    path = tmp_path / "r.jsonl"
    line = _with_huge_speed(path)
    args = [a if a != "SELF" else str(path) for a in cmd]
    r = run_cli(args[0], str(path), *args[1:])
    assert r.returncode == 0 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert f"line {line}: tok_s is 1e+308" in r.stderr
    if "--json" in cmd:
        json.loads(r.stdout)


# ------------------------------------------------------------------------------------------
# --mix: finite, bounded weights, in the one parser of the CLI and the window


def test_mix_weights_are_finite_and_bounded():
    for mix, words in (("code=1e308,story=1e308", "'1e308' is more than the 1,000,000 a weight may be (code=1e308)"),
                       ("code=2e6,story=1", "more than the 1,000,000"), ("code=1e-9,story=1", "less than the 0.000001")):
        with pytest.raises(UserError, match=re.escape(words)):
            parse_mix(mix, ("code", "story"))
    assert parse_mix("code=1e6,story=1e6", ("code", "story")) == {"code": 0.5, "story": 0.5}  # the bounds fit
    assert parse_mix("code=3,story=0", ("code", "story")) == {"code": 1.0}  # 0 leaves a task out


def test_recommend_refuses_an_overflowing_mix(tmp_path):
    """Two tasks measured: the old parser summed 1e308 + 1e308 to infinity and showed 0 % each."""
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        for task in ("code", "story"):
            for rep in range(6):
                ts = f"2026-01-01T00:{rep * 2:02d}:00+00:00"
                w.append(make_record(run_id=f"{task}b{rep}", task=task, arm_kind="baseline", k=None, p_min=None,
                                     draft_n=None, draft_accepted=None, acceptance=None, mtp_engaged=None, rep=rep,
                                     tok_s=40.0 + rep, timestamp_utc=ts))
                w.append(make_record(run_id=f"{task}m{rep}", task=task, rep=rep, tok_s=60.0 + rep, timestamp_utc=ts))
    assert run_cli("recommend", str(path), "--mix", "code=0.6,story=0.4").returncode == 0
    clean_error(run_cli("recommend", str(path), "--mix", "code=1e308,story=1e308"),
                "--mix: '1e308' is more than the 1,000,000 a weight may be (code=1e308)")
