"""Hardening round four (issue 53, defects 7-10) and the one resume request (issue 54): ``bench
--resume`` and the window's "Finish when quiet" make one core request (app.core.session.resume)
and refuse the same things in the same sentence; a sweep that mixes models or engines is refused;
two resumes of one file are kept apart by a lock; counts from a results file are bounded before a
sweep is planned again (--resume and --again), refused in one line naming the line and field."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys

import pytest

from app.core.measure.busy import DISTURBED
from app.core.records.arm import Arm
from app.core.records.rpc import rpc_field
from app.core.records.writer import ResultsWriter
from helpers import ROOT, clear_sweep_file, make_record

WORKER = "127.0.0.1:18251"  # this helper's port range; nothing listens there in these tests


def _write(path, records):
    with ResultsWriter(path) as w:
        for r in records:
            w.append(r)
    return path


def _cli_error(capsys, *argv) -> str:
    """The CLI's one error line for ``argv`` (in this process), after checking it refused."""
    from app.cli import main

    assert main(list(argv)) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mtp-tuner: error: ")]
    assert len(lines) == 1, lines
    return lines[0].removeprefix("mtp-tuner: error: ")


def _mixed(tmp_path, field, a, b):
    runs = clear_sweep_file(tmp_path / "plain.jsonl")
    half = len(runs) // 2
    return _write(tmp_path / f"mixed-{field}.jsonl",
                  [dataclasses.replace(r, **{field: a if i < half else b}) for i, r in enumerate(runs)])


# the sweeps bench --resume refuses, each with how the window is set for it
CASES = {
    "own flags": (lambda t: _write(t / "flags.jsonl", [dataclasses.replace(r, server_args=("-fa", "on"))
                                                      for r in clear_sweep_file(t / "plain.jsonl")]), (), ()),
    "split, workers not named": (lambda t: _write(t / "rpc.jsonl", [
        dataclasses.replace(r, rpc=rpc_field((WORKER,), (0.3,))) for r in clear_sweep_file(t / "plain.jsonl")]),
                                 (), ()),
    "here, workers named": (lambda t: clear_sweep_file(t / "plain.jsonl") and t / "plain.jsonl",
                            ("--rpc", WORKER), (WORKER,)),
    "mixed models": (lambda t: _mixed(t, "model_path", "/a.gguf", "/b.gguf"), (), ()),
    "mixed engines": (lambda t: _mixed(t, "engine", "inprocess", "server"), (), ()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_finish_when_quiet_refuses_what_bench_resume_refuses_in_the_same_sentence(state, tmp_path, capsys, case):
    from app.core.common.errors import UserError
    from app.core.records.reader import load_records
    from app.gui.tabs.start.finish import finish_request

    make, flags, window_workers = CASES[case]
    path = make(tmp_path)
    said = _cli_error(capsys, "bench", "--resume", str(path), *flags)
    state.set_results(load_records(path), path)
    state.rpc_workers = window_workers
    with pytest.raises(UserError) as e:
        finish_request(state)
    assert str(e.value) == said


def test_a_sweep_mixing_models_or_engines_is_refused_naming_the_mix(tmp_path, capsys):
    said = _cli_error(capsys, "bench", "--resume", str(_mixed(tmp_path, "model_path", "/a.gguf", "/b.gguf")))
    assert "mixes 2 models (/a.gguf, /b.gguf)" in said and "refused" in said
    said = _cli_error(capsys, "bench", "--again", str(_mixed(tmp_path, "engine", "inprocess", "server")))
    assert "mixes 2 engines (inprocess, server)" in said


def test_a_sweep_is_not_finished_with_the_windows_own_command(state, tmp_path, capsys, make_model, server_bin):
    """The window's command box is the user's own command: a resume would append runs with its
    flags into a sweep that ran without them; refused, as --server-command is with --resume."""
    from app.core.common.errors import UserError
    from app.core.engines.server.binary import load_user_command
    from app.core.records.reader import load_records
    from app.gui.tabs.start.finish import finish_request

    model = str(make_model(0.3))
    path = _write(tmp_path / "plain-real.jsonl", [dataclasses.replace(r, model_path=model)
                                                  for r in clear_sweep_file(tmp_path / "plain.jsonl")])
    said = _cli_error(capsys, "bench", "--resume", str(path), "--server-command", f"llama-server -m {model}")
    assert "your own llama-server command does not combine" in said
    state.set_results(load_records(path), path)
    command, binary = load_user_command(f"{server_bin} -m {model} -c 1024", None)
    state.own_command.set(command, binary)
    with pytest.raises(UserError) as e:
        finish_request(state)
    assert str(e.value) == said


def _prompt_file(tmp_path):
    """The prompts of clear_sweep_file's sweeps (ids code and story), as the user's prompt file."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"id": "code", "task": "code", "text": "def add(a, b):"},
                                   {"id": "story", "task": "story", "text": "Once upon a time"}]))
    return prompts


# ---- counts from a file ----------------------------------------------------------------------------

def _limited(*args, timeout=90):
    """The CLI in a child with 6 GiB of address space at most (today's code allocated 14 GB for one
    hostile depth): a run that would take more fails there instead of taking the machine."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit)


@pytest.mark.parametrize("flag", ["--resume", "--again"])
@pytest.mark.parametrize("field, value, bound", [("depth", 10**12, "0 to 1048576"), ("rep", 10**9, "0 to 999"),
                                                 ("n_predict", 10**12, "1 to 1048576"), ("k", 10**6, "1 to 64")])
def test_a_count_beyond_what_a_sweep_plans_refuses_the_file_naming_line_and_field(tmp_path, make_model, flag,
                                                                                   field, value, bound):
    model = str(make_model(0.3))
    runs = [dataclasses.replace(r, model_path=model, flags=(DISTURBED,) if i == 4 else ())
            for i, r in enumerate(clear_sweep_file(tmp_path / "plain.jsonl"))]
    path = tmp_path / "hostile.jsonl"
    lines = [r.to_json() for r in runs]
    d = json.loads(lines[2])
    d[field] = value
    lines[2] = json.dumps(d)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prompts = _prompt_file(tmp_path)  # the sweep's prompts found: today's code went on to plan it
    extra = ("--out", str(tmp_path / "again.jsonl")) if flag == "--again" else ()
    try:
        p = _limited("bench", flag, str(path), "--prompts", str(prompts), "--ctx-size", "512", *extra)
    except subprocess.TimeoutExpired:
        pytest.fail(f"bench {flag} on a file with {field} {value} did not end within 90 s")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and "MemoryError" not in p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("mtp-tuner: error: ")]
    assert err == [f"mtp-tuner: error: {path} line 3: {field} is {value}, beyond what a sweep plans ({bound}); "
                   "the file is refused"]


def test_a_plan_of_more_runs_than_one_sweep_lists_is_one_line_not_a_hang():
    from app.core.common.errors import UserError
    from app.core.measure.plan import MAX_RUNS, Plan
    from app.core.records.prompt import Prompt

    prompts = (Prompt("a", "code", "x"),)
    with pytest.raises(UserError, match="would list 3,000,000,000 runs"):
        Plan(model="/m.gguf", arms=(Arm(), Arm(2), Arm(3)), prompts=prompts, reps=10**9)
    assert Plan(model="/m.gguf", arms=(Arm(),), prompts=prompts, reps=MAX_RUNS).reps == MAX_RUNS


# ---- one resume of a file at a time ------------------------------------------------------------------

def _busy_sweep(tmp_path, model):
    """A sweep of two prompts (in a prompt file) on a real model, one group disturbed: a resume
    has something to measure."""
    prompts = _prompt_file(tmp_path)
    runs = [dataclasses.replace(r, model_path=str(model), n_predict=8, flags=(DISTURBED,) if r.rep == 5 else ())
            for r in clear_sweep_file(tmp_path / "plain.jsonl")]
    return _write(tmp_path / "busy.jsonl", runs), prompts


def test_a_second_resume_of_one_file_is_refused_while_the_first_runs(tmp_path, make_model):
    """Two resumes of one file both planned from the same runs, and both measured everything
    again; the first now holds the file's resume lock while it runs and the second is refused at
    once, in one line naming the holder (in process and through the CLI)."""
    from app.cli import build_parser
    from app.cli.bench import request_of
    from app.core.common.errors import UserError
    from app.core.session.events import EngineReady
    from app.core.session.sweep import prepare, run
    from helpers import cli

    path, prompts = _busy_sweep(tmp_path, make_model(0.3))
    argv = ["bench", "--resume", str(path), "--prompts", str(prompts), "--ctx-size", "512"]
    first = prepare(request_of(build_parser().parse_args(argv))).request
    assert first.resume is not None and first.resume.runs == 6  # the disturbed repetition's groups
    second = prepare(request_of(build_parser().parse_args(argv))).request
    a = run(first)
    try:
        assert isinstance(next(a), EngineReady)  # the first is running
        b = run(second)
        with pytest.raises(UserError) as e:
            next(b)
        assert str(e.value) == (f"{path}: another resume of this results file is running (pid {os.getpid()}); "
                                "let it finish, then resume again if anything is left")
        p = cli(*argv, timeout=120)
        assert p.returncode == 2 and "another resume of this results file is running" in p.stderr, p.stderr
    finally:
        a.close()
    again = run(second)  # the first has ended: the next resume runs
    assert isinstance(next(again), EngineReady)
    again.close()
