"""One clock the user recognises (issue 55 item 3): a run's tok/s is decode alone, the first token
out (RunRecord.tok_s, llama-server's predicted_per_second); the whole answer (prompt processing,
a drafter's own prefill of the prompt and the first token counted: RunRecord.whole_tok_s) is said
beside it, by the verdict, the CLI and the window from the one pick, where the two speedups differ
by more than recommend.CLOCK_GAP. On recorded numbers only."""

from __future__ import annotations

import json

import pytest

from app.core.analysis.analysis import analyze
from app.core.analysis.recommend import parse_mix, recommend
from app.core.records.arm import Arm
from app.core.verdict import build_verdict, verdict_dict, verdict_text
from app.gui.words import verdict_line
from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter
from tests.helpers import cli, make_record

DRAFTER = "/models/qwen2.5-coder-0.5b.gguf"
SPEC = Arm(4, 0.0, "draft-simple", DRAFTER)


def times(first: float, tok_s: float, n: int = 96) -> tuple[float, ...]:
    """Token arrival times from the request: the first at ``first`` s (the prompt, and the drafter's
    prefill of it), then ``n`` - 1 more at ``tok_s``."""
    return tuple(first + i / tok_s for i in range(n))


def run(task: str, arm: Arm, rep: int, first: float, tok_s: float, t: int) -> object:
    return make_record(
        arm, run_id=f"{task}{arm.k}{rep}", task=task, prompt_id=task, rep=rep, n_predict=96, n_generated=96,
        tok_s=tok_s, output_tokens=tuple(range(96)), token_times=times(first, tok_s),
        drafter={"path": arm.drafter} if arm.drafter else None, draft_n=80 if arm.is_spec else None,
        draft_accepted=74 if arm.is_spec else None, acceptance=74 / 80 if arm.is_spec else None,
        timestamp_utc=f"2026-12-07T16:{t // 60:02d}:{t % 60:02d}+00:00")


# the shape of the real pair (benchmarks/real_clocks.py): the first token comes after the target's
# prompt processing and, with draft-simple, after the drafter's own prefill of the prompt too (about a
# third of the target's: a 0.5B beside a 1.5B); decoding runs at the arm's speed. An edit prompt is
# long (2 s of prefill here), a code prompt short (0.3 s). (first token s, decode tok/s) per arm:
EDIT = {"base": (2.0, 9.0), "spec": (2.7, 11.7)}  # decode 1.30x, the whole answer 1.16x
CODE = {"base": (0.3, 9.0), "spec": (0.4, 11.7)}  # decode 1.30x, the whole answer 1.27x


def records(tasks: dict[str, dict[str, tuple[float, float]]], reps: int = 4) -> list:
    out, t = [], 0
    for rep in range(reps):
        for task, f in tasks.items():
            wobble = 1 + 0.004 * rep
            out.append(run(task, Arm(), rep, f["base"][0], f["base"][1] * wobble, t))
            out.append(run(task, SPEC, rep, f["spec"][0], f["spec"][1] * wobble, t + 1))
            t += 2
    return out


def test_the_whole_answer_is_timed_from_the_request_and_decode_from_the_first_token():
    r = run("edit", SPEC, 0, 2.7, 11.7, 0)
    assert r.whole_tok_s == pytest.approx(96 / (2.7 + 95 / 11.7))
    assert r.tok_s == 11.7
    # an old file's failed run has no times: no whole answer, no error
    assert make_record(token_times=()).whole_tok_s is None
    # times that are not the ones its tok/s was read from (written apart): no whole answer either
    assert make_record(tok_s=10.0, token_times=(0.5, 0.6, 0.7, 0.9)).whole_tok_s is None
    assert make_record(tok_s=10.0, token_times=(0.5, 0.6, 0.7, 0.8)).whole_tok_s == pytest.approx(4 / 0.8)


def test_recommend_reads_the_whole_answer_from_a_file_read_without_the_speculative_runs_times(tmp_path):
    """The CLI (recommend, compare, bench's view) reads a file without the speculative runs' token
    times (memory: most of a large file); it keeps their first and last, so it says what the window
    says (the window reads them whole)."""
    path = tmp_path / "runs.jsonl"
    with ResultsWriter(path) as w:
        for r in records({"edit": EDIT, "code": CODE}):
            w.append(r)
    lean = load_records(path, mtp_times=False)
    assert all(len(r.token_times) == 2 for r in lean if r.arm_kind != "baseline")
    whole = {p.scope: p.whole for p in build_verdict(load_records(path)).per_task}
    lean_whole = {p.scope: p.whole for p in build_verdict(lean).per_task}
    assert lean_whole["edit"] is not None and lean_whole == whole
    out = cli("recommend", str(path))
    assert out.returncode == 0 and "counting the whole answer" in out.stdout and "1.16x" in out.stdout


def test_the_cells_speedup_over_the_whole_answer_is_paired_like_decode():
    a = analyze(records({"edit": EDIT}))
    c = a.cell("edit", SPEC)
    assert c.ratio.estimate == pytest.approx(1.3, rel=1e-6)
    whole = (96 / (2.7 + 95 / 11.7)) / (96 / (2.0 + 95 / 9.0))
    assert c.whole.estimate == pytest.approx(whole, rel=1e-3)
    assert c.whole.n_pairs == c.ratio.n_pairs == 4


def test_a_long_prompt_task_says_both_speedups_in_the_verdict_cli_and_window():
    recs = records({"edit": EDIT, "code": CODE})
    v = build_verdict(recs)
    edit = next(p for p in v.per_task if p.scope == "edit")
    code = next(p for p in v.per_task if p.scope == "code")
    # edit: decode 1.30x, the whole answer 1.16x (more than CLOCK_GAP apart): both said
    assert edit.whole is not None and abs(edit.whole.estimate / edit.ratio.estimate - 1) > 0.05
    assert "1.30x" in edit.reason and "counting the whole answer" in edit.reason and "1.16x" in edit.reason
    # code: a short prompt, the two within CLOCK_GAP: decode's alone
    assert code.whole is None and "whole answer" not in code.reason
    text = verdict_text(v)
    assert "it is 1.16x" in text
    d = verdict_dict(v)
    per = {p["task"]: p for p in d["per_task"]}
    assert per["edit"]["whole_answer"]["estimate"] == pytest.approx(edit.whole.estimate, rel=1e-3)
    assert "whole_answer" not in per["code"]
    json.dumps(d)
    line, _ = verdict_line(edit, "Edit")
    assert "1.30x" in line and "decoding alone" in line and "1.16x" in line
    assert "whole answer" not in verdict_line(code, "Code")[0]


def test_a_drafter_that_pays_on_decode_but_not_on_the_whole_answer_says_so():
    """A long prompt where decode pays 1.15x but the drafter's prefill eats the gain: the pick
    still turns it on by decode (the documented clock), and says the whole answer's 0.96x."""
    long = {"base": (6.0, 9.0), "spec": (8.0, 10.35)}
    mix, per_task = recommend(analyze(records({"edit": long})), parse_mix(None, ("edit",)))
    p = per_task[0]
    assert p.arm == SPEC and p.ratio.estimate == pytest.approx(1.15, rel=1e-3)
    assert p.whole is not None and p.whole.estimate == pytest.approx(0.964, abs=0.002)
    assert "1.15x" in p.reason and "counting the whole answer" in p.reason
    assert mix.whole is not None  # the mix (edit alone) says it too


def test_the_drafters_prefill_is_named_only_for_a_setting_with_a_drafter():
    """draft-mtp drafts with the model's own heads: its whole answer counts prompt processing and
    the first token, and names no drafter."""
    mtp = Arm(4, 0.0)
    recs = [run("edit", arm, rep, f[0], f[1] * (1 + 0.004 * rep), 2 * rep + i)
            for rep in range(4) for i, (arm, f) in enumerate(((Arm(), EDIT["base"]), (mtp, EDIT["spec"])))]
    _, per_task = recommend(analyze(recs), parse_mix(None, ("edit",)))
    p = per_task[0]
    assert p.arm == mtp and p.whole is not None
    assert p.whole_words == f"counting the whole answer (prompt processing and the first token) it is " \
                            f"{p.whole.estimate:.2f}x, 95% CI {p.whole.lo:.2f}-{p.whole.hi:.2f}"
    assert "drafter" not in p.reason
