"""From a window's counts to the speedup of every draft width, and a recommendation.

The counts are the server's own: verification steps and accepted drafts per position. The
conditional acceptance at position i is ``accepted[i] / accepted[i-1]`` (``accepted[-1]`` = the
steps), a binomial share; app.core.analysis.positions turns the conditionals into accepted
drafts per step for any width K (the last measured conditional carries on past the server's own
width: those widths are *extrapolated*), and app.core.analysis.breakeven prices a step with
the probe's costs. The interval of each prediction puts every conditional at its Wilson 95 %
bound at once (low, then high): the speedup rises with each conditional, so these bound it,
and more widely than a joint 95 % interval would. Off is 1.00 by definition."""

from __future__ import annotations

import dataclasses
import math

from app.core.analysis import breakeven
from app.core.analysis.positions import PositionModel
from app.core.analysis.watched import duration as duration  # one wording of a window's length
from app.core.watch.window import Counts

MIN_STEPS = 50  # fewer verification steps than this: no prediction (the intervals would say nothing)
CLEAR = 0.01  # a change is recommended when even its interval's low end gains at least this much
Z = 1.96


@dataclasses.dataclass(frozen=True)
class Prediction:
    k: int  # 0: off
    speedup: float
    lo: float
    hi: float
    extrapolated: bool


@dataclasses.dataclass(frozen=True)
class Recommendation:
    k: int | None  # 0: off; None: nothing to recommend (the reason says why)
    reason: str


def wilson(x: int, n: int, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of x successes in n trials (0..1 for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = x / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def conditionals(per_pos: tuple[int, ...], steps: int) -> list[tuple[int, int]]:
    """(accepted at i, reached i) for each position a step reached."""
    out, den = [], steps
    for a in per_pos:
        if den <= 0:
            break
        out.append((min(a, den), den))
        den = a
    return out


def models(counts: Counts, server_k: int) -> tuple[PositionModel, PositionModel, PositionModel] | None:
    """The position model at the counts, at every conditional's lower and upper bound."""
    pairs = conditionals(counts.accepted_per_pos, counts.draft_steps)
    if not pairs:
        return None
    ks = (server_k,)
    bounds = [wilson(a, n) for a, n in pairs]
    return (PositionModel(tuple(a / n for a, n in pairs), ks), PositionModel(tuple(b[0] for b in bounds), ks),
            PositionModel(tuple(b[1] for b in bounds), ks))


def k_max(costs: breakeven.Costs) -> int:
    """The largest width the probe priced: the whole steps it timed (a llama-server probe), or the
    verify passes (a step of K verifies K + 1 tokens)."""
    return max(costs.widths(), default=0)


def predict(counts: Counts, server_k: int, costs: breakeven.Costs) -> list[Prediction]:
    """Off, then K = 1 .. the largest the probe priced."""
    ms = models(counts, server_k)
    if ms is None:
        return []
    mid, lo, hi = ms
    out = [Prediction(0, 1.0, 1.0, 1.0, False)]
    for k in range(1, k_max(costs) + 1):
        out.append(Prediction(k, mid.speedup(k, costs), lo.speedup(k, costs), hi.speedup(k, costs),
                              k > server_k or mid.extrapolates(k)))
    return out


def _pct(x: float, unit: str = " %") -> str:
    """A relative change in whole percent, signed (0 without a sign: never "-0")."""
    n = round(x * 100)
    return f"{n:+d}{unit}" if n else f"0{unit}"


def recommend(preds: list[Prediction], counts: Counts, server_k: int) -> Recommendation:
    """The width to run and why, against the one the server runs now."""
    by_k = {p.k: p for p in preds}
    head = (f"over the last {duration(counts.seconds)} ({counts.draft_steps:,} draft steps): acceptance by "
            f"position {' / '.join(f'{r:.2f}' for r in counts.rates)}; you run K={server_k}")
    cur = by_k.get(server_k)
    if cur is None:
        return Recommendation(None, f"{head}; the probe does not price K={server_k}")
    if cur.hi < 1.0:
        return Recommendation(0, f"{head}; MTP costs you {(1 - cur.speedup) * 100:.0f} % here "
                                 f"({cur.speedup:.2f}x [{cur.lo:.2f}, {cur.hi:.2f}]): turn it off for this work")
    best = max(preds, key=lambda p: p.speedup)
    if best.k == server_k:
        return Recommendation(server_k, f"{head}, the best predicted: {cur.speedup:.2f}x "
                                        f"[{cur.lo:.2f}, {cur.hi:.2f}] over plain decoding; K={server_k} is fine")
    gains = [best.speedup / cur.speedup - 1]
    if best.k == 0:
        gains += [1 / cur.hi - 1, 1 / cur.lo - 1] if cur.lo > 0 else [1 / cur.hi - 1]
    else:
        gains += [best.lo / cur.lo - 1 if cur.lo > 0 else gains[0], best.hi / cur.hi - 1]
    g, g_lo, g_hi = gains[0], min(gains), max(gains)
    name = "off" if best.k == 0 else f"K={best.k}"
    mark = " (extrapolated)" if best.extrapolated else ""
    said = f"{name}{mark} is predicted {_pct(g)} [{_pct(g_lo, '')}, {_pct(g_hi, '')}]"
    if g_lo < CLEAR:
        return Recommendation(server_k, f"{head}; {said}: too close to call, K={server_k} is fine")
    if best.k == 0:
        return Recommendation(0, f"{head}; {said}: MTP does not pay for this work; turn it off")
    if best.extrapolated:  # past what the server drafts: a flat tail assumed, so a thing to try
        return Recommendation(best.k, f"{head}; {said}: worth trying K={best.k} (--spec-draft-n-max {best.k}), "
                                      "then watch again to measure it")
    return Recommendation(best.k, f"{head}; {said}: run K={best.k} (--spec-draft-n-max {best.k})")
