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


# the words of an error raised when a request never reached its server, by kind
_NO_NAME = ("name or service not known", "nodename nor servname", "getaddrinfo failed",
            "temporary failure in name resolution", "no address associated", "name resolution")
_UNREACHABLE = ("network is unreachable", "no route to host", "network is down")
_GERUNDS = {"downloading ": "download ", "listing ": "list ", "reading ": "read ", "searching ": "search "}


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in out and len(out) < 8:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def network_problem(e: BaseException, host: str, what: str) -> str | None:
    """One plain sentence for a request that never reached ``host`` (``what``: what it was for,
    e.g. "list llama.cpp releases" or "downloading X"): no network (the name does not resolve, no
    route), refused, or no answer in time. None when ``e`` is something else (an answer, a disk).
    The one place such errors are worded, for the Hub, downloads and the llama.cpp releases."""
    for prefix, verb in _GERUNDS.items():
        if what.startswith(prefix):
            what = verb + what[len(prefix):]
            break
    chain = _chain(e)
    names = " ".join(type(x).__name__ for x in chain)
    text = " ".join(str(x) for x in chain).lower()
    if any(isinstance(x, ConnectionRefusedError) for x in chain) or "connection refused" in text:
        return (f"cannot reach {host} to {what}: the connection was refused (the server is down, or the "
                "address is wrong)")
    if any(w in text for w in _NO_NAME) or "gaierror" in names or "NameResolution" in names:
        return f"no network: cannot reach {host} to {what}"
    if any(w in text for w in _UNREACHABLE):
        return f"no network: cannot reach {host} to {what}"
    if "Timeout" in names or any(isinstance(x, TimeoutError) for x in chain):
        return f"cannot reach {host} to {what}: it did not answer in time (a slow or blocked network)"
    if "ConnectError" in names:
        return f"no network: cannot reach {host} to {what}"
    return None
