"""llama-cpp-python's low-level API, loaded once: the backend initialised, its log kept in a
buffer (for the reason a load or a decode failed), and the batch helpers the in-process engine,
its decode loop and the cost probe share."""

from __future__ import annotations

import atexit
import collections
import ctypes
import threading

import numpy as np

from app.core.common.errors import EngineError
from app.core.engines.base import reason_lines

_log_lock = threading.Lock()
_LOG: collections.deque[str] = collections.deque(maxlen=500)
_backend_ready = False
_log_cb = None


def llama():
    """Import llama_cpp lazily (heavy), init the backend once, route its log into a buffer."""
    global _backend_ready, _log_cb
    try:
        import llama_cpp as L  # deferred: heavy (loads the llama.cpp library); only when an engine runs
        from llama_cpp import llama_cpp_ext as X
    except Exception as e:  # pragma: no cover - depends on the install
        raise EngineError(f"llama-cpp-python is not usable here ({e}); reinstall mtp-tuner") from None
    if not _backend_ready:
        @L.llama_log_callback
        def _cb(level, text, _user):  # pragma: no cover - called from C
            try:
                s = text.decode("utf-8", errors="replace")
            except Exception:
                return
            with _log_lock:
                if _LOG and not _LOG[-1].endswith("\n"):
                    _LOG[-1] += s
                else:
                    _LOG.append(s)

        _log_cb = _cb
        L.llama_log_set(_log_cb, ctypes.c_void_p(0))
        L.llama_backend_init()
        _backend_ready = True
        # llama.cpp may log while the interpreter tears down; a Python callback freed by then
        # would crash the process at exit
        atexit.register(lambda: L.llama_log_set(ctypes.cast(None, L.llama_log_callback), ctypes.c_void_p(0)))
    return L, X


def recent_log(n: int = 30) -> list[str]:
    with _log_lock:
        return [ln.rstrip("\n") for ln in list(_LOG)[-n:]]


def failure_reasons() -> str:
    """The reason lines of llama.cpp's recent log, joined (empty when it gave none)."""
    r = reason_lines(recent_log(60), limit=4)
    return "; ".join(r)


def llama_cpp_version() -> str:
    try:
        import llama_cpp  # deferred: heavy (loads the llama.cpp library); asked for only by a run

        return f"llama-cpp-python {llama_cpp.__version__}"
    except Exception:
        return "llama-cpp-python (unavailable)"


def fill_batch(b, toks, pos0: int, logits, embs=None, demb: np.ndarray | None = None,
               n_embd: int = 0) -> None:
    """Fill a llama_batch for sequence 0 at positions pos0.. (with hidden-state rows if given)."""
    b.n_tokens = len(toks)
    for i, t in enumerate(toks):
        b.token[i] = int(t)
        b.pos[i] = pos0 + i
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = 0
        b.logits[i] = logits[i]
    if embs is not None:
        for i, e in enumerate(embs):
            demb[i * n_embd:(i + 1) * n_embd] = e


def decode_or_raise(L, ctx, b, what: str) -> None:
    rc = L.llama_decode(ctx, b)
    if rc != 0:
        raise EngineError(f"llama_decode failed during {what} (code {rc})"
                          + (f": {failure_reasons()}" if failure_reasons() else ""))
