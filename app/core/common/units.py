"""One formatter per unit, for every size and ratio the app shows (core, CLI and window alike).

    size(5 * 2**30)            -> "5.00 GiB"   (MiB below 1 GiB: "3.4 MiB", "512 MiB")
    size(3 << 20, 1, "MiB")    -> "3.0 MiB"    (a fixed unit and precision where a line needs one)
    amount(3 << 20, "MiB", 1)  -> "3.0"        (the number alone, for "3.0/10.0 MiB")
    ratio(1.337)               -> "1.34x"
    signed_percent(0.05)       -> "+5 %"       (a relative error)
    UNITS["ratio"](1.337)      -> "1.34x"      (the registry the field lists format by)
"""

from __future__ import annotations

from typing import Callable

KiB, MiB, GiB = 2**10, 2**20, 2**30
_BYTES = {"KiB": KiB, "MiB": MiB, "GiB": GiB}


def in_unit(b: float, unit: str) -> float:
    """Bytes in ``unit`` ("KiB", "MiB" or "GiB") as a number."""
    return b / _BYTES[unit]


def amount(b: float, unit: str, digits: int) -> str:
    """Bytes in ``unit`` with ``digits`` decimals, without the unit's name."""
    return f"{in_unit(b, unit):.{digits}f}"


def size(b: float, digits: int | None = None, unit: str | None = None) -> str:
    """Bytes for people: GiB from 1 GiB up, MiB below (a tiny model's parts are not all "0.00 GiB");
    by default two decimals in GiB, and in MiB one below 10 MiB and none above. ``unit`` fixes the
    unit and ``digits`` the decimals where a line needs them."""
    if unit is None:
        unit = "GiB" if abs(b) >= GiB else "MiB"
    if digits is None:
        digits = 2 if unit == "GiB" else 1 if abs(b) < 10 * MiB else 0
    return f"{amount(b, unit, digits)} {unit}"


def ratio(x: float | None, digits: int = 2) -> str:
    """A ratio (a speedup, a predicted or measured B/A): "1.34x"; "-" when there is none."""
    return "-" if x is None else f"{x:.{digits}f}x"


def signed_percent(x: float, digits: int = 0) -> str:
    """A relative difference as a signed percentage: 0.05 -> "+5 %"."""
    return f"{100 * x:+.{digits}f} %"


def percent(x: float, digits: int = 0) -> str:
    """A fraction as a percentage: 0.734 -> "73%"."""
    return f"{100 * x:.{digits}f}%"


def fixed2(x: float) -> str:
    """A plain number with two decimals (alpha, mean accepted length)."""
    return f"{x:.2f}"


UNITS: dict[str, Callable[[float], str]] = {
    "size": size, "ratio": ratio, "signed_percent": signed_percent, "percent": percent, "fixed2": fixed2,
}


def _rounded_seconds(seconds: float) -> int:
    """Seconds under a minute as an estimate says them: to the ten from 15 s up, at least 1."""
    return int(max(1, round(seconds / 10) * 10 if seconds >= 15 else round(seconds)))


def duration(seconds: float, style: str = "span") -> str:
    """The one formatter of durations, in three styles:

        duration(45)                 -> "45 s"          ("span": a time that passed; minutes from
        duration(300)                -> "5 minutes"      2 min up, hours from 2 h up)
        duration(40, "about")        -> "about 40 s"    (an estimate: "about 2 min", "about 1.5 h")
        duration(90, "more")         -> "about 2 more minutes" (an estimate of what is left)
    """
    if style == "span":
        s = max(0, round(seconds))
        if s < 120:
            return f"{s} s"
        if s < 7200:
            return f"{s // 60} minutes"
        return f"{s / 3600:.1f} hours"
    more = style == "more"
    if seconds < 60:
        return f"about {_rounded_seconds(seconds)} " + ("more seconds" if more else "s")
    if seconds < 3600:
        m = round(seconds / 60)
        return f"about {m} more minute{'s' if m != 1 else ''}" if more else f"about {m:.0f} min"
    return f"about {seconds / 3600:.1f} " + ("more hours" if more else "h")
