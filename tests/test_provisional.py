"""A provisional answer from a busy machine's runs (app.core.analysis.provisional), from recorded
runs: the verdict, its text, report and JSON, bench --json, and the window's line."""

from __future__ import annotations

import json

import pytest

from app.core.measure.busy import DISTURBED
from app.core.records.arm import Arm
from app.core.verdict import build_verdict, markdown_report, verdict_dict, verdict_text
from helpers import make_record

CONFIRM = "provisional; run again when quiet to confirm"


def _runs(task: str, n: int, speedup: float, busy=frozenset(), mixed=frozenset(), start: int = 0):
    """``n`` pairs (baseline, then K=2 a second later) of ``task``; the pairs in ``busy`` ran
    both under cc1plus at 84 % (both slowed alike), those in ``mixed`` only their baseline."""
    out = []
    for i in range(n):
        t = start + 2 * i
        for j, arm in enumerate((Arm(), Arm(2))):
            hit = i in busy or (i in mixed and arm.is_baseline)
            speed = (20.0 if arm.is_baseline else 20.0 * speedup) * (0.5 if hit else 1.0) * (1 + 0.002 * (i % 3))
            out.append(make_record(arm, run_id=f"{task}{i}{j}", task=task, prompt_id=f"{task}-p", rep=i, tok_s=speed,
                                   timestamp_utc=f"2026-01-01T00:{(t + j) // 60:02d}:{(t + j) % 60:02d}Z",
                                   other_cpu=0.84 if hit else 0.02, flags=(DISTURBED,) if hit else (),
                                   other_top={"name": "cc1plus", "cpu": 0.84} if hit else None))
    return out


def busy_sweep():
    """Code measured mostly while a compiler ran (pairs 0-5 under one load, pair 6 mixed), stories
    quietly: 13 of 40 runs disturbed, more than the 25 % that withholds a verdict."""
    return _runs("code", 10, 1.2, busy=set(range(6)), mixed={6}) + _runs("story", 10, 0.8, start=40)


def test_pairs_under_one_load_give_a_provisional_answer_marked_per_task():
    v = build_verdict(busy_sweep())
    assert v.disturbed is not None and v.disturbed.withheld  # as busy as a withheld verdict was
    assert v.withheld is None and v.provisional == ("code",)
    assert v.is_provisional("code") and not v.is_provisional("story") and v.is_provisional()
    code, story = v.per_task
    assert code.arm == Arm(2) and code.ratio.estimate == pytest.approx(1.2, rel=0.01)
    assert code.ratio.n_pairs == 9  # the mixed pair (a busy baseline, a quiet K=2) is left out
    assert "measured while cc1plus was busy, 13 of 40 runs disturbed" in code.reason and CONFIRM in code.reason
    assert "95% CI" in code.reason  # with its interval
    assert story.arm is None and "provisional" not in story.reason
    assert v.command("code").export is not None  # a command, never an empty box
    text = verdict_text(v)
    assert "!! provisional answer (code): measured while cc1plus was busy" in text
    assert "verdict withheld" not in text
    assert "Provisional answer (code)" in markdown_report(v)


def test_the_json_carries_provisional_per_task():
    d = verdict_dict(build_verdict(busy_sweep()))
    assert [(t["task"], t["provisional"]) for t in d["per_task"]] == [("code", True), ("story", False)]
    assert d["per_task"][0]["command"] and d["recommendation"]["provisional"] is True
    assert d["withheld"] is None and d["disturbed"]["withheld"] is False and CONFIRM in d["disturbed"]["message"]
    assert CONFIRM in d["provisional"]
    quiet = verdict_dict(build_verdict(_runs("code", 6, 1.2)))
    assert quiet["provisional"] is None and quiet["per_task"][0]["provisional"] is False


def test_no_pair_under_one_load_still_withholds():
    v = build_verdict(_runs("code", 4, 1.2, mixed={0, 1, 2}))  # 3 of 8 busy, each beside a quiet run
    assert v.withheld and v.provisional == () and v.export is None
    assert all(p.arm is None for p in v.per_task)


def test_bench_json_marks_the_provisional_picks(capsys):
    from app.cli.bench import BenchView
    from app.core.session.events import RunFinished, SessionFinished, dispatch

    view = BenchView()
    runs = busy_sweep()
    for r in runs:
        dispatch(RunFinished(r), view.handlers)
    dispatch(SessionFinished(None, len(runs), len(runs), 0, False), view.handlers)
    capsys.readouterr()
    assert view.report(True, "m.gguf") == 0
    d = json.loads(capsys.readouterr().out)
    assert {p["task"]: p["provisional"] for p in d["picks"]} == {"code": True, "story": False}
    assert d["picks"][0]["pick"] == "K=2" and d["withheld"] is False
    assert any(CONFIRM in line for line in d["verdict"])


def test_the_window_line_says_provisional_not_sure():
    from app.gui.words import UNSURE, verdict_line

    v = build_verdict(busy_sweep())
    line, colour = verdict_line(v.per_task[0], "Code", v.withheld, v.repeats("code"), v.is_provisional("code"))
    assert line.startswith("Code: turn MTP on, K=2 -> 1.20x faster (") and "provisional" in line
    assert colour == UNSURE


def test_the_window_shows_the_provisional_answer_its_command_and_finish_when_quiet(window, qtbot, tmp_path):
    from app.core.records.writer import ResultsWriter

    path = tmp_path / "busy.jsonl"
    with ResultsWriter(path) as w:
        for r in busy_sweep():
            w.append(r)
    window.results_tab.open_results(str(path))
    v = window.state.verdict
    assert v.provisional == ("code",)
    rows = window.results_tab.banner.rows
    assert "provisional" in rows["code"].line.text() and "provisional" not in rows["story"].line.text()
    assert any(CONFIRM in t for t in rows["code"].warning_texts)
    start = window.start_tab
    assert start.finish_btn.isVisibleTo(start)
    window.state.command_requested.emit("code")
    exp = window.export_tab
    assert "Provisional command" in exp.verdict_label.text() and exp.command.toPlainText().strip()
    start.finish_btn.click()  # its model is not on this machine: said in words, nothing started
    assert not start.running and "not there any more" in (window.state.last_error or "")


def test_a_task_measured_only_while_busy_gets_a_provisional_answer_of_its_own():
    # 6 of 26 runs disturbed (23 %: the verdict stands), all of them the story's
    v = build_verdict(_runs("code", 10, 1.2) + _runs("story", 3, 0.8, busy={0, 1, 2}, start=40))
    assert v.withheld is None and v.provisional == ("story",)
    code, story = v.per_task
    assert code.arm == Arm(2) and "provisional" not in code.reason
    assert story.ratio is not None and story.ratio.n_pairs == 3 and CONFIRM in story.reason


def test_recommend_answers_provisionally_with_exit_0(tmp_path):
    from app.core.records.writer import ResultsWriter
    from helpers import cli

    path = tmp_path / "busy.jsonl"
    with ResultsWriter(path) as w:
        for r in busy_sweep():
            w.append(r)
    p = cli("recommend", str(path), "--json")
    assert p.returncode == 0, p.stderr  # an answer, not the withheld verdict's failed status
    d = json.loads(p.stdout)
    assert [t["provisional"] for t in d["per_task"]] == [True, False] and d["per_task"][0]["command"]
    assert "provisional answer: measured while cc1plus was busy" in p.stderr
