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
