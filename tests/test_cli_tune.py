"""mtp-tuner tune: the Start page's flow from the command line. Its request is the core's
(app.core.session.tune, which the Start page calls too), its options are checked in one line, and
a short live run on the tiny calibrated model prints the answer as JSON: per task its pick and
its llama-server command, and where the sweep stopped. No timing is asserted."""

from __future__ import annotations

import json

import pytest

from app.core.calibrated.demo import demo_model
from app.core.common.errors import UserError
from app.core.session.request import ADAPTIVE_MAX_REPS
from app.core.session.tune import QUICK_S, parse_uses, tune_request
from test_cli import assert_clean_error, cli


def test_the_uses_are_tasks_with_weights_if_given():
    assert parse_uses("code,story") == {"code": 1.0, "story": 1.0}
    assert parse_uses("code=0.7, story=0.3") == {"code": 0.7, "story": 0.3}
    assert parse_uses("code=2,story=0") == {"code": 2.0}  # a weight of 0 leaves the task out
    for bad, said in [("", "name at least one use"), ("code=-1", "must not be negative"),
                      ("code=x", "not a number"), ("code=0", "--for: the weights add up to zero"), ("code,code", "given twice")]:
        with pytest.raises(UserError, match=said):
            parse_uses(bad)


def test_quick_and_thorough_are_the_start_pages_requests():
    model = str(demo_model())
    quick = tune_request(model, {"code": 0.7, "story": 0.3}, quick=True, started=12.5)
    assert quick.adaptive is not None and quick.adaptive.budget_s == QUICK_S and quick.adaptive.started == 12.5
    assert quick.adaptive.ks == (1, 2, 3) and quick.mix == "code=0.7,story=0.3"  # the demo's own widths
    assert [p.task for p in quick.plan.prompts] == ["code", "story"]  # the demo's own prompt per task
    thorough = tune_request(model, {"code": 1}, quick=False)
    assert thorough.adaptive is not None and thorough.adaptive.budget_s is None
    assert thorough.adaptive.max_reps == ADAPTIVE_MAX_REPS  # the cap it states before it starts
    ngram = tune_request(model, {"code": 1}, quick=True, ngram=True)
    assert ngram.adaptive is None and ngram.until_decided and {a.mode for a in ngram.plan.arms if a.is_spec} == {
        "ngram-mod", "ngram-simple"}


def test_tune_options_are_checked_in_one_line(tmp_path):
    r = cli("tune", "--for", "code")
    assert r.returncode == 2 and "one of the arguments --model --demo is required" in r.stderr
    assert_clean_error(cli("tune", "--demo", "--quick", "--thorough"), "not allowed with argument")
    assert_clean_error(cli("tune", "--demo", "--for", "code=-1"), "must not be negative")
    assert_clean_error(cli("tune", "--model", str(tmp_path / "none.gguf")), "no such file")
    assert_clean_error(cli("tune", "--demo", "--quick", "soon"), "--quick")
    r = cli("tune", "--help")
    assert r.returncode == 0 and "--for USES" in r.stdout and "--thorough" in r.stdout
    assert "tune" in cli("--help").stdout


def test_a_short_quick_tune_on_the_demo_answers_as_json_with_a_command_per_task(tmp_path):
    out = tmp_path / "tune.jsonl"
    r = cli("tune", "--demo", "--for", "code=0.7,story=0.3", "--quick", "20s", "--json", "--out", str(out))
    assert r.returncode in (0, 1), r.stderr  # 1: no answer (a busy machine's runs are withheld)
    assert "Traceback" not in r.stderr
    assert "it runs until every task is decided, or for at most 20 s" in r.stderr  # the cap, said first
    d = json.loads(r.stdout)
    assert d["uses"] == {"code": 0.7, "story": 0.3} and d["quick"] is True and d["budget_s"] == 20.0
    assert d["results"] == str(out) and isinstance(d["elapsed_s"], float)
    dec = d["decisions"]
    assert dec["stopped"] in ("decided", "budget", "max_reps") and {t["task"] for t in dec["tasks"]} >= {"code", "story"}
    v = d["verdict"]
    if v is not None:  # the window's verdict: per task its pick and its own command (None when withheld)
        assert {t["task"] for t in v["per_task"]} == {"code", "story"} and v["mix"] == {"code": 0.7, "story": 0.3}
        assert all("command" in t and "k" in t for t in v["per_task"])
    if r.returncode == 0 and v is not None:
        assert all(t["command"] for t in v["per_task"])


def test_the_answer_is_the_windows_verdict_with_a_command_per_task(tmp_path, capsys):
    """tune's answer on recorded runs (a clear sweep: code pays, story does not): the window's
    verdict (build_verdict weighed by the uses), a command per task, and the decisions."""
    import argparse

    from app.cli import tune
    from app.cli.bench_view import BenchView
    from app.core.session.events import Decisions, SessionFinished
    from tests.helpers import clear_sweep_file

    path = tmp_path / "clear.jsonl"
    view = BenchView()
    view.records = clear_sweep_file(path)
    view.path = path
    view.done = SessionFinished(path, len(view.records), len(view.records), 0, False)
    view.last_decisions = Decisions((), len(view.records), 0, 30.0, None, True, "decided")
    args = argparse.Namespace(json=True, thorough=False, server_bin=None, ngl=None)
    rc = tune.answer(view, "/m.gguf", {"code": 0.7, "story": 0.3}, args, 31.0, 120.0)
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["decisions"]["stopped"] == "decided" and d["elapsed_s"] == 31.0
    per = {t["task"]: t for t in d["verdict"]["per_task"]}
    assert set(per) == {"code", "story"} and d["verdict"]["mix"] == {"code": 0.7, "story": 0.3}
    assert per["code"]["mtp"] and "--spec-type draft-mtp" in per["code"]["command"]  # its command turns MTP on
    assert per["story"]["command"] and "draft-mtp" not in per["story"]["command"]  # leave it off: plain
