"""Checks of one value read from a results file, for the record readers (cost.py, watch.py): each
returns the value as its field declares it or raises ``BadField`` (a ValueError) naming the field
and what it holds, shown short and on one line. A record is outside input: a hand-edited or
hostile line may hold a string for a number, a list for an address, NaN, 1e400, a 400-digit
integer or a negative count, and none of those may reach the arithmetic, the sorting or the
messages that come after."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any, Callable, TypeVar

from app.core.common.text import clean_strings, one_line, shown

T = TypeVar("T")

MAX_TEXT = 4096  # a path, an address, a sentence; no field of a record comes near it
MAX_ITEMS = 1024  # a list's items (devices, GPUs, positions, predictions)
MAX_COUNT = 2**53  # a count beyond this cannot even be a float exactly


class BadField(ValueError):
    """A field of a record that is missing, of another type, or beyond its bounds."""


def describe(v: Any) -> str:
    """A value as a message shows it: short, one line, a huge integer by its size."""
    if type(v) is int and abs(v) > MAX_COUNT:
        return f"an integer of about {int(v.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(v, (list, dict)):
        return f"a {'list' if isinstance(v, list) else 'JSON object'} of {len(v)} items"
    return shown(repr(v), 60)


def _bad(name: str, v: Any, want: str) -> BadField:
    return BadField(f"{name} is {describe(v)}, not {want}")


def integer(v: Any, name: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    """A JSON integer (not a bool, not a float) from ``lo`` to ``hi``."""
    if type(v) is not int or not lo <= v <= hi:
        raise _bad(name, v, f"an integer from {lo:,} to {hi:,}")
    return v


def number(v: Any, name: str, lo: float, hi: float, *, above: bool = False) -> float:
    """A finite JSON number (an integer or a float, not a bool) within ``lo``..``hi`` (above ``lo``
    when ``above``), as a float."""
    want = f"a finite number above {lo:g}, at most {hi:g}" if above else f"a finite number from {lo:g} to {hi:g}"
    if type(v) not in (int, float) or (type(v) is int and abs(v) > MAX_COUNT):
        raise _bad(name, v, want)
    x = float(v)
    if not math.isfinite(x) or x > hi or x < lo or (above and x == lo):
        raise _bad(name, v, want)
    return x


def text(v: Any, name: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise _bad(name, v, f"a text of at most {limit:,} characters")
    return one_line(v)  # outside text: one escaped line, so no field can print a line of its own


def flag(v: Any, name: str) -> bool:
    if type(v) is not bool:
        raise _bad(name, v, "true or false")
    return v


def mapping(v: Any, name: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _bad(name, v, "a JSON object")
    return v


def items(v: Any, name: str, limit: int = MAX_ITEMS) -> list[Any]:
    if not isinstance(v, list) or len(v) > limit:
        raise _bad(name, v, f"a list of at most {limit:,} items")
    return v


def optional(check: Callable[..., T], v: Any, name: str, *args: Any, **kw: Any) -> T | None:
    """``check`` of a value that may also be null."""
    return None if v is None else check(v, name, *args, **kw)


def timestamp(v: Any, name: str) -> str:
    """An ISO 8601 time as the app writes them ("2026-12-02T04:10:00.000+00:00", "...Z"); the empty
    string says none was recorded."""
    s = text(v, name, 64)
    if s:
        try:
            dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            raise _bad(name, v, "an ISO 8601 time") from None
    return s


_KEY = re.compile(r"[0-9]{1,6}")


def int_key(k: Any, name: str, lo: int, hi: int) -> int:
    """A mapping's key that stands for an integer ("3", as json writes an int key): ASCII digits only
    (int() would also take " 3", "3_0" and other scripts' digits), within ``lo``..``hi``."""
    if not isinstance(k, str) or not _KEY.fullmatch(k) or not lo <= int(k) <= hi:
        raise BadField(f"{name} has the key {describe(k)}, not a whole number from {lo} to {hi}")
    return int(k)


def host(v: Any, name: str = "host") -> dict[str, Any]:
    """The machine a record was made on, as schema.host_info writes it: what the readers compare
    (os, machine, cpu_count, gpus' names) of the types they compare; other keys as they are."""
    d = mapping(v, name)
    for key in ("os", "machine", "python"):
        optional(text, d.get(key), f"{name}.{key}", 512)
    optional(integer, d.get("cpu_count"), f"{name}.cpu_count", 0, 2**20)
    for i, g in enumerate(optional(items, d.get("gpus"), f"{name}.gpus", 256) or ()):
        mapping(g, f"{name}.gpus[{i}]")
    if "unified_memory" in d:
        optional(flag, d["unified_memory"], f"{name}.unified_memory")
    out = clean_strings(dict(d))
    assert isinstance(out, dict)
    return out
