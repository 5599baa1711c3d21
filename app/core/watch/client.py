"""Reading a user's llama-server: GET ``/metrics``, ``/props``, ``/slots`` and ``/health``, and
nothing else (watch never changes the server). An API key comes from a file or the
``LLAMA_API_KEY`` variable (llama-server's own), is sent only to the server watched, and is
taken out of every message (app.core.common.redact); it is never written anywhere."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import time
import urllib.parse
from pathlib import Path
from typing import Any

from app.core.common.errors import UserError
from app.core.common.redact import redact, remember

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
            raise UserError(f"{p}: cannot read the API key file ({e.strerror or e})") from None
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


def normal_url(url: str) -> str:
    """``url`` as scheme://host:port (a bare host:port gets http://); a path or query is refused,
    since watch reads only its four endpoints."""
    u = url.strip()
    if "://" not in u:
        u = "http://" + u
    parts = urllib.parse.urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{url!r}: not a server address (expected e.g. http://127.0.0.1:8080)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise UserError(f"{url!r}: give the server's address only (e.g. http://127.0.0.1:8080), "
                        "watch reads its /metrics, /props, /slots and /health itself")
    if parts.username or parts.password:
        raise UserError("a user name or password in the address is not supported; give the key with "
                        f"--api-key-file or {KEY_ENV}")
    try:
        parts.port
    except ValueError:
        raise UserError(f"{url!r}: the port is not a number") from None
    return f"{parts.scheme}://{parts.netloc}"


def is_local(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


class Client:
    """GETs to one server. Errors (refused, timed out, not HTTP) become UserErrors naming the
    server, with any key taken out."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 10.0):
        self.url = normal_url(url)
        parts = urllib.parse.urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port
        self._key = api_key
        self.timeout = timeout

    def get(self, path: str) -> Page:
        if path not in ENDPOINTS:  # the one rule of watch: read these and nothing else
            raise ValueError(f"watch does not read {path}")
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout)
        headers = {"Accept": "*/*"}
        if self._key and path != "/health":
            headers["Authorization"] = f"Bearer {self._key}"
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            raw = resp.read(MAX_BODY + 1)
            page = Page(resp.status, raw[:MAX_BODY].decode("utf-8", errors="replace"),
                        {k.lower(): v for k, v in resp.getheaders()}, time.monotonic())
        except (OSError, http.client.HTTPException) as e:
            raise UserError(redact(f"{self.url}: no answer to GET {path} ({e or type(e).__name__})")) from None
        finally:
            conn.close()
        if page.status == 401:
            raise UserError(f"{self.url}: the server wants an API key (401 on {path}): give it with "
                            f"--api-key-file FILE or in {KEY_ENV}" if not self._key else
                            f"{self.url}: the server refused the API key (401 on {path})")
        return page

    def get_json(self, path: str) -> Any:
        """The JSON of ``path``, or None when the server does not give it (an error status, not
        JSON)."""
        page = self.get(path)
        if page.status != 200:
            return None
        try:
            return json.loads(page.body)
        except ValueError:
            return None
