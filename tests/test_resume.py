"""A sweep finished when the machine is quiet (app.core.measure.resume, ``bench --resume``): the
quiet runs are reused and only what is missing is measured."""

from __future__ import annotations

import dataclasses
import json

from app.core.engines.inprocess import InProcessEngine
from app.core.measure.busy import DISTURBED, Busy
from app.core.measure.plan import Plan
from app.core.measure.resume import resume_of
from app.core.measure.runner import run_sweep
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter
from app.core.session.events import RunFinished
from app.core.verdict import build_verdict
from helpers import cli, make_record

PROMPTS = (Prompt("hello", "code", "hello world"), Prompt("cats", "story", "Write a story about 101 cats."))


def _plan(model="/m.gguf", reps=3):
    return Plan(model=str(model), arms=(Arm(), Arm(2)), prompts=PROMPTS, engine="inprocess", n_predict=8, reps=reps,
                warmup=0)


def test_resume_measures_again_the_busy_groups_and_the_missing_prompts_only():
    plan = _plan()
    sampling = {**plan.samplers[0].to_dict(), "raw": False, "ignore_eos": False}
    recs = []
    for s in plan.runs():
        if s.rep == 2 and s.prompt.id == "cats":
            continue  # the sweep stopped before the story's last repetition
        busy = s.rep == 1 and s.prompt.id == "hello" and s.arm.is_spec
        recs.append(make_record(s.arm, run_id=f"r{s.index}", task=s.prompt.task, prompt_id=s.prompt.id, rep=s.rep,
                                sampling=sampling, flags=(DISTURBED,) if busy else ()))
    todo = resume_of(recs, plan)
    picked = [(s.prompt.id, s.rep, s.arm) for s in plan.runs() if todo.wanted(s)]
    # the busy K=2 run goes again with its baseline beside it; the missing prompt with its arms
    assert picked == [("hello", 1, Arm()), ("hello", 1, Arm(2)), ("cats", 2, Arm()), ("cats", 2, Arm(2))]
    assert todo.runs == 4 and todo.reused == len(recs) - 2
    quiet = [dataclasses.replace(r, flags=()) for r in recs if r.rep < 2]
    assert resume_of(quiet, _plan(reps=2)).runs == 0  # all measured quietly: nothing to do


class Replay:
    """Each run the next recorded share of others' CPU (then quiet), cc1plus the busiest."""

    def __init__(self, shares):
        self.shares = list(shares)

    def start(self) -> None:
        pass

    def stop(self) -> Busy:
        cpu = self.shares.pop(0) if self.shares else 0.02
        return Busy(cpu=cpu, top="cc1plus", top_cpu=cpu, cores=2)


def test_bench_resume_reuses_the_quiet_runs_of_a_busy_sweep(make_model, tmp_path):
    """A live sweep on a calibrated model with runs disturbed past the re-run limit, finished
    with ``bench --resume``: only the busy groups are measured, and the verdict is no longer
    withheld or provisional."""
    path = tmp_path / "busy.jsonl"
    plan = _plan(make_model(), reps=2)
    with InProcessEngine(ctx_size=512) as eng, ResultsWriter(path) as w:
        events = list(run_sweep(plan, eng, w, monitor=Replay([0.9] * 4)))
    first = [e.record for e in events if isinstance(e, RunFinished)]
    assert sum(DISTURBED in r.flags for r in first) >= 3  # the re-runs ran out: busy runs are left
    todo = resume_of(first, plan)
    assert 0 < todo.runs < len(first)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"id": q.id, "task": q.task, "text": q.text} for q in PROMPTS]))
    p = cli("bench", "--resume", str(path), "--prompts", str(prompts), "--json", "--warmup", "0", "--ctx-size", "512")
    assert p.returncode == 0, p.stderr
    assert f"resume: {todo.reused} quiet runs kept, {todo.runs} to measure again" in p.stderr
    after = load_records(path)
    new = after[len(first):]
    assert len(new) == todo.runs  # measured again: exactly what was missing
    assert {r.sweep_id for r in after} == {first[0].sweep_id}  # one sweep, one file
    assert not any(DISTURBED in r.flags for r in new)
    v = build_verdict(after)
    assert v.withheld is None and v.provisional == ()
    d = json.loads(p.stdout)
    assert [t["provisional"] for t in d["picks"]] == [False, False]
