"""Combined speculative modes (issue 40 item 6): ``--modes draft-mtp+ngram-mod`` is one arm that
llama-server runs with ``--spec-type draft-mtp,ngram-mod``; named in one order, checked, measured,
exported, shown in the window's mode list; and the built-in edit task."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.cli.bench import parse_drafters
from app.core.analysis.analysis import analyze
from app.core.analysis.recommend import Pick
from app.core.calibrated import design as calibrated, gguf as calibrated_gguf, modes as calibrated_modes
from app.core.common import spec_modes
from app.core.common.errors import EngineError, UserError
from app.core.engines.commands import ServerConfig, build_server_argv
from app.core.engines.inprocess import InProcessEngine
from app.core.engines.server.binary import probe_capabilities
from app.core.engines.server.engine import ServerEngine
from app.core.measure.plan import Plan, make_arms
from app.core.measure.prompts import BUILTIN_TASKS, DEFAULT_TASKS, builtin_prompts, select_prompts
from app.core.measure.runner import run_sweep
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter
from app.core.session.events import RunFinished, SweepError
from app.core.verdict import build_verdict, verdict_dict, verdict_text
from app.core.verdict.export import CURRENT_CAPS, export_command

from conftest import servers_mentioning

COMBO = "draft-mtp+ngram-mod"
HELLO = (Prompt("hello", "code", "hello world"),)


# ------------------------------------------------------------------------------------------
# names, arms, argv (no llama.cpp needed)


def test_a_combined_mode_is_one_arm_named_in_one_order():
    a = Arm(2, mode="ngram-mod+draft-mtp")
    assert a == Arm(2, mode=COMBO) and a.mode == COMBO and a.label == f"{COMBO} K=2" and a.kind == "spec"
    assert not a.is_mtp and not a.own_heads and a.needs_server and a.draft_sampling == "greedy"
    assert Arm(mode="ngram-mod+ngram-simple").mode == "ngram-simple+ngram-mod"  # no K: both draft from the text
    row = spec_modes.mode_or_guess(COMBO)
    assert row.takes_k and row.fresh_server and not row.in_process and not row.needs_drafter
    assert row.drafter_kinds == spec_modes.MODES["draft-mtp"].drafter_kinds and "draft-mtp,ngram-mod" in row.tip
    assert spec_modes.mode_or_guess("draft-simple+ngram-simple").needs_drafter
    for bad, why in (("draft-mtp+draft-simple", "both draft with a model"), ("ngram-mod+ngram-mod", "twice"),
                     ("none+ngram-mod", "'none'")):
        with pytest.raises(ValueError, match=why):
            Arm(2, mode=bad)
        with pytest.raises(UserError, match=why):
            make_arms([2], modes=[bad])
    with pytest.raises(ValueError, match="needs a draft width"):
        Arm(mode=COMBO)
    with pytest.raises(ValueError, match="takes no draft width"):
        Arm(2, mode="ngram-simple+ngram-mod")


def test_make_arms_runs_a_combination_at_each_k_and_gives_its_drafter():
    arms = make_arms([1, 2], modes=["draft-mtp", "ngram-mod+draft-mtp", "ngram-simple+ngram-mod"])
    assert [a.label for a in arms] == ["baseline", "K=1", "K=2", f"{COMBO} K=1", f"{COMBO} K=2",
                                       "ngram-simple+ngram-mod"]
    simple = make_arms([3], modes=["draft-simple+ngram-simple"],
                       drafters=parse_drafters(["/d.gguf"], ["draft-simple+ngram-simple"]))
    assert simple[1] == Arm(3, 0.0, "draft-simple+ngram-simple", "/d.gguf")
    with pytest.raises(UserError, match="draft-simple\\+ngram-simple needs a drafter model"):
        make_arms([3], modes=["draft-simple+ngram-simple"])
    # a bare drafter goes to draft-mtp and its combinations (a Gemma 4 assistant) when no mode needs one
    assert parse_drafters(["/a.gguf"], ["draft-mtp", COMBO, "ngram-mod"]) == {"draft-mtp": "/a.gguf", COMBO: "/a.gguf"}


def test_the_argv_lists_the_parts_and_k_goes_to_the_draft_part():
    argv = build_server_argv("llama-server", ServerConfig("m.gguf", spec_type=COMBO, spec_k=3, p_min=0.5),
                             CURRENT_CAPS)
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp,ngram-mod"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3" and argv[argv.index("--spec-draft-p-min") + 1] == "0.5"
    ngrams = build_server_argv("llama-server", ServerConfig("m.gguf", spec_type="ngram-simple+ngram-mod"), CURRENT_CAPS)
    assert ngrams[ngrams.index("--spec-type") + 1] == "ngram-simple,ngram-mod" and "--spec-draft-n-max" not in ngrams
    old = type(CURRENT_CAPS)(flags=CURRENT_CAPS.flags, spec_types=frozenset({"none", "draft-mtp"}))
    with pytest.raises(EngineError, match="does not accept ngram-mod "):
        build_server_argv("llama-server", ServerConfig("m.gguf", spec_type=COMBO, spec_k=2), old)
    assert spec_modes.build_problem(COMBO, 10745) and not spec_modes.build_problem(COMBO, 10749)


def test_the_in_process_engine_says_in_one_line_that_it_cannot(tmp_path):
    msg = InProcessEngine(ctx_size=256).mode_problem(Arm(2, mode=COMBO))
    assert msg and "\n" not in msg and f"cannot run {COMBO}" in msg and "llama-server" in msg


def test_a_near_tie_with_its_combination_goes_to_the_single_mode():
    """K=2 at 1.66x and draft-mtp+ngram-mod K=2 at 1.68x (text that never repeats: the n-gram part
    adds nothing): within 3 %, the pick is the single mode, and the reason says why (not "the
    smaller K", which is the same)."""
    import dataclasses
    import math
    import random

    from app.core.analysis.recommend import recommend
    from tests.test_recommend import rec

    rng, recs, t = random.Random(1), [], 0.0
    for rep in range(6):
        base = 40 * math.exp(rng.gauss(0, 0.01))
        for k, s, mode in ((None, 1.0, "none"), (2, 1.68, COMBO), (2, 1.66, "draft-mtp")):
            t += 1
            r = rec("code", k, rep, "p", base * s * math.exp(rng.gauss(0, 0.005)), acc=0.8, ts=t)
            recs.append(dataclasses.replace(r, spec_type=mode, run_id=f"{r.run_id}{mode}",
                                            arm_kind="spec" if mode == COMBO else r.arm_kind))
    _, [code] = recommend(analyze(recs), {"code": 1.0})
    assert code.arm == Arm(2) and f"{COMBO} K=2" in code.reason and "the simpler setting is kept" in code.reason


# ------------------------------------------------------------------------------------------
# the edit task


def test_the_edit_task_is_built_in_and_measured_when_asked():
    assert "edit" in BUILTIN_TASKS and "edit" not in DEFAULT_TASKS
    edit = builtin_prompts(["edit"])
    assert 6 <= len(edit) <= 8 and all(p.task == "edit" and p.id.startswith("edit-") for p in edit)
    assert all("\n" in p.text and len(p.text) > 150 for p in edit)  # the text to change is in the prompt
    assert {p.task for p in select_prompts(None)} == set(DEFAULT_TASKS)  # a sweep of no chosen task: as before
    assert [p.id for p in select_prompts(["edit"], per_task=2)] == [p.id for p in edit[:2]]


# ------------------------------------------------------------------------------------------
# the real llama-server


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    return calibrated_gguf.make_model(tmp_path_factory.mktemp("combo") / "combo-p0.3.gguf", 0.3)


def test_a_combined_arm_on_llama_server_is_measured_and_exported(server_bin, mtp_model, tmp_path):
    """draft-mtp+ngram-mod K=2 through the app's path (plan, runner, engine, record, analysis,
    verdict, export) on the calibrated model with an MTP head. Its greedy text is a cycle of 771
    tokens: for the first ~800 tokens only the MTP head can draft, after that ngram-mod drafts the
    repeat (past K: positions beyond the draft width). The counts are the simulator's exactly."""
    n = 880
    out = tmp_path / "r.jsonl"
    plan = Plan(model=str(mtp_model), arms=make_arms([2], modes=[COMBO]), prompts=HELLO, n_predict=n, reps=1,
                warmup=0, raw=True)
    with ServerEngine(server_bin, ctx_size=2048) as eng:
        events = list(run_sweep(plan, eng, ResultsWriter(out)))
        argvs = [p.cmdline() for p in servers_mentioning(str(mtp_model))]
    assert not [e for e in events if isinstance(e, SweepError)]
    assert any(a[a.index("--spec-type") + 1] == "draft-mtp,ngram-mod" and a[a.index("--spec-draft-n-max") + 1] == "2"
               for a in argvs if "--spec-type" in a), argvs
    recs = [e.record for e in events if isinstance(e, RunFinished)]
    base, combo = (next(r for r in recs if r.arm_kind == kind) for kind in ("baseline", "spec"))
    assert combo.spec_type == COMBO and combo.k == 2 and combo.output_tokens == base.output_tokens
    sim = calibrated_modes.simulate_mtp_ngram_mod(calibrated.load_tables(mtp_model), combo.prompt_tokens, 2, n)
    mtp_alone = calibrated.simulate(calibrated.load_tables(mtp_model), combo.prompt_tokens, 2, n)
    assert (combo.draft_n, combo.draft_accepted) == (sim.draft_n, sim.draft_accepted)
    assert sim.draft_accepted > mtp_alone.draft_accepted  # ngram-mod drafted the repeat
    assert len(combo.accepted_per_pos) > 2 and sum(combo.accepted_per_pos[2:]) > 0  # drafts past K: n-gram ones

    back = load_records(out)
    a = analyze(back)
    assert Arm(2, mode=COMBO) in a.arms
    cell = next(c for c in a.cells if c.arm.mode == COMBO)
    assert cell.acceptance is not None and cell.alpha is None  # no i.i.d. alpha for drafts past K
    caps = probe_capabilities(server_bin)
    exp = export_command(Pick("code", cell.arm, None, ""), str(mtp_model), caps, server_bin)
    assert exp.argv[exp.argv.index("--spec-type") + 1] == "draft-mtp,ngram-mod"
    assert exp.argv[exp.argv.index("--spec-draft-n-max") + 1] == "2" and "spec-type = draft-mtp,ngram-mod" in exp.preset
    v = build_verdict(back, caps=caps, binary=server_bin)
    assert f"not priced by the cost probe" in verdict_text(v) and f"{COMBO} K=2" in v.unpriced
    assert verdict_dict(v)["unpriced"] == v.unpriced
    if v.per_task[0].arm == cell.arm:  # when it paid on this machine, the task's command is its own
        assert "--spec-type draft-mtp,ngram-mod" in v.command("code").export.command


def test_bench_takes_combined_modes_and_a_model_without_heads_skips_them(server_bin, tmp_path):
    """--modes draft-mtp+ngram-mod on a model without MTP heads: its arms skipped with the reason
    (llama-server would exit at start), the baseline measured, no traceback."""
    model = calibrated_gguf.make_model(tmp_path / "nomtp.gguf", 0.3, mtp=False)
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "app", "bench", "--model", str(model), "--engine", "server",
                        "--modes", COMBO, "--k", "2", "--reps", "1", "--warmup", "0", "--n-predict", "8", "--raw",
                        "--server-bin", server_bin, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in p.stderr and f"{COMBO} arms skipped" in p.stderr, p.stderr
    assert {r.spec_type for r in load_records(out)} == {"none"}


@pytest.mark.parametrize("k", [1, 3])
def test_an_ngram_draft_rejected_past_k_rolls_back_exactly_on_a_hybrid_model(server_bin, mtp_model, tmp_path, k):
    """The calibrated target is hybrid (recurrent layers): draft-mtp makes llama-server keep K
    recurrent-state snapshots, yet ngram-mod drafts up to 64 tokens. A prompt that repeats a stretch
    of the model's text makes ngram-mod draft it (drafts of 48-64 tokens), and the generation runs
    past the stretch's end, where such a draft is partly rejected. The tokens stay the greedy text
    and the counts are the simulator's (which cuts a rejected tail off, no replay)."""
    from conftest import bare_server, post_json

    tables = calibrated.load_tables(mtp_model)
    prompt = calibrated_modes.ngram_prompt(tables, 104, 300, 40)

    def run(args):
        with bare_server(server_bin, ["-np", "1", "-c", "1024", "-t", "1", "-m", str(mtp_model), *args],
                         tmp_path / "server.log") as url:
            res = post_json(url, "/completion", {"prompt": prompt, "n_predict": 300, "temperature": 0,
                                                 "cache_prompt": False, "return_tokens": True})
        return tuple(res["tokens"]), res["timings"].get("draft_n"), res["timings"].get("draft_n_accepted")

    tokens, draft_n, accepted = run(["--spec-type", "draft-mtp,ngram-mod", "--spec-draft-n-max", str(k)])
    sim = calibrated_modes.simulate_mtp_ngram_mod(tables, prompt, k, 300, n_ctx=1024)
    assert (draft_n, accepted) == (sim.draft_n, sim.draft_accepted) and accepted < draft_n
    assert tokens == sim.tokens == tuple(tables.chain(prompt[-1], 300))  # the greedy text
