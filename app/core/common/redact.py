"""Secrets never reach a message: ``redact`` takes out every known secret (the Hub token as read,
and whatever the token variables hold) and anything shaped like a credential (an
``Authorization: Bearer ...`` value or any other ``Authorization`` header's, a Hugging Face token,
the ``user:password@`` of a URL, an API key given as ``--api-key KEY``, ``api_key=KEY`` or
``"x-api-key": "KEY"``) from text bound for the screen or the log. Used where exceptions become
messages (the Hub client, the CLI's last handler, watch's client) and by the log's formatter."""

from __future__ import annotations

import os
import re

# where a Hub token may come from; the children the app starts (llama-server) never get them
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")

MASK = "[redacted]"
_MIN_PIECE = 6  # a shorter piece of a broken secret is too common a string to take out of text

_BEARER_RE = re.compile(r"(?i)\b(bearer)(\s+)[^\s'\",;)}\]]+")
_HF_TOKEN_RE = re.compile(r"\bhf_[A-Za-z0-9]{16,}")
# a URL's user information (scheme://user:password@host): everything between :// and the @,
# the user name too (it is half of the credential), up to the last @ before a space or a quote (a
# password may hold a /: more is masked rather than less)
_URL_USER_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s'\"<>]*@")
# an API key as a flag (llama-server's own --api-key KEY, --api-key=KEY; not --api-key-file)
_KEY_FLAG_RE = re.compile(r"(?i)(--api-key)(?![\w-])(\s*=\s*|\s+)(?:\"[^\"]*\"|'[^']*'|[^\s'\"]+)")
# an API key or an Authorization header as a field: api_key=KEY, "api-key": "KEY", x-api-key: KEY,
# Authorization: Basic KEY (its scheme word kept; a Bearer's value is masked by _BEARER_RE)
_KEY_FIELD_RE = re.compile(r"(?i)((?<![A-Za-z0-9_])(?:x-)?api[_-]?key|\bauthorization)(['\"]?\s*[:=]\s*['\"]?)"
                           r"(?:(basic|token|digest)\s+)?(?!bearer\s)(?!\[redacted\])[^\s'\",;&)}\]]+")
_SPLIT_RE = re.compile(r"[\x00-\x20\x7f-\x9f]+")

_known: set[str] = set()


def remember(secret: str | None) -> None:
    """Take ``secret`` out of every later message: the whole of it, and each piece of it between
    control characters or spaces (a token with a line break shows up as its lines, or in a
    ``repr`` with ``\\n`` between them)."""
    for s in _forms(secret):
        _known.add(s)


def _forms(secret: str | None) -> list[str]:
    if not secret:
        return []
    out = [secret, secret.strip(), repr(secret)[1:-1]]
    out += _SPLIT_RE.split(secret)
    return [s for s in out if len(s) >= _MIN_PIECE]


def redact(text: object) -> str:
    """``text`` as a string with every secret masked."""
    s = str(text)
    known = set(_known)
    for var in TOKEN_ENV_VARS:
        known.update(_forms(os.environ.get(var)))
    for secret in sorted(known, key=len, reverse=True):  # the whole before its pieces
        if secret in s:
            s = s.replace(secret, MASK)
    s = _BEARER_RE.sub(lambda m: m.group(1) + m.group(2) + MASK, s)
    s = _URL_USER_RE.sub(lambda m: m.group(1) + MASK + "@", s)
    s = _KEY_FLAG_RE.sub(lambda m: m.group(1) + m.group(2) + MASK, s)
    s = _KEY_FIELD_RE.sub(lambda m: m.group(1) + m.group(2) + (m.group(3) + " " if m.group(3) else "") + MASK, s)
    return _HF_TOKEN_RE.sub(MASK, s)
