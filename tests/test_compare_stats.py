"""compare with statistics: a cell is "changed" only where the 95 % interval of B/A
(of the paired speedups, or of the baseline's tok/s) excludes 1; a verdict that crossed a boundary
by noise is shown as such; the smallest detectable change is reported; the same in compare's text,
--json and the window's Comparison view."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from app.core.analysis.analysis import analyze
from app.core.analysis.compare import (CHANGED, SAME, TOO_FEW, cell_logs, compare, difference, format_summary,
                                       summary)
from app.core.analysis.fields import COMPARE_FIELDS, cell_rows, text_table
from app.core.analysis.stats import t95
from app.core.records.arm import Arm
from app.core.records.reader import load_records
from app.core.records.schema import RunRecord
from tests.helpers import make_record

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
BEFORE, AFTER = DATA / "compare_before.jsonl", DATA / "compare_after.jsonl"


def _pair():
    a, b = load_records(BEFORE), load_records(AFTER)
    return a, b, {(c.task, c.arm.label): c for c in compare(analyze(a), analyze(b), a, b)}


def test_the_recorded_pair_only_the_true_30_percent_drop_is_changed():
    """compare_before/after.jsonl (tests/data/make_compare_pair.py): code K=2 dropped 30 % (1.50 ->
    1.05); story K=2 is 1.03 in both, faster in A and within noise in B by noise alone."""
    _, _, rows = _pair()
    code, story = rows[("code", "K=2")], rows[("story", "K=2")]
    assert code.changed and code.status == CHANGED and code.change.what == "speedup"
    assert 0.65 < code.change.estimate < 0.75 and code.change.hi < 1  # the built-in 0.70
    assert story.verdict_changed and (story.a.verdict, story.b.verdict) == ("faster", "within noise")
    assert not story.changed and story.status == SAME and story.change.lo < 1 < story.change.hi
    assert [k for k, c in rows.items() if c.changed] == [("code", "K=2")]
    assert [k for k, c in rows.items() if c.verdict_changed] == [("story", "K=2")]
    assert rows[("code", "baseline")].change.what == "tok/s" and not rows[("code", "baseline")].changed
    # the smallest detectable change: the interval's half-width, a few % with 9 pairs a side
    assert all(0 < c.change.detectable < 0.06 for c in rows.values())
    text = text_table(rows.values(), COMPARE_FIELDS, rule=False)
    line = {ln.split()[0] + " " + ln.split()[1]: ln for ln in text.splitlines()[1:]}
    assert "changed" in line["code K=2"] and "(changed)" not in line["code K=2"]  # faster -> faster: no crossing
    assert line["story K=2"].rstrip().endswith("faster -> within noise  (noise, not a change)")
    assert "same within noise" in line["story K=2"]


def test_compare_json_and_text_say_the_same(tmp_path):
    r = subprocess.run([sys.executable, "-m", "app", "compare", str(BEFORE), str(AFTER), "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["summary"]["changed"] == ["code K=2"] and d["summary"]["crossed_by_noise"] == ["story K=2"]
    lo, hi = d["summary"]["detectable_speedup"]
    assert 0 < lo <= hi < 0.06
    cells = {(c["task"], c["arm"]): c for c in d["cells"]}
    code, story = cells[("code", "K=2")], cells[("story", "K=2")]
    assert code["changed"] and code["status"] == "changed" and code["change_of"] == "speedup"
    assert code["change_lo"] < code["change"] < code["change_hi"] < 1
    assert story["verdict_changed"] and not story["changed"] and story["status"] == "same within noise"
    assert cells[("story", "baseline")]["change_of"] == "tok/s"
    assert d["watch"] == {"a": [], "b": [], "pairs": []}  # neither file holds a watch summary
    r = subprocess.run([sys.executable, "-m", "app", "compare", str(BEFORE), str(AFTER)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "changed (the 95 % interval of B/A excludes 1): code K=2\n" in r.stdout
    assert "verdicts that crossed a boundary by noise, not a change: story K=2\n" in r.stdout
    assert "smallest change these sweeps could detect: speedup ±" in r.stdout
    assert "From your own use" not in r.stdout


def test_difference_is_welchs_interval_on_the_logs():
    a, b = [0.0, 0.1, 0.2, 0.05], [0.3, 0.5, 0.35]
    d = difference(a, b, "speedup")
    va, vb = statistics.variance(a) / 4, statistics.variance(b) / 3
    df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2)
    h = t95(int(df)) * math.sqrt(va + vb)
    m = statistics.fmean(b) - statistics.fmean(a)
    assert d.estimate == pytest.approx(math.exp(m)) and d.lo == pytest.approx(math.exp(m - h))
    assert d.hi == pytest.approx(math.exp(m + h)) and d.detectable == pytest.approx(math.exp(h) - 1)
    assert d.status == CHANGED and (d.n_a, d.n_b) == (4, 3)
    assert difference([0.1], [0.1, 0.2], "tok/s").status == TOO_FEW  # one value: no spread to judge by
    assert difference([], [0.1, 0.2], "tok/s").estimate is None
    assert difference([0.1, 0.1], [0.1, 0.1], "speedup").status == SAME  # no spread, no difference
    assert difference([0.1, 0.1], [0.2, 0.2], "speedup").status == CHANGED  # no spread, a real difference
    assert difference([0.1, 0.3], [0.2, 0.4], "speedup").status == SAME


@pytest.mark.parametrize("path", [BEFORE, DATA / "demo_sweep.jsonl"])
def test_cell_logs_pair_runs_as_the_analysis_does(path):
    """The logs compare uses are the analysis' own pairs: their mean is each cell's log speedup."""
    recs = load_records(path)
    a, logs = analyze(recs), cell_logs(recs)
    for c in a.cells:
        xs = logs[(c.task, c.arm)]
        if c.ratio is None:
            assert len(xs) == c.tok_s.n and math.exp(statistics.fmean(xs)) == pytest.approx(
                statistics.geometric_mean([math.exp(x) for x in xs]))
        else:
            assert len(xs) == c.ratio.n_pairs and statistics.fmean(xs) == pytest.approx(c.ratio.log_mean, abs=1e-12)


def test_without_records_compare_keeps_to_the_cells():
    a = analyze(load_records(BEFORE))
    rows = compare(a, a)
    assert all(c.change is None and c.status == "-" and not c.changed for c in rows)
    assert "no statistics" in format_summary(rows)


# -- the property: a sweep against itself, or a resample of itself, is never "changed" -------
def sweep(speedups: dict, reps: int, prompts: int, noise: float, rng: random.Random) -> list[RunRecord]:
    """A sweep with each repetition's runs of a prompt together (the analysis pairs each run with
    the baseline of its own repetition); tok/s with log-normal noise."""
    out, t = [], 0
    for rep in range(reps):
        for task, per_k in speedups.items():
            for p in range(prompts):
                for k in (None, *per_k):
                    s = 40.0 * math.exp(rng.gauss(0, noise)) * (per_k[k] if k else 1.0)
                    out.append(make_record(
                        run_id=f"r{len(out)}", sweep_id="s", arm_kind="mtp" if k else "baseline", k=k,
                        p_min=0.0 if k else None, task=task, prompt_id=f"{task}{p}", rep=rep, n_predict=64,
                        n_generated=64, tok_s=s, tok_s_engine=None, draft_n=10 if k else None,
                        draft_accepted=7 if k else None, acceptance=0.7 if k else None, mtp_engaged=bool(k) or None,
                        output_sha256="x", output_tokens=(1,), prompt_tokens=(1,), prompt_tok_s=None,
                        model_path="/m/x.gguf", token_times=(0.0, 0.1),
                        timestamp_utc=f"2026-08-20T{10 + rep:02d}:00:{t % 60:02d}+00:00",
                        spec_type="draft-mtp" if k else "none"))
                    t += 1
    return out


def resample(recs: list[RunRecord], rng: random.Random) -> list[RunRecord]:
    """The same sweep measured "again": each prompt's and arm's speeds dealt to its repetitions in
    another order (so the runs pair differently and every interval and verdict can move), with new
    run and sweep ids and the records in another order. Each cell's runs are the same multiset, so
    its geometric mean stays; its spread does not."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(recs):
        groups.setdefault((r.task, r.prompt_id, r.k), []).append(i)
    speeds = [r.tok_s for r in recs]
    for idx in groups.values():
        vals = [speeds[i] for i in idx]
        rng.shuffle(vals)
        for i, v in zip(idx, vals):
            speeds[i] = v
    out = [dataclasses.replace(r, tok_s=s, run_id=f"again{i}", sweep_id="again") for i, (r, s) in
           enumerate(zip(recs, speeds))]
    rng.shuffle(out)
    return out


SPEEDUP = st.floats(0.5, 2.5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10 ** 6), reps=st.integers(2, 5), prompts=st.integers(1, 3), noise=st.floats(0.0, 0.3),
       code=st.lists(SPEEDUP, min_size=1, max_size=3), story=st.lists(SPEEDUP, min_size=1, max_size=3))
def test_a_sweep_against_itself_or_a_resample_of_itself_is_never_changed(seed, reps, prompts, noise, code, story):
    rng = random.Random(seed)
    recs = sweep({"code": dict(enumerate(code, 1)), "story": dict(enumerate(story, 1))}, reps, prompts, noise, rng)
    again = resample(recs, rng)
    a = analyze(recs)
    for other in (recs, again):
        rows = compare(a, analyze(other), recs, other)
        assert not [c for c in rows if c.changed], [(c.task, c.arm.label, c.change) for c in rows if c.changed]
        assert all(c.a and c.b and c.change and c.change.status in (SAME, TOO_FEW) for c in rows)
        assert summary(rows)["changed"] == []


def test_a_resample_can_cross_a_verdict_boundary_and_is_still_not_changed():
    """The property is not empty: among a few seeds, a resample moves a verdict across a boundary
    (a verdict that changes by noise alone) and compare calls it noise."""
    crossings = 0
    for seed in range(40):
        rng = random.Random(seed)
        recs = sweep({"code": {2: 1.06}}, 3, 2, 0.05, rng)
        again = resample(recs, rng)
        rows = compare(analyze(recs), analyze(again), recs, again)
        assert not any(c.changed for c in rows)
        crossings += sum(c.verdict_changed for c in rows)
    assert crossings > 0


def test_a_real_change_is_found_by_the_same_design():
    rng = random.Random(3)
    a = sweep({"code": {2: 1.5}}, 3, 2, 0.03, rng)
    b = sweep({"code": {2: 1.05}}, 3, 2, 0.03, rng)
    row = next(c for c in compare(analyze(a), analyze(b), a, b) if c.arm == Arm(2))
    assert row.changed and row.change.estimate == pytest.approx(0.7, rel=0.05)


# -- the window's Comparison view -------------------------------------------------------------
def test_the_comparison_view_shows_the_statistics(window):
    pytest.importorskip("PySide6")
    tab = window.results_tab
    tab.open_results(str(BEFORE))
    tab.compare_results(str(AFTER))
    t = tab.compare_table
    headers = [t.horizontalHeaderItem(c).text().strip() for c in range(t.columnCount())]
    rows = {(t.item(r, 0).text(), t.item(r, 1).text()): [t.item(r, c).text() for c in range(t.columnCount())]
            for r in range(t.rowCount())}
    status, verdict = headers.index("status"), headers.index("verdict")
    assert rows[("code", "K=2")][status] == "changed"
    assert rows[("story", "K=2")][status] == "same within noise"
    assert rows[("story", "K=2")][verdict].endswith("(noise, not a change)")
    assert "B/A [95% CI]" in headers and "detect" in headers
    label = tab.compare_label.text()
    assert "changed (the 95 % interval of B/A excludes 1): code K=2" in label
    assert "crossed a boundary by noise, not a change: story K=2" in label
    assert "From your own use" not in label  # neither file holds a watch summary


def test_the_comparison_view_shows_the_watch_summaries(window, tmp_path):
    pytest.importorskip("PySide6")
    a, b, *_ = _watch_files(tmp_path)
    tab = window.results_tab
    tab.open_results(str(a))
    tab.compare_results(str(b))
    label = tab.compare_label.text()
    assert "changed (the 95 % interval of B/A excludes 1): code K=2" in label
    assert "From your own use (watch): A holds 1 watch summary (calibrated-p0.3.gguf)" in label
    assert "A K=3 is fine, B K=3 is fine (the same recommendation)" in label


# ---- the files' watch summaries (mtp-tuner watch --out) -----------------------------------------------


def _watch_files(tmp_path, sweeps=True):
    """A: compare_before + the recorded server's first 114 steps; B: compare_after + its whole
    window (247 steps), and a window of another model whose acceptance at position 1 fell."""
    import shutil

    from helpers import ReplayClient, replayed_watch, server_costs

    from app.core.records.writer import append_line

    costs = tmp_path / "costs.jsonl"
    append_line(costs, server_costs({1: 10.0, 2: 10.5, 3: 11.0, 4: 11.5, 5: 12.0, 6: 12.5}, 0.5).to_json())
    short, whole = replayed_watch(costs, ReplayClient().pages[:4]).record, replayed_watch(costs).record
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    if sweeps:
        shutil.copy(BEFORE, a)
        shutil.copy(AFTER, b)
    append_line(a, short.to_json())
    append_line(b, whole.to_json())
    return a, b, short, whole


def test_share_difference_and_pairs():
    from app.core.analysis.watched import newest, pair_up, share_difference
    from app.core.records.watch import WatchRecord

    d, lo, hi = share_difference(60, 100, 30, 100)
    h = 1.96 * math.sqrt(0.6 * 0.4 / 100 + 0.3 * 0.7 / 100)
    assert d == pytest.approx(-0.3) and (lo, hi) == pytest.approx((-0.3 - h, -0.3 + h)) and hi < 0
    base = dict(schema_version=1, record_type="watch", run_id="r", timestamp_utc="2026-12-01T00:00:00+00:00",
                url="http://h:1", model_path="/m/x.gguf", llama_build="b1", spec_types="none,draft-mtp", server_k=2,
                seconds=60.0, restarts=0, requests=3, generated=500, draft_steps=400, draft_tokens=800, accepted=500,
                accepted_per_pos=(300, 200), decode_tok_s=None, cost_run_id=None, predicted=(),
                recommendation_k=None, reason="r", host={})
    a = WatchRecord(**base)
    b = WatchRecord(**{**base, "accepted_per_pos": (200, 190), "url": "http://other:1"})
    (p,) = pair_up(newest([a]), newest([b]))
    assert [c.changed for c in p.positions] == [True, False] and p.positions[0].b == 0.5
    assert pair_up(newest([a]), newest([dataclasses.replace(b, model_path="/m/y.gguf")])) == []


def test_compare_sets_the_files_watch_summaries_side_by_side(tmp_path):
    a, b, short, whole = _watch_files(tmp_path)
    r = subprocess.run([sys.executable, "-m", "app", "compare", str(a), str(b), "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["summary"]["changed"] == ["code K=2"]  # the sweeps' comparison as before
    w = d["watch"]
    assert [x["draft_steps"] for x in w["a"]] == [114] and [x["draft_steps"] for x in w["b"]] == [247]
    (pair,) = w["pairs"]
    assert pair["model"] == "calibrated-p0.3.gguf" and pair["same_recommendation"]
    assert pair["a_recommendation_k"] == short.recommendation_k and pair["b_recommendation_k"] == whole.recommendation_k
    assert [c["position"] for c in pair["positions"]] == [1, 2, 3] and not any(c["changed"] for c in pair["positions"])
    assert pair["positions"][0]["a"] == round(67 / 114, 4) and pair["positions"][0]["b"] == round(148 / 247, 4)
    r = subprocess.run([sys.executable, "-m", "app", "compare", str(a), str(b)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = r.stdout[r.stdout.index("From your own use (watch): A holds 1 watch summary (calibrated-p0.3.gguf); "
                                   "B holds 1 watch summary"):]
    assert "calibrated-p0.3.gguf: A K=3 is fine, B K=3 is fine (the same recommendation)" in text
    assert "position 1      A 0.59  B 0.60" in text and "same within noise" in text
    # two files of watch summaries alone: those compared
    (tmp_path / "w").mkdir()
    a, b, *_ = _watch_files(tmp_path / "w", sweeps=False)
    r = subprocess.run([sys.executable, "-m", "app", "compare", str(a), str(b)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no runs in this results file: the watch summaries alone" in r.stdout and "A K=3 is fine" in r.stdout
    r = subprocess.run([sys.executable, "-m", "app", "compare", str(a), str(BEFORE)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "no runs in this results file" in r.stderr and "Traceback" not in r.stderr
