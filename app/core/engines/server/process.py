"""One llama-server process: started on 127.0.0.1 with a free port, a random API key, ``-np 1``
and ``--metrics``; waits for ``/health``; streams completions timing every token as it arrives;
stopped by interrupt, wait, then killing the whole process group. A start that fails is
reported with the server's own reason lines, each redacted (common.redact) as it is read.
Servers still up when the app exits are stopped."""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import http.client
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Generator

from app.core.common.cancel import CancelToken
from app.core.common import jsonsafe
from app.core.common.redact import redact
from app.core.common.errors import Cancelled, EngineError, EngineStartError, os_reason
from app.core.engines import commands
from app.core.engines.base import Progress, reason_lines
from app.core.engines.commands import Capabilities, ServerConfig
from app.core.engines.server.binary import child_env, group_kwargs, kill_group
from app.core.records.sampler import Sampler

# the one clock of a request's token times, baseline and speculative alike (a module name, so a
# test can put a recorded clock in its place: tests/test_fidelity.py)
clock = time.perf_counter


HOST = "127.0.0.1"
STOP_GRACE_S = 1.0
LOG_VERBOSITY = 4  # -lv 4: llama.cpp's own load lines (devices, "offloaded N/M layers") are logged from 4 on
DIED_WAIT_S = 2.0  # after a request broke off: how long to wait for the server's exit code
_LIVE: "weakref.WeakSet[ServerProcess]" = weakref.WeakSet()
_SPEC_PREFIX = "llamacpp:spec_decode_num_"
_PER_POS = _SPEC_PREFIX + "accepted_tokens_per_pos_total"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass(frozen=True)
class SpecCounters:
    """Counters of /metrics since the server started: verification steps that drafted
    (``llamacpp:spec_decode_num_drafts_total``) and accepted drafts per draft position
    (``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}``, i from 0; absent
    until a speculative request has finished, and in builds before llama.cpp PR #24536)."""

    drafts: int | None  # None: too large to be exact (llama.cpp prints it as a double, 6 digits)
    per_pos: dict[int, int]


def parse_spec_counters(text: str) -> SpecCounters | None:
    """The speculative counters of a Prometheus text page (None without the drafts counter)."""
    drafts, found, per_pos = None, False, {}
    for line in text.splitlines():
        if not line.startswith(_SPEC_PREFIX):
            continue
        name, _, value = line.rpartition(" ")
        try:
            n = int(value)  # the per-position counters are integers; the others doubles (1e+06 ...)
        except ValueError:
            n = None
        if name == _SPEC_PREFIX + "drafts_total":
            found, drafts = True, n
        elif name.startswith(_PER_POS) and n is not None:
            m = re.fullmatch(r'\{position="(\d+)"\}', name[len(_PER_POS):])
            if m:
                per_pos[int(m.group(1))] = n
    return SpecCounters(drafts, per_pos) if found else None


class ServerProcess:
    """One running llama-server. Use :meth:`start`, then requests, then :meth:`stop`."""

    def __init__(self, binary: str, caps: Capabilities, cfg: ServerConfig,
                 log_path: str | os.PathLike[str] | None = None):
        self.binary, self.caps, self.cfg = binary, caps, cfg
        self.api_key = secrets.token_urlsafe(24)
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
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
                                                   port=self.port, metrics=True, no_webui=True,
                                                   verbosity=LOG_VERBOSITY)
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
        kwargs = group_kwargs()
        self.log.clear()
        self.broken = False
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=child_env({"LLAMA_API_KEY": self.api_key}), **kwargs)
        except OSError as e:
            raise EngineError(f"{self.binary}: cannot start llama-server ({os_reason(e)})") from None
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
                # its own lines may quote a flag's URL with its password or a key: masked before
                # any message, record or log file holds them
                line = redact(raw.decode("utf-8", errors="replace").rstrip("\n"))
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
                    proc.send_signal(signal.CTRL_BREAK_EVENT)
                else:
                    os.killpg(proc.pid, signal.SIGINT)
            except (OSError, ValueError):
                pass
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        kill_group(proc)
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
                return resp.status, jsonsafe.loads(raw) if raw else None
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

    def slots(self) -> list[dict[str, Any]]:
        payload = self.request_json("GET", "/slots")
        return payload if isinstance(payload, list) else []

    def spec_counters(self) -> SpecCounters | None:
        """llama.cpp's speculative counters from ``/metrics`` (the server runs with --metrics), or
        None when the endpoint does not answer or has no ``spec_decode_num_drafts_total``."""
        try:
            status, payload = self._request("GET", "/metrics", timeout=10.0)
        except (OSError, http.client.HTTPException):
            return None
        return parse_spec_counters(payload) if status == 200 and isinstance(payload, str) else None

    def apply_template(self, text: str) -> str:
        payload = self.request_json("POST", "/apply-template",
                                    {"messages": [{"role": "user", "content": text}]})
        return str(payload["prompt"])

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        payload = self.request_json("POST", "/tokenize", {"content": text, "add_special": add_special,
                                                          "parse_special": True})
        return [int(t) if not isinstance(t, dict) else int(t["id"]) for t in payload["tokens"]]

    def stream_completion(self, prompt_tokens: list[int], n_predict: int, sampler: Sampler,
                          cancel: CancelToken, ignore_eos: bool = False, read_timeout: float = 600.0,
                          server_times: bool = False) -> Generator[Progress, None, dict[str, Any]]:
        """Stream one completion; yields Progress, returns the raw result (tokens, times, timings).
        The request carries the whole sampler chain (order and every setting), so neither the
        server's command line nor the model's general.sampling.* keys can change it.
        ``server_times``: the server also stamps every token with its own clock ("server_times":
        seconds since the first token, the tokens of one step sharing its stamp, from each chunk's
        timings with ``timings_per_token``; None where a chunk lacks a usable stamp)."""
        body = {"prompt": prompt_tokens, "n_predict": int(n_predict), **sampler.request(),
                "stream": True, "cache_prompt": False, "return_tokens": True,
                "ignore_eos": bool(ignore_eos), "timings_per_token": bool(server_times)}
        conn = http.client.HTTPConnection(HOST, self.port, timeout=read_timeout)
        with self._conn_lock:
            self._active_conn = conn
        unregister = cancel.on_cancel(self._abort_connection)
        tokens: list[int] = []
        times: list[float] = []
        stamps: list[float] | None = [] if server_times else None
        content: list[str] = []
        final: dict[str, Any] | None = None
        try:
            t0 = clock()
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
                now = clock()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    chunk = jsonsafe.loads(data)
                except ValueError:
                    continue
                if "error" in chunk and not chunk.get("tokens"):
                    err = chunk["error"]
                    raise EngineError(f"llama-server error: {err.get('message', err) if isinstance(err, dict) else err}")
                new = chunk.get("tokens") or []
                for t in new:
                    tokens.append(int(t))
                    times.append(now - t0)
                if stamps is not None and new:
                    stamp = _stamp(chunk.get("timings"))
                    if stamp is None:
                        stamps = None
                    else:
                        stamps.extend([stamp] * len(new))
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
                "timings": final.get("timings") or {}, "final": final, "server_times": stamps}


BURST = 0.8  # tokens read within under this share of the server's own decode time came in a burst


def token_clock(times: list[float], stamps: list[float] | None, timings: Any) -> list[float]:
    """The token times a run's speed is read from: the client's arrival times (``times``), unless
    the tokens reached the client in a burst (their span under BURST of the server's own time for
    the steps after the first token, ``predicted_ms``): a model faster than the stream is read, so
    its lines queued and were read together, and the arrival times measured the reading, not the
    decoding (64 tokens in 0.85 ms, 73,913 tok/s, from a server that took 14.5 ms). Then the
    server's own stamps (``stamps``, seconds after the first token) placed from the first token's
    arrival; an EngineError where it sent none, as no speed can be read from the run. (A reader
    held up reads slower than the server decoded: the analysis leaves such a speed out,
    analysis.findings.clock_off.)"""
    ms = timings.get("predicted_ms") if isinstance(timings, dict) else None
    if len(times) < 2 or isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0.0 < ms < 1e9:
        return times
    span, server = times[-1] - times[0], float(ms) / 1000.0
    if span >= BURST * server:
        return times
    if stamps is None or len(stamps) != len(times) or not stamps[-1] > stamps[0]:
        raise EngineError(f"llama-server's {len(times)} tokens reached this client in a burst (read within "
                          f"{1000 * span:.2f} ms, decoded in {1000 * server:.2f} ms) and it stamped no token "
                          "times, so this run's speed cannot be measured")
    return [times[0] + (s - stamps[0]) for s in stamps]


def _stamp(timings: Any) -> float | None:
    """A chunk's own server time (seconds after the first token: its ``predicted_ms``), or None
    where the server sent none or not a finite, non-negative number."""
    ms = timings.get("predicted_ms") if isinstance(timings, dict) else None
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0.0 <= ms < 1e9:
        return None
    return float(ms) / 1000.0


def stop_all_servers() -> None:
    for s in list(_LIVE):
        with contextlib.suppress(Exception):
            s.stop()


atexit.register(stop_all_servers)
