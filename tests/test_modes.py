"""Every speculative mode through the app's own path (plan -> runner -> engine -> record ->
analysis -> recommendation -> export): the real llama-server with models the project generates,
counts checked against the simulators, and the in-process engine's refusal."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from app.cli.common import PLAN_NAMES
from app.core.analysis.analysis import analyze
from app.core.analysis.compare import compare, setting_changes
from app.core.analysis.recommend import Pick, parse_mix, recommend
from app.core.common.errors import EngineError, UserError
from app.core.calibrated import design as calibrated, gemma4 as calibrated_gemma4, gguf as calibrated_gguf, modes as calibrated_modes
from app.core.engines.commands import ServerConfig, build_server_argv
from app.core.engines.inprocess import InProcessEngine
from app.core.engines.server.binary import probe_capabilities
from app.core.engines.server.engine import ServerEngine
from app.core.measure.plan import Plan, check_drafters, make_arms
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished, SweepError
from app.core.records.arm import Arm, arm_from_fields
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.records.schema import SCHEMA_VERSION
from app.core.records.writer import ResultsWriter
from app.core.verdict.export import export_command

from conftest import servers_mentioning
from tests.helpers import make_record

HELLO = (Prompt("hello", "code", "hello world"),)


def finished(events):
    return [e.record for e in events if isinstance(e, RunFinished)]


# ------------------------------------------------------------------------------------------
# arms


def test_arms_name_their_mode_and_old_fields_read_as_draft_mtp():
    assert Arm() == Arm(None, 0.0, "none") and Arm().label == "baseline" and not Arm().is_spec
    assert Arm(2) == Arm(2, 0.0, "draft-mtp") and Arm(2).label == "K=2" and Arm(2).kind == "mtp"
    assert Arm(3, 0.5, "draft-simple", "d.gguf").label == "draft-simple K=3 p=0.5"
    assert Arm(mode="ngram-mod").label == "ngram-mod" and Arm(mode="ngram-mod").kind == "spec"
    assert Arm(2, mode="draft-mtp", drafter="a.gguf").mode_label == "draft-mtp +drafter"
    for bad in (dict(mode="ngram-mod", k=2), dict(mode="draft-simple"), dict(mode="none", k=1),
                dict(mode="Draft MTP", k=1), dict(mode="ngram-mod", drafter="x.gguf")):
        with pytest.raises(ValueError):
            Arm(**bad)
    # schema 1 and 2 records have no spec_type: a K means draft-mtp
    assert arm_from_fields(2, 0.0, None, None) == Arm(2)
    assert arm_from_fields(None, None, None, None) == Arm()
    assert arm_from_fields(None, None, "ngram-mod", None) == Arm(mode="ngram-mod")


def test_make_arms_per_mode_with_drafters():
    arms = make_arms([1, 2], modes=["draft-mtp", "ngram-mod", "draft-simple"], drafters={"draft-simple": "d.gguf"})
    assert [a.label for a in arms] == ["baseline", "K=1", "K=2", "ngram-mod", "draft-simple K=1", "draft-simple K=2"]
    assert {a.drafter for a in arms if a.mode == "draft-simple"} == {"d.gguf"}
    with pytest.raises(UserError, match="draft-simple needs a drafter model$"):
        make_arms([1], modes=["draft-simple"])
    with pytest.raises(UserError, match=r"needs a drafter model \(give one with --drafter draft-simple=FILE\)"):
        make_arms([1], modes=["draft-simple"], names=PLAN_NAMES)
    with pytest.raises(UserError, match="takes no drafter"):
        make_arms([1], modes=["ngram-mod"], drafters={"ngram-mod": "d.gguf"})
    with pytest.raises(UserError, match="not a speculative mode"):
        make_arms([1], modes=["none"])


# ------------------------------------------------------------------------------------------
# the argv per mode, against the real binary's --help


def test_argv_per_mode_uses_the_binarys_flags(server_bin):
    caps = probe_capabilities(server_bin)
    assert {"draft-mtp", "draft-simple", "ngram-mod"} <= caps.spec_types
    ngram = build_server_argv("ls", ServerConfig("m.gguf", spec_type="ngram-mod"), caps)
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-mod"
    assert "--spec-draft-n-max" not in ngram and "--spec-draft-model" not in ngram  # no K, no drafter
    simple = build_server_argv("ls", ServerConfig("m.gguf", spec_type="draft-simple", spec_k=3, drafter="d.gguf",
                                                  draft_n_gpu_layers="99", draft_cache_type_k="q8_0",
                                                  draft_cache_type_v="q8_0"), caps)
    for flag, value in (("--spec-type", "draft-simple"), ("--spec-draft-model", "d.gguf"),
                        ("--spec-draft-n-max", "3"), ("--spec-draft-ngl", "99"),
                        ("--spec-draft-type-k", "q8_0"), ("--spec-draft-type-v", "q8_0")):
        assert simple[simple.index(flag) + 1] == value, flag
    # a binary that lists no such mode: refused with what it does list
    old = type(caps)(flags=caps.flags, version="old", spec_types=frozenset({"none", "draft-mtp"}))
    with pytest.raises(EngineError, match="does not accept ngram-mod .*draft-mtp"):
        build_server_argv("ls", ServerConfig("m.gguf", spec_type="ngram-mod"), old)


def test_export_of_each_pick_writes_its_modes_flags(server_bin):
    caps = probe_capabilities(server_bin)
    exp = export_command(Pick("code", Arm(mode="ngram-mod"), None, ""), "m.gguf", caps, "llama-server")
    assert "--spec-type ngram-mod" in exp.command and "--spec-draft-n-max" not in exp.command
    exp = export_command(Pick("mix", Arm(2, mode="draft-mtp", drafter="/m/mtp-gemma.gguf"), None, ""),
                         "/m/gemma.gguf", caps, "llama-server", n_gpu_layers="999", cache_type_k="q8_0")
    argv = list(exp.argv)
    assert argv[argv.index("--spec-draft-model") + 1] == "/m/mtp-gemma.gguf"
    assert argv[argv.index("--spec-draft-ngl") + 1] == "999"  # the drafter where the target is
    assert argv[argv.index("--spec-draft-type-k") + 1] == "q8_0"  # its KV cache like the target's
    assert "[mtp-tuner]" in exp.preset and "spec-draft-model = /m/mtp-gemma.gguf" in exp.preset


# ------------------------------------------------------------------------------------------
# the real llama-server, per mode


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pairs")
    target, drafter = calibrated_gguf.make_pair(d / "simple", 0.3)
    g_target, g_assistant = calibrated_gemma4.make_gemma4_pair(d / "gemma", 0.3)
    return {"target": target, "drafter": drafter, "g_target": g_target, "g_assistant": g_assistant}


def test_gemma4_assistant_pair_through_the_runner(server_bin, pairs, tmp_path):
    """draft-mtp with a drafter file: draft_n > 0 on every run, the baseline's tokens, counts equal
    to the simulator (so equal on repeated runs), the drafter recorded (schema 3)."""
    tables = calibrated_gemma4.pair_tables(0.3)
    plan = Plan(model=str(pairs["g_target"]),
                arms=make_arms([1, 2, 3], drafters={"draft-mtp": str(pairs["g_assistant"])}),
                prompts=HELLO, n_predict=48, reps=2, warmup=0, raw=True)
    with ServerEngine(server_bin, ctx_size=512) as eng:
        recs = finished(run_sweep(plan, eng, ResultsWriter(tmp_path / "g.jsonl")))
    assert len(recs) == 8
    base = [r for r in recs if r.arm_kind == "baseline"]
    for r in recs:
        assert r.schema_version == SCHEMA_VERSION and r.output_tokens == base[0].output_tokens
        if r.arm_kind == "baseline":
            assert r.spec_type == "none" and not r.draft_n and r.drafter is None
            continue
        sim = calibrated_gemma4.simulate_pair(tables, r.prompt_tokens, r.k, 48)
        assert r.draft_n > 0 and (r.draft_n, r.draft_accepted) == (sim.draft_n, sim.draft_accepted), r.k
        assert r.spec_type == "draft-mtp" and r.drafter["arch"] == "gemma4-assistant"
        assert len(r.drafter["sha256"]) == 64 and r.drafter["size"] == pairs["g_assistant"].stat().st_size
    back = load_records(tmp_path / "g.jsonl")
    assert [r.measured_arm for r in back] == [r.measured_arm for r in recs]
    assert analyze(back).arms[1] == Arm(1, 0.0, "draft-mtp", str(pairs["g_assistant"]))


def test_draft_simple_and_ngram_mod_counts_follow_the_construction(server_bin, pairs):
    """draft-simple: the simulator's counts exactly. ngram-mod: the model's greedy text is a cycle of
    771 tokens, so a generation longer than that repeats itself; ngram-mod then drafts, with the
    simulator's counts from an empty table on every run (its table lives as long as the server, so
    each n-gram run gets a fresh one; else a repetition would draft the answer the run before
    generated). Every run keeps the baseline's tokens."""
    t_tab, d_tab = calibrated.load_tables(pairs["target"]), calibrated.load_tables(pairs["drafter"])
    runs = []
    for modes, n in ((["draft-simple"], 64), (["ngram-mod"], 880)):
        plan = Plan(model=str(pairs["target"]), arms=make_arms([1, 3], modes=modes,
                                                               drafters={"draft-simple": str(pairs["drafter"])}
                                                               if modes == ["draft-simple"] else None),
                    prompts=HELLO, n_predict=n, reps=2, warmup=0, raw=True)
        with ServerEngine(server_bin, ctx_size=1024) as eng:
            events = list(run_sweep(plan, eng))
        assert not [e for e in events if isinstance(e, SweepError)]
        recs = finished(events)
        assert len(recs) == len(plan.runs())
        base = [r for r in recs if r.arm_kind == "baseline"][0]
        for r in recs:
            assert r.output_tokens == base.output_tokens, r.measured_arm.label
            if r.spec_type == "draft-simple":
                sim = calibrated_modes.simulate_draft_simple(t_tab, d_tab, r.prompt_tokens, r.k, n)
                assert (r.draft_n, r.draft_accepted) == (sim.draft_n, sim.draft_accepted), r.k
                assert r.drafter["arch"] == "qwen35" and r.mtp_engaged
            elif r.spec_type == "ngram-mod":
                sim, _ = calibrated_modes.simulate_ngram_mod(t_tab, r.prompt_tokens, n)  # a fresh table
                assert r.draft_n > 0 and (r.draft_n, r.draft_accepted) == (sim.draft_n, sim.draft_accepted), r.rep
                assert r.k is None and r.p_min is None and r.drafter is None
        runs += recs
    a = analyze(runs)
    assert {arm.label for arm in a.arms} == {"baseline", "draft-simple K=1", "draft-simple K=3", "ngram-mod"}
    pick, per_task = recommend(a, parse_mix(None, a.tasks))
    assert "MTP" not in pick.reason and ("speculative decoding off" in pick.reason or "turn on" in pick.reason)


def test_each_ngram_run_starts_from_an_empty_table(server_bin, pairs):
    """On one reused server, the second repetition of a prompt drafts the whole answer the first
    generated (ngram-mod's table outlives requests): 100 % "acceptance" that says nothing about the
    text. Each n-gram run gets a fresh server, so a short generation that never repeats itself
    drafts nothing, every time."""
    plan = Plan(model=str(pairs["target"]), arms=make_arms((), modes=["ngram-mod"]), prompts=HELLO, n_predict=100,
                reps=3, warmup=1, raw=True)
    with ServerEngine(server_bin, ctx_size=1024) as eng:
        recs = finished(run_sweep(plan, eng))
        # the baseline's server, and one per n-gram run; none for a warmup (a fresh server is warmed
        # by the engine: a warmup run's own would be thrown away unused)
        assert eng.starts == 1 + 3
    ngram = [r for r in recs if r.spec_type == "ngram-mod"]
    assert len(ngram) == 3 and all(not r.draft_n for r in ngram) and all(r.mtp_engaged is False for r in ngram)
    assert all("mtp_not_engaged" not in r.flags for r in ngram)  # nothing to draft from is no fault


def test_in_process_engine_refuses_other_modes_and_the_baseline_still_runs(pairs):
    plan = Plan(model=str(pairs["target"]), arms=(Arm(), Arm(mode="ngram-mod"),
                                                  Arm(2, mode="draft-simple", drafter=str(pairs["drafter"]))),
                prompts=HELLO, n_predict=16, reps=1, warmup=0, raw=True, engine="inprocess")
    with InProcessEngine(ctx_size=512) as eng:
        events = list(run_sweep(plan, eng))
    errors = [e.message for e in events if isinstance(e, SweepError)]
    assert len(errors) == 2 and all("in-process engine cannot run" in m and "llama-server" in m for m in errors)
    assert [r.arm_kind for r in finished(events)] == ["baseline"]


# ------------------------------------------------------------------------------------------
# pair checks, before any server starts


@pytest.fixture(scope="module")
def bad_drafters(tmp_path_factory, pairs):
    d = tmp_path_factory.mktemp("bad")
    return {
        "another vocabulary": calibrated_gemma4.make_gemma4_assistant(d / "vocab.gguf", vocab_offset=7),
        "the wrong width": calibrated_gemma4.make_gemma4_assistant(d / "width.gguf", target_n_embd=96),
        "not a drafter": pairs["g_target"],
        "missing": d / "nothing-here.gguf",
    }


@pytest.mark.parametrize("case", ["another vocabulary", "the wrong width", "not a drafter", "missing"])
def test_a_drafter_that_does_not_pair_is_one_clear_error_before_any_server(server_bin, pairs, bad_drafters, case,
                                                                           tmp_path):
    drafter = str(bad_drafters[case])
    plan = Plan(model=str(pairs["g_target"]), arms=make_arms([2], drafters={"draft-mtp": drafter}),
                prompts=HELLO, n_predict=16, reps=1, warmup=0, raw=True)
    with pytest.raises(UserError) as ei:
        check_drafters(plan)
    msg = str(ei.value)
    assert "\n" not in msg and drafter in msg
    # the CLI: exit 2 with that line, and no llama-server was started for it
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "app", "bench", "--model", str(pairs["g_target"]),
                        "--drafter", drafter, "--k", "2", "--reps", "1", "--n-predict", "16", "--raw",
                        "--server-bin", server_bin, "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1] == f"mtp-tuner: error: {msg}" and "Traceback" not in p.stderr
    assert not out.exists() and not servers_mentioning(str(pairs["g_target"]))
    # the runner, given the plan anyway: the drafter's arms dropped with that reason, the baseline runs
    with ServerEngine(server_bin, ctx_size=512) as eng:
        events = list(run_sweep(plan, eng))
    assert [e.message for e in events if isinstance(e, SweepError)][0].startswith("draft-mtp arms skipped:")
    assert [r.arm_kind for r in finished(events)] == ["baseline"]


# ------------------------------------------------------------------------------------------
# old files


def test_schema_1_results_load_analyse_and_compare_with_a_schema_3_sweep(tmp_path):
    old = load_records("tests/data/demo_sweep.jsonl")
    assert {r.schema_version for r in old} == {1} and {r.spec_type for r in old} == {None}
    assert {r.measured_arm.mode for r in old} == {"none", "draft-mtp"}
    new_lines = []
    for line in open("tests/data/demo_sweep.jsonl", encoding="utf-8"):
        d = json.loads(line)
        if d.get("record_type", "run") == "run":
            d["schema_version"] = SCHEMA_VERSION
            d["spec_type"] = "none" if d["k"] is None else "draft-mtp"
        new_lines.append(json.dumps(d))
    (tmp_path / "new.jsonl").write_text("\n".join(new_lines) + "\n", encoding="utf-8")
    new = load_records(tmp_path / "new.jsonl")
    a, b = analyze(old), analyze(new)
    assert a.arms == b.arms and [c.arm for c in a.cells] == [c.arm for c in b.cells]
    assert all(c.a is not None and c.b is not None and not c.verdict_changed for c in compare(a, b))
    assert setting_changes(old, new) == []
    # the same sweep with a drafter file: compare names it as a set-up change
    drafted = [dataclasses.replace(r, drafter={"path": "/m/mtp-x.gguf", "sha256": "ab" * 32, "arch": "gemma4-assistant",
                                               "size": 1}) if r.arm_kind != "baseline" else r for r in new]
    assert setting_changes(new, drafted) == [("drafter", "none", "mtp-x.gguf (sha256 abababababab)")]


# ------------------------------------------------------------------------------------------
# what a review found (each fails on the code before its fix)


def test_a_moved_drafter_is_the_same_arm_in_compare_and_a_changed_one_is_named(pairs, tmp_path):
    lines = []
    for i, (kind, k) in enumerate((("baseline", None), ("mtp", 2))):
        for rep in range(3):
            lines.append(make_record(
                run_id=f"r{i}{rep}", sweep_id="s", arm_kind=kind, k=k, p_min=0.0 if k else None, rep=rep,
                n_predict=64, n_generated=64, tok_s=100.0 + 10 * bool(k) + rep, tok_s_engine=None,
                draft_n=40 if k else None, draft_accepted=30 if k else None, acceptance=0.75 if k else None,
                mtp_engaged=bool(k) or None, output_sha256="x", output_tokens=(1, 2), prompt_tokens=(1,),
                prompt_tok_s=None, model_path="/m/t.gguf", token_times=(0.0, 0.1),
                timestamp_utc=f"2026-11-30T00:00:0{2 * rep + i}+00:00", spec_type="draft-mtp" if k else "none",
                drafter={"path": "/a/mtp-x.gguf", "sha256": "ab" * 32, "arch": "gemma4-assistant", "size": 9}
                if k else None).to_json())
    a_path, b_path = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a_path.write_text("\n".join(lines) + "\n")
    b_path.write_text("\n".join(ln.replace("/a/mtp-x.gguf", "/elsewhere/mtp-x.gguf") for ln in lines) + "\n")
    ra, rb = load_records(a_path), load_records(b_path)
    rows = compare(analyze(ra), analyze(rb))
    assert len(rows) == 2 and all(c.a is not None and c.b is not None for c in rows)
    assert setting_changes(ra, rb) == []  # the same file (name and sha256) in another folder
    rc = [dataclasses.replace(r, drafter=dict(r.drafter, sha256="cd" * 32)) if r.drafter else r for r in rb]
    assert setting_changes(ra, rc) == [("drafter", "mtp-x.gguf (sha256 abababababab)", "mtp-x.gguf (sha256 cdcdcdcdcdcd)")]


def test_a_drafter_file_given_as_the_model_is_one_clear_error(pairs):
    plan = Plan(model=str(pairs["g_assistant"]), arms=(Arm(),), prompts=HELLO, n_predict=8, reps=1, warmup=0)
    with InProcessEngine(ctx_size=256) as eng:
        with pytest.raises(UserError, match="gemma4-assistant drafter, not a model to run"):
            list(run_sweep(plan, eng))


def test_bench_drafter_options_and_modes_are_checked_before_any_run(pairs, server_bin, tmp_path):
    from app.cli.bench import parse_drafters

    with pytest.raises(UserError, match="two drafters for draft-mtp"):
        parse_drafters(["/a.gguf", "/b.gguf"], ["draft-mtp"])
    assert parse_drafters(["/a.gguf", "draft-mtp=/a.gguf"], ["draft-mtp"]) == {"draft-mtp": "/a.gguf"}
    out = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "app", "bench", "--model", str(pairs["target"]), "--modes", "ngram-mood",
                        "--reps", "1", "--n-predict", "8", "--raw", "--server-bin", server_bin, "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "does not accept ngram-mood" in p.stderr.splitlines()[-1] and not out.exists()


def test_again_takes_a_moved_drafter(pairs, tmp_path):
    from app.core.measure.plan import plan_again

    moved = tmp_path / "moved.gguf"
    moved.write_bytes(pairs["g_assistant"].read_bytes())
    plan = Plan(model=str(pairs["g_target"]), arms=make_arms([2], drafters={"draft-mtp": str(tmp_path / "gone.gguf")}),
                prompts=(Prompt("story-en-cats", "story", "x"),), n_predict=8, reps=1)
    recs = [make_record(a, run_id="r", sweep_id="s", task="story", prompt_id="story-en-cats", n_predict=8,
                        n_generated=8, tok_s=10.0, tok_s_engine=None, draft_n=None, draft_accepted=None,
                        acceptance=None, mtp_engaged=None, output_sha256="x", output_tokens=(), prompt_n=1,
                        prompt_tokens=(), prompt_tok_s=None, llama_build="b", model_path=str(pairs["g_target"]),
                        sampling={}, token_times=(), timestamp_utc="2026-11-30T00:00:00+00:00",
                        drafter={"path": a.drafter, "sha256": "0" * 64, "arch": "gemma4-assistant", "size": 1}
                        if a.drafter else None) for a in plan.arms]
    with pytest.raises(UserError, match="drafter is not there any more$"):  # the window names no flag
        plan_again(recs)
    with pytest.raises(UserError, match=r"drafter is not there any more \(give it with --drafter draft-mtp=FILE\)"):
        plan_again(recs, names=PLAN_NAMES)
    again = plan_again(recs, drafters={"draft-mtp": str(moved)})
    assert [a.drafter for a in again.arms] == [None, str(moved)]


@pytest.mark.parametrize("edit", [dict(spec_type="draft-mtp", k=None), dict(spec_type="Draft MTP"),
                                  dict(spec_type="none", k=2), dict(drafter={"sha256": "ab"}), dict(drafter={"path": 5})])
def test_a_record_whose_mode_k_and_drafter_make_no_arm_is_left_out_by_name(tmp_path, edit):
    good = json.loads(next(line for line in open("tests/data/demo_sweep.jsonl", encoding="utf-8") if '"k":2' in line))
    good.update(schema_version=SCHEMA_VERSION, spec_type="draft-mtp")
    bad = dict(good, run_id="bad", **edit)
    (tmp_path / "r.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    problems: list[str] = []
    recs = load_records(tmp_path / "r.jsonl", problems)
    assert [r.run_id for r in recs] == [good["run_id"]] and len(problems) == 1
    assert problems[0].startswith(f"{tmp_path / 'r.jsonl'} line 2: ") and "left out" in problems[0]
    analyze(recs)  # no traceback downstream


def test_tok_s_far_from_the_engines_own_figure_is_a_finding():
    """Seen with the tiny Gemma 4 pair on a busy machine: 128 tokens read within 2 ms of each other
    (72,000 tok/s by the arrival times, 2,800 by llama-server's own timings)."""
    old = load_records("tests/data/demo_sweep.jsonl")
    assert "clock_mismatch" not in {f.code for f in analyze(old).findings}
    burst = [dataclasses.replace(r, tok_s_engine=r.tok_s / 25) if i == 0 else r for i, r in enumerate(old)]
    f = [f for f in analyze(burst).findings if f.code == "clock_mismatch"]
    assert len(f) == 1 and f[0].message.startswith("in 1 run(s)")
