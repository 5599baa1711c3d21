"""Does the sweep's baseline run at the speed its own cost probe measured? The probe's plain step
(``CostRecord.plain_ms``: the engine's own decode loop, the same loop and clock as the runs, issue
37) and the sweep's baseline runs both time one plain decode step a token. When they differ by more
than their noise, something ran differently between them (the engine's settings, another program,
a throttled CPU), and every speedup measured against that baseline reads high (a slow baseline) or
low (a fast one): the verdict says so.

    f = baseline_finding(records, probe)   # a Finding, or None
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from app.core.analysis.findings import Finding
from app.core.records.cost import CostRecord
from app.core.records.schema import RunRecord

CODE = "baseline_vs_probe"
MIN_GAP = 0.08  # a gap below this is within what depth and warm-up alone move (a fraction)
MIN_RUNS = 2


def _rel_noise(xs: Sequence[float]) -> float:
    """Half the 10-90 % spread of ``xs`` relative to their median (0 for fewer than 3)."""
    if len(xs) < 3:
        return 0.0
    s = sorted(xs)
    lo, hi = s[int(0.1 * (len(s) - 1))], s[math.ceil(0.9 * (len(s) - 1))]
    return (hi - lo) / 2 / statistics.median(s)


def _baseline_ms(records: Sequence[RunRecord], engine: str) -> list[float]:
    """ms a token of the finished, undisturbed baseline runs through ``engine``."""
    return [1000.0 / r.tok_s for r in records if r.arm_kind == "baseline" and r.status == "ok" and r.tok_s
            and r.engine == engine and "disturbed" not in r.flags]


def baseline_gap(records: Sequence[RunRecord], probe: CostRecord | None) -> tuple[float, float, float] | None:
    """(gap, baseline ms a token, probe ms a token): gap = baseline / probe - 1, when the probe
    timed the plain step through the runs' engine and enough baseline runs finished; else None."""
    got = _gap(records, probe)
    return got[:3] if got is not None else None


def _gap(records: Sequence[RunRecord], probe: CostRecord | None) -> tuple[float, float, float, float] | None:
    """baseline_gap's three, and the relative noise of the two medians together."""
    if probe is None or probe.plain_ms is None or not probe.plain_ms.median > 0:
        return None
    base = _baseline_ms(records, probe.engine)
    if len(base) < MIN_RUNS:
        return None
    ms = statistics.median(base)
    noise = math.hypot(_rel_noise(base), probe.plain_ms.rel_width / 2)
    return ms / probe.plain_ms.median - 1.0, ms, probe.plain_ms.median, noise


def baseline_finding(records: Sequence[RunRecord], probe: CostRecord | None) -> Finding | None:
    """The warning when the baseline runs' step differs from the probe's plain step by more than
    the noise of both (and at least MIN_GAP), else None."""
    got = _gap(records, probe)
    if got is None:
        return None
    gap, base_ms, probe_ms, noise = got
    if abs(gap) <= max(MIN_GAP, 2 * noise):
        return None
    slower = gap > 0
    return Finding(CODE, f"the baseline ran {abs(gap):.0%} {'slower' if slower else 'faster'} than the decode step "
                   f"the probe measured ({base_ms:.2f} against {probe_ms:.2f} ms a token): the speedups may "
                   f"read {'high' if slower else 'low'}",
                   "something ran differently between the probe and the runs (another program, the "
                   "engine's settings, a throttled CPU): probe again and measure again on a quiet machine")
