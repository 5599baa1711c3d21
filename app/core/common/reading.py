"""Reading a file the user named: only a regular file, refused at once otherwise.

``open(path)`` on a FIFO waits for a writer, and on a device reads without end: a command file,
a prompt file, a chat template or a results file that is one would hang the command until Ctrl-C.
:func:`open_regular` opens without blocking (O_NONBLOCK, so a FIFO with no writer opens at once),
looks at what was opened (fstat of the open file: no race between a check and the open), and
refuses anything but a regular file in one line naming it; the regular file is then read as usual.
:func:`read_capped` is the one capped read of such a file (a command, template, token, prompt,
community table or release listing file): too large a file is refused from its size, at once."""

from __future__ import annotations

import os
from typing import IO

from app.core.common.atomic import file_kind
from app.core.common.errors import NotRegularFile, UserError, os_reason


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


def _amount(limit: int) -> str:
    """A limit in the unit it was set in: "4 MiB", "64 KiB", "4,096 bytes"."""
    if limit >= 1 << 20 and not limit % (1 << 20):
        return f"{limit >> 20} MiB"
    if limit >= 1 << 10 and not limit % (1 << 10):
        return f"{limit >> 10} KiB"
    return f"{limit:,} bytes"


def read_capped(path: str | os.PathLike[str], what: str, limit: int, flag: str = "") -> bytes:
    """The bytes of the regular file ``path`` (open_regular) of at most ``limit`` bytes; otherwise a
    UserError in one line naming the file and the cause (``what``: "command file"; ``flag``: the
    option that named it, said beside the cause):

    - a FIFO, device or folder: NotRegularFile, before a byte is read;
    - "PATH: WHAT not found", "PATH: cannot read the WHAT (REASON)";
    - "PATH: N bytes, more than the 1 MiB a WHAT may have": from the open file's size (fstat), before
      a byte is read, so a huge file is refused at once; or from what was read when it grew meanwhile."""
    where = f" ({flag})" if flag else ""
    try:
        with open_regular(path, what + where) as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(limit + 1) if size <= limit else b""
    except NotRegularFile:
        raise
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found{where}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read the {what} ({flag + ': ' if flag else ''}{os_reason(e)})") from None
    if size > limit or len(data) > limit:
        raise UserError(f"{path}: {max(size, len(data)):,} bytes, more than the {_amount(limit)} a {what} may "
                        f"have{where}")
    return data
