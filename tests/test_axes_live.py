"""A server flag as a sweep axis on real llama-server processes: bench --axis "-ub=64,128" on the
tiny calibrated model measures the whole plan (its baseline included) once per value, every
server started with that value, each record carrying it, and answers per value and jointly."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from helpers import cli

pytestmark = pytest.mark.server


def test_axis_sweep_with_a_verdict_per_value(tmp_path, make_model, server_bin):
    model = make_model(0.0)  # every draft right: K=2 pays at either value
    out, logs = tmp_path / "r.jsonl", tmp_path / "logs"
    r = cli("bench", "--model", str(model), "--server-bin", server_bin, "--axis", "-ub=64,128", "--k", "2",
            "--reps", "2", "--warmup", "0", "--n-predict", "16", "--tasks", "code", "--per-task", "1",
            "--out", str(out), "--log-dir", str(logs))
    assert r.returncode == 0, r.stderr
    assert "engine: llama-server, for the --axis flags" in r.stderr
    # each value's servers ran with it (their load logs, each value's in its own folder)
    assert sorted(p.name for p in logs.iterdir()) == ["ub-128", "ub-64"]
    for value in ("64", "128"):
        names = sorted(p.name for p in (logs / f"ub-{value}").iterdir())
        assert names == ["llama-server-baseline.log", "llama-server-draft-mtp-k2-p0.log"]
        for name in names:
            assert re.search(rf"n_ubatch\s+= {value}\n", (logs / f"ub-{value}" / name).read_text(encoding="utf-8"))
    # the records carry the value; the reference (the first value) was measured first
    runs = [x for x in map(json.loads, out.read_text(encoding="utf-8").splitlines()) if x["record_type"] == "run"]
    assert [x["server_args"] for x in runs] == [["-ub", "64"]] * 4 + [["-ub", "128"]] * 4
    assert {(x["arm"], tuple(x["server_args"])) for x in runs} == {
        (arm, ("-ub", v)) for arm in ("baseline", "mtp") for v in ("64", "128")}
    # a verdict per value, then the best joint setting against the reference and its command
    assert "== -ub 64 ==" in r.stdout and "== -ub 128 ==" in r.stdout
    assert "best joint setting: -ub " in r.stdout and "over your command as it is (-ub 64, speculation off)" in r.stdout
    assert "  -ub 64 (reference): " in r.stdout and "  -ub 128: " in r.stdout
    command = next(line for line in r.stdout.splitlines() if line.startswith("command: "))
    assert f"-m {model} -ub " in command
    # recommend on the results file says the same
    r2 = cli("recommend", str(out), "--server-bin", server_bin)
    assert r2.returncode == 0, r2.stderr
    assert "best joint setting: -ub " in r2.stdout and "== -ub 128 ==" in r2.stdout
    r3 = cli("recommend", str(out), "--server-bin", server_bin, "--json")
    assert r3.returncode == 0, r3.stderr
    answer = json.loads(r3.stdout)
    assert [s["setting"] for s in answer["settings"]] == ["-ub 64", "-ub 128"]
    assert answer["joint"]["reference"] == "-ub 64" and answer["joint"]["best"] in ("-ub 64", "-ub 128")
    assert answer["joint"]["argv"][:3] == [server_bin, "-m", str(model)]


def test_axis_over_the_users_command(tmp_path, make_model, server_bin):
    """With the user's command, its own value of the flag is the reference (measured first, added
    to the values), its other flags kept; the answer is their command with the winning value."""
    model = make_model(0.0)
    command = shlex.join([server_bin, "-m", str(model), "-fa", "on", "--ubatch-size", "128", "--port", "9"])
    out = tmp_path / "r.jsonl"
    r = cli("bench", "--server-command", command, "--axis", "-ub=64", "--k", "2", "--reps", "2", "--warmup", "0",
            "--n-predict", "16", "--tasks", "code", "--per-task", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    runs = [x for x in map(json.loads, out.read_text(encoding="utf-8").splitlines()) if x["record_type"] == "run"]
    assert [x["server_args"] for x in runs] == [["-fa", "on", "-ub", "128"]] * 4 + [["-fa", "on", "-ub", "64"]] * 4
    assert "over your command as it is (-ub 128, speculation off)" in r.stdout
    r2 = cli("recommend", str(out), "--server-command", command, "--json")
    assert r2.returncode == 0, r2.stderr
    answer = json.loads(r2.stdout)
    for setting in answer["settings"]:  # each value's own command: the user's, with that value
        assert setting["argv"][:8] == [server_bin, "-m", str(model), "-fa", "on", *setting["setting"].split(),
                                       "--port"], setting["argv"]
    joint = answer["joint"]
    best = joint["best"].split()[1]
    assert joint["argv"][:8] == [server_bin, "-m", str(model), "-fa", "on", "-ub", best, "--port"]
