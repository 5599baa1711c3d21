"""Confirm says what it did (issue 56, item 4): the confirm run times the pick against the plain
command on the task's prompts (at least stats.MIN_PAIRS pairs), its progress is said as it goes
("llama-server: 3 of 6 runs"), and its words name what it timed, the arm, the task, the speedup
with its interval (or that there were too few runs for one), and nothing it did not time. The
words are the core's (session.confirm), shown as they are by recommend --confirm and the Export
tab. Recorded runs (the demo sweep's) stand in for llama-server's answers; no timing is live."""

from __future__ import annotations

import dataclasses

from app.core.measure.events import RunStarted, SweepStarted
from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.session import confirm as C
from app.core.session.events import EngineReady, RunFinished
from conftest import ROOT

DEMO = ROOT / "tests" / "data" / "demo_sweep.jsonl"
K2 = Arm(k=2)


def _code_runs(arms=(Arm(), K2)):
    """The demo sweep's code runs of the plain command and K=2, in file order (paired by time)."""
    return [dataclasses.replace(r, engine="server", llama_build="b9999") for r in load_records(DEMO)
            if r.status == "ok" and r.task == "code" and r.measured_arm in arms]


def _plan(arm=K2, speedup=1.29, prompts=("demo-code",), reps=3):
    arms = (Arm(), arm) if arm.is_spec else (arm,)
    plan = Plan(model="m.gguf", arms=arms, prompts=tuple(Prompt(p, "code", "x") for p in prompts), reps=reps)
    return C.ConfirmPlan(plan, arm, "code", prompts[0], "inprocess", 50.0, speedup)


def test_the_confirm_run_times_the_pick_against_the_plain_command_on_enough_pairs():
    from app.core.verdict import build_verdict

    # the demo sweep with its K=2 code runs made to pay (the recorded demo leaves every task off)
    recs = [dataclasses.replace(r, tok_s=3 * r.tok_s) if r.task == "code" and r.measured_arm == K2 and r.tok_s
            else r for r in load_records(DEMO)]
    v = build_verdict(recs)
    c = C.confirm_plan(v, task="code")
    assert c.plan.arms == (Arm(), c.arm) and c.arm.is_spec  # a speedup of its own, not a speed
    assert [p.id for p in c.plan.prompts] == ["demo-code"]
    assert c.plan.reps * len(c.plan.prompts) >= 3 and c.plan.total_runs == 6  # one prompt: 3 pairs


def test_its_words_name_what_it_timed_with_its_interval_and_nothing_else():
    runs = _code_runs()
    c = _plan()
    head = C.confirm_headline(c, runs)
    assert head.startswith("llama-server timed K=2 on the code prompt demo-code: "), head
    assert "95 % CI " in head and "(3 pairs against the plain command)" in head, head
    assert "the sweep measured 1.29x" in head, head
    # nothing it did not time: no "confirms", no claim about "these flags" (the mix's command)
    assert "confirms" not in head and "these flags" not in head and "faster" not in head, head
    details = C.confirm_text(c, runs)
    assert details.startswith("llama-server (b9999), K=2 on code: ") and "the plain command" in details, details


def test_with_too_few_runs_for_an_interval_it_says_so():
    runs = _code_runs()
    one_pair = [r for r in runs if r.rep == 0]
    head = C.confirm_headline(_plan(), one_pair)
    assert "on 1 pair against the plain command, too few runs for an interval" in head, head
    assert "CI" not in head and "confirms" not in head, head
    only_pick = [r for r in runs if r.measured_arm == K2]
    assert "no speedup was timed" in C.confirm_headline(_plan(), only_pick)
    assert "no run finished" in C.confirm_headline(_plan(), [])


def test_a_pick_to_leave_it_off_times_the_plain_command_and_claims_no_speedup():
    runs = _code_runs((Arm(),))
    head = C.confirm_headline(_plan(Arm(), None), runs)
    assert head.startswith("llama-server timed baseline on the code prompt demo-code: ") and "tok/s" in head, head
    assert "no speedup timed" in head and "x," not in head, head


def test_its_progress_counts_the_runs_as_they_go():
    runs = _code_runs()
    c = _plan()
    p = C.ConfirmProgress(c)
    lines = [p.see(EngineReady("server", "b9999", None, False)),
             p.see(SweepStarted("s", c.plan, 6, None)),
             p.see(RunStarted(0, 6, Arm(), "demo-code", "code", 0, warmup=True))]
    for i, r in enumerate(runs):
        lines.append(p.see(RunStarted(i, 6, r.measured_arm, r.prompt_id, r.task, r.rep)))
        lines.append(p.see(RunFinished(r)))
    said = [x for x in lines if x]
    assert said[0] == "llama-server: starting, K=2 on the code prompt demo-code"
    assert said[1] == "llama-server: warming up baseline (0 of 6 runs)"
    assert "llama-server: 3 of 6 runs" in said and said[-1] == "llama-server: 6 of 6 runs"
    assert "llama-server: 1 of 6 runs, now K=2 on code/demo-code" in said


def test_runs_that_other_programs_disturbed_are_said_not_called_unfinished():
    """On a busy machine every confirm run finished but was marked disturbed: the words said "no
    run finished" and "the run failed"; they say the runs were disturbed and what to do."""
    runs = [dataclasses.replace(r, flags=[*r.flags, "disturbed"]) for r in _code_runs()]
    head = C.confirm_headline(_plan(), runs)
    assert head == ("llama-server could not time K=2 on the code prompt demo-code: 6 of 6 runs were disturbed by "
                    "other programs, so none counts; close them and confirm again"), head
    assert "failed" not in C.confirm_text(_plan(), runs) and "disturbed" in C.confirm_text(_plan(), runs)


def test_a_terminal_is_told_of_a_long_wait_every_ten_seconds_not_every_poll():
    from app.core.measure.events import QuietWait

    p = C.ConfirmProgress(_plan(), wait_every_s=10)
    said = [p.see(QuietWait("busy", float(s), "python", 0.5)) for s in range(0, 31, 3)]
    assert [x for x in said if x] == [f"llama-server: 0 of 6 runs; {QuietWait('busy', float(s), 'python', 0.5).text()}"
                                      for s in (0, 12, 24)]
    assert all(C.ConfirmProgress(_plan()).see(QuietWait("busy", float(s), "python", 0.5)) for s in (0, 3))
