"""Stopping rules on simulated sweeps: today's (a fixed-sample 95 % t interval looked at every
round, "pays" once within ±5 % and above 1) against the new one (app.core.analysis.anytime's
confidence sequence, three decisions: pays, no gain worth having, slower).

A simulated sweep is one arm against baseline: per-pair log speedups log(true) + noise, one pair
a round, a look after every round from the second pair (``--per-round``, ``--first``: a task's prompts a
round, as the adaptive sweep measures them), stopped at the first decision or at the
cap (40 pairs: the adaptive sweep's repetitions of an arm under a budget). The noise is resampled
from recorded per-pair log ratios (each cell centred on its own mean, so only the spread is kept):
as recorded, and the recorded shape scaled to a quiet machine's spread; and normal noise at that
spread. Reported per true speedup, 1,000 sweeps a cell (seeded):

- pays / no gain / slower / undecided: the share of sweeps ending so;
- false pays: "pays" at a true speedup <= 1; false slower: "slower" at a true speedup >= 1;
- decided: the share decided within the cap;
- median pairs: pairs at the decision (an undecided sweep counts the cap).

    python benchmarks/stopping.py                                   # the table (docs/methodology.md)
    python benchmarks/stopping.py --records results.jsonl          # noise from a results file
    python benchmarks/stopping.py --extract results.jsonl OUT.json  # its per-pair log ratios, kept

The rules are vectorised here (numpy); a self-check runs the first sweeps of every cell through
the core's own rule (app.core.analysis.decide.decide_task) and stops on any disagreement.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.analysis import anytime as seq  # noqa: E402
from app.core.analysis.decide import MIN_GAIN, MIN_PAIRS, NO_GAIN, PAYS, PRECISION, SLOWER, decide_task  # noqa: E402
from app.core.analysis.stats import Ratio, t95  # noqa: E402
from app.core.records.arm import Arm  # noqa: E402

PAIRS = ROOT / "tests" / "data" / "noise_pairs.json"  # this machine's recorded per-pair log ratios (its "source")
TRUE = (0.80, 0.95, 0.97, 1.00, 1.02, 1.05, 1.20, 1.50)
QUIET_SD = 0.03  # a quiet machine's per-pair spread (log): the calibrated comparisons' 3 % run-to-run noise
UNDECIDED = "undecided"


def pairs_of(records_path: str) -> dict[str, list[float]]:
    """Per cell (task, arm, prompt), the per-pair log speedups of a results file (quiet, ok runs,
    paired by task, prompt and repetition)."""
    from app.core.records.reader import load_records

    recs = [r for r in load_records(records_path) if r.status == "ok" and r.tok_s]
    base = {(r.task, r.prompt_id, r.rep): r.tok_s for r in recs if r.arm_kind == "baseline"}
    cells: dict[str, list[float]] = {}
    for r in recs:
        b = base.get((r.task, r.prompt_id, r.rep))
        if r.arm_kind != "baseline" and b and r.tok_s:
            cells.setdefault(f"{r.task} {r.measured_arm.label} {r.prompt_id}", []).append(round(math.log(r.tok_s / b), 6))
    return cells


def residuals(cells: dict[str, list[float]]) -> np.ndarray:
    """Every cell's log ratios less the cell's mean (cells of 3 pairs or more), times
    sqrt(n / (n - 1)): centring a cell of n pairs on its own mean shrinks their spread by
    sqrt((n - 1) / n) (0.82 for a cell of 3 pairs), which would understate the noise resampled."""
    out = [(x - statistics.fmean(v)) * math.sqrt(len(v) / (len(v) - 1))
           for v in cells.values() if len(v) >= 3 for x in v]
    return np.array(out)


def simulate(true: float, noise: np.ndarray | None, sd: float, n_sims: int, cap: int,
             rng: np.random.Generator) -> np.ndarray:
    """(n_sims, cap) per-pair log speedups: log(true) plus noise resampled from ``noise`` (None:
    normal with standard deviation ``sd``)."""
    if noise is None:
        eps = rng.normal(0.0, sd, size=(n_sims, cap))
    else:
        eps = rng.choice(noise, size=(n_sims, cap), replace=True)
    return math.log(true) + eps


def running(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, mean, sample sd) after each pair, for every sweep."""
    n = np.arange(1, x.shape[1] + 1, dtype=float)
    s1 = np.cumsum(x, axis=1)
    s2 = np.cumsum(x * x, axis=1)
    mean = s1 / n
    var = np.where(n > 1, (s2 - n * mean ** 2) / np.maximum(n - 1, 1), np.nan)
    return n, mean, np.sqrt(np.maximum(var, 0.0))


def today(x: np.ndarray, tie: float = MIN_GAIN, precision: float = PRECISION) -> tuple[np.ndarray, np.ndarray]:
    """Today's rule on one arm, looked at after every pair: (the decision, pairs at it)."""
    n, mean, sd = running(x)
    t = np.array([t95(int(k) - 1) for k in n])
    h = t * sd / np.sqrt(n)
    lo, hi, est = np.exp(mean - h), np.exp(mean + h), np.exp(mean)
    slower = hi < 1.0
    nogain = (hi < 1.0 + tie) & ~slower
    pays = (lo > 1.0) & (hi <= est * (1 + precision)) & (lo >= est * (1 - precision)) & ~slower & ~nogain
    return first(x.shape, [(slower, SLOWER), (nogain, NO_GAIN), (pays, PAYS)], n >= 2)


def new(x: np.ndarray, min_gain: float = MIN_GAIN, g: float = seq.G) -> tuple[np.ndarray, np.ndarray]:
    """The new rule on one arm (anytime interval, three decisions), looked at after every pair."""
    n, mean, sd = running(x)
    rad = np.array([seq.radius(int(k), seq.ALPHA, g) for k in n])
    with np.errstate(invalid="ignore"):  # the first pair: no spread, no bound
        h = sd * np.sqrt((n - 1) / n) * rad
    lo, hi = np.exp(mean - h), np.exp(mean + h)
    slower = hi < 1.0
    nogain = (hi < 1.0 + min_gain) & ~slower
    pays = (lo > 1.0) & (n >= MIN_PAIRS) & ~slower & ~nogain
    return first(x.shape, [(slower, SLOWER), (nogain, NO_GAIN), (pays, PAYS)], n >= 2)


LOOKS = np.ones(0, dtype=bool)  # set by main: the pair counts at which the sweep looks (a round's end)


def first(shape: tuple[int, ...], rules: list[tuple[np.ndarray, str]], ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first look at which any rule holds: its decision and pair count (undecided: the cap)."""
    sims, cap = shape
    ok = ok & LOOKS[:cap]
    any_hit = np.zeros((sims, cap), dtype=bool)
    for m, _ in rules:
        any_hit |= m & ok
    at = np.where(any_hit.any(axis=1), any_hit.argmax(axis=1), cap - 1)
    decision = np.full(sims, UNDECIDED, dtype=object)
    rows = np.arange(sims)
    for m, word in reversed(rules):  # the first rule listed wins at a look where several hold
        hit = (m & ok)[rows, at] & any_hit.any(axis=1)
        decision[hit] = word
    return decision, at + 1


def check_against_core(x: np.ndarray, decision: np.ndarray, pairs: np.ndarray, min_gain: float) -> None:
    """The vectorised new rule against decide_task on the same pairs (a few sweeps)."""
    arm = Arm(2, 0.0)
    for i in range(min(len(x), 30)):
        got = UNDECIDED
        at = x.shape[1]
        for k in range(2, x.shape[1] + 1):
            if not LOOKS[k - 1]:
                continue
            v = x[i, :k]
            m, s = float(v.mean()), float(v.std(ddof=1))
            r = seq.anytime(Ratio(k, math.exp(m), None, None, m, s / math.sqrt(k)))
            d = decide_task("t", {arm: r}, min_gain=min_gain)
            if d.decided:
                got, at = d.outcome, k
                break
        if got != decision[i] or at != pairs[i]:
            raise SystemExit(f"self-check: sweep {i}: the core says {got} at {at}, the vectorised rule "
                             f"{decision[i]} at {pairs[i]}")


def table(noises: list[tuple[str, np.ndarray | None, float]], n_sims: int, cap: int, seed: int,
          min_gain: float, g: float) -> list[str]:
    rows = ["| noise | true | rule | pays | no gain | slower | undecided | false pays | false slower | decided "
            "| median pairs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, noise, sd in noises:
        for i, true in enumerate(TRUE):
            x = simulate(true, noise, sd, n_sims, cap, np.random.default_rng(seed + 1000 * i))
            for rule, (dec, pairs) in (("today", today(x, min_gain)), ("anytime", new(x, min_gain, g))):
                if rule == "anytime" and g == seq.G and min_gain == MIN_GAIN:
                    check_against_core(x, dec, pairs, min_gain)
                share = {w: float(np.mean(dec == w)) for w in (PAYS, NO_GAIN, SLOWER, UNDECIDED)}
                fp = share[PAYS] if true <= 1.0 else float("nan")
                fs = share[SLOWER] if true >= 1.0 else float("nan")
                rows.append(f"| {name} | {true:.2f} | {rule} | " + " | ".join(
                    f"{100 * share[w]:.1f} %" for w in (PAYS, NO_GAIN, SLOWER, UNDECIDED))
                    + f" | {'-' if math.isnan(fp) else f'{100 * fp:.1f} %'} | {'-' if math.isnan(fs) else f'{100 * fs:.1f} %'}"
                    + f" | {100 * (1 - share[UNDECIDED]):.1f} % | {float(np.median(pairs)):.0f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", help="a results file whose per-pair log ratios give the noise")
    ap.add_argument("--extract", nargs=2, metavar=("RECORDS", "OUT"), help="write a results file's per-pair log "
                    "ratios to OUT (JSON) and stop")
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--cap", type=int, default=40)
    ap.add_argument("--seed", type=int, default=57)
    ap.add_argument("--min-gain", type=float, default=100 * MIN_GAIN, metavar="PCT")
    ap.add_argument("--g", type=float, default=seq.G, help="the mixture's prior variance (anytime.G)")
    ap.add_argument("--per-round", type=int, default=1, help="pairs a round (a task's prompts; tune: 2)")
    ap.add_argument("--first", type=int, default=2, help="pairs at the first look (min_reps x prompts; tune: 4)")
    args = ap.parse_args()
    global LOOKS
    k = np.arange(1, args.cap + 1)
    LOOKS = (k >= args.first) & ((k - args.first) % args.per_round == 0)
    if args.extract:
        src, out = args.extract
        Path(out).write_text(json.dumps({"source": Path(src).name, "cells": pairs_of(src)}, indent=0) + "\n")
        return
    if args.records:
        cells, source = pairs_of(args.records), Path(args.records).name
    else:
        data = json.loads(PAIRS.read_text())
        cells, source = data["cells"], data["source"]
    noise = residuals(cells)
    sd = float(noise.std())
    print(f"noise: {len(noise)} per-pair log ratios from {source}, spread (sd) {sd:.3f}; "
          f"{args.sims} sweeps a cell, first look at {args.first} pairs, then every {args.per_round}, cap {args.cap} pairs, δ {args.min_gain:g} %, g {args.g:g}")
    noises = [(f"normal, sd {QUIET_SD:.2f}", None, QUIET_SD),
              (f"recorded shape, sd {QUIET_SD:.2f}", noise * (QUIET_SD / sd), QUIET_SD),
              (f"recorded, sd {sd:.2f}", noise, sd)]
    print("\n".join(table(noises, args.sims, args.cap, args.seed, args.min_gain / 100, args.g)))


if __name__ == "__main__":
    main()
