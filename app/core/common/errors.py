"""Errors meant for the user: one clear sentence naming the file or setting and the cause."""

from __future__ import annotations

import errno


class UserError(Exception):
    """A problem with the user's input or environment; shown as one line, never a traceback."""


class ModelFileError(UserError):
    """A model file that is missing, unreadable or not a usable GGUF."""


class EngineError(UserError):
    """An inference engine that could not be found, started or used."""


class EngineStartError(EngineError):
    """A configuration that could not start (the engine said why); retrying will not help."""


class MtpUnavailable(UserError):
    """The model or engine cannot run MTP; baseline may still run."""


class ModeUnavailable(MtpUnavailable):
    """The engine cannot run this speculative mode (or this drafter); another engine may."""


class NotRegularFile(UserError, OSError):
    """An output path that names a device, a FIFO, a socket or a folder: never written. Also an
    OSError, so a caller that reports failed writes reports this one the same way."""


class Cancelled(Exception):
    """Work stopped because the user asked for it."""


def write_reason(e: OSError) -> str:
    """Why a write failed, in plain words (a full disk and a file-size limit named as such)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    if e.errno == errno.EFBIG:
        return "the file is larger than this system allows"
    return e.strerror or str(e)
