"""The results writer: appends records to a JSONL file, one line at once.

A crash loses at most the run in flight: every record is written, flushed and fsynced before the
next run starts."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from app.core.common.atomic import check_regular, check_writable, file_kind, refusal, write_error
from app.core.common.errors import UserError
from app.core.common.filelock import exclusive
from app.core.records.schema import RunRecord, redacted

log = logging.getLogger(__name__)

LOCK_WAIT_S = 60.0  # another writer's append takes milliseconds; this long is a stuck writer


class ResultsWriter:
    """Appends records to a JSONL file; each line is on disk before :meth:`append` returns.

    The destination is checked when the writer is made, but the file is created only with the
    first record, so an error before any run leaves no empty file behind. A file whose last line
    was cut short (a crash or a full disk in an earlier sweep) gets that line ended first, so the
    next record is not glued onto it; ``notes`` says so. A failed write stops with a UserError
    naming the file and the cause; the records written before it stay whole.

    Several writers may share a file (two sweeps into one results file): each append, from
    finding the end to the fsync or the cut back after a failure, holds a lock on the file
    (``<name>.lock`` beside it), so a failed write removes only its own bytes."""

    def __init__(self, path: str | os.PathLike[str], what: str = "results file") -> None:
        self.what = what
        self.path = check_writable(path, what)
        self._fd: int | None = None
        self._ended = False  # the file's last line was checked (end_cut_line)
        self.count = 0
        self.notes: list[str] = []

    def _open(self) -> int:
        check_regular(self.path, self.what)
        # O_NONBLOCK: a FIFO made meanwhile is refused below instead of waiting for a reader
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            raise write_error(self.path, e, self.what) from None
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            os.close(fd)
            raise refusal(self.path, kind, self.what)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return fd

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        """The lock every writer of this file takes for an append; none where no lock file can be
        made (a folder this user cannot write in)."""
        real = Path(os.path.realpath(self.path))
        if not os.access(real.parent, os.W_OK | os.X_OK):
            return contextlib.nullcontext()
        return exclusive(real.with_name(real.name + ".lock"),
                         f"{self.path}: another process (pid {{pid}}) has been appending to it for over "
                         f"{LOCK_WAIT_S:.0f} s; stop it, or give another file", wait_s=LOCK_WAIT_S)

    def _reopen_if_replaced(self, fd: int) -> None:
        """Under the lock: the path may name another file now than ``fd`` (an empty one another
        writer removed, or one moved away); records go to what the path names."""
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            self._fd, self._ended = None, False
            self._fd = self._open()

    def append(self, rec: RunRecord) -> None:
        """Write ``rec``, every secret its flags or its error quote masked (schema.redacted)."""
        try:
            self.append_line(redacted(rec).to_json())
        except UserError as e:
            raise UserError(f"{e}; the sweep stopped there") from None

    def append_line(self, line: str) -> None:
        """Write one line and fsync it; on failure cut the file back to where the line began, so
        no partial line is left for the next reader or writer."""
        if self._fd is None:
            self._fd = self._open()
        with self._lock():
            try:
                self._reopen_if_replaced(self._fd)
                if not self._ended:
                    end_cut_line(self.path, self._fd, self.notes)
                    self._ended = True
            except OSError as e:
                raise write_error(self.path, e, self.what) from None
            start = os.lseek(self._fd, 0, os.SEEK_END)
            try:
                _write_all(self._fd, (line + "\n").encode("utf-8"))
                os.fsync(self._fd)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
                kept = f"; the {self.count} record(s) written before are kept" if self.count else ""
                raise UserError(f"{write_error(self.path, e, self.what)}{kept}") from None
        self.count += 1

    def take_notes(self) -> list[str]:
        out, self.notes = self.notes, []
        return out

    def close(self) -> None:
        """Close the file; one that no record reached and that is empty (a name reserved for a
        sweep that then did not run) is removed, so no empty results file is left behind."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)  # every record was fsynced when written
        if self.count == 0 and _empty_file(self.path):
            with contextlib.suppress(OSError, UserError), self._lock():  # not while another writer appends
                if _empty_file(self.path):
                    self.path.unlink()

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _empty_file(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size == 0
    except OSError:
        return False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def end_cut_line(path: Path, fd: int, notes: list[str]) -> None:
    """If the file does not end with a newline, its last line was cut short (a crash or a full
    disk): end it, so what comes next starts on a line of its own, and say so in ``notes``."""
    size = os.lseek(fd, 0, os.SEEK_END)
    if not size:
        return
    with open(path, "rb") as r:
        r.seek(size - 1)
        if r.read(1) == b"\n":
            return
        r.seek(0)
        n_lines = sum(chunk.count(b"\n") for chunk in iter(lambda: r.read(1 << 20), b"")) + 1
    _write_all(fd, b"\n")
    os.fsync(fd)
    notes.append(f"{path} line {n_lines}: the last line was cut short (a crash or a full disk while "
                 "writing); it was ended so that new records stay readable, and it is left out")


def append_line(path: str | os.PathLike[str], line: str, what: str = "results file") -> None:
    """Append one JSON line durably (flush + fsync), ending a cut last line first. Raises
    UserError naming the file and the cause when it cannot be written."""
    with ResultsWriter(path, what) as w:
        w.append_line(line)
    for note in w.notes:
        log.warning(note)
