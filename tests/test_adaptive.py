"""The adaptive sweep planner: drops K that cannot pay, pilots, measures few candidates."""

from __future__ import annotations

from app.core.session.adaptive import adaptive_sweep
from app.core.session.events import AdaptiveResult, AdaptiveStage
from app.core.engines.inprocess import InProcessEngine
from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.measure.runner import RunFinished
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
