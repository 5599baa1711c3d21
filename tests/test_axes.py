"""Server flags as sweep axes (bench --axis): the text parsed, each flag checked against --help
and refused where the measurement owns it, the values set in the user's flags, each value a
setting of its own in the analysis, and the verdict's best joint setting from recorded runs."""

from __future__ import annotations

import dataclasses
import math
import random
import re
from pathlib import Path

import pytest

from app.core.analysis.settings import setting_label, setting_of, split_by_setting
from app.core.common.errors import UserError
from app.core.engines.base import EngineSettings
from app.core.engines.commands import Capabilities
from app.core.engines.user_command import help_flags
from app.core.measure.axes import Axis, axis_settings, check_axes, engine_for, parse_axis, with_value
from app.core.verdict.export import ExportOptions
from app.core.verdict.joint import joint_verdict
from helpers import make_record

HELP = """----- common params -----
-t,    --threads N                      number of CPU threads
-c,    --ctx-size N                     size of the prompt context
-b,    --batch-size N                   logical maximum batch size
-ub,   --ubatch-size N                  physical maximum batch size
-fa,   --flash-attn [on|off|auto]       set Flash Attention use
-ctk,  --cache-type-k TYPE              KV cache data type for K
-ncmoe, --n-cpu-moe N                   keep the MoE weights of the first N layers in the CPU
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM
-m,    --model FNAME                    model path to load
-np,   --parallel N                     number of server slots
--port PORT                             port to listen (default: 8080)
--api-key KEY                           API key to use for authentication
--metrics                               enable prometheus compatible metrics endpoint
--control-vector-layer-range START END
--spec-type none,draft-simple,draft-mtp,ngram-mod
--spec-draft-n-max N                    number of tokens to draft
"""
CAPS = Capabilities(flags=frozenset(help_flags(HELP)), version="b1 (test)", help_text=HELP,
                    spec_types=frozenset({"draft-mtp"}))


def test_parse_axis():
    axis = parse_axis(" --n-cpu-moe=20, 24,28 ")
    assert (axis.flag, axis.values) == ("--n-cpu-moe", ("20", "24", "28"))
    assert parse_axis("-ctk=f16,q8_0").values == ("f16", "q8_0")
    assert parse_axis("-ub=64").values == ("64",)


@pytest.mark.parametrize("text, fragment", [
    ("-ub", "expected a llama-server flag, '=' and its values"),
    ("ub=64,128", "expected a llama-server flag"),
    ("-5=1,2", "expected a llama-server flag"),
    ("-ub=64,,128", "an empty value"),
    ("-ub=", "an empty value"),
    ("-ub=64,64", "a value is given twice"),
    ("-ub=" + ",".join(str(i) for i in range(20)), "more than the 16"),
])
def test_parse_axis_refuses(text, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_axis(text)


@pytest.mark.parametrize("text, fragment", [
    ("--ubatch=64,128", "not a flag of this llama-server"),
    ("-np=1,2", "the measurement owns this flag"),
    ("--port=1,2", "the measurement owns this flag"),
    ("--spec-draft-n-max=2,3", "a speculative flag"),
    ("--api-key=a,b", "a secret"),
    ("-m=a.gguf,b.gguf", "the model is the sweep's"),
    ("-c=4096,8192", "--depths"),
    ("--metrics=1,2", "takes no values"),
    ("--control-vector-layer-range=1,2", "takes 2 values"),
    ("-t=2,x", "not a whole number"),
    ("-ngl=99,-5", "not a whole number of at least -1"),
])
def test_check_axes_refuses(text, fragment):
    with pytest.raises(UserError, match=fragment):
        check_axes([parse_axis(text)], CAPS)


def test_check_axes_spellings_and_the_users_value_first():
    ub, = check_axes([parse_axis("-ub=256,512")], CAPS)
    assert ub.aliases == {"-ub", "--ubatch-size"} and ub.values == ("256", "512")
    # the user's own value is the reference: measured first (added when the axis lacks it)
    assert check_axes([parse_axis("-ub=256,512")], CAPS, ["--ubatch-size", "512"])[0].values == ("512", "256")
    assert check_axes([parse_axis("-ub=256,512")], CAPS, ["--ubatch-size=1024"])[0].values == ("1024", "256", "512")
    assert check_axes([parse_axis("-fa=on,off")], CAPS)[0].values == ("on", "off")  # an optional value
    with pytest.raises(UserError, match="already an axis"):
        check_axes([parse_axis("-ub=1,2"), parse_axis("--ubatch-size=3,4")], CAPS)
    with pytest.raises(UserError, match="at most 32"):
        check_axes([parse_axis("-ub=" + ",".join(map(str, range(1, 9)))),
                    parse_axis("-b=" + ",".join(map(str, range(1, 6))))], CAPS)


def test_values_in_the_users_flags():
    ub = Axis("-ub", ("64", "128"), frozenset({"-ub", "--ubatch-size"}))
    user = ("-fa", "on", "--ubatch-size", "512", "-ctk", "q8_0")
    assert with_value(user, ub, "64") == ("-fa", "on", "-ub", "64", "-ctk", "q8_0")  # in its place
    assert with_value(("--ubatch-size=512", "-fa", "on", "-ub", "8"), ub, "64") == ("-ub", "64", "-fa", "on")
    assert with_value(("-fa", "on"), ub, "64") == ("-fa", "on", "-ub", "64")  # added at the end
    b = Axis("-b", ("256", "512"), frozenset({"-b"}))
    assert axis_settings(("-fa", "on"), (ub, b)) == [
        (("-fa", "on", "-ub", "64", "-b", "256"), "-ub 64 -b 256"), (("-fa", "on", "-ub", "64", "-b", "512"), "-ub 64 -b 512"),
        (("-fa", "on", "-ub", "128", "-b", "256"), "-ub 128 -b 256"),
        (("-fa", "on", "-ub", "128", "-b", "512"), "-ub 128 -b 512")]


def test_engine_settings_follow_threads_and_layers():
    base = EngineSettings(threads=4, n_gpu_layers="99", log_dir="logs")
    t, ngl = Axis("-t", ("2",), frozenset({"-t"})), Axis("-ngl", ("0",), frozenset({"-ngl"}))
    got = engine_for(base, ("-t", "2", "-ngl", "0"), (t, ngl))
    assert (got.threads, got.n_gpu_layers, got.user_args) == (2, "0", ("-t", "2", "-ngl", "0"))
    assert got.log_dir == str(Path("logs") / "t-2_ngl-0")  # each setting's server logs its own
    got = engine_for(dataclasses.replace(base, log_dir=None), ("-ub", "64"), (Axis("-ub", ("64",), frozenset({"-ub"})),))
    assert (got.threads, got.n_gpu_layers, got.user_args, got.log_dir) == (4, "99", ("-ub", "64"), None)


def _runs(ub: str, base_speed: float, k2_speedup: float, start: int, rng: random.Random) -> list:
    out = []
    for rep in range(6):
        for k, speed in ((None, base_speed), (2, base_speed * k2_speedup), (3, base_speed * 0.9)):
            t = start + len(out)
            out.append(make_record(
                run_id=f"{ub}-{k}-{rep}", task="code", prompt_id="p", rep=rep,
                arm_kind="baseline" if k is None else "mtp", k=k, p_min=None if k is None else 0.0,
                draft_n=None if k is None else 10, draft_accepted=None if k is None else 7,
                acceptance=None if k is None else 0.7, mtp_engaged=None if k is None else True,
                tok_s=speed * math.exp(rng.gauss(0, 0.01)), server_args=("-fa", "on", "-ub", ub),
                timestamp_utc=f"2026-01-01T00:{t // 60:02d}:{t % 60:02d}+00:00"))
    return out


def test_each_value_its_own_setting():
    rng = random.Random(3)
    runs = _runs("64", 40, 1.3, 0, rng) + _runs("128", 44, 1.3, 100, rng)
    groups = split_by_setting(runs)
    assert len(groups) == 2 and setting_of(runs[0]) != setting_of(runs[-1])
    assert [setting_label(g, runs) for g in groups.values()] == ["-ub 64", "-ub 128"]
    old = make_record(server_args=None)  # older files: no server flags, one setting as before
    assert setting_of(old) == setting_of(make_record())


def test_joint_pick_against_the_reference():
    rng = random.Random(5)
    runs = _runs("64", 40, 1.3, 0, rng) + _runs("128", 44, 1.3, 100, rng)
    user = ("llama-server", "-m", "/m.gguf", "-fa", "on", "--ubatch-size", "64")  # another spelling of -ub
    jv = joint_verdict(runs, caps=CAPS, options=ExportOptions(base_argv=user))
    assert jv is not None and [v.label for v in jv.values] == ["-ub 64", "-ub 128"]
    ref, other = jv.values
    assert ref.verdict.pick.arm.k == 2 and other.verdict.pick.arm.k == 2  # each value's own best K
    assert ref.verdict.pick.ratio.estimate == pytest.approx(1.3, rel=0.02)  # over its own baseline
    assert other.verdict.pick.ratio.estimate == pytest.approx(1.3, rel=0.02)
    assert ref.over_reference.estimate == pytest.approx(1.3, rel=0.02)
    assert other.over_reference.estimate == pytest.approx(1.43, rel=0.02)  # 1.1x plain, 1.3x with K=2
    assert jv.best is other and re.match(r"-ub 128 with K=2: 1\.4\dx \(95% CI 1\.\d\d-1\.\d\d\)", jv.sentence)
    assert jv.sentence.endswith("over your command as it is (-ub 64, speculation off)")
    # the user's command with the winning value in place of theirs, and the picked flags
    argv = jv.best.verdict.export.argv
    assert argv[:7] == ("llama-server", "-m", "/m.gguf", "-fa", "on", "-ub", "128")
    assert "--spec-type" in argv and "64" not in argv
    lines = jv.lines()
    assert lines[1].startswith("  -ub 64 (reference): K=2, 1.3") and "over its own baseline; 1.3" in lines[1]
    assert lines[2].startswith("  -ub 128: K=2, 1.") and lines[2].endswith("over the reference")
    assert lines[-1].startswith("command: llama-server -m /m.gguf -fa on -ub 128")
    d = jv.as_dict()
    assert (d["best"], d["reference"], d["sentence"], d["argv"]) == ("-ub 128", "-ub 64", jv.sentence, list(argv))
    assert [(x["setting"], x["pick"]) for x in d["values"]] == [("-ub 64", "K=2"), ("-ub 128", "K=2")]
    assert d["values"][1]["over_reference"] == pytest.approx(1.43, rel=0.02) and d["values"][1]["lo"] > 1


def test_joint_pick_keeps_speculation_off_where_it_loses():
    rng = random.Random(9)
    runs = _runs("64", 40, 0.7, 0, rng) + _runs("128", 46, 0.7, 100, rng)
    jv = joint_verdict(runs)
    assert jv is not None and jv.best.label == "-ub 128" and jv.best.verdict.pick.arm is None
    assert jv.best.over_reference.estimate == pytest.approx(1.15, rel=0.02)
    assert jv.sentence.startswith("-ub 128 with speculation off: 1.15x")
    assert jv.lines()[2].startswith("  -ub 128: speculation off (no setting reliably faster than its own baseline); 1.15x")


def test_no_joint_verdict_without_axes():
    rng = random.Random(1)
    assert joint_verdict(_runs("64", 40, 1.3, 0, rng)) is None


def test_axis_values_that_start_with_a_dash_reach_argparse():
    from app.cli.options import axis_joined

    assert axis_joined(["bench", "--axis", "-ub=64,128", "--axis", "--n-cpu-moe=20,24", "--k", "2"]) == [
        "bench", "--axis=-ub=64,128", "--axis=--n-cpu-moe=20,24", "--k", "2"]
    assert axis_joined(["bench", "--axis=-b=1,2", "--", "--axis", "x"]) == ["bench", "--axis=-b=1,2", "--", "--axis", "x"]
    assert axis_joined(["bench", "--axis"]) == ["bench", "--axis"]  # argparse says it needs a value


def test_each_value_a_whole_session_in_one_sweep(monkeypatch, tmp_path):
    """The session runs the request once per setting, the reference first, each on llama-server
    with that setting's flags and its arms fitted in memory with them (a setting whose baseline
    does not fit is skipped, said), all in one sweep id; an adaptive budget is shared by the values."""
    from app.core.measure.plan import Plan
    from app.core.records.prompt import Prompt
    from app.core.records.arm import Arm
    from app.core.session import sweep
    from app.core.session.events import RunFinished, SessionFinished, SweepWarning
    from app.core.session.request import AdaptiveOptions, SweepRequest

    asked: list[SweepRequest] = []

    def one(request, cancel=None):
        asked.append(request)
        yield RunFinished(make_record())
        yield SessionFinished(tmp_path / "r.jsonl", 2, 1, 0, False, ("e",) if len(asked) == 2 else ())

    def fit(plan, settings, limit, adaptive, server_args):  # each setting's arms fitted with its own flags
        if "32" in server_args:
            raise UserError("the model itself does not fit: needs 2 GiB")
        return dataclasses.replace(plan, left_out=(*plan.left_out, f"K=4 skipped at {server_args[-1]}")), adaptive

    monkeypatch.setattr(sweep, "run", one)
    monkeypatch.setattr(sweep, "fit_arms", fit)
    ub = Axis("-ub", ("128", "64", "32"), frozenset({"-ub", "--ubatch-size"}))
    plan = Plan(model="/m.gguf", arms=(Arm(),), prompts=(Prompt("a", "code", "hello world"),), left_out=("earlier",))
    request = SweepRequest(plan, EngineSettings(user_args=("-fa", "on", "--ubatch-size", "128")),
                           AdaptiveOptions(budget_s=120.0, budget_tokens=1001), axes=(ub,))
    events = list(sweep._each_axis_setting(request, sweep.CancelToken()))
    assert [r.engine.user_args for r in asked] == [("-fa", "on", "-ub", "128"), ("-fa", "on", "-ub", "64")]
    assert all(r.axes == () for r in asked) and len({r.sweep_id for r in asked}) == 1 and asked[0].sweep_id
    assert [(r.adaptive.budget_s, r.adaptive.budget_tokens) for r in asked] == [(40.0, 333)] * 2
    done = events[-1]
    assert [r.plan.left_out for r in asked] == [("earlier",  "-ub 128: K=4 skipped at 128"),
                                                ("earlier", "-ub 64: K=4 skipped at 64")]
    assert [type(e) for e in events] == [RunFinished, RunFinished, SweepWarning, SessionFinished]
    assert events[2].message == "-ub 32: skipped: the model itself does not fit: needs 2 GiB"
    assert (done.results_path, done.written, done.n_ok, done.errors) == (tmp_path / "r.jsonl", 4, 2, ("e",))


def test_resume_refuses_a_sweep_with_server_flags(tmp_path):
    """bench --resume would measure again without the runs' own server flags (an axis value, the
    user's command): it says so instead."""
    from app.core.records.writer import ResultsWriter
    from helpers import clean_error, cli

    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        w.append(make_record(server_args=("-ub", "64")))
    r = cli("bench", "--resume", str(path))
    clean_error(r, "this sweep ran with your own llama-server command's flags or --axis values, which a resumed sweep "
                   "does not carry over")
