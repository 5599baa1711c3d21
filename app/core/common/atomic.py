"""Atomic file writes: write to a temporary file beside the target, fsync, then rename.

Writes go only to regular files: a target that is a device, a FIFO or a socket is refused (the
rename would replace the node with a file), checked first and again right before the rename. A
symbolic link is followed: the file it names is the one written (and must be a regular file
or not exist yet); the link stays."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from app.core.common.errors import NotRegularFile, UserError, os_reason


def file_kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode):
        return "a device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def not_regular(path: str | os.PathLike[str], what: str = "output") -> NotRegularFile | None:
    """The error for writing ``path`` when it exists (after symbolic links) and is not a regular
    file, else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # absent (or unreadable: the write itself says why)
    kind = file_kind(mode)
    return None if kind is None else refusal(path, kind, what)


def refusal(path: str | os.PathLike[str], kind: str, what: str = "output") -> NotRegularFile:
    """The error for a path of ``kind`` (file_kind) that is not written."""
    if kind == "a folder":
        return NotRegularFile(f"{path}: is a folder; give a file name for the {what}")
    return NotRegularFile(f"{path}: is {kind}, not a regular file; give a file name for the {what}")


def check_regular(path: str | os.PathLike[str], what: str = "output") -> None:
    """Raise :func:`not_regular`'s error, if any."""
    e = not_regular(path, what)
    if e is not None:
        raise e


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], what: str = "output") -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success it replaces ``target`` (the file
    a symbolic link names, for a link). A target that is not a regular file is never replaced:
    NotRegularFile (a UserError and an OSError)."""
    target = Path(os.path.realpath(target)) if os.path.islink(target) else Path(target)
    check_regular(target, what)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        check_regular(target, what)  # again: it may have been made meanwhile
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


def write_text_atomic(target: str | os.PathLike[str], text: str, what: str = "output") -> None:
    with atomic_path(target, what) as tmp:
        tmp.write_text(text, encoding="utf-8")


def check_writable(path: str | os.PathLike[str], what: str = "results file") -> Path:
    """Before the work starts: can ``path`` be written (created or appended to)? Creates nothing.
    Only a regular file (after symbolic links) is written: a FIFO, a socket or a device is
    refused. Raises UserError naming the file and the cause."""
    p = Path(path).expanduser()
    with _looking(p, f"write the {what}"):
        check_regular(p, what)
        if p.exists():
            if not os.access(p, os.W_OK):
                raise UserError(f"{p}: cannot write the {what} ({_not_writable(p.parent, 'permission denied')})")
            return p
        return _creatable(p, f"write the {what}")


def check_writable_dir(path: str | os.PathLike[str], what: str = "log folder") -> Path:
    """Before the work starts: is ``path`` a folder that can be written in, or one that can be made?
    A FIFO, a file or a device where a folder should be is refused (logs written into one would be
    lost without a word). Creates nothing. Raises UserError naming the folder and the cause."""
    p = Path(path).expanduser()
    with _looking(p, f"use it as the {what}"):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                kind = "a pipe (FIFO)" if stat.S_ISFIFO(p.stat().st_mode) else "a file" if p.is_file() else \
                    "not a folder" if p.exists() else "a broken link"
                raise UserError(f"{p}: cannot use it as the {what} (it is {kind}, not a folder)")
            if not os.access(p, os.W_OK | os.X_OK):
                raise UserError(f"{p}: cannot write in the {what} ({_not_writable(p, 'permission denied')})")
            return p
        return _creatable(p, f"make the {what}")


@contextlib.contextmanager
def _looking(p: Path, doing: str) -> Iterator[None]:
    """Looking at ``p`` may itself fail (a folder on its way this user may not open, a name too
    long): that is the UserError "P: cannot <doing> (the cause in words)", not a traceback."""
    try:
        yield
    except NotRegularFile:
        raise
    except OSError as e:
        raise UserError(f"{p}: cannot {doing} ({os_reason(e)})") from None


def _not_writable(folder: Path, otherwise: str) -> str:
    """Why this process may not write in ``folder``: a read-only file system is named as such
    (os.access says only no), else ``otherwise``."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return os_reason(OSError(errno.EROFS, ""))
    except (OSError, AttributeError):  # no statvfs on Windows
        pass
    return otherwise


def _creatable(p: Path, doing: str) -> Path:
    """``p``, when the nearest folder above it that exists is a folder this process may write in;
    else a UserError "P: cannot <doing> (...)"."""
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{p}: cannot {doing} ({parent} is a file, not a folder)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{p}: cannot {doing} ({_not_writable(parent, f'no permission to write in {parent}')})")
    return p


def write_error(path: Path, e: OSError, what: str = "results file") -> UserError:
    """One sentence for a failed write: the file and the cause in plain words."""
    return UserError(f"{path}: cannot write the {what} ({os_reason(e)})")
