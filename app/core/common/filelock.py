"""An exclusive lock on a file across processes, held by the operating system.

The lock lives in a small ``.lock`` file beside what it guards and holds the holder's pid, so a
second process can say who holds it. The operating system drops the lock when the holder dies
(``flock`` on POSIX, ``LockFileEx`` through ``msvcrt.locking`` on Windows), so a crash never
leaves a stale lock behind, only a stale file that the next holder takes over.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Iterator

from app.core.common.errors import UserError, os_reason

# Windows locks are mandatory: the pid at offset 0 stays readable because the lock is on one
# byte far past it.
_WIN_LOCK_OFFSET = 1 << 30


class LockBusy(UserError):
    """Another process holds the lock; ``pid`` is its process id when it could be read."""

    def __init__(self, message: str, pid: int | None):
        super().__init__(message)
        self.pid = pid


def _try_lock(fd: int) -> bool:
    if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
        import msvcrt  # Windows only

        os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl  # POSIX only (absent on Windows)

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


WAIT_STEP_S = 0.005


@contextlib.contextmanager
def exclusive(lock_path: str | os.PathLike[str], busy_message: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold ``lock_path`` exclusively for the ``with`` block, or raise :class:`LockBusy`: at once
    by default, or when another holder still has it after ``wait_s`` seconds (for short work
    that takes turns, such as appending one record).

    ``busy_message`` may contain ``{pid}``. On POSIX the file is removed on release; the holder
    checks after locking that the path still names the file it locked, so a process that opened
    the file just before it was removed cannot hold a lock nobody else sees."""
    path = Path(lock_path)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"{path}: cannot create the lock file ({os_reason(e)})") from None
        if not _try_lock(fd):
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(WAIT_STEP_S)
                continue
            pid = _read_pid(path)
            raise LockBusy(busy_message.format(pid=pid if pid is not None else "unknown"), pid)
        if sys.platform == "win32":  # pragma: no cover
            break
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # removed by the previous holder between our open and our lock: again
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, str(os.getpid()).encode())
    except OSError:
        pass  # the pid is only for the message; the lock itself holds
    try:
        yield
    finally:
        if sys.platform == "win32":  # pragma: no cover
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()  # fails while another process has it open: it is theirs then
        else:
            with contextlib.suppress(OSError):
                path.unlink()
            os.close(fd)
