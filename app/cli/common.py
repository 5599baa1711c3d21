"""What the commands share: exit codes, the one-line error, progress on stderr, warnings, and
loading one sweep of a results file."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, TextIO

from app.core.common.errors import UserError
from app.core.common.redact import redact
from app.core.common.text import printable
from app.core.records.reader import load_records
from app.core.records.schema import RunRecord
from app.core.records.sweeps import SweepInfo, select_sweep

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130
# the flags that give what a plan's errors ask for (app.core.measure.plan.Names): bench passes
# them to make_arms and plan_again
PLAN_NAMES = {"drafter": "--drafter {mode}=FILE", "model": "--model", "prompts": "--prompts FILE"}


def err(msg: str) -> None:
    print(f"mtp-tuner: error: {msg}", file=sys.stderr)


def warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


@contextlib.contextmanager
def on_signal(sig: int, handler: Any) -> Iterator[None]:
    """``handler`` for ``sig`` while the block runs (in the main thread only: elsewhere Python
    allows no handler, and the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(sig, handler)
    try:
        yield
    finally:
        signal.signal(sig, before)


class CleanStream:
    """A text stream that shows what it is given through ``redact`` and ``printable``: no secret
    (a key, a token, a URL's password) is printed, and a model's name, a prompt id or a release's
    tag carrying terminal escapes cannot reach the terminal raw. ``raw_write`` is for the app's own
    control sequences (the progress line's redraw)."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(redact(text)))
        return len(text)

    def raw_write(self, text: str) -> None:
        self._stream.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, buffer ...
        return getattr(self._stream, name)


@contextlib.contextmanager
def clean_output() -> Iterator[None]:
    """While a command runs, stdout and stderr show outside text cleaned (``CleanStream``)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = CleanStream(saved[0]), CleanStream(saved[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _raw_write(stream: TextIO, text: str) -> None:
    getattr(stream, "raw_write", stream.write)(text)


class Progress:
    """One progress line on stderr, redrawn in place on a terminal; only final lines otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()

    def line(self, text: str, final: bool = False) -> None:
        if self.tty:
            _raw_write(sys.stderr, "\r\033[K")
            sys.stderr.write(text + ("\n" if final else ""))
        elif final:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()


def warn_all(problems: list[str], limit: int = 20) -> None:
    for msg in problems[:limit]:
        warn(msg)
    if len(problems) > limit:
        warn(f"... and {len(problems) - limit} more such lines")


class NoRuns(UserError):
    """A results file without a run (e.g. one that holds only watch records)."""


def load_sweep(path: str, sweep: str | None = None, model: str | None = None,
               hint: str = "--sweep ID or --model PATH",
               refuse: Callable[[RunRecord], str | None] | None = None) -> tuple[list[RunRecord], SweepInfo | None]:
    """The runs of one sweep of a results file (the latest unless chosen), saying on stderr which
    one when the file holds several, and every line that was left out and why. The MTP runs come
    without their token times (checked, then left out: analyze uses only the baseline's, and
    they are most of a large file's memory); nothing here or in --again needs them. ``refuse``:
    records.reader's (a record it finds a reason against refuses the file)."""
    problems: list[str] = []
    records = load_records(path, problems, mtp_times=False, refuse=refuse)
    warn_all(problems)
    if not records:
        raise NoRuns(f"{path}: no runs in this results file")
    runs, chosen, note = select_sweep(records, sweep, model, where=path)
    if note:
        print(f"note: {note} (choose with {hint})", file=sys.stderr)
    return runs, chosen
