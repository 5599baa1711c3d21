"""Reading a user's llama-server: GET ``/metrics``, ``/props``, ``/slots`` and ``/health``, and
nothing else (watch never changes the server). An API key comes from a file or the
``LLAMA_API_KEY`` variable (llama-server's own), is sent only to the server watched, and is
taken out of every message (app.core.common.redact); it is never written anywhere."""

from __future__ import annotations

import dataclasses
import errno
import http.client
import io
import os
import re
import select
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from app.core.common import jsonsafe
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError, os_reason
from app.core.common.redact import redact, remember
from app.core.common.text import shown

KEY_ENV = "LLAMA_API_KEY"
ENDPOINTS = ("/metrics", "/props", "/slots", "/health")
MAX_BODY = 8 * 2**20  # no page of these is near this; more is not a llama-server


@dataclasses.dataclass(frozen=True)
class Page:
    status: int
    body: str
    headers: dict[str, str]
    t: float  # time.monotonic() when the answer came


def read_api_key(key_file: str | None) -> str | None:
    """The key from ``key_file`` (its first line that is not empty or a # comment, as
    llama-server reads --api-key-file), else from LLAMA_API_KEY, else None. Remembered for
    redaction either way."""
    key = None
    if key_file:
        p = Path(key_file).expanduser()
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise UserError(f"{p}: cannot read the API key file ({os_reason(e)})") from None
        except UnicodeDecodeError:
            raise UserError(f"{p}: the API key file is not text") from None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if not lines:
            raise UserError(f"{p}: the API key file holds no key")
        key = lines[0]
    else:
        key = os.environ.get(KEY_ENV) or None
    remember(key)
    if key is not None and any(not (0x21 <= ord(ch) <= 0x7E) for ch in key):
        where = key_file or KEY_ENV
        raise UserError(f"{where}: the API key holds a space, a control character or a non-ASCII character; "
                        "an HTTP header cannot carry it")
    return key


def without_credentials(url: str) -> str:
    """``url`` with any ``user:password@`` taken out (for a message that quotes it)."""
    return re.sub(r"(?i)^(\s*(?:[a-z][a-z0-9+.\-]*:)?//)[^\s'\"<>]*@", r"\1", url) if "@" in url else url


def normal_url(url: str) -> str:
    """``url`` as scheme://host:port (a bare host:port gets http://); a path or query is refused,
    since watch reads only its four endpoints. An address with a user name or password (an @) is
    refused first, without quoting it: a message never repeats a password."""
    if "@" in url:
        raise UserError("a user name or password in the server's address is not supported (and is not shown "
                        f"here); give the server's address alone and its key with --api-key-file or {KEY_ENV}")
    shown_url = shown(without_credentials(url), 120)
    u = url.strip()
    if "://" not in u:
        u = "http://" + u
    try:
        parts = urllib.parse.urlsplit(u)
        host = parts.hostname
    except ValueError:  # an unclosed [ of an IPv6 address
        raise UserError(f"{shown_url}: not a server address (expected e.g. http://127.0.0.1:8080)") from None
    if parts.scheme not in ("http", "https") or not host:
        raise UserError(f"{shown_url}: not a server address (expected e.g. http://127.0.0.1:8080)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise UserError(f"{shown_url}: give the server's address only (e.g. http://127.0.0.1:8080), "
                        "watch reads its /metrics, /props, /slots and /health itself")
    try:
        parts.port
    except ValueError:
        raise UserError(f"{shown_url}: the port is not a number from 0 to 65535") from None
    if any(not (0x21 <= ord(ch) <= 0x7E) for ch in parts.netloc):
        raise UserError(f"{shown_url}: the address holds a space, a control character or a non-ASCII character")
    return f"{parts.scheme}://{parts.netloc}"


def is_local(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


class _Stopped(Exception):
    """A read cut short: its deadline passed (``expired``) or the watch was cancelled."""

    def __init__(self, expired: bool):
        super().__init__("timed out" if expired else "cancelled")
        self.expired = expired


class _Bounded:
    """A connected socket whose every read and write ends by ``end`` (time.monotonic()) or soon
    after ``cancel``: a per-operation timeout alone lets a server that sends a byte a second hold a
    read for ever. Waits in steps of ``STEP`` seconds, checking both between them."""

    STEP = 0.2

    def __init__(self, sock: socket.socket, end: float, cancel: CancelToken | None):
        self._sock, self._end, self._cancel = sock, end, cancel
        self._files, self._closed = 0, False

    def _left(self) -> float:
        if self._cancel is not None and self._cancel.cancelled:
            raise _Stopped(expired=False)
        left = self._end - time.monotonic()
        if left <= 0:
            raise _Stopped(expired=True)
        return left

    def wait(self, op: Callable[[], Any]) -> Any:
        while True:
            self._sock.settimeout(min(self._left(), self.STEP))
            try:
                return op()
            except TimeoutError:
                continue

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._left())  # a few hundred bytes: the kernel takes them at once
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: Any, **kw: Any) -> io.BufferedReader:
        self._files += 1  # as socket.makefile: the socket stays open while a response reads it
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        self._closed = True
        if self._files <= 0:
            self._sock.close()

    def file_closed(self) -> None:
        self._files -= 1
        if self._closed and self._files <= 0:
            self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Reader(io.RawIOBase):
    def __init__(self, b: _Bounded):
        self._b = b

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        return int(self._b.wait(lambda: self._b._sock.recv_into(buf)))

    def close(self) -> None:
        if not self.closed:
            self._b.file_closed()
        super().close()


_PENDING = {errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY, getattr(errno, "WSAEWOULDBLOCK", errno.EAGAIN)}


def _connect(end: float, cancel: CancelToken | None, step: float = _Bounded.STEP) -> Callable[..., socket.socket]:
    """socket.create_connection's stand-in for http.client: connects without blocking, checking
    ``end`` and ``cancel`` every ``step`` seconds (an address that never answers a connect)."""

    def connect(address: tuple[str, int], timeout: Any = None, source_address: Any = None) -> socket.socket:
        host, port = address
        last: Exception | None = None
        for family, kind, proto, _, addr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                err = sock.connect_ex(addr)
                bounded = _Bounded(sock, end, cancel)
                while err in _PENDING:
                    _, ready, failed = select.select([], [sock], [sock], min(bounded._left(), step))
                    if ready or failed:  # Windows says a refused connect in the third list
                        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
                sock.settimeout(max(end - time.monotonic(), 0.001))
                return sock
            except BaseException as e:
                sock.close()
                if isinstance(e, OSError):
                    last = e
                    continue
                raise
        raise last or OSError("no address to connect to")

    return connect


class Client:
    """GETs to one server. Errors (refused, timed out, not HTTP) become UserErrors naming the
    server, with any key taken out. Every read ends within ``timeout`` seconds, or by the
    ``deadline`` given, or soon after ``cancel`` (which raises Cancelled)."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 10.0):
        self.url = normal_url(url)
        parts = urllib.parse.urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port
        self._key = api_key
        self.timeout = timeout

    def get(self, path: str, deadline: float | None = None, cancel: CancelToken | None = None) -> Page:
        if path not in ENDPOINTS:  # the one rule of watch: read these and nothing else
            raise ValueError(f"watch does not read {path}")
        if cancel is not None and cancel.cancelled:
            raise Cancelled()
        now = time.monotonic()
        end = now + self.timeout if deadline is None else min(deadline, now + self.timeout)
        if end <= now:
            raise UserError(f"{self.url}: no time left to read {path} (the watch is over)")
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=end - now)
        conn._create_connection = _connect(end, cancel)  # type: ignore[attr-defined]
        headers = {"Accept": "*/*"}
        if self._key and path != "/health":
            headers["Authorization"] = f"Bearer {self._key}"
        sock: socket.socket | None = None
        try:
            conn.connect()
            sock = conn.sock
            conn.sock = _Bounded(conn.sock, end, cancel)  # type: ignore[assignment]
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            raw = resp.read(MAX_BODY + 1)
            page = Page(resp.status, raw[:MAX_BODY].decode("utf-8", errors="replace"),
                        {k.lower(): v for k, v in resp.getheaders()}, time.monotonic())
        except _Stopped as e:
            if not e.expired:
                raise Cancelled() from None
            raise UserError(f"{self.url}: no whole answer to GET {path} within {end - now:.1f} s") from None
        except (OSError, http.client.HTTPException, ValueError) as e:
            why = shown(redact(str(e) or type(e).__name__), 160)
            raise UserError(f"{self.url}: no answer to GET {path} ({why})") from None
        finally:
            conn.close()
            if sock is not None:  # whatever the response left open
                sock.close()
        if page.status == 401:
            raise UserError(f"{self.url}: the server wants an API key (401 on {path}): give it with "
                            f"--api-key-file FILE or in {KEY_ENV}" if not self._key else
                            f"{self.url}: the server refused the API key (401 on {path})")
        return page

    def get_json(self, path: str, deadline: float | None = None, cancel: CancelToken | None = None) -> Any:
        """The JSON of ``path``, or None when the server does not give it (an error status, not
        JSON). JSON nested past jsonsafe's limit is a UserError: no llama-server sends it."""
        page = self.get(path, deadline, cancel)
        if page.status != 200:
            return None
        try:
            return jsonsafe.loads(page.body)
        except jsonsafe.TooDeep:
            raise UserError(f"{self.url}: {path} is JSON nested deeper than {jsonsafe.MAX_DEPTH} levels: "
                            "not a llama-server's answer") from None
        except ValueError:
            return None
