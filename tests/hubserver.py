"""A local test Hub on 127.0.0.1: the endpoints, headers and JSON the real huggingface_hub client
needs (as the client library calls the Hub), plus fault injection and a count of bytes served.

Run standalone (``python tests/hubserver.py PORTFILE``) for tests that need it in another process.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Repo:
    def __init__(self, repo_id: str, files: dict[str, bytes], gated: bool = False):
        self.id = repo_id
        self.files = files
        self.gated = gated


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.bytes_served = 0
        self.last_sent_at: float | None = None  # time.monotonic() just before the last body write
        self.requests: list[tuple[str, str, dict]] = []
        self.cut_after: int | None = None  # close the body (gracefully) after this many bytes
        self.stall_after: int | None = None  # stop sending after this many bytes, keep the socket
        self.stall_seconds = 3600.0
        self.corrupt = False  # flip one byte, same length
        self.chunk_delay = 0.0  # seconds between 64 KiB chunks: a slow download others can overlap
        self.flowing = threading.Event()  # file bodies are sent only while set: clear it to hold a
        self.flowing.set()  # download in flight (its client holds the file's lock) until set again
        self.commit = COMMIT  # the commit id the listing answers (a hostile Hub may lie)
        self.valid_token: str | None = None
        self._server: ThreadingHTTPServer | None = None
        self._stop = threading.Event()

    def add(self, repo_id: str, files: dict[str, bytes], gated: bool = False) -> None:
        self.repos[repo_id] = Repo(repo_id, files, gated)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self, port: int = 0) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.flowing.set()
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    # -- routing ---------------------------------------------------------------------------
    def _error(self, h, status: int, code: str | None, msg: str, head: bool) -> None:
        body = json.dumps({"error": msg}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", msg)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", "0" if head else str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _json(self, h, obj) -> None:
        body = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _denied(self, h, repo: Repo) -> int | None:
        """None when allowed; 401 without a token, 403 with a wrong one (gated repo)."""
        if not repo.gated:
            return None
        auth = h.headers.get("Authorization")
        if auth is None:
            return 401
        return None if self.valid_token and auth == f"Bearer {self.valid_token}" else 403

    def _repo_or_error(self, h, repo_id: str, head: bool) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository not found", head)
            return None
        status = self._denied(h, repo)
        if status:
            self._error(h, status, "GatedRepo", "Access to this repo is restricted", head)
            return None
        return repo

    def _handle(self, h, head: bool) -> None:
        u = urlparse(h.path)
        path = u.path
        self.requests.append(("HEAD" if head else "GET", h.path, dict(h.headers)))
        if path == "/api/models":
            q = parse_qs(u.query).get("search", [""])[0].lower()
            return self._json(h, [{"id": r.id} for r in self.repos.values() if q in r.id.lower()])
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", path)
        if m:
            repo = self._repo_or_error(h, m.group(1), head)
            if repo is None:
                return
            sib = []
            for name, data in repo.files.items():
                sha = hashlib.sha256(data).hexdigest()
                sib.append({"rfilename": name, "size": len(data), "blobId": sha[:40],
                            "lfs": {"sha256": sha, "size": len(data), "pointerSize": 134}})
            return self._json(h, {"id": repo.id, "sha": self.commit, "siblings": sib,
                                  "lastModified": "2026-01-01T00:00:00.000Z"})
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            repo = self._repo_or_error(h, m.group(1), head)
            if repo is None:
                return
            name = unquote(m.group(3))
            if name not in repo.files:
                return self._error(h, 404, "EntryNotFound", "Entry not found", head)
            return self._file(h, repo.files[name], head)
        return self._error(h, 404, None, "not found", head)

    def _file(self, h, data: bytes, head: bool) -> None:
        sha = hashlib.sha256(data).hexdigest()
        size = len(data)
        start = 0
        rng = h.headers.get("Range")
        if rng and not head:
            mm = re.match(r"bytes=(\d+)-", rng)
            if mm:
                start = int(mm.group(1))
                if start >= size:
                    return self._error(h, 416, None, "range not satisfiable", head)
        body = data[start:]
        if self.corrupt and body:
            body = body[:-1] + bytes([body[-1] ^ 0xFF])
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", f'"{sha}"')
        h.send_header("Content-Length", str(size if head else len(body)))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        if head:
            return
        sent = 0
        step = 64 * 1024
        if self.stall_after is not None and start >= self.stall_after and body:
            self._stop.wait(self.stall_seconds)  # stalled for every request past the mark
            return
        while sent < len(body):
            limit = None
            for cut in (self.cut_after, self.stall_after):
                if cut is not None and start + sent < cut:
                    limit = min(limit or cut, cut)
            chunk = body[sent:sent + step]
            if limit is not None and start + sent + len(chunk) > limit:
                chunk = chunk[:limit - start - sent]
            if chunk:
                self.flowing.wait()
                if self._stop.is_set():
                    return
                self.last_sent_at = time.monotonic()  # before the write: never after the client has it
                try:
                    h.wfile.write(chunk)
                    h.wfile.flush()
                except OSError:
                    return
                sent += len(chunk)
                self.bytes_served += len(chunk)
                if self.chunk_delay:
                    time.sleep(self.chunk_delay)
            if self.stall_after is not None and start + sent >= self.stall_after and sent < len(body):
                self._stop.wait(self.stall_seconds)
                return
            if self.cut_after is not None and start + sent >= self.cut_after and sent < len(body):
                h.close_connection = True
                return


def _main() -> None:  # pragma: no cover - used as a subprocess
    portfile = sys.argv[1]
    spec = json.loads(sys.argv[2])
    hub = FakeHub()
    for repo, files in spec["repos"].items():
        hub.add(repo, {n: bytes.fromhex(h) if isinstance(h, str) else b"" for n, h in files.items()})
    for k in ("cut_after", "stall_after"):
        setattr(hub, k, spec.get(k))
    hub.start()
    with open(portfile, "w") as f:
        f.write(hub.url)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    _main()
