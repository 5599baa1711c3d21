"""Writes go only to regular files, and a shared results file keeps every writer's records.

A report or a picture aimed at a device, a FIFO or a socket is one clear error and the node
stays what it was (the atomic rename never replaces it); appending refuses a FIFO, a socket and
a block device. Two writers on one results file take turns under a lock, so the one whose write
fails cuts back only its own bytes. The device nodes here are made in the test's own folder
(never /dev/null itself: the old code would replace it)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.common.atomic import atomic_path, write_text_atomic
from app.core.common.errors import UserError
from app.core.records.writer import ResultsWriter
from conftest import ROOT
from tests.helpers import clean_error, cli

DATA = ROOT / "tests" / "data"
RESULTS = DATA / "compare_before.jsonl"
TABLE = DATA / "community_table.md"


@pytest.fixture
def nulldev(tmp_path) -> Path:
    """A character device like /dev/null (1, 3), in the test's folder."""
    p = tmp_path / "nulldev"
    try:
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (OSError, AttributeError) as e:
        pytest.skip(f"cannot make a device node here ({e})")
    return p


@pytest.fixture
def fifo(tmp_path) -> Path:
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


def _is_chr(p: Path) -> bool:
    return stat.S_ISCHR(os.lstat(p).st_mode)


def _is_fifo(p: Path) -> bool:
    return stat.S_ISFIFO(os.lstat(p).st_mode)


def _no_temp_left(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".part")]


# ------------------------------------------------------------------------------------------
# a report or a picture never replaces a device or a FIFO


def test_a_report_aimed_at_a_device_or_a_fifo_is_one_error_and_the_node_stays(nulldev, fifo, tmp_path):
    r = cli("recommend", str(RESULTS), "--report", str(nulldev))
    clean_error(r, f"{nulldev}: is a device, not a regular file; give a file name for the report")
    assert _is_chr(nulldev)
    r = cli("recommend", str(RESULTS), "--report", str(fifo))
    clean_error(r, f"{fifo}: is a FIFO (named pipe), not a regular file")
    assert _is_fifo(fifo)
    _no_temp_left(tmp_path)
    # a regular file is still written, and one named through a link is the file the link names
    real = tmp_path / "real.md"
    real.write_text("old")
    link = tmp_path / "link.md"
    link.symlink_to(real)
    r = cli("recommend", str(RESULTS), "--report", str(link))
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and "# MTP Tuner report" in real.read_text()


def test_a_card_picture_aimed_at_a_device_or_a_fifo_is_one_error_and_the_node_stays(nulldev, fifo, tmp_path):
    for node, check in ((nulldev, _is_chr), (fifo, _is_fifo)):
        r = cli("card", str(RESULTS), "--png", str(node))
        clean_error(r, str(node), "not a regular file")
        assert check(node)
        r = cli("card", str(RESULTS), "--community", str(TABLE), "--placement-png", str(node))
        clean_error(r, str(node), "not a regular file")
        assert check(node)
    link = tmp_path / "to-dev.png"
    link.symlink_to(nulldev)
    clean_error(cli("card", str(RESULTS), "--png", str(link)), "is a device")
    assert _is_chr(nulldev) and link.is_symlink()
    _no_temp_left(tmp_path)


def test_the_rename_never_replaces_a_node_made_while_writing(tmp_path):
    """Checked again right before the rename: a FIFO or a socket that appears at the target
    while the file is being written is left alone."""
    target = tmp_path / "out.md"
    with pytest.raises(UserError, match="is a FIFO"):
        with atomic_path(target) as tmp:
            tmp.write_text("report")
            os.mkfifo(target)
    assert _is_fifo(target)
    _no_temp_left(tmp_path)
    target.unlink()
    sock = socket.socket(socket.AF_UNIX)
    try:
        with pytest.raises(UserError, match="is a socket"):
            with atomic_path(target) as tmp:
                tmp.write_text("report")
                sock.bind(str(target))
        assert stat.S_ISSOCK(os.lstat(target).st_mode)
    finally:
        sock.close()
    _no_temp_left(tmp_path)
    # the message names the file; the refusal is also an OSError, as every failed write is
    with pytest.raises(OSError, match="not a regular file"):
        write_text_atomic(target, "x")


# ------------------------------------------------------------------------------------------
# appending


def test_appending_refuses_a_fifo_a_socket_and_a_block_device(fifo, tmp_path):
    with pytest.raises(UserError, match="is a FIFO .named pipe., not a regular file; give a file name for the results"):
        ResultsWriter(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        with pytest.raises(UserError, match="is a socket"):
            ResultsWriter(sock_path)
    finally:
        sock.close()
    blk = tmp_path / "blk"
    try:
        os.mknod(blk, 0o600 | stat.S_IFBLK, os.makedev(7, 255))  # never opened
    except OSError:
        return
    with pytest.raises(UserError, match="is a block device"):
        ResultsWriter(blk)
    assert _is_fifo(fifo) and stat.S_ISBLK(os.lstat(blk).st_mode)


def test_a_character_device_is_no_results_file_either(nulldev):
    """A results file is a regular file: a device is refused before the work, and kept."""
    with pytest.raises(UserError, match="is a device, not a regular file; give a file name for the results"):
        ResultsWriter(nulldev)
    assert _is_chr(nulldev) and sorted(p.name for p in nulldev.parent.iterdir()) == ["nulldev"]


# ------------------------------------------------------------------------------------------
# a shared results file: a failed append removes only its own bytes

# Writer A's append fails (a file-size limit, in this child process only); writer B appends in
# between A finding the end of the file and A's failed write. Made, not hoped for: A pauses at
# its first os.write until B has either finished (no lock: B's record lands where A started) or
# been turned away by the lock A holds (B's flock fails); then A goes on, fails and cuts back.
INTERLEAVE = r"""
import fcntl, json, os, resource, sys, threading
from app.core.records.writer import ResultsWriter

path = sys.argv[1]
a_line = json.dumps({"who": "A", "pad": "a" * 4000})
b_line = json.dumps({"who": "B"})
size = os.path.getsize(path)
limit = size + len(b_line) + 1 + 100  # B's record fits, A's does not, whoever goes first
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
wa, wb = ResultsWriter(path), ResultsWriter(path)
a_paused, a_go, b_turn = threading.Event(), threading.Event(), threading.Event()
result = {}

def prof_a(frame, event, arg):
    if event == "c_call" and arg is os.write and not a_paused.is_set():
        a_paused.set()
        a_go.wait(120)

def prof_b(frame, event, arg):
    if event == "c_exception" and arg is fcntl.flock:
        b_turn.set()  # turned away by the lock: it waits for A

def run(w, line, key, prof):
    sys.setprofile(prof)
    try:
        w.append_line(line)
        result[key] = "ok"
    except Exception as e:
        result[key] = f"{type(e).__name__}: {e}"
    finally:
        sys.setprofile(None)
        if key == "b":
            b_turn.set()

ta = threading.Thread(target=run, args=(wa, a_line, "a", prof_a))
ta.start()
assert a_paused.wait(120)
tb = threading.Thread(target=run, args=(wb, b_line, "b", prof_b))
tb.start()
assert b_turn.wait(120)
a_go.set()
ta.join(120)
tb.join(120)
wa.close()
wb.close()
print(json.dumps(result))
"""


def test_a_failed_append_never_removes_another_writers_record(tmp_path):
    path = tmp_path / "shared.jsonl"
    with ResultsWriter(path) as w:
        for i in range(3):
            w.append_line(json.dumps({"who": "earlier", "i": i}))
    r = subprocess.run([sys.executable, "-c", INTERLEAVE, str(path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["b"] == "ok"
    assert result["a"].startswith("UserError") and "larger than this system allows" in result["a"]
    lines = path.read_text().splitlines()
    assert [json.loads(x)["who"] for x in lines] == ["earlier"] * 3 + ["B"]  # B's record kept, A's bytes gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.jsonl"]  # no lock file left
