"""Errors meant for the user: one clear sentence naming the file or setting and the cause."""

from __future__ import annotations

import errno

from app.core.common.text import shown


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


# errno -> the cause in words: the one map of OS errors to sentences, for reads and writes alike
# (getattr: a few codes exist only on some systems)
_OS_CAUSES = {getattr(errno, name): words for name, words in (
    ("EACCES", "permission denied: this user has no access to it or to a folder on its way"),
    ("EPERM", "not permitted: the system does not let this user do it"),
    ("ENOENT", "no such file or folder"),
    ("ENOTDIR", "a part of the path is a file, not a folder"),
    ("EISDIR", "it is a folder, not a file"),
    ("ENOSPC", "the disk is full"),
    ("EDQUOT", "the disk is full: this user's quota is used up"),
    ("EFBIG", "the file is larger than this system allows"),
    ("EROFS", "the file system is read-only"),
    ("EMFILE", "too many files are open in this program"),
    ("ENFILE", "too many files are open on this system"),
    ("ENAMETOOLONG", "the name is too long for this system"),
    ("ELOOP", "too many symbolic links: a link that points back to itself?"),
    ("EIO", "the device reported a read or write error: a failing disk, or a drive that was removed?"),
    ("ENXIO", "the device is not there: a drive that was removed?"),
    ("ENODEV", "the device is not there: a drive that was removed?"),
    ("EBUSY", "it is in use by another program"),
    ("ETXTBSY", "it is a program that is running now"),
    ("EEXIST", "something of that name exists already"),
    ("ENOTEMPTY", "the folder is not empty"),
    ("ENOEXEC", "it is not a program this system can run: one for another system or processor?"),
    ("ESTALE", "a network file that is gone from its server: a stale file handle"),
) if hasattr(errno, name)}

CUT_SHORT = "the file is cut short (an incomplete download?)"


def os_reason(e: OSError) -> str:
    """Why a file could not be read or written, in plain words (the system's own words for a
    cause the map above does not know)."""
    return _OS_CAUSES.get(e.errno or 0) or e.strerror or str(e) or type(e).__name__


def os_problem(e: OSError, path: object = None) -> str:
    """One line "PATH: cause" for an OS error (``path``, else the file the error names; only the
    cause when neither is known), the path shown safely (text.shown)."""
    where = path if path is not None else e.filename
    return f"{shown(where)}: {os_reason(e)}" if where is not None else os_reason(e)


def in_words(e: BaseException) -> str | None:
    """The one line a front end shows for ``e`` when it is the user's problem, not a bug: a
    UserError's sentence, or an OS error's (os_problem). None for anything else."""
    if isinstance(e, UserError):
        return str(e)
    if isinstance(e, OSError):
        return os_problem(e)
    return None


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
