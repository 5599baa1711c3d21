"""The adaptive sweep planner: drops K that cannot pay, pilots, measures few candidates."""

from __future__ import annotations

from app.core.session.adaptive import adaptive_sweep
from app.core.session.events import AdaptiveResult, AdaptiveStage, RunFinished
from app.core.engines.inprocess import InProcessEngine
from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from tests.helpers import fake_costs


def test_adaptive_drops_hopeless_k_and_measures_few_candidates(make_model):
    # verify cost grows steeply past n=4: K >= 5 cannot pay even with every draft accepted
    t = {1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0, 5: 60.0, 6: 70.0, 7: 80.0, 8: 90.0, 9: 100.0}
    plan = Plan(model=str(make_model(0.0)), arms=(Arm(),),
                prompts=(Prompt("a", "code", "hello world"), Prompt("b", "story", "the cat")),
                engine="inprocess", n_predict=48, reps=1, warmup=0)
    with InProcessEngine(ctx_size=1024) as eng:
        events = list(adaptive_sweep(plan, eng, cost=fake_costs(t, 0.5), min_reps=2, max_reps=3,
                                     max_candidates=2))
    stages = [e for e in events if isinstance(e, AdaptiveStage)]
    assert "[1, 2, 3]" in stages[0].message  # K=4 verifies 5 tokens: too dear
    cand = [s for s in stages if s.stage == "candidates"][0]
    assert 1 <= len(cand.candidates) <= 2 and all(a.k <= 3 for a in cand.candidates)
    result = events[-1]
    assert isinstance(result, AdaptiveResult)
    runs = [e.record for e in events if isinstance(e, RunFinished)]
    measured = [r for r in runs if r.rep < 10_000]
    assert len(measured) == result.runs
    grid_runs = 9 * 2 * 3
    assert result.runs < grid_runs / 2
    assert {r.k for r in measured} <= {None} | {a.k for a in cand.candidates}


# ---- stop when decided, and the budget --------------------------------------------------------------

import dataclasses  # noqa: E402

import app.core.session.adaptive as adaptive_mod  # noqa: E402
from app.core.analysis.decide import TaskDecision, describe  # noqa: E402
from app.core.session.events import Decisions  # noqa: E402

COSTS = {1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0, 5: 60.0, 6: 70.0, 7: 80.0, 8: 90.0, 9: 100.0}


def _plan(make_model, n_predict=32):
    return Plan(model=str(make_model(0.0)), arms=(Arm(),),
                prompts=(Prompt("a", "code", "hello world"), Prompt("b", "story", "the cat")),
                engine="inprocess", n_predict=n_predict, reps=1, warmup=0)


def test_adaptive_stops_by_itself_once_every_task_is_decided(make_model, monkeypatch):
    """A recorded rule (decided once each arm has 3 pairs, else the arm with fewest pairs needs
    one more): the sweep gives each repetition to that arm and stops the moment all are decided."""

    def rule(task, ratios, precision=0.05, **_):
        short = [a for a, r in ratios.items() if r.n_pairs < 3]
        if not short:
            return TaskDecision(task, True, max(ratios, key=lambda a: ratios[a].estimate or 0), None, more_reps=0)
        return TaskDecision(task, False, None, None, tuple(short), min(short, key=lambda a: ratios[a].n_pairs), 1)

    monkeypatch.setattr(adaptive_mod, "decide_task", rule)
    with InProcessEngine(ctx_size=1024) as eng:
        events = list(adaptive_sweep(_plan(make_model), eng, cost=fake_costs(COSTS, 0.5), min_reps=2, max_reps=10))
    decisions = [e for e in events if isinstance(e, Decisions)]
    final = decisions[-1]
    assert final.final and final.stopped == "decided" and final.decided
    measured = [e.record for e in events if isinstance(e, RunFinished) and e.record.rep < 10_000]
    arms = {(r.task, r.k) for r in measured if r.k}
    for task, k in arms:  # exactly the 3 repetitions the rule asked for, none more
        assert sum(1 for r in measured if r.task == task and r.k == k) == 3
    # each step after the first round: one baseline and one arm
    assert len(measured) == sum(3 + 3 for _ in arms)
    assert [d.stopped for d in decisions[:-1]] == [""] * (len(decisions) - 1)
    result = events[-1]
    assert isinstance(result, AdaptiveResult) and result.decisions == final and result.runs == len(measured)


def test_adaptive_budget_in_tokens_ends_it_and_says_what_is_undecided(make_model, monkeypatch):
    # a recorded rule that never decides (every arm stays a contender, the one with fewest pairs
    # next): the budget, not the timing of these runs, ends the sweep
    def undecided(task, ratios, precision=0.05, **_):
        arms = tuple(ratios)
        needs = min(arms, key=lambda a: ratios[a].n_pairs) if arms else None
        return TaskDecision(task, False, None, None, arms, needs, 1)

    monkeypatch.setattr(adaptive_mod, "decide_task", undecided)
    plan = _plan(make_model)
    with InProcessEngine(ctx_size=1024) as eng:
        events = list(adaptive_sweep(plan, eng, cost=fake_costs(COSTS, 0.5), min_reps=2, max_reps=6,
                                     budget_tokens=400))
    final = [e for e in events if isinstance(e, Decisions)][-1]
    generated = sum(e.record.n_generated for e in events if isinstance(e, RunFinished))
    assert final.final and final.stopped == "budget"
    assert generated < final.tokens <= 400  # the pilot's tokens count too (its runs are not passed on)
    for d in final.tasks:
        line = describe(d, final=True)
        assert line.startswith(f"{d.task}: ")
        if not d.decided:
            assert "undecided" in line and ("would decide it" in line or "no runs yet" in line), line
    stage = [e for e in events if isinstance(e, AdaptiveStage) and e.stage == "done"][0]
    assert stage.message.startswith("stopped: the budget is spent")


def test_adaptive_time_budget_counts_from_the_start(make_model):
    """A recorded clock: 30 s pass per reading, so a 30 s budget is spent by the first look after the pilot."""
    ticks = iter(range(0, 10_000, 30))
    with InProcessEngine(ctx_size=1024) as eng:
        events = list(adaptive_sweep(_plan(make_model), eng, cost=fake_costs(COSTS, 0.5), budget_s=30.0,
                                     clock=lambda: float(next(ticks))))
    final = [e for e in events if isinstance(e, Decisions)][-1]
    assert final.stopped == "budget"
    assert not [e for e in events if isinstance(e, RunFinished) and e.record.rep < 10_000]
    assert all(not d.decided and dataclasses.replace(d).reason == "no runs yet" for d in final.tasks)


def test_a_budget_spent_during_the_pilot_cuts_the_pilot(make_model):
    """A recorded clock that passes the 30 s budget while the first task's pilot run goes: the
    pilot stops after it (the second task's pilot run is not started) and says so; a sweep with
    time left pilots every task."""
    def pilot_runs(budget):
        ticks = iter(range(0, 10_000, 30))
        with InProcessEngine(ctx_size=1024) as eng:
            events = list(adaptive_sweep(_plan(make_model), eng, cost=fake_costs(COSTS, 0.5), budget_s=budget,
                                         clock=lambda: float(next(ticks))))
        said = [e.message for e in events if isinstance(e, AdaptiveStage) and e.stage == "pilot"]
        return [m.split(":")[0] for m in said if ": acceptance" in m], said

    runs, said = pilot_runs(45.0)  # the clock is read before each pilot run too: at 30 s, then 60 s
    assert runs == ["story"] and any("the budget is spent: the pilot stops" in m for m in said), said
    runs, _ = pilot_runs(1e6)
    assert sorted(runs) == ["code", "story"]


def test_candidates_hold_the_predicted_best_and_the_smallest_k_tied_with_it():
    """A flat prediction (K=3..6 within 3 %, as code on a calibrated model): the predicted best and
    the smallest K within 3 % of it are measured (the rule picks the smaller of a near tie), not
    the next-best widths; the mix's K only when the mix may pay."""
    from app.core.session.widths import candidates as _candidates

    flat = {1: 1.30, 2: 1.55, 3: 1.66, 4: 1.67, 5: 1.68, 6: 1.69}.__getitem__
    assert _candidates(range(1, 7), flat, 2, None) == [3, 6]
    assert _candidates(range(1, 7), flat, 3, None) == [3, 5, 6]
    assert _candidates(range(1, 7), flat, 2, 1) == [3, 6, 1]
    steep = {1: 0.60, 2: 0.45, 3: 0.35}.__getitem__  # a task predicted off at every K: one arm
    assert _candidates(range(1, 4), steep, 2, None) == [1]


def test_a_mix_predicted_off_is_not_measured_on_every_task(model_dir):
    """Story's drafts are nearly all wrong on this per-task model, so a mix of code and story is
    predicted off at every K (costs where a wide verify is dear): each task measures its own
    candidates only, and the stage says so."""
    from app.core.calibrated import gguf as calibrated_gguf
    from app.core.calibrated.demo import demo_prompts

    path = calibrated_gguf.make_model(model_dir / "cal-code-story.gguf", 0.0, "embedding",
                                      task_p={"code": 0.0, "story": 0.97})
    prompts = tuple(demo_prompts(path))
    plan = Plan(model=str(path), arms=(Arm(),), prompts=prompts, engine="inprocess", n_predict=32, reps=1, warmup=0)
    dear = {1: 10.0, 2: 15.0, 3: 20.0, 4: 25.0}
    with InProcessEngine(ctx_size=1024) as eng:
        events = list(adaptive_sweep(plan, eng, ks=(1, 2, 3), cost=fake_costs(dear, 0.5), min_reps=2,
                                     max_reps=2, max_candidates=1, mix="code=1,story=3"))
    cand = [e for e in events if isinstance(e, AdaptiveStage) and e.stage == "candidates"][0]
    assert "off at every K" in cand.message, cand.message
    runs = [e.record for e in events if isinstance(e, RunFinished) and e.record.rep < 10_000]
    story_k = {r.k for r in runs if r.task == "story" and r.k}
    code_k = {r.k for r in runs if r.task == "code" and r.k}
    assert len(story_k) == 1 and not story_k & code_k  # each its own best: the mix's K is not run on code


def test_the_mix_is_decided_on_its_own_line_and_its_k_is_no_rival_on_a_task(model_dir, monkeypatch):
    """Code drafts well and story badly on this per-task model, and wide verifies are cheap: the
    mix may pay, at a K that is not story's own best. That K is measured on story too (the mix
    needs it there), but story's pick is decided among story's own candidates; the mix is decided
    by the same rule on its own line, over its arms' weighted ratios (a recorded rule: decided
    once an arm has 2 pairs, the rule that the sweep asks of each line)."""
    from app.core.calibrated import gguf as calibrated_gguf
    from app.core.calibrated.demo import demo_prompts
    from app.core.session.adaptive import MIX

    path = calibrated_gguf.make_model(model_dir / "cal-code-story-mix.gguf", 0.0, "embedding",
                                      task_p={"code": 0.0, "story": 0.97})
    plan = Plan(model=str(path), arms=(Arm(),), prompts=tuple(demo_prompts(path)), engine="inprocess",
                n_predict=24, reps=1, warmup=0)
    cheap = {1: 10.0, 2: 10.2, 3: 10.4, 4: 10.6}
    seen: list[tuple[str, frozenset]] = []

    def rule(task, ratios, precision=0.05, **_):
        seen.append((task, frozenset(ratios)))
        short = [a for a, r in ratios.items() if r.n_pairs < 2]
        if not short:
            return TaskDecision(task, True, max(ratios, key=lambda a: ratios[a].estimate or 0), None, more_reps=0)
        return TaskDecision(task, False, None, None, tuple(short), short[0], 1)

    monkeypatch.setattr(adaptive_mod, "decide_task", rule)
    with InProcessEngine(ctx_size=1024) as eng:
        events = list(adaptive_sweep(plan, eng, ks=(1, 2, 3), cost=fake_costs(cheap, 0.5), min_reps=1,
                                     max_reps=3, max_candidates=1))
    cand = [e for e in events if isinstance(e, AdaptiveStage) and e.stage == "candidates"][0]
    assert "the mix is decided at K=3 on its own" in cand.message, cand.message
    runs = [e.record for e in events if isinstance(e, RunFinished) and e.record.rep < 10_000]
    story_k = {r.k for r in runs if r.task == "story" and r.k}
    assert story_k == {1, 3}  # its own best (K=1) and the mix's K
    story_lines = {arms for task, arms in seen if task == "story"}
    assert story_lines == {frozenset({Arm(1, 0.0)})}  # the mix's K is no rival of story's pick
    assert {arms for task, arms in seen if task == MIX} == {frozenset({Arm(3, 0.0)})}
    final = [e for e in events if isinstance(e, Decisions)][-1]
    assert [d.task for d in final.tasks] == ["code", "story", MIX] and final.stopped == "decided"
    stage = [e for e in events if isinstance(e, AdaptiveStage) and e.stage == "done"][0]
    assert "every task (and the mix) is decided" in stage.message


def test_the_mix_repetitions_go_to_its_fewest_paired_cell(model_dir, monkeypatch):
    """The mix's interval takes the t quantile of its fewest-paired cell, so the rule reads the mix
    by that cell's pairs and each repetition goes to it: with a recorded rule that decides the mix
    at 3 pairs, every task's mix cell ends with exactly 3 (the tasks decided after their first round)."""
    from app.core.calibrated import gguf as calibrated_gguf
    from app.core.calibrated.demo import demo_prompts
    from app.core.session.adaptive import MIX

    path = calibrated_gguf.make_model(model_dir / "cal-code-story-mix2.gguf", 0.0, "embedding",
                                      task_p={"code": 0.0, "story": 0.97})
    plan = Plan(model=str(path), arms=(Arm(),), prompts=tuple(demo_prompts(path)), engine="inprocess",
                n_predict=16, reps=1, warmup=0)
    cheap = {1: 10.0, 2: 10.2, 3: 10.4, 4: 10.6}

    def rule(task, ratios, precision=0.05, **_):
        a = next(iter(ratios))
        if task != MIX or min(r.n_pairs for r in ratios.values()) >= 3:
            return TaskDecision(task, True, a, None, more_reps=0)
        return TaskDecision(task, False, None, None, (a,), a, 1)

    monkeypatch.setattr(adaptive_mod, "decide_task", rule)
    with InProcessEngine(ctx_size=1024) as eng:
        events = list(adaptive_sweep(plan, eng, ks=(1, 2, 3), cost=fake_costs(cheap, 0.5), min_reps=1,
                                     max_reps=6, max_candidates=1))
    runs = [e.record for e in events if isinstance(e, RunFinished) and e.record.rep < 10_000]
    assert {t: sum(1 for r in runs if r.task == t and r.k == 3) for t in ("code", "story")} == {"code": 3, "story": 3}
    final = [e for e in events if isinstance(e, Decisions)][-1]
    assert final.stopped == "decided"
