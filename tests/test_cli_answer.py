"""The answer first on the command line: `recommend` prints each task's verdict with its own
command (the flags of that task's pick), `--for TASK` one of them, the sampler flags only with
--with-sampler, the model check and held-out tables only with --verbose; `bench --demo` ends with
the verdict lines and the next command; the card carries the sweep's warnings."""

from __future__ import annotations

import json
import shlex

import pytest

from app.core.verdict.export import SAMPLER_FLAGS
from tests.helpers import clear_sweep_file, cli


def _sampler_flags(argv) -> set[str]:
    return set(argv) & set(SAMPLER_FLAGS)


@pytest.fixture(scope="module")
def demo_sweep(tmp_path_factory):
    """The real demo sweep, measured once by `bench --demo` (its text output and results file)."""
    out = tmp_path_factory.mktemp("demo") / "demo.jsonl"
    r = cli("bench", "--demo", "--engine", "inprocess", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    return out, r.stdout


@pytest.fixture(scope="module")
def clear_sweep(tmp_path_factory):
    path = tmp_path_factory.mktemp("clear") / "clear.jsonl"
    clear_sweep_file(path)
    return path


def test_recommend_for_code_prints_the_command_with_codes_mtp_flags(clear_sweep):
    r = cli("recommend", str(clear_sweep), "--for", "code")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("code: turn MTP on with K=2")
    argv = shlex.split(lines[1])
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp" and argv[argv.index("--spec-draft-n-max") + 1] == "2"
    assert not _sampler_flags(argv)  # not asked
    assert "story" not in r.stdout  # one task only
    # story's own command: leave it off, so no speculative flags
    r = cli("recommend", str(clear_sweep), "--for", "story", "--json")
    j = json.loads(r.stdout)
    assert j["for"] == "story" and j["mtp"] is False and "--spec-type" not in j["argv"]
    # the mix: the user's weights
    r = cli("recommend", str(clear_sweep), "--for", "mix", "--mix", "code=1", "--json")
    j = json.loads(r.stdout)
    assert j["for"] == "mix" and j["k"] == 2 and "draft-mtp" in j["argv"]


def test_the_sampler_is_written_only_when_asked_with_a_note(clear_sweep):
    r = cli("recommend", str(clear_sweep), "--json")
    j = json.loads(r.stdout)
    assert not _sampler_flags(j["argv"]) and j["sampler_note"] is None
    assert all(not _sampler_flags(t["argv"]) for t in j["per_task"])
    r = cli("recommend", str(clear_sweep), "--with-sampler", "--for", "code")
    argv = shlex.split(r.stdout.splitlines()[1])
    assert argv[argv.index("--temp") + 1] == "0" and argv[argv.index("--seed") + 1] == "42"
    assert "note: --temp 0 makes the server greedy" in r.stdout


def test_recommend_without_for_puts_each_tasks_command_after_its_verdict_then_the_mix(clear_sweep):
    r = cli("recommend", str(clear_sweep))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("code: turn MTP on with K=2") and "--spec-draft-n-max 2" in lines[1]
    assert lines[2].startswith("story: leave MTP off") and "--spec-type" not in lines[3]
    assert lines[4].startswith("your task mix (") and lines[5].startswith("  ")
    # the tables come after the verdict; the model check and held-out only with --verbose
    assert r.stdout.index("task            arm") > r.stdout.index("your task mix")
    assert "model check" not in r.stdout
    assert "model check (predicted vs measured speedup)" in cli("recommend", str(clear_sweep), "--verbose").stdout
    j = json.loads(cli("recommend", str(clear_sweep), "--json").stdout)
    code = next(t for t in j["per_task"] if t["task"] == "code")
    assert "--spec-draft-n-max" in code["argv"] and code["command"].endswith(" ".join(code["argv"][-2:]))


def test_an_unknown_task_is_one_clean_error_naming_the_tasks(clear_sweep):
    r = cli("recommend", str(clear_sweep), "--for", "poetry")
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.count("error:") == 1 and "no task 'poetry'" in r.stderr and "code, story" in r.stderr


def test_demo_bench_ends_with_the_verdict_and_the_next_command(demo_sweep):
    out, text = demo_sweep
    tail = text.rstrip().splitlines()
    nxt = next(i for i, ln in enumerate(tail) if ln.startswith("next: "))
    assert nxt >= len(tail) - 2  # the last lines: the next command and what it gives
    cmd = shlex.split(tail[nxt][len("next: "):])
    assert cmd[:3] == ["mtp-tuner", "recommend", str(out)]
    verdicts = [ln for ln in tail if ln.startswith(("code: ", "story: ", "tongue-twister: ", "your task mix ("))]
    assert len(verdicts) == 4 and text.index(verdicts[0]) > text.index(f"results: {out}")
    # the next command is `recommend --for` the first task where MTP pays (else all of them)
    j = json.loads(cli("recommend", str(out), "--json").stdout)
    pays = [t["task"] for t in j["per_task"] if t["speculative"]]
    assert cmd[3:] == (["--for", pays[0]] if pays else [])


def test_each_tasks_command_on_the_demo_sweep_carries_its_own_pick(demo_sweep):
    out, _ = demo_sweep
    j = json.loads(cli("recommend", str(out), "--json").stdout)
    for t in j["per_task"]:
        one = json.loads(cli("recommend", str(out), "--for", t["task"], "--json").stdout)
        assert one["argv"] == t["argv"] and not _sampler_flags(one["argv"])
        if t["k"] is not None:
            assert one["argv"][one["argv"].index("--spec-draft-n-max") + 1] == str(t["k"])
        else:
            assert "--spec-type" not in one["argv"]
    text = cli("recommend", str(out), "--for", "code").stdout
    assert text.splitlines()[0] == next(t["reason"] for t in j["per_task"] if t["task"] == "code")


def test_the_cards_json_carries_the_sweeps_warnings(demo_sweep, tmp_path):
    out, _ = demo_sweep
    card = json.loads(cli("card", str(out), "--json").stdout)
    rec = json.loads(cli("recommend", str(out), "--json").stdout)
    for f in rec["findings"]:  # each warning bench and recommend print is on the card
        assert any(w == f["message"] or f["message"].startswith(w) for w in card["warnings"]) or \
            f["code"] in ("measured_on_cpu", "fewer_gpu_layers", "disturbed"), (f, card["warnings"])
    # a sweep with a failed run and disturbed runs says so
    lines = out.read_text().splitlines()
    bad = json.loads(lines[0])
    bad.update(status="failed", error="engine died", run_id="failed-1")
    path = tmp_path / "with-failure.jsonl"
    path.write_text("\n".join(lines + [json.dumps(bad)]) + "\n")
    card = json.loads(cli("card", str(path), "--json").stdout)
    assert f"1 of {len(lines) + 1} runs failed" in card["warnings"]
