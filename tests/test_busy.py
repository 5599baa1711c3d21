"""A verdict you can trust on a busy desktop: what other programs take during each run (recorded as
other_cpu / other_gpu), runs they disturbed marked, left out of the analysis and measured again
within a limit, the verdict withheld when too many were, the thread count from the free cores, and
the Sweep tab's live indicator. The logic runs on recorded shares (a monitor that replays them);
one test hogs every core for real."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.core.analysis.analysis import analyze
from app.core.analysis.disturbed import disturbance
from app.core.engines.inprocess import InProcessEngine
from app.core.measure import busy
from app.core.measure.busy import DISTURBED, Busy, BusyMonitor, _between, peak_share
from app.core.measure.busy_counters import Sample, Tick
from app.core.measure.threads import choose_threads, measure_now
from app.core.measure.plan import Plan
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished, SweepWarning
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.records.schema import RunRecord
from app.core.records.writer import ResultsWriter
from app.core.verdict import build_verdict, verdict_dict, verdict_text
from helpers import cli, make_record

PROMPTS = (Prompt("hello", "code", "hello world"), Prompt("cats", "story", "Write a story about 101 cats."))


class Replay:
    """A monitor for the runner's tests: each run gets the next recorded share of the CPU that
    other programs took (then 0.0 for every later run), with chrome as the busiest."""

    def __init__(self, shares):
        self.shares = list(shares)

    def start(self) -> None:
        pass

    def stop(self) -> Busy:
        cpu = self.shares.pop(0) if self.shares else 0.0
        return Busy(cpu=cpu, top="chrome", top_cpu=round(cpu * 0.8, 4), cores=4)


def sweep(model, shares, arms=(Arm(), Arm(2)), reps=2, prompts=PROMPTS[:1]):
    plan = Plan(model=str(model), arms=tuple(arms), prompts=prompts, engine="inprocess", n_predict=8, reps=reps,
                warmup=0)
    with InProcessEngine(ctx_size=512) as eng:
        events = list(run_sweep(plan, eng, monitor=Replay(shares)))
    return plan, [e.record for e in events if isinstance(e, RunFinished)], \
        [e.message for e in events if isinstance(e, SweepWarning)]


# -- the measurement ------------------------------------------------------------------------------


def test_others_share_leaves_out_this_app_and_its_children_and_names_the_busiest():
    a = Sample(0.0, busy=10.0, total=40.0, procs={1: ("me", 5.0), 2: ("llama-server", 1.0), 3: ("chrome", 2.0),
                                                    4: ("chrome", 0.0), 5: ("indexer", 1.0)},
                own=frozenset({1, 2}), own_reaped=0.0, nvml_us=0)
    # 4 s of 4 CPUs: 16 CPU-seconds; busy 12 of them: this app 6 (itself 4, llama-server 2), chrome 5, indexer 1
    b = Sample(4.0, busy=22.0, total=56.0, procs={1: ("me", 9.0), 2: ("llama-server", 3.0), 3: ("chrome", 5.0),
                                                    4: ("chrome", 2.0), 5: ("indexer", 2.0)},
                own=frozenset({1, 2}), own_reaped=0.0, nvml_us=0)
    got = _between(a, b)
    assert got.cpu == pytest.approx(6 / 16)
    assert (got.top, got.top_cpu) == ("chrome", pytest.approx(5 / 16))
    assert got.disturbed and "chrome 31 %" in got.text()


def test_disturbed_and_free_cores_follow_the_threshold():
    assert not Busy(cpu=busy.BUSY_SHARE).disturbed and Busy(cpu=busy.BUSY_SHARE + 0.01).disturbed
    assert Busy(cpu=0.0, gpu=0.5).disturbed and not Busy().disturbed  # unknown is never disturbed
    # others' busy cores, rounded to the nearest: 0.3 of 8 cores is 2.4, so 6 free
    assert Busy(cpu=0.30, cores=8).free_cores == 6 and Busy(cpu=1.0, cores=8).free_cores == 1
    assert choose_threads(Busy(cpu=0.30, top="chrome", top_cpu=0.2), cores=8)[0] == 6
    n, note = choose_threads(Busy(cpu=0.02), cores=8)
    assert n == 8 and note and note.startswith("threads: 8")
    n, note = choose_threads(Busy(cpu=0.6, top="chrome", top_cpu=0.5), cores=4)
    assert n == 2 and note and "2 of 4 cores" in note and "chrome" in note
    assert choose_threads(Busy(), cores=8) == (None, None)  # not measured: llama.cpp's own default


def _ticks(others_per_tick, own_per_tick=0.3, cores=2, dt=0.2):
    """Ticks every ``dt`` s: each step others took ``others_per_tick[i]`` of the ``cores``, this app
    ``own_per_tick`` of them (recorded shares, as the monitor's thread reads the counters)."""
    out, busy_s, total_s, own_s = [Tick(0.0, 0.0, 0.0, 0.0)], 0.0, 0.0, 0.0
    for i, o in enumerate(others_per_tick):
        total_s += cores * dt
        own_s += own_per_tick * cores * dt
        busy_s += (o + own_per_tick) * cores * dt
        out.append(Tick((i + 1) * dt, busy_s, total_s, own_s))
    return out


def test_the_busiest_second_of_a_run_is_found_where_the_average_hides_it():
    # 3 s run, quiet (2 %) but for a program taking half the machine over its last 1.2 s:
    # over the run others took 21 %, under the threshold; over its busiest second 50 %
    ticks = _ticks([0.02] * 9 + [0.5] * 6)
    whole = (ticks[-1].busy - ticks[0].busy - ticks[-1].own) / ticks[-1].total
    assert whole == pytest.approx(0.212) and whole < busy.BUSY_SHARE
    assert peak_share(ticks) == pytest.approx(0.5)
    assert peak_share(_ticks([0.02] * 15)) == pytest.approx(0.02)  # a quiet run stays quiet
    assert peak_share(_ticks([0.9] * 4)) is None  # under a second of ticks: no busiest second
    b = Busy(cpu=round(whole, 3), cpu_peak=0.5, top="python", top_cpu=0.2)
    assert b.disturbed and "50 % in its busiest second" in b.text()
    assert not Busy(cpu=0.2, cpu_peak=busy.BUSY_SHARE).disturbed and not Busy(cpu=0.2, cpu_peak=None).disturbed


def test_prepare_chooses_threads_from_the_free_cores_unless_set(make_model, monkeypatch):
    from app.core.engines.base import EngineSettings
    from app.core.session.request import SweepRequest
    from app.core.session.sweep import prepare

    plan = Plan(model=str(make_model()), arms=(Arm(), Arm(2)), prompts=PROMPTS[:1], engine="inprocess",
                n_predict=8, reps=1)
    monkeypatch.setattr("app.core.session.sweep.choose_threads", lambda: (3, "threads: 3 of 4 cores, ..."))
    monkeypatch.delenv("MTP_TUNER_THREADS")
    p = prepare(SweepRequest(plan, keep_results=False))
    assert p.request.engine.threads == 3 and "threads: 3 of 4 cores, ..." in p.notes
    p = prepare(SweepRequest(plan, EngineSettings(threads=6), keep_results=False))  # the user's choice stands
    assert p.request.engine.threads == 6 and not any(n.startswith("threads") for n in p.notes)


# -- the runner: mark, record, measure again --------------------------------------------------------


def test_a_disturbed_run_is_kept_marked_and_measured_again_with_a_baseline(make_model):
    # runs: base r0, K2 r0 (disturbed), base r1, ...: the K2 run goes again with a baseline before it
    plan, recs, warnings = sweep(make_model(), [0.05, 0.61])
    assert len(recs) == plan.total_runs + 2
    hit = [r for r in recs if DISTURBED in r.flags]
    assert [(r.k, r.rep, r.other_cpu, r.other_top) for r in hit] == [(2, 0, 0.61, {"name": "chrome", "cpu": 0.488})]
    assert recs[0].other_cpu == 0.05 and DISTURBED not in recs[0].flags
    # one block of arms later (two arms: here the sweep's end), a baseline and the K2 run again
    assert [(r.k, r.rep) for r in recs] == [(None, 0), (2, 0), (None, 1), (2, 1), (None, 0), (2, 0)]
    assert any("disturbed" in w and "measured again" in w and "chrome" in w for w in warnings)
    a = analyze(recs)
    assert a.cell("code", Arm(2)).ratio.n_pairs == 2  # the disturbed run is not among the pairs
    assert any(f.code == "disturbed" for f in a.findings)


def test_a_disturbed_baseline_takes_its_speculative_runs_along(make_model):
    plan, recs, _ = sweep(make_model(), [0.9], arms=(Arm(), Arm(1), Arm(2)), reps=2)
    order = [(r.k, r.rep, DISTURBED in r.flags) for r in recs]
    # the baseline of rep 0 disturbed: K1 and K2 of rep 0 wait and run after its re-run, one block
    # of arms later; only the baseline is measured twice
    assert order == [(None, 0, True), (None, 1, False), (1, 1, False), (2, 1, False),
                     (None, 0, False), (1, 0, False), (2, 0, False)]
    assert len(recs) == plan.total_runs + 1
    a = analyze(recs)
    assert all(a.cell("code", arm).ratio.n_pairs == 2 for arm in (Arm(1), Arm(2)))


def test_re_runs_stop_at_the_limit_and_say_so(make_model):
    plan, recs, warnings = sweep(make_model(), [0.8] * 100, reps=4)  # every run disturbed
    limit = max(busy.MIN_RERUNS, math.ceil(busy.MAX_RERUN_SHARE * plan.total_runs))
    assert len(recs) == plan.total_runs + limit and all(DISTURBED in r.flags for r in recs)
    assert sum("re-run limit" in w for w in warnings) == 1
    v = build_verdict(recs)
    # every run under the same load: a provisional answer with its command (issue 39), not withheld
    assert v.withheld is None and v.provisional == ("code",) and v.command("code").export is not None
    assert f"the machine was busy: {len(recs)} of {len(recs)} runs disturbed by other programs (top: chrome 64 %)" \
        in verdict_text(v)


# -- the file, the analysis and the verdict -------------------------------------------------------


def test_the_fields_round_trip_and_old_files_read_as_unknown(tmp_path):
    rec = make_record(other_cpu=0.4, other_gpu=0.1, other_top={"name": "chrome", "cpu": 0.3}, other_cpu_peak=0.7,
                      flags=(DISTURBED,))
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        w.append(rec)
        w.append(dataclasses.replace(rec, run_id="r2", other_cpu=None, other_gpu=None, other_top=None, flags=()))
    line = json.loads(path.read_text().splitlines()[0])
    assert (line["other_cpu"], line["other_gpu"], line["other_top"]) == (0.4, 0.1, {"name": "chrome", "cpu": 0.3})
    got = load_records(path)
    assert (got[0].other_cpu, got[0].other_top, got[0].flags) == (0.4, {"name": "chrome", "cpu": 0.3}, (DISTURBED,))
    assert line["other_cpu_peak"] == 0.7 and got[0].other_cpu_peak == 0.7
    assert (got[1].other_cpu, got[1].other_gpu) == (None, None)
    old = {k: v for k, v in json.loads(rec.to_json()).items() if not k.startswith("other_")}
    old["schema_version"] = 3
    assert RunRecord.from_dict(old).other_cpu is None
    with pytest.raises(ValueError):
        RunRecord.from_dict({**old, "other_cpu": "busy"})
    assert RunRecord.from_dict(old).other_cpu_peak is None


def _paired(n, disturbed=(), top="chrome", speedup=1.2):
    """n repetitions of baseline then K=2, a second apart; ``disturbed``: indexes of runs marked."""
    out = []
    for i in range(2 * n):
        base = i % 2 == 0
        mark = i in disturbed
        out.append(make_record(Arm() if base else Arm(2), run_id=f"r{i}", rep=i // 2,
                               tok_s=(20.0 if base else 20.0 * speedup) * (0.1 if mark else 1.0) * (1 + 0.001 * i),
                               timestamp_utc=f"2026-01-01T00:00:{i:02d}Z",
                               other_cpu=0.61 if mark else 0.02, flags=(DISTURBED,) if mark else (),
                               other_top={"name": top, "cpu": 0.61} if mark else None))
    return out


def test_the_analysis_leaves_out_disturbed_runs_and_their_pairs():
    clean = analyze(_paired(8)).cell("code", Arm(2)).ratio
    # baseline 0 disturbed (its K2 run is left out with it), K2 run 5 disturbed
    a = analyze(_paired(8, disturbed={0, 5}))
    r = a.cell("code", Arm(2)).ratio
    assert r.n_pairs == clean.n_pairs - 2 and r.estimate == pytest.approx(1.2, rel=0.01)
    f = next(f for f in a.findings if f.code == "disturbed")
    assert "2 of 16 runs disturbed by other programs (top: chrome 61 %)" in f.message
    assert "1 run(s) paired with a disturbed baseline" in f.message
    assert a.cell("code", Arm(2)).n_failed == 0


def test_a_few_disturbed_runs_keep_the_verdict_and_say_so():
    v = build_verdict(_paired(8, disturbed={3}))
    assert not v.withheld and v.disturbed is not None and v.disturbed.runs == 1
    d = verdict_dict(v)
    assert d["disturbed"]["runs"] == 1 and d["disturbed"]["withheld"] is False and d["withheld"] is None
    assert "disturbed by other programs" in verdict_text(v)
    assert "disturbed" not in verdict_dict(build_verdict(_paired(8)))  # no key when none was


def test_too_many_disturbed_runs_withhold_the_verdict():
    v = build_verdict(_paired(10, disturbed=set(range(0, 20, 3))))  # 7 of 20: 35 %
    assert v.withheld and v.pick.arm is None and v.export is None
    assert all(p.arm is None and "withheld" in p.reason for p in v.per_task)
    text = verdict_text(v)
    assert "verdict withheld: the machine was busy: 7 of 20 runs disturbed by other programs (top: chrome 61 %)" \
        in text and "close them or run again" in text
    d = verdict_dict(v)
    assert d["disturbed"] | {"message": None} == {
        "runs": 7, "of": 20, "share": 0.35, "top": "chrome", "top_cpu": 0.61, "threshold": busy.BUSY_SHARE,
        "max_share": busy.MAX_DISTURBED_SHARE, "withheld": True, "message": None}
    assert d["withheld"].startswith("verdict withheld") and d["recommendation"]["speculative"] is False
    assert d["command"] is None
    assert disturbance(_paired(10)) is None


def test_recommend_says_the_runs_were_disturbed(tmp_path):
    path = tmp_path / "busy.jsonl"
    with ResultsWriter(path) as w:
        for r in _paired(10, disturbed=set(range(0, 20, 3))):
            w.append(r)
    p = cli("recommend", str(path))
    assert p.returncode == 1, p.stderr
    assert "verdict withheld: the machine was busy: 7 of 20 runs disturbed by other programs (top: chrome 61 %)" \
        in p.stdout
    j = cli("recommend", str(path), "--json")
    assert j.returncode == 1
    d = json.loads(j.stdout)
    assert d["disturbed"]["withheld"] and d["disturbed"]["top"] == "chrome" and d["command"] is None


# -- for real: a busy loop on every core ----------------------------------------------------------


def _detached_hogs(n: int) -> list[int]:
    """n busy loops that are not this process's children (a shell starts them and exits): the
    monitor counts this app's own process tree as its own, so a child would not be another program."""
    out = subprocess.run(["sh", "-c", " ".join([f'"{sys.executable}" -c "while True: pass" >/dev/null 2>&1 & echo $!;'] * n)],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return [int(x) for x in out.split()]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_a_cpu_hog_marks_the_runs_it_disturbs(make_model):
    import psutil

    n = os.cpu_count() or 1
    plan = Plan(model=str(make_model()), arms=(Arm(), Arm(2)), prompts=PROMPTS[:1], engine="inprocess",
                n_predict=48, reps=1, warmup=0)
    pids: list[int] = []
    try:
        pids = _detached_hogs(n)
        assert not {c.pid for c in psutil.Process().children(recursive=True)} & set(pids)
        monitor = BusyMonitor(gpu=False)
        monitor.start()
        time.sleep(busy.MIN_WINDOW_S)  # the hogs under way for a whole window before the first run
        with InProcessEngine(ctx_size=512) as eng:
            events = list(run_sweep(plan, eng, monitor=monitor))
    finally:
        _kill(pids)
    recs = [e.record for e in events if isinstance(e, RunFinished)]
    assert recs and all(r.other_cpu is not None and r.other_cpu > 0.3 for r in recs)
    assert all(DISTURBED in r.flags for r in recs)  # 0.3 is over the threshold
    assert recs[0].other_top and recs[0].other_top["name"]


def test_a_program_that_starts_late_in_a_run_marks_it_by_its_busiest_second():
    """A quiet first half, then a busy loop on every core for the second: the whole interval's
    share may stay under the threshold, its busiest second does not (this app sleeps throughout,
    so the hogs take every core while they run)."""
    n = os.cpu_count() or 1
    quiet = measure_now(0.5).cpu
    monitor = BusyMonitor(gpu=False)
    monitor.start()
    pids: list[int] = []
    try:
        time.sleep(3.0)
        pids = _detached_hogs(n)
        time.sleep(1.5)
        b = monitor.stop()
    finally:
        _kill(pids)
    assert b.cpu is not None and b.cpu_peak is not None
    assert b.cpu_peak > 0.6 and b.cpu_peak >= b.cpu and b.disturbed  # the busiest second: the hogs had it
    if quiet is not None and quiet < 0.05:  # a quiet machine before the hogs: the average is well under it
        assert b.cpu_peak > b.cpu + 0.2
    monitor.close()


# -- the window -----------------------------------------------------------------------------------


def test_the_sweep_tab_shows_the_busy_machine_and_the_disturbed_runs(qtbot):
    from app.gui.tabs.sweep.busy import BUSY_STYLE, BusyIndicator

    class Fixed:
        def start(self):
            pass

        def poll(self):
            return Busy(cpu=0.61, top="chrome", top_cpu=0.45, cores=4)

    w = BusyIndicator(monitor=Fixed())
    qtbot.addWidget(w)
    w.show()
    w.poll()
    assert "CPU 61 % (top: chrome 45 %)" in w.text() and "busy" in w.text() and w.styleSheet() == BUSY_STYLE
    w.reset(("threads: 1 of 4 cores, the ones other programs leave free",))
    w.run_done(make_record(flags=(DISTURBED,)))
    w.run_done(make_record())
    assert "1 of 2 runs disturbed" in w.text() and "threads: 1 of 4 cores" in w.text()
    assert w.timer.isActive() and w.timer.interval() == 2000


def test_bench_json_says_the_runs_were_disturbed_and_what_is_decided(capsys):
    """bench --json carries the same "disturbed" object as recommend --json (absent on a quiet
    run), and the final decisions of a sweep that stops when decided."""
    from app.cli.bench_view import BenchView
    from app.core.analysis.decide import TaskDecision
    from app.core.session.events import Decisions, RunFinished, SessionFinished, dispatch

    def report(records, decisions=None):
        view = BenchView()
        for r in records:
            dispatch(RunFinished(r), view.handlers)
        if decisions is not None:
            dispatch(decisions, view.handlers)
        dispatch(SessionFinished(None, len(records), len(records), 0, False), view.handlers)
        capsys.readouterr()
        view.report(True, "m.gguf")
        return json.loads(capsys.readouterr().out)

    busy = report(_paired(10, disturbed=set(range(0, 20, 3))))
    assert busy["withheld"] and busy["disturbed"]["runs"] == 7 and busy["disturbed"]["of"] == 20
    assert busy["disturbed"]["top"] == "chrome" and "the machine was busy" in busy["disturbed"]["message"]
    quiet = report(_paired(10))
    assert "disturbed" not in quiet and "decisions" not in quiet
    dec = Decisions((TaskDecision("code", True, Arm(2), None, reason="precise"),
                     TaskDecision("story", False, None, None, (None, Arm(1)), Arm(1), 3, "reaches down to 1")),
                    12, 768, 30.0, None, True, "budget")
    j = report(_paired(4), dec)["decisions"]
    assert j["stopped"] == "budget" and [t["decided"] for t in j["tasks"]] == [True, False]
    assert j["tasks"][0]["pick"] == "K=2" and j["tasks"][1]["contenders"] == ["off", "K=1"]


def test_a_sweep_whose_runs_were_all_disturbed_says_how_many_finished_and_why_none_counts():
    """bench's table of a sweep whose every run was disturbed: never "no finished runs"."""
    from app.cli.bench_view import summary_text

    text = summary_text(_paired(5, disturbed=set(range(10)), top="cc1plus"))
    assert text.startswith("10 runs finished, and none counts: the machine was busy: 10 of 10 runs disturbed by "
                           "other programs (top: cc1plus 61 %)"), text
    assert "close the busy programs and run again" in text and "no finished runs" not in text
    assert summary_text([]) == "no finished runs"
