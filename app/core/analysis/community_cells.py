"""The cells of a community results table, read defensively: the table's text from a file (only a
regular file, never more than ``MAX_BYTES``), a cell's text with its markup reduced, and a cell's
figure (a speed, a speedup, an acceptance) with every number's length capped before it is
converted and its value held to a plausible range.

    text = read_table_text("README.md")         # a UserError naming the file
    figure("47.8 avg (36.6-53.8)")              # 47.8; a BadFigure for a 400-digit number
    in_range("baseline", 41.2)                  # a BadFigure when no real run could measure it

Every limit is a size or a count: a hostile cell (a 40,000-digit number, an unclosed ``<`` run)
costs at most ``MAX_CELL`` characters' work, since the patterns below may backtrack over a cell
(a run of digits is tried from each of its positions) and are never run on more."""

from __future__ import annotations

import functools
import html
import math
import re

from app.core.common.errors import UserError
from app.core.common.reading import read_capped
from app.core.common import units

MAX_BYTES = 4 * 2**20  # a table file or pasted text: the community's README is some 100 KB
MAX_LINE = 64 * 2**10  # characters in one table line
MAX_CELL = 1024  # characters in one cell that is read
MAX_NUMBER = 24  # characters in one number ("1234.5678"): a longer one is no measurement
MAX_ROWS = 50_000  # a real table has hundreds; the rest of a longer one is left out, with a note

# the plausible values of each figure: (lowest, highest, whether the lowest itself is allowed)
SPEED_MAX, SPEEDUP_MAX = 1e7, 1000.0
RANGES = {"baseline": (0.0, SPEED_MAX, False), "spec": (0.0, SPEED_MAX, False),
          "speedup": (0.0, SPEEDUP_MAX, False), "acceptance": (0.0, 1.0, True), "n_max": (0.0, 1000.0, True),
          "p_min": (0.0, 1.0, True), "reps": (0.0, 1e6, True), "parallel": (0.0, 1e5, True)}
_UNITS = {"baseline": " tok/s", "spec": " tok/s", "speedup": "x"}

_TAG = re.compile(r"<[^>]*>")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
# numbers are ASCII digits only (re.ASCII: "\d" would take "３０" or "٣٠" as 30); a sign before one is kept
# so that "-30" tok/s is refused, not read as 30
_NUM = re.compile(r"([-−]\s*)?(?<![\d.])(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)", re.ASCII)  # "1e400": one number, not a 1
_RANGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*[-–—]\s*(\d+(?:\.\d+)?)", re.ASCII)
_PCT = re.compile(r"([+\-−]?)\s*(\d+(?:\.\d+)?)\s*%", re.ASCII)  # a gain written as "+33 %"
_MARKUP = re.compile(r"[<&\[*`\\]|__")
_AGGREGATE = (re.compile(r"\((\d+(?:\.\d+)?)\s*(?:aggregate|avg)?\)", re.ASCII),  # "(0.73)", "(0.48 aggregate)"
              re.compile(r"(\d+(?:\.\d+)?)\s*(?:aggregate|avg)", re.ASCII))


class BadFigure(ValueError):
    """A cell's figure that cannot be a measurement: why, without the line (the caller names it)."""


def read_table_text(path: str) -> str:
    """A community table file's text: only a regular file (a folder, device or FIFO is refused
    before a byte is read; opened without blocking, so a FIFO with no writer does not hang),
    at most MAX_BYTES of it; a UserError naming the file otherwise."""
    data = read_capped(path, "community table", MAX_BYTES)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: cannot read the community table (not UTF-8 text: {e.reason} at byte "
                        f"{e.start})") from None


def check_text(text: str, source: str) -> None:
    """A pasted or read table's size, before it is split into lines."""
    if len(text) > MAX_BYTES:
        raise UserError(f"{source}: {len(text):,} characters, more than the {units.size(MAX_BYTES, 0)} a community "
                        "table may have")


@functools.lru_cache(maxsize=1 << 16)  # a table repeats its cells (backends, quants, n-max)
def clean(cell: str) -> str:
    """A cell's text: HTML tags out (a <br> is a space), entities decoded, Markdown emphasis,
    code and links reduced to their text. The caller keeps cells to MAX_CELL characters."""
    if not _MARKUP.search(cell):  # most cells: plain text
        return " ".join(cell.split())
    s = _TAG.sub(" ", cell.replace("\\|", "|"))
    s = _LINK.sub(r"\1", html.unescape(s))
    return " ".join(s.replace("**", "").replace("`", "").replace("__", "").split()).strip("* ")


def split_row(line: str) -> list[str]:
    """The cells of a table line ("| a | b |" or "a | b"); an escaped \\| stays in its cell."""
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return [c.strip() for c in (re.split(r"(?<!\\)\|", s) if "\\|" in s else s.split("|"))]


def shown(text: str, n: int = 40) -> str:
    """A cell as a message quotes it: at most ``n`` characters."""
    return text if len(text) <= n else text[:n - 1] + "…"


def _float(digits: str) -> float:
    """One number's value, its length checked before it is converted."""
    if len(digits) > MAX_NUMBER:
        raise BadFigure(f"a number of {len(digits):,} characters")
    return float(digits)


def _long(text: str) -> None:
    if len(text) > MAX_CELL:
        raise BadFigure(f"{len(text):,} characters, more than the {MAX_CELL} a cell may have")


@functools.lru_cache(maxsize=1 << 16)
def figure(text: str) -> float | None:
    """The figure of a cell: "41.3", "**108.7**", "28.7 *", "47.8 avg (36.6-53.8)" (its first
    number), "10.5-11.1" (a range: its middle); None when it has none; BadFigure for a number
    too long to be one."""
    _long(text)
    m = _RANGE.match(text)
    if m:
        return (_float(m.group(1)) + _float(m.group(2))) / 2
    digits = _first_number(text)
    return _float(digits) if digits is not None else None


def _first_number(text: str) -> str | None:
    """The digits of the first number in ``text``, or None; BadFigure when it has a minus sign."""
    m = _NUM.search(text)
    if m and m.group(1):
        raise BadFigure(f"a negative number ({shown(m.group())})")
    return m.group(2) if m else None


@functools.lru_cache(maxsize=1 << 16)
def acceptance(text: str) -> float | None:
    """One acceptance figure: "0.78", "78 %", or a range's stated aggregate ("0.47-0.90 (0.73)",
    "0.19-0.85 (0.48 aggregate)"); None for a bare range or nothing."""
    _long(text)
    m = _AGGREGATE[0].search(text) or _AGGREGATE[1].search(text)
    digits = m.group(1) if m else None if _RANGE.match(text) else _first_number(text)
    if digits is None:
        return None
    v = _float(digits)
    if v > 100:
        raise BadFigure("above 100 %")
    return v / 100 if v > 1 else v


def speedup_figure(text: str) -> float | None:
    """A speedup cell's figure: "1.46x", or a gain in percent ("+33 %", "-1%"); None when it has none."""
    _long(text)
    pct = _PCT.search(text)
    if pct:
        return 1 + _float(pct.group(2)) / 100 * (-1 if pct.group(1) in ("-", "−") else 1)
    return figure(text)


def in_range(key: str, v: float) -> float:
    """``v`` when it is a plausible value of the figure ``key`` (RANGES), else a BadFigure."""
    lo, hi, closed = RANGES[key]
    if not (math.isfinite(v) and (lo <= v if closed else lo < v) and v <= hi):
        unit = _UNITS.get(key, "")
        top = f"{hi:,.0f}" if hi >= 1000 else f"{hi:g}"
        raise BadFigure(f"{v:g}{unit} is out of the plausible range ({'' if closed else 'above '}{lo:g} to "
                        f"{top}{unit})")
    return v


def plottable(x: float | None, y: float | None) -> bool:
    """Whether a point (a bandwidth or tok/s, a speedup) can be drawn: both finite, above 0 and
    within the plausible ranges."""
    return (x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
            and 0 < x <= SPEED_MAX and 0 < y <= SPEEDUP_MAX)
