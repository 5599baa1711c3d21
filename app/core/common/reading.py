"""Reading a file the user named: only a regular file, refused at once otherwise.

``open(path)`` on a FIFO waits for a writer, and on a device reads without end: a command file,
a prompt file, a chat template or a results file that is one would hang the command until Ctrl-C.
:func:`open_regular` opens without blocking (O_NONBLOCK, so a FIFO with no writer opens at once),
looks at what was opened (fstat of the open file: no race between a check and the open), and
refuses anything but a regular file in one line naming it; the regular file is then read as usual."""

from __future__ import annotations

import os
from typing import IO

from app.core.common.atomic import file_kind
from app.core.common.errors import NotRegularFile


def open_regular(path: str | os.PathLike[str], what: str, buffering: int = -1) -> IO[bytes]:
    """``path`` opened for reading in binary mode, when it is a regular file (after symbolic
    links); NotRegularFile ("PATH: is a FIFO (named pipe), not a regular file: a WHAT is a file")
    otherwise, before a byte is read. OSError as ``open`` raises it."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotRegularFile(f"{path}: is {kind}, not a regular file: the {what} must be a file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file: reads as usual from here
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], what: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of a regular file (open_regular): more than ``limit`` tells the
    caller the file is too long."""
    with open_regular(path, what) as f:
        return f.read(limit + 1)
