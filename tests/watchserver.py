"""A hostile llama-server on 127.0.0.1 (an ephemeral port) for ``mtp-tuner watch``: its four GET
endpoints answer as a real one does (counters that grow with every /metrics read, a model path,
a mode), and each can be made hostile: another body (a model path with an escape, JSON nested
100,000 deep, a position label of 5,000 digits), or an answer sent one byte a second, from its
``slow_from``-th request on. Every request is kept in ``requests`` (path, headers)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

MODEL = "/models/calibrated-p0.3.gguf"


def metrics_page(n: int, k: int = 3, extra: str = "") -> str:
    """llama-server's /metrics after ``n`` reads' worth of traffic: 40 draft steps per read."""
    steps = 40 * n
    per_pos = [steps * (k - i) // (k + 1) for i in range(k)]
    lines = [f"llamacpp:tokens_predicted_total {steps * 3}", f"llamacpp:tokens_predicted_seconds_total {n * 0.5}",
             f"llamacpp:spec_decode_num_drafts_total {steps}",
             f"llamacpp:spec_decode_num_draft_tokens_total {steps * k}",
             f"llamacpp:spec_decode_num_accepted_tokens_total {sum(per_pos)}", "llamacpp:prompt_tokens_total 100"]
    lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {a}'
              for i, a in enumerate(per_pos)]
    return "\n".join(lines) + "\n" + extra


class WatchServer:
    """``bodies[path]``: a function of the request count (of that path, from 1) giving the body,
    or a fixed body; ``slow[path]``: from which request of that path on it answers a byte a second."""

    def __init__(self, model: str = MODEL, metrics_extra: str = ""):
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.counts: dict[str, int] = {}
        self.slow: dict[str, int] = {}
        self.stop = threading.Event()
        self.bodies: dict[str, Callable[[int], str] | str] = {
            "/health": '{"status":"ok"}',
            "/metrics": lambda n: metrics_page(n, extra=metrics_extra),
            "/props": json.dumps({"model_path": model, "build_info": "b1-abcdef0"}),
            "/slots": json.dumps([{"id": 0, "id_task": 5, "is_processing": False,
                                   "params": {"speculative.types": "none,draft-mtp"}}]),
        }
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                with owner._lock:
                    owner.requests.append((path, dict(self.headers)))
                    n = owner.counts[path] = owner.counts.get(path, 0) + 1
                body = owner.bodies.get(path)
                if body is None:
                    raw = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                else:
                    text = body(n) if callable(body) else body
                    data = text.encode("utf-8", "surrogatepass")
                    raw = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(data)}\r\n"
                           "Process-Start-Time-Unix: 1700000000\r\nConnection: close\r\n\r\n").encode() + data
                try:
                    if path in owner.slow and n >= owner.slow[path]:
                        for i in range(len(raw)):  # one byte a second: no socket timeout ever fires
                            if owner.stop.wait(1.0 if i else 0.0):
                                return
                            self.wfile.write(raw[i:i + 1])
                            self.wfile.flush()
                    else:
                        self.wfile.write(raw)
                except OSError:  # the client went away
                    pass
                self.close_connection = True

        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def paths(self) -> list[str]:
        with self._lock:
            return [p for p, _ in self.requests]

    def __enter__(self) -> "WatchServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
