"""One reader for JSON from outside (results files, ``/props``, ``/slots``, the Hub, release
listings): it refuses a document nested deeper than ``MAX_DEPTH`` with a clear ``ValueError``
before any parser recurses into it (Python's json and msgspec both end in RecursionError on
``[`` x 100,000, which no caller expects), and raises only ``ValueError`` for a bad document."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64  # the app's own documents nest 6 deep at most; llama-server's /props about 5

# a JSON string (skipped whole: brackets inside it are text) or one bracket
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


class TooDeep(ValueError):
    """A JSON document nested deeper than the limit."""


def _deeper_than(raw: bytes, limit: int) -> bool:
    """Whether ``raw``'s arrays and objects nest deeper than ``limit``, read without parsing (and
    no further than the first place that does)."""
    d = 0
    for m in _TOKENS.finditer(raw):
        c = m.group()
        if c in (b"[", b"{"):
            d += 1
            if d > limit:
                return True
        elif c in (b"]", b"}"):
            d -= 1
    return False


def check_depth(raw: bytes | bytearray | str, limit: int = MAX_DEPTH) -> None:
    """Raise ``TooDeep`` when ``raw`` nests deeper than ``limit`` (a line with fewer brackets than
    that, nearly every one, is passed on two counts and no scan)."""
    b = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    if b.count(b"[") + b.count(b"{") > limit and _deeper_than(b, limit):
        raise TooDeep(f"JSON nested deeper than {limit} levels")


def loads(raw: bytes | bytearray | str, limit: int = MAX_DEPTH) -> Any:
    """``json.loads`` for outside JSON: ``TooDeep`` past ``limit`` levels, ``ValueError`` (never
    RecursionError) for anything else that is not JSON."""
    check_depth(raw, limit)
    try:
        return json.loads(raw)
    except RecursionError as e:  # pragma: no cover - check_depth refuses such documents first
        raise TooDeep(f"JSON nested too deep ({e})") from None
