"""Honest statistics for paired, interleaved measurements.

Speedup of an MTP arm over baseline is estimated from *pairs*: the MTP run and the baseline run
of the same prompt and repetition, measured back to back. The estimate is the geometric mean of
the paired ratios with a 95 % Student-t interval on the mean log-ratio (log-ratios are close to
symmetric; the t interval is exact for log-normal noise and needs no resampling). A cell's verdict
is "faster" when the whole interval is above 1, "slower" when below, else "within noise".
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import statistics
from typing import TYPE_CHECKING, Iterable, Literal, Sequence, cast

if TYPE_CHECKING:  # numpy loads only where a large file's values are vectorised (bimodal)
    import numpy as np
    from numpy.typing import NDArray

# two-sided 95 % Student t quantiles by degrees of freedom (1..30); 1.96 beyond
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042]

MIN_PAIRS = 3
MAX_PAIR_GAP_S = 120.0


def t95(df: int) -> float:
    if df < 1:
        return float("inf")
    return _T95[df - 1] if df <= len(_T95) else 1.96


@dataclasses.dataclass(frozen=True)
class Summary:
    n: int
    median: float | None
    mean: float | None
    stdev: float | None
    p10: float | None
    p90: float | None
    cv: float | None  # stdev / mean

    @classmethod
    def of(cls, xs: Iterable[float]) -> "Summary":
        v = sorted(x for x in xs if x is not None and math.isfinite(x))
        if not v:
            return cls(0, None, None, None, None, None, None)
        mean = statistics.fmean(v)
        sd = statistics.stdev(v) if len(v) > 1 else None
        return cls(len(v), statistics.median(v), mean, sd, _pct(v, 10), _pct(v, 90),
                   sd / mean if sd is not None and mean else None)


def _pct(v: Sequence[float], q: float) -> float:
    if len(v) == 1:
        return v[0]
    pos = (len(v) - 1) * q / 100
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclasses.dataclass(frozen=True)
class Ratio:
    n_pairs: int
    estimate: float | None  # geometric mean of paired ratios
    lo: float | None
    hi: float | None
    log_mean: float | None
    log_se: float | None
    anytime: bool = False  # lo, hi: an anytime-valid interval (app.core.analysis.anytime), not a fixed-sample one

    @property
    def verdict(self) -> str:
        if self.estimate is None or self.lo is None or self.hi is None:
            return "too few runs"
        if self.lo > 1.0:
            return "faster"
        if self.hi < 1.0:
            return "slower"
        return "within noise"


def paired_ratio(pairs: Iterable[tuple[float, float]]) -> Ratio:
    """``pairs`` of (mtp, baseline) speeds measured back to back."""
    logs = [math.log(a / b) for a, b in pairs if a and b and a > 0 and b > 0]
    n = len(logs)
    if n == 0:
        return Ratio(0, None, None, None, None, None)
    m = statistics.fmean(logs)
    if n == 1:
        return Ratio(1, math.exp(m), None, None, m, None)
    se = statistics.stdev(logs) / math.sqrt(n)
    h = t95(n - 1) * se
    return Ratio(n, math.exp(m), math.exp(m - h), math.exp(m + h), m, se)


def combine_ratios(parts: Sequence[tuple[float, Ratio]]) -> Ratio:
    """Weighted geometric combination of independent ratios (task mix): sum of w*log, var sum w^2 se^2."""
    parts = [(w, r) for w, r in parts if w > 0]
    means = [(w, r.log_mean) for w, r in parts if r.log_mean is not None]
    if not parts or len(means) < len(parts):
        return Ratio(0, None, None, None, None, None)
    tot = sum(w for w, _ in parts)
    m = sum(w / tot * log_mean for w, log_mean in means)
    ses = [(w, r.log_se) for w, r in parts if r.log_se is not None]
    if len(ses) < len(parts):
        return Ratio(sum(r.n_pairs for _, r in parts), math.exp(m), None, None, m, None)
    se = math.sqrt(sum((w / tot) ** 2 * log_se ** 2 for w, log_se in ses))
    n = min(r.n_pairs for _, r in parts)
    h = t95(n - 1) * se
    return Ratio(sum(r.n_pairs for _, r in parts), math.exp(m), math.exp(m - h), math.exp(m + h), m, se)


def outliers(xs: Sequence[float], threshold: float = 3.5) -> list[int]:
    """Indices of outliers by the modified z-score (median and MAD; Iglewicz & Hoaglin)."""
    if len(xs) < 4:
        return []
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    if mad == 0:
        return []
    return [i for i, x in enumerate(xs) if abs(0.6745 * (x - med) / mad) > threshold]


@dataclasses.dataclass(frozen=True)
class Bimodal:
    low: float
    high: float
    share_high: float


# From this many values on, bimodal works on a numpy array (a results file of 200k runs holds
# millions of inter-token gaps); below, and for lists, the plain loop. Both give the same answer.
VECTOR_FROM = 50_000


class _Unsure(enum.Enum):
    """The vectorised bimodal cannot vouch for its answer: the loop decides."""

    UNSURE = enum.auto()


_UNSURE = _Unsure.UNSURE


def bimodal(xs: Sequence[float] | NDArray[np.float64], min_share: float = 0.15,
            min_sep: float = 4.0) -> Bimodal | None:
    """Two separate levels in ``xs``? Best two-cluster split of the sorted values (Otsu); report it
    when both clusters hold >= ``min_share`` of the points and the gap between their medians is
    more than ``min_sep`` times the pooled within-cluster spread (MAD-based). ``xs`` may be a
    float64 numpy array."""
    if getattr(xs, "dtype", None) is not None:  # a numpy array
        array = cast("NDArray[np.float64]", xs)
        if len(array) >= VECTOR_FROM:
            found = _bimodal_array(array, min_share, min_sep)
            if found is not _UNSURE:
                return found
        xs = array.tolist()  # Python floats: numpy's own scalars square differently
    v = sorted(x for x in xs if math.isfinite(x))
    n = len(v)
    if n < 8:
        return None
    best, best_i = -1.0, 0
    total = sum(v)
    left = 0.0
    for i in range(1, n):
        left += v[i - 1]
        w0, w1 = i / n, (n - i) / n
        m0, m1 = left / i, (total - left) / (n - i)
        between = w0 * w1 * (m0 - m1) ** 2
        if between > best:
            best, best_i = between, i
    a, b = v[:best_i], v[best_i:]
    if len(a) < min_share * n or len(b) < min_share * n:
        return None
    ma, mb = statistics.median(a), statistics.median(b)

    def mad(c: list[float], m: float) -> float:
        return statistics.median(abs(x - m) for x in c) * 1.4826

    spread = max(math.sqrt((mad(a, ma) ** 2 + mad(b, mb) ** 2) / 2), 1e-12 * abs(mb))
    if (mb - ma) / spread < min_sep:
        return None
    return Bimodal(ma, mb, len(b) / n)


def _median_sorted(v: NDArray[np.float64]) -> float:
    """statistics.median of an already sorted array, as Python floats."""
    n = len(v)
    if n % 2 == 1:
        return float(v[n // 2])
    return (float(v[n // 2 - 1]) + float(v[n // 2])) / 2


def _split_scores(left: NDArray[np.float64], i: NDArray[np.float64], total: float,
                  n: int) -> NDArray[np.float64]:
    """The loop's between-class score of splits ``i`` (a float64 array), vectorised: close to the
    loop's own (its ``** 2`` rounds differently now and then), used only to shortlist."""
    d = left / i - (total - left) / (n - i)
    return (i / n) * ((n - i) / n) * (d * d)


def _bimodal_array(xs: NDArray[np.float64], min_share: float,
                   min_sep: float) -> Bimodal | None | Literal[_Unsure.UNSURE]:
    """bimodal's loop on a sorted numpy array, with the same result to the last bit: the running
    sums are numpy's cumsum (sequential, as the loop adds), the total Python's own sum, and every
    split whose vectorised score comes within 1e-12 of the best is scored again exactly as the loop
    does (its ``** 2`` is C's pow, which differs from numpy's square in the last bit now and then),
    so the first best split is the loop's. Returns _UNSURE where that argument does not hold
    (negative zeros, whose order sorted() keeps; scores that are not finite or tiny)."""
    import numpy as np  # numpy only where a large file's many values are vectorised

    a = np.asarray(xs)
    if a.dtype != np.float64:
        return _UNSURE
    v = a[np.isfinite(a)]  # a copy: sorted in place below
    if np.signbit(v[v == 0]).any():
        return _UNSURE
    v.sort()
    n = len(v)
    if n < 8:
        return None
    total = sum(itertools.chain.from_iterable(c.tolist() for c in np.array_split(v, max(1, n >> 16))))
    if not math.isfinite(total):
        return _UNSURE
    left = np.cumsum(v)  # left[i - 1] is the loop's ``left`` at split i
    chunk = 1 << 18

    def scores(s: int) -> NDArray[np.float64]:  # of splits s .. s + chunk - 1, a chunk at a time (memory)
        i = np.arange(s, min(n, s + chunk), dtype=np.float64)
        return _split_scores(left[s - 1:s - 1 + len(i)], i, total, n)

    best_np = -1.0
    for s in range(1, n, chunk):
        sc = scores(s)
        if not np.isfinite(sc).all():
            return _UNSURE
        best_np = max(best_np, float(sc.max()))
    if best_np < 1e-290:  # relative error bounds fail near the subnormals
        return _UNSURE
    best, best_i = -1.0, 0
    cut = best_np * (1 - 1e-12)
    for s in range(1, n, chunk):
        for j in np.flatnonzero(scores(s) >= cut).tolist():
            i = s + j
            lf = float(left[i - 1])
            w0, w1 = i / n, (n - i) / n
            m0, m1 = lf / i, (total - lf) / (n - i)
            between = w0 * w1 * (m0 - m1) ** 2
            if between > best:
                best, best_i = between, i
    del left  # freed before the medians (memory)
    if best_i < min_share * n or n - best_i < min_share * n:
        return None
    lo, hi = v[:best_i], v[best_i:]
    ma, mb = _median_sorted(lo), _median_sorted(hi)

    def mad(c: NDArray[np.float64], m: float) -> float:
        dev = np.subtract(c, m)
        np.abs(dev, out=dev)
        dev.sort()
        return _median_sorted(dev) * 1.4826

    spread = max(math.sqrt((mad(lo, ma) ** 2 + mad(hi, mb) ** 2) / 2), 1e-12 * abs(mb))
    if (mb - ma) / spread < min_sep:
        return None
    return Bimodal(ma, mb, (n - best_i) / n)
