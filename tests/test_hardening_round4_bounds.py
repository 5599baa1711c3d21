"""Hardening round four (issue 53), the bounds: prepare.sh's --dest removes only what it made (6);
a 400-digit --memory-limit (11); a read-only or missing $OUT for the GPU check (12); the default
memory limit on the baseline (13); the user's --chat-template-file through the template's step
bound (14); `rpc check` within one deadline for all workers, hostile ones included, in the CLI
and the window (15); FIFOs given as files (17); a worker's impossible memory and rpc-worker's
--host (20). Each test is the defect's reproduction."""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.core.common.errors import UserError
from app.core.engines.base import EngineSettings
from app.core.engines.server.rpc_check import CMD_DEVICE_COUNT, CMD_GET_DEVICE_MEMORY, CMD_HELLO, worker_info
from app.core.machine.arm_memory import LoadSettings, parse_size, predict
from app.core.machine.modelinfo import inspect
from app.core.measure.plan import Plan, make_arms
from app.core.measure.prompts import builtin_prompts
from conftest import bench_or_fail, servers_mentioning
from tests.helpers import clean_error, cli
from tests.test_rpc_check import FakePeer, read_request, worker_like

ROOT = Path(__file__).resolve().parent.parent
PREPARE = ROOT / "benchmarks" / "gpu" / "prepare.sh"
CHECK = ROOT / "benchmarks" / "gpu" / "check.py"
GIB = 2**30
HANG_S = 120  # a command that has not ended by then hangs
NESTED_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ 'x' }}"


def one_line(r) -> str:
    """The one error line of a refused command (and nothing else on stderr)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    return lines[0]


def usage_error(r) -> str:
    """An option argparse refused: the usage, then one error line (the last)."""
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout, r.stderr
    return r.stderr.strip().splitlines()[-1]


@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "pipe"
    os.mkfifo(p)
    return p


# -- 6. prepare.sh --dest ---------------------------------------------------------------------------


def prepare(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """prepare.sh with a missing --sdist: everything up to the unpacking runs, then it stops (no
    package index is asked)."""
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(PREPARE), *args, "--sdist", str(cwd / "none.tar.gz")], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=env)


def test_prepare_refuses_an_empty_dest_and_makes_nothing(tmp_path):
    before = Path("/wheels").exists()
    try:
        r = prepare("--dest", "", cwd=tmp_path)
        assert r.returncode == 2 and "--dest is empty" in one_line(r)
        assert Path("/wheels").exists() == before
    finally:  # the old script made /wheels (as root): gone again
        if not before and Path("/wheels").is_dir() and not any(Path("/wheels").iterdir()):
            Path("/wheels").rmdir()


def test_prepare_refuses_a_folder_it_did_not_make_and_removes_nothing(tmp_path):
    dest = tmp_path / "mine"
    (dest / "sub").mkdir(parents=True)
    (dest / "keep.txt").write_text("the user's")
    (dest / "sub" / "deep.txt").write_text("the user's")
    r = prepare("--dest", str(dest), cwd=tmp_path)
    assert r.returncode == 2 and "holds files this script did not make" in one_line(r)
    assert (dest / "keep.txt").read_text() == "the user's" and (dest / "sub" / "deep.txt").exists()
    link = tmp_path / "link"
    link.symlink_to(dest)
    r = prepare("--dest", str(link), cwd=tmp_path)
    assert r.returncode == 2 and "symbolic link" in one_line(r) and (dest / "keep.txt").exists()


def test_prepare_replaces_only_what_it_made(tmp_path):
    dest = tmp_path / "carry"
    (dest / "llama.cpp").mkdir(parents=True)
    (dest / "llama.cpp" / "old.c").write_text("an earlier run's")
    (dest / "manifest.json").write_text("{}")
    (dest / ".mtp-tuner-carry").write_text("made by prepare.sh")
    (dest / "notes.txt").write_text("the user's, beside them")
    r = prepare("--dest", str(dest), cwd=tmp_path)
    assert r.returncode != 0  # the missing sdist stops it after the folder is made ready
    assert not (dest / "llama.cpp" / "old.c").exists() and not (dest / "manifest.json").exists()
    assert (dest / "notes.txt").read_text() == "the user's, beside them"
    assert (dest / ".mtp-tuner-carry").is_file() and (dest / "wheels").is_dir()
    # an empty folder is taken, and marked
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare("--dest", str(empty), cwd=tmp_path)
    assert (empty / ".mtp-tuner-carry").is_file()


# -- 11. --memory-limit -----------------------------------------------------------------------------


def test_a_400_digit_memory_limit_is_one_line(make_model, tmp_path):
    for text in ("9" * 400, "9" * 30 + "T"):
        with pytest.raises(ValueError):
            parse_size(text)
    r = cli("bench", "--model", str(make_model(0.0)), "--memory-limit", "9" * 400, "--out", str(tmp_path / "r.jsonl"))
    line = usage_error(r)
    assert "--memory-limit" in line and "too long for a size (400 characters)" in line and len(line) < 300
    r = cli("bench", "--model", str(make_model(0.0)), "--memory-limit", "99999999999T")
    assert "more than any machine's memory" in usage_error(r)
    assert parse_size("4GiB") == 4 * GIB and parse_size("0.5G") == GIB // 2


# -- 12. the GPU check's $OUT ------------------------------------------------------------------------


def gpu_check(tmp_path: Path, out: str) -> subprocess.CompletedProcess:
    """check.py with every step skipped: only the reports are written (after each step and at the end)."""
    sys.path.insert(0, str(CHECK.parent))
    import check  # noqa: PLC0415 - benchmarks/gpu is not a package

    env = dict(os.environ, OUT=out)
    skip = ",".join(s.name for s in check.STEPS)
    return subprocess.run([sys.executable, str(CHECK), "--cpu", "--no-install", "--carry", str(tmp_path / "carry"),
                           "--work", str(tmp_path / "work"), "--skip", skip], capture_output=True, text=True,
                          timeout=120, env=env, cwd=str(tmp_path))


def test_a_read_only_out_is_one_line_at_the_start(tmp_path):
    if os.geteuid() == 0:  # root writes past permission bits: a folder of a read-only file system
        ro = "/proc/1"
    else:
        ro = str(tmp_path / "ro")
        os.mkdir(ro, 0o555)
    r = gpu_check(tmp_path, ro)
    assert r.returncode == 2 and one_line(r).startswith(f"check.py: $OUT {ro}: cannot write the reports there (")
    assert r.stdout == "" and not (tmp_path / "work").exists()  # nothing was started


def test_a_missing_out_or_one_that_is_a_file_is_one_line(tmp_path):
    r = gpu_check(tmp_path, str(tmp_path / "nowhere"))
    assert r.returncode == 2 and one_line(r) == (f"check.py: $OUT {tmp_path / 'nowhere'}: no such folder (set OUT "
                                                 "to a folder that exists, or unset it for .gpu-work/out)")
    (tmp_path / "file").write_text("x")
    r = gpu_check(tmp_path, str(tmp_path / "file"))
    assert r.returncode == 2 and one_line(r) == f"check.py: $OUT {tmp_path / 'file'}: not a folder"
    out = tmp_path / "out"
    out.mkdir()
    r = gpu_check(tmp_path, str(out))  # a folder that can be written: the (empty) run and its reports
    assert r.returncode == 0, r.stderr
    assert (out / "gpu-check.json").is_file() and not list(out.glob(".write-check-*"))


# -- 13. the baseline's memory under the machine's limit ---------------------------------------------


def _plan(model):
    return Plan(model=str(model), arms=make_arms([1]), prompts=tuple(builtin_prompts()[:1]))


def test_the_machine_limit_bounds_the_baselines_context(make_model, monkeypatch):
    """-c 100000000 asked llama-server for 25.6 GB on the tiny model: refused in one line before
    any server starts, whether --ctx-size is bench's or in the user's own command. The weights
    alone past the limit are still left to llama.cpp (it maps them from disk)."""
    from app.core.machine import hardware
    from app.core.session.memory import fit_arms

    model = make_model(0.0)
    info = inspect(model)
    ram = 8 * GIB
    monkeypatch.setattr(hardware, "snapshot", lambda: hardware.HardwareSnapshot("Linux", "cpu", 2, 2, 16 * GIB, ram,
                                                                                 (), False))
    huge = predict(info, None, None, LoadSettings(ctx=100_000_000))
    assert huge.total - huge.parts["weights"] > 20 * GIB  # the 25.6 GB on its tiny model
    for settings, args in ((EngineSettings(ctx_size=100_000_000), ()),
                           (EngineSettings(ctx_size=4096), ("--ctx-size", "100000000")),
                           (EngineSettings(ctx_size=4096), ("-c=100000000",))):
        with pytest.raises(UserError, match=r"^the model itself does not fit: its context and buffers besides the "
                                            r"weights needs \d+\.\d GiB, 8\.0 GiB of RAM available \(sized by .*\) \(a smaller -c"):
            fit_arms(_plan(model), settings, None, server_args=args)
    # on a GPU with every layer there (the recorded RTX 3060, 12 GiB): its free memory is the bound
    from tests.helpers import gpu_snapshot

    monkeypatch.setattr(hardware, "snapshot", gpu_snapshot)
    with pytest.raises(UserError, match=r"besides the weights needs \d+\.\d GiB, \d+\.\d GiB free on the GPU "):
        fit_arms(_plan(model), EngineSettings(ctx_size=100_000_000, n_gpu_layers="999"), None)
    plan, _ = fit_arms(_plan(model), EngineSettings(ctx_size=4096, n_gpu_layers="999"), None)
    assert [a.label for a in plan.arms] == ["baseline", "K=1"]
    # the weights alone do not fit, the rest does: left to llama.cpp as before
    base = predict(info, None, None, LoadSettings(ctx=4096))
    between = base.total - base.parts["weights"] // 2
    monkeypatch.setattr(hardware, "snapshot", lambda: hardware.HardwareSnapshot("Linux", "cpu", 2, 2, 16 * GIB,
                                                                                 between, (), False))
    plan, _ = fit_arms(_plan(model), EngineSettings(ctx_size=4096), None)
    assert [a.label for a in plan.arms] == ["baseline", "K=1"]


@pytest.mark.server
@pytest.mark.timeout(3 * HANG_S)
def test_bench_refuses_a_huge_context_in_the_users_command(make_model, server_bin, tmp_path):
    model = make_model(0.0)
    for how in (("--server-command", f"{shlex.quote(server_bin)} -m {shlex.quote(str(model))} --ctx-size 1000000000"),
                ("--model", str(model), "--engine", "server", "--server-bin", server_bin, "--ctx-size", "1000000000")):
        r = bench_or_fail(*how, "--k", "1", "--reps", "1", "--n-predict", "4", "--tasks", "code", "--per-task", "1",
                          "--out", str(tmp_path / "r.jsonl"), model=model)
        assert r.returncode == 2 and "the model itself does not fit: its context and buffers" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not (tmp_path / "r.jsonl").exists()
        assert servers_mentioning(str(model)) == []


# -- 14. the user's --chat-template-file ------------------------------------------------------------


def test_a_template_file_goes_through_the_bound(tmp_path, fifo):
    from app.core.engines.chat_template import user_template
    from app.core.engines.server.engine import ServerEngine

    loop = tmp_path / "loop.jinja"
    loop.write_text(NESTED_LOOP)
    got = user_template(("-c", "512", "--chat-template-file", str(loop)))
    assert got is not None and got.text == NESTED_LOOP and got.name == str(loop)
    assert user_template((f"--chat-template-file={loop}",)).text == NESTED_LOOP
    assert user_template(("--chat-template", "chatml")).text == "chatml"
    assert user_template(("-c", "512")) is None
    engine = ServerEngine.__new__(ServerEngine)  # only what check_template reads: no binary is asked
    engine.extra_args, engine._templates_checked = ("--chat-template-file", str(loop)), set()
    with pytest.raises(UserError, match=rf"^{loop}: the chat template in this file \(--chat-template-file\) did not "
                                        r"finish rendering within 2,000,000 steps"):
        engine.check_template("/no/model.gguf")
    t0 = time.monotonic()
    with pytest.raises(UserError, match=rf"^{fifo}: is a FIFO \(named pipe\), not a regular file"):
        user_template(("--chat-template-file", str(fifo)))
    assert time.monotonic() - t0 < 5
    (tmp_path / "big.jinja").write_bytes(b"x" * (1 << 20 | 1))
    with pytest.raises(UserError, match="more than the 1 MiB"):
        user_template(("--chat-template-file", str(tmp_path / "big.jinja")))


@pytest.mark.server
@pytest.mark.timeout(2 * HANG_S)
def test_bench_refuses_a_runaway_template_file_on_llama_server(server_bin, make_model, tmp_path):
    model = make_model(0.0)
    loop = tmp_path / "loop.jinja"
    loop.write_text(NESTED_LOOP)
    command = shlex.join([server_bin, "-m", str(model), "--chat-template-file", str(loop)])
    r = bench_or_fail("--server-command", command, "--k", "1", "--reps", "1", "--warmup", "0", "--n-predict", "4",
                      "--tasks", "code", "--per-task", "1", "--out", str(tmp_path / "r.jsonl"), model=model)
    clean_error(r, f"error: {loop}: the chat template in this file (--chat-template-file) did not finish rendering "
                   "within 2,000,000 steps")
    assert r.stderr.count("error:") == 1 and not (tmp_path / "r.jsonl").exists()
    assert servers_mentioning(str(model)) == []


# -- 15. rpc check: one deadline for all -------------------------------------------------------------


def trickler(devices: int = 64):
    """A peer that answers every request as a worker does, a byte at a time: each answer comes
    within a per-request timeout, so asked request by request it took minutes."""
    def handler(conn, stop):
        while not stop.is_set():
            cmd, payload = read_request(conn)
            body = (bytes([3, 0, 0, 0]) + bytes(24) if cmd == CMD_HELLO else struct.pack("<I", devices)
                    if cmd == CMD_DEVICE_COUNT else struct.pack("<QQ", GIB, 2 * GIB))
            for b in struct.pack("<Q", len(body)) + body:
                conn.sendall(bytes([b]))
                time.sleep(0.02)
    return handler


def silent(conn, stop):
    read_request(conn)
    stop.wait(30)


class Timed(FakePeer):
    """A FakePeer that records when each connection came."""

    def __init__(self, handler):
        super().__init__(handler)
        self.times: list[float] = []

    def _serve(self, conn):
        self.times.append(time.monotonic())
        super()._serve(conn)


def test_one_hostile_worker_is_cut_off_at_the_deadline_not_per_request():
    with FakePeer(trickler()) as peer:
        t0 = time.monotonic()
        info = worker_info(peer.endpoint, timeout=1.0)
        elapsed = time.monotonic() - t0
    assert elapsed < 3.0, elapsed  # a request at a time: 72 answers of 0.3 to 0.7 s each, 30 s
    assert info.reachable and not info.usable and info.error.startswith("timed out after 1 s")


def test_all_workers_are_asked_at_once_within_one_deadline():
    from app.core.engines.server.rpc_check import check_workers

    with Timed(trickler()) as a, Timed(silent) as b, Timed(silent) as c, FakePeer(worker_like()) as good:
        t0 = time.monotonic()
        infos = check_workers([a.endpoint, b.endpoint, c.endpoint, good.endpoint], timeout=1.0)
        elapsed = time.monotonic() - t0
    assert elapsed < 3.0, elapsed
    assert [i.endpoint for i in infos] == [a.endpoint, b.endpoint, c.endpoint, good.endpoint]
    assert [i.usable for i in infos] == [False, False, False, True]
    assert infos[1].error.startswith("timed out after 1 s")
    assert max(a.times[0], b.times[0], c.times[0]) - min(a.times[0], b.times[0], c.times[0]) < 0.5


def test_rpc_check_cli_takes_its_timeout_for_all_workers(tmp_path):
    with FakePeer(trickler()) as a, FakePeer(silent) as b:
        t0 = time.monotonic()
        r = cli("rpc", "check", f"{a.endpoint},{b.endpoint}", "--timeout", "2", "--server-bin",
                str(tmp_path / "none"), timeout=60)
        elapsed = time.monotonic() - t0
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{a.endpoint}  NOT usable: it answered HELLO (RPC 3.0.0), then timed out after 2 s" in r.stdout
    assert f"{b.endpoint}  NOT reachable: timed out after 2 s" in r.stdout
    assert elapsed < 15, elapsed  # the Python start and 2 s; a request at a time took a minute


def test_the_window_checks_workers_at_once(state, qtbot):
    pytest.importorskip("PySide6")
    from app.gui.tabs.machine.workers import WorkersBox

    box = WorkersBox(state, state.services.jobs)
    qtbot.addWidget(box)
    with Timed(silent) as a, Timed(silent) as b, Timed(silent) as c:
        state.rpc_workers = tuple(str(p.endpoint) for p in (a, b, c))
        box.show()
        box.check()
        qtbot.waitUntil(lambda: box.job is None, timeout=60000)
        firsts = [p.times[0] for p in (a, b, c)]
    assert max(firsts) - min(firsts) < 1.0  # one at a time: 3 s apart (the timeout each)
    rows = [box.list.item(r, 1).text() for r in range(3)]
    assert all(t.startswith("no: timed out after 3 s") for t in rows), rows
    assert state.rpc_worker_free == {}


# -- 17. FIFOs and other non-regular files ------------------------------------------------------------


def test_a_fifo_as_the_command_file_is_refused_at_once(fifo, tmp_path):
    try:
        r = cli("bench", "--server-command-file", str(fifo), "--out", str(tmp_path / "r.jsonl"), timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("bench waited on the FIFO")
    assert r.returncode == 2 and f"{fifo}: is a FIFO (named pipe), not a regular file" in one_line(r)
    r = cli("bench", "--server-command-file", str(tmp_path), "--out", str(tmp_path / "r.jsonl"), timeout=30)
    assert r.returncode == 2 and f"{tmp_path}: is a folder" in one_line(r)


def test_prompt_and_results_files_that_are_fifos_are_refused_at_once(fifo):
    from app.core.common.reading import open_regular
    from app.core.measure.prompts import load_prompt_file
    from app.core.records.reader import load_records

    with pytest.raises(UserError, match=r"is a FIFO \(named pipe\), not a regular file: the prompt file"):
        load_prompt_file(fifo)
    with pytest.raises(UserError, match=r"is a FIFO \(named pipe\), not a regular file: the results file"):
        load_records(fifo)
    with pytest.raises(UserError, match="is a device, not a regular file"):
        open_regular("/dev/zero", "results file")
    r = cli("recommend", str(fifo), timeout=30)
    assert r.returncode == 2 and "is a FIFO (named pipe), not a regular file" in r.stderr, r.stderr


def test_a_fifo_as_the_token_file_is_refused_at_once(fifo):
    from app.core.machine.hub_token import read_token

    said: list[BaseException] = []

    def read() -> None:
        try:
            read_token(fifo)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            said.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # it waits for a writer: give it one (an empty one), then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail("read_token waited on the FIFO")
    assert len(said) == 1 and isinstance(said[0], UserError)
    assert str(said[0]) == f"{fifo}: is a FIFO (named pipe), not a regular file: the token file must be a file"


# -- 20. RPC messages ---------------------------------------------------------------------------------


def test_free_memory_above_total_is_not_believed_and_fails_the_check(tmp_path):
    with FakePeer(worker_like(memory=(8 * GIB, GIB))) as peer:
        info = worker_info(peer.endpoint, timeout=2.0)
        assert info.reachable and not info.usable and info.devices == ()
        assert info.error == f"not an RPC worker (device 0 claims {8 * GIB} bytes free of {GIB} in all)"
        r = cli("rpc", "check", str(peer.endpoint), "--server-bin", str(tmp_path / "none"), timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"{peer.endpoint}  NOT usable: it answered HELLO (RPC 7.0.0), then not an RPC worker" in r.stdout


def test_a_peer_that_hangs_up_after_hello_fails_the_check(tmp_path):
    def hang_up_later(conn, stop):
        read_request(conn)
        conn.sendall(struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24))
        read_request(conn)
        conn.sendall(b"\x04\x00")  # half an answer, then gone
        conn.close()
    with FakePeer(hang_up_later) as peer:
        r = cli("rpc", "check", str(peer.endpoint), "--json", "--server-bin", str(tmp_path / "none"), timeout=60)
    assert r.returncode == 1 and '"usable": false' in r.stdout and "not an RPC worker" in r.stdout, r.stdout


@pytest.mark.parametrize("host", ["::1", "::", "[::1]", "my-host.example"])
def test_rpc_worker_refuses_an_address_its_worker_cannot_listen_on(host):
    r = cli("rpc-worker", "--host", host, timeout=60)
    line = usage_error(r)
    assert "--host" in line and "IPv4" in line and "port" not in line, line


def test_rpc_worker_on_localhost_listens_on_loopback(rpc_worker_bin, server_bin):
    from app.core.engines.server.rpc_worker import free_port

    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "app", "rpc-worker", "--host", "localhost", "--port", str(port),
                          "--server-bin", server_bin, "--threads", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        assert first.startswith(f"RPC worker listening on 127.0.0.1:{port} ("), (first, p.poll())
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "RPC worker stopped" in out and "exited at start" not in err, (out, err)
