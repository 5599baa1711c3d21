"""Errors nobody caught: logged with the traceback, one line on stderr, shown once in plain words;
a problem of the user's (a file that cannot be read, a full disk) only in words, on the window's
error line, never as a crash. Qt's own messages go to the same log. An error while the window is built is fatal, and said so."""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path
from types import TracebackType
from typing import Callable

from PySide6.QtCore import QMessageLogContext, QtMsgType, qInstallMessageHandler
from PySide6.QtWidgets import QApplication, QMessageBox

from app.core.common.errors import in_words
from app.core.common.redact import redact

log = logging.getLogger("mtp_tuner")

_QT_LEVELS = {QtMsgType.QtDebugMsg: logging.DEBUG, QtMsgType.QtInfoMsg: logging.INFO,
              QtMsgType.QtWarningMsg: logging.WARNING, QtMsgType.QtCriticalMsg: logging.ERROR,
              QtMsgType.QtFatalMsg: logging.CRITICAL}


def _qt_message(mode: QtMsgType, context: QMessageLogContext, message: str) -> None:
    log.log(_QT_LEVELS.get(mode, logging.INFO), "qt: %s", message)


class CrashHandler:
    """sys.excepthook: log, then one dialog at a time (more errors while it is open only go to
    the log, so a failing timer cannot bury the user in dialogs)."""

    def __init__(self, log_file: Path) -> None:
        self.log_file = log_file
        self.dialog: QMessageBox | None = None
        self.shown = 0
        self.logged = 0
        self._previous = sys.excepthook
        # where a problem of the user's (an OSError, a UserError) is said in words instead of the
        # crash dialog: the window's error line, once there is a window
        self.say: Callable[[str], None] | None = None

    def install(self) -> "CrashHandler":
        sys.excepthook = self
        qInstallMessageHandler(_qt_message)
        return self

    def uninstall(self) -> None:
        if sys.excepthook is self:
            sys.excepthook = self._previous
        qInstallMessageHandler(None)

    def __call__(self, etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(etype, KeyboardInterrupt):
            self._previous(etype, value, tb)
            return
        words = in_words(value)
        if words is not None and self.say is not None:  # a file, a folder, the disk: no bug to report
            log.warning("uncaught %s, shown in words: %s", etype.__name__, words, exc_info=(etype, value, tb))
            self.say(redact(words))
            return
        self.logged += 1
        log.error("uncaught %s: %s\n%s", etype.__name__, value, "".join(traceback.format_exception(etype, value, tb)))
        for h in log.handlers:
            h.flush()
        _say(redact(f"mtp-tuner: unexpected error: {etype.__name__}: {str(value)[:500]} (details in {self.log_file})"))
        if QApplication.instance() is None or (self.dialog is not None and self.dialog.isVisible()):
            return
        self.shown += 1
        box = QMessageBox(QMessageBox.Icon.Critical, "MTP Tuner: unexpected error",
                          f"Something went wrong that MTP Tuner did not expect:\n\n{etype.__name__}: {redact(value)}\n\n"
                          f"Your results so far are saved. The details are in the log:\n{self.log_file}")
        box.setDetailedText(redact("".join(traceback.format_exception(etype, value, tb))))
        box.setModal(False)
        box.finished.connect(lambda *_: setattr(self, "dialog", None))
        self.dialog = box
        box.show()

    def fatal(self, etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        """An error that leaves no window (raised while it was built): logged, said on stderr,
        and shown in a dialog the user closes (not on the offscreen platform: nobody is there)."""
        self(etype, value, tb)
        app = QApplication.instance()
        if self.dialog is not None and app is not None and QApplication.platformName() != "offscreen":
            self.dialog.setModal(True)
            self.dialog.exec()


def _say(line: str) -> None:
    """One line on stderr, where there is one (a windowed app may have none)."""
    if sys.stderr is None:
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
