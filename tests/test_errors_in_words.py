"""Errors in words (issue 39, item 7): a model that cannot be read, an output that cannot be written
and a truncated file are one line naming the file and the cause, from one map of OS errors to
sentences: exit 2 in the CLI, the window's own error line in the GUI, never a traceback or the
unexpected-error dialog."""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from app.core.common.errors import CUT_SHORT, UserError, in_words, os_problem, os_reason
from conftest import ROOT

# -- the map ---------------------------------------------------------------------------------


@pytest.mark.parametrize("code, words", [
    (errno.EACCES, "permission denied"),
    (errno.ENOENT, "no such file or folder"),
    (errno.ENOTDIR, "a part of the path is a file, not a folder"),
    (errno.ENOSPC, "the disk is full"),
    (errno.EROFS, "the file system is read-only"),
    (errno.EMFILE, "too many files are open"),
])
def test_each_os_error_is_a_sentence_naming_the_file(code, words):
    e = OSError(code, os.strerror(code), "/data/model.gguf")
    assert os_reason(e).startswith(words)
    assert os_problem(e) == f"/data/model.gguf: {os_reason(e)}"
    assert "Errno" not in os_problem(e) and os.strerror(code) not in os_problem(e)


def test_an_unknown_cause_keeps_the_systems_words_and_a_path_is_shown_safely():
    assert os_reason(OSError(errno.EPIPE, "Broken pipe")) == "Broken pipe"
    shown = os_problem(OSError(errno.EACCES, "Permission denied", "/x/\x1b[2Jevil\n.gguf"))
    assert "\x1b" not in shown and "\n" not in shown and "\\u001b" in shown
    assert os_problem(OSError(errno.ENOSPC, "No space left on device")) == "the disk is full"
    assert os_problem(OSError(errno.ENOSPC, "x"), "out.jsonl") == "out.jsonl: the disk is full"


def test_in_words_is_for_the_users_problems_only():
    assert in_words(UserError("m.gguf: no such file")) == "m.gguf: no such file"
    assert in_words(PermissionError(errno.EACCES, "Permission denied", "m.gguf")).startswith("m.gguf: permission denied")
    assert in_words(ValueError("a bug")) is None


# -- the CLI ---------------------------------------------------------------------------------


def _cli(prefix, *args):
    return subprocess.run([*prefix, sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))


def _one_line(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtp-tuner: error: "), r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


@pytest.fixture
def locked(tmp_path):
    """(a folder with mode 000, the command prefix under which it really cannot be opened). Root
    reads through a mode of 000: as root the CLI runs without the capabilities that allow it
    (setpriv); skipped where nothing makes the folder closed."""
    if os.name != "posix":
        pytest.skip("file modes do not lock a folder here")
    prefix: list[str] = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: a mode of 000 does not stop reads")
        caps = "-dac_override,-dac_read_search"
        prefix = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]
    d = tmp_path / "locked"
    d.mkdir()
    (d / "m.gguf").write_bytes(b"GGUF")
    d.chmod(0)
    probe = subprocess.run([*prefix, sys.executable, "-c", f"open({str(d / 'm.gguf')!r}, 'rb')"],
                           capture_output=True, text=True)
    if "PermissionError" not in probe.stderr:
        pytest.skip(f"the folder stays readable here ({probe.stderr.strip()[-200:]})")
    yield d, prefix
    d.chmod(0o700)


def test_an_unreadable_model_is_one_line_and_exit_2(locked):
    d, prefix = locked
    r = _cli(prefix, "bench", "--threads", "1", "--model", str(d / "m.gguf"))
    _one_line(r, f"{d / 'm.gguf'}: permission denied")


def test_an_unwritable_output_is_one_line_and_exit_2(locked, make_model):
    d, prefix = locked
    out = d / "sub" / "r.jsonl"
    r = _cli(prefix, "bench", "--threads", "1", "--model", str(make_model(0.0)), "--out", str(out))
    _one_line(r, str(out), "cannot write the results file (permission denied")


def test_a_truncated_model_says_it_is_cut_short(tmp_path, make_model):
    good = make_model(0.0).read_bytes()
    cut = good.index(b"tokenizer.ggml.tokens") + 400  # inside the token list
    p = tmp_path / "cut.gguf"
    p.write_bytes(good[:cut])
    r = _cli([], "bench", "--threads", "1", "--model", str(p))
    line = _one_line(r, f"{p}: {CUT_SHORT}", "tokenizer.ggml.tokens", f"the file has {cut:,} bytes")
    assert "impossible length" not in line


def test_an_os_error_that_escapes_a_command_is_one_line_and_exit_2(monkeypatch, capsys):
    from app.cli import hw, main

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out.json")

    monkeypatch.setattr(hw, "run", full)
    assert main(["hw"]) == 2
    assert capsys.readouterr().err == "mtp-tuner: error: /data/out.json: the disk is full\n"


# -- the window ------------------------------------------------------------------------------


def test_the_window_says_an_unreadable_model_in_words_not_as_a_crash(window, monkeypatch, tmp_path):
    """The model in a folder this user cannot open (PermissionError from stat, simulated: tests run
    as root): the Model tab and the Sweep tab's line beside Start say so; no crash is reported."""
    from app.core.common.logs import log_path, setup_logging
    from app.gui.crash import CrashHandler

    locked = tmp_path / "locked"
    real_stat = pathlib.Path.stat

    def stat(self, *a, **k):
        if str(self).startswith(str(locked)):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_stat(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "stat", stat)
    setup_logging()
    handler = CrashHandler(log_path()).install()
    said: list[str] = []
    handler.say = said.append
    try:
        window.state.set_model(str(locked / "m.gguf"))
    finally:
        handler.uninstall()
    sentence = f"{locked / 'm.gguf'}: permission denied"
    assert window.model_tab.model_info.toPlainText().startswith(sentence)
    assert "permission denied" in window.sweep_tab.form.show_problem()
    assert handler.logged == 0 and handler.dialog is None and said == []


def test_an_os_error_escaping_a_slot_is_said_not_a_crash_dialog(qtbot):
    from PySide6.QtCore import QObject, Signal

    from app.core.common.logs import log_path, setup_logging
    from app.gui.crash import CrashHandler

    class Boom(QObject):
        fire = Signal()

    setup_logging()
    handler = CrashHandler(log_path()).install()
    said: list[str] = []
    handler.say = said.append
    try:
        def write_results():
            raise OSError(errno.EROFS, "Read-only file system", "/mnt/r.jsonl")

        boom = Boom()
        boom.fire.connect(write_results)
        boom.fire.emit()
    finally:
        handler.uninstall()
    assert said == ["/mnt/r.jsonl: the file system is read-only"]
    assert handler.shown == 0 and handler.dialog is None


def test_a_job_that_meets_an_os_error_reports_the_sentence(qtbot):
    from app.gui.adapter import CoreJob

    def factory(cancel):
        yield "started"
        raise OSError(errno.ENOSPC, "No space left on device", "/data/r.jsonl")

    job = CoreJob(factory)
    failed: list[str] = []
    job.failed.connect(failed.append)
    with qtbot.waitSignal(job.finished, timeout=10000):
        job.start()
    job.wait()
    assert failed == ["/data/r.jsonl: the disk is full"]
