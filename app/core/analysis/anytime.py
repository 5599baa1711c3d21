"""Anytime-valid intervals for the paired speedup: a confidence sequence on the mean per-pair log
speedup that holds at every look, however often a sweep looks and whenever it stops.

The fixed-sample 95 % t interval (app.core.analysis.stats) is right once, at a sample size fixed in
advance. A sweep that stops as soon as it is decided looks after every round; a true 1.00x then
crosses a fixed-sample interval's bound sooner or later (optional stopping). This module gives
the interval a sequential sweep decides with: **Lai's (1976) t-mixture confidence sequence**
for the mean of i.i.d. normal observations with unknown variance (as reconstructed and proved
time-uniform by Wang & Ramdas, "Anytime-valid t-tests and confidence sequences for Gaussian means
with unknown variance", 2023; the normal-mixture family of Howard et al., "Time-uniform,
nonparametric, nonasymptotic confidence sequences", Ann. Statist. 2021). For a candidate mean
mu0, the mixture of the scale-invariant likelihood ratio over a N(0, g) prior on the standardised
effect (mu - mu0) / sigma is

    E_n(mu0) = (1 + n g)^(-1/2) * ((SS + n d^2) / (SS + n d^2 / (1 + n g)))^(n / 2),

with n pairs, d = mean - mu0 and SS the sum of squared deviations from the mean. Under mu0 it is
a nonnegative martingale with mean 1 (in the filtration of the scale-invariant statistics), so
by Ville's inequality P(some n: E_n(mu0) >= 1/alpha) <= alpha. The sequence is the set of mu0
with E_n(mu0) < 1/alpha; in closed form, mean ± sqrt(SS / n · r), r below (``half_width``),
unbounded while n is too small for any mu0 to reach 1/alpha.

Why this one: it models what the fixed interval models (log-ratios near normal: the t interval is
exact for log-normal noise), with the unknown variance handled exactly (no plug-in estimate, no
bound on a pair's range: a betting sequence needs the log-ratios bounded, and a disturbed pair
can be any size), in closed form (no grid, no numpy) and cheap at every look. ``G`` is set by
``benchmarks/stopping.py`` (docs/methodology.md: the table).

Pure: numbers in, intervals out.
"""

from __future__ import annotations

import dataclasses
import math

from app.core.analysis.stats import Ratio

ALPHA = 0.05  # a 95 % sequence: the error rate holds at every look together
G = 2.0  # the mixture's prior variance of the standardised effect (benchmarks/stopping.py chose it)
LABEL = "anytime 95 % interval"  # how every front end names it


def radius(n: int, alpha: float = ALPHA, g: float = G) -> float:
    """The sequence's half-width in units of the pairs' root mean square deviation sqrt(SS / n):
    sqrt(r) with r = (A - 1) / (1 - A / (1 + n g)), A = ((1 + n g) / alpha²)^(1/n); inf while
    A >= 1 + n g (too few pairs for any bound) and for n < 2."""
    if n < 2:
        return math.inf
    b = 1.0 + n * g
    a = math.exp((math.log(b) - 2.0 * math.log(alpha)) / n)
    if a >= b:
        return math.inf
    return math.sqrt((a - 1.0) / (1.0 - a / b))


def half_width(n: int, sd: float, alpha: float = ALPHA, g: float = G) -> float:
    """The log half-width after ``n`` pairs whose sample standard deviation is ``sd``."""
    if n < 2:
        return math.inf
    rms = sd * math.sqrt((n - 1) / n)  # sqrt(SS / n)
    return rms * radius(n, alpha, g)


def e_value(logs: list[float], mu0: float, g: float = G) -> float:
    """E_n(mu0) of the module's formula, for checks: the sequence holds mu0 while it is below 1/alpha."""
    n = len(logs)
    if n < 2:
        return 1.0
    m = sum(logs) / n
    ss = sum((x - m) ** 2 for x in logs)
    d2 = n * (m - mu0) ** 2
    b = 1.0 + n * g
    if ss == 0.0:
        return math.inf if d2 > 0 else b ** -0.5
    return float(b ** -0.5 * ((ss + d2) / (ss + d2 / b)) ** (n / 2))


def anytime(r: Ratio, alpha: float = ALPHA, g: float = G) -> Ratio:
    """The same pairs' anytime interval in place of the fixed-sample one (estimate, n, log mean and
    standard error kept; ``anytime`` set). Too few pairs for a bound: no interval (lo, hi None), as
    for a fixed interval from too few runs. A ratio already anytime, or without a standard error,
    is returned as it is."""
    if r.anytime or r.log_mean is None or r.log_se is None:
        return r
    n = r.n_pairs
    h = half_width(n, r.log_se * math.sqrt(n), alpha, g)
    if not math.isfinite(h):
        return dataclasses.replace(r, lo=None, hi=None, anytime=True)
    return dataclasses.replace(r, lo=math.exp(r.log_mean - h), hi=math.exp(r.log_mean + h), anytime=True)


def half_after(r: Ratio, extra: int, alpha: float = ALPHA, g: float = G) -> float:
    """The anytime log half-width after ``extra`` more pairs, the pairs' spread as now."""
    assert r.log_se is not None
    n = max(r.n_pairs, 2)
    return half_width(n + extra, r.log_se * math.sqrt(n), alpha, g)
