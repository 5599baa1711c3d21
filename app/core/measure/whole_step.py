"""The whole speculative step, timed the same way by both cost probes (in process: probe; through
llama-server: server_probe): per draft width K at full acceptance and full rejection, and one
middle rate that checks the straight line between the two. ``whole_steps`` runs the rounds over
a ``Request`` (one request at a width and a synthetic acceptance) that each probe supplies;
``step_cost`` prices one step from a request's timings.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import statistics
from typing import Any, Callable, Generator, Mapping, Sequence, TypeVar

from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError
from app.core.records.cost import Spread

# the middle rate's check holds when a measured step is within 5 % of the line between full
# acceptance and full rejection (read by the probes' text and by the reuse of a probe)
MID_TOLERANCE = 0.05
FILLER = ("The quick brown fox jumps over the lazy dog while the river runs past old stone walls and "
          "green fields. ")  # the whole-step probes' prompt text, repeated to the depth
MID_ALPHA = 0.6  # the middle rate's per-token acceptance (position i accepted with alpha^(i+1))
EDGE_FIRST, EDGE_LAST = "edge_first_ms", "edge_last_ms"  # steady_steps' reading of a request's edges

Key = tuple[str, int]  # ("accept" | "reject" | "mid" | "plain", K)
Setting = tuple[Key, int, list[float], int]  # (key, K, the synthetic rates, the request's tokens)
StepMs = dict[int, dict[str, Spread]]  # K -> {"accept": ..., "reject": ...}
Timings = tuple[Mapping[str, Any], int]  # a request's timings, and its verification steps that drafted
# one request at width k (0: a plain one) with synthetic acceptance ``rates``, of n tokens
Request = Callable[[int, Sequence[float], int], Timings]


@dataclasses.dataclass(frozen=True)
class ProbeProgress:
    round: int
    max_rounds: int
    message: str


@dataclasses.dataclass(frozen=True)
class Rounds:
    """How long the rounds go: at least ``min_rounds``, at most ``max_rounds``, until the relative
    standard error of each median is below ``target_rel`` / 2."""

    min_rounds: int
    max_rounds: int
    target_rel: float

    def stable(self, xs: list[float]) -> bool:
        return len(xs) >= self.min_rounds and rse_median(xs) < self.target_rel / 2


def centred_prompt_len(depth: int, n: int) -> int:
    """The prompt length that centres a request of ``n`` tokens on ``depth`` (half of its steps
    before the depth, half after; at least one token): the whole-step probes' requests are of
    different lengths (full acceptance K + 1 tokens a step, full rejection one), and each is then
    measured around the same depth, as the probe says, not the longest ones deeper than the rest."""
    return max(1, depth - (n - 1) // 2)


def rates_text(rates: Sequence[float]) -> str:
    return ",".join(f"{r:.4g}" for r in rates)


def rse_median(xs: list[float]) -> float:
    """Relative standard error of the median (1.2533 * sd / sqrt(n) / median)."""
    if len(xs) < 3:
        return float("inf")
    med = statistics.median(xs)
    return 1.2533 * statistics.stdev(xs) / (len(xs) ** 0.5) / med if med else float("inf")


def step_cost(timings: Mapping[str, Any], steps: int, k: int, t1: float) -> float | None:
    """ms of one full speculative step at width k from a request's timings (predicted_n,
    predicted_ms: the span of the N - 1 steps after the first token; draft_n, draft_n_accepted)
    and its verification steps that drafted (``steps``), given the plain step ``t1``. Plain steps
    (no draft) are priced t1, and each draft slot a capped last step leaves out saves
    (full - t1) / k. None when the request has no full step."""
    n = int(timings.get("predicted_n") or 0)
    total = float(timings.get("predicted_ms") or 0.0)
    drafted = int(timings.get("draft_n") or 0)
    accepted = int(timings.get("draft_n_accepted") or 0)
    plain = max(0, (n - 1) - (steps + accepted))
    missing = max(0, steps * k - drafted)
    denom = steps - missing / k
    if steps <= 0 or denom <= 0 or total <= 0:
        return None
    return (total - t1 * (plain + missing / k)) / denom


def steady_steps(token_times: Sequence[float], k: int, n_predict: int) -> Timings:
    """A request's timings over its steady steps alone, from its own token times (seconds, the
    first token's first; the tokens of one step share a time): every step after the first that
    drafted the full width k (k = 0: every plain step after the first). Left out: the first step
    after the prompt, whose cost varies by tens of ms from request to request (an overhead of the
    request, not of a step: a fresh graph after the prompt's batch), and the steps the end of the
    request capped below k, which step_cost would price on a straight line between the plain and
    the full step (a capped slot saves about one draft, less than that line credits). Timed step
    by step (2026-12-03, bench model, one thread), full acceptance and full rejection cost the same
    (K=3: 105.5 and 105.9 ms), where the request's whole span priced the rejection step 6 % dear.
    So step_cost reads from these timings exactly span / steps. Returns (timings, steps)."""
    out, width_ok = 1, []  # (time, tokens) of each full-width step after the first token
    for x, same in itertools.groupby(token_times[1:]):
        if k and n_predict - out - 1 < k:  # the decode loop's draft budget fell below k
            break
        size = len(list(same))
        width_ok.append((x, size))
        out += size
    timed = width_ok[1:]
    if not timed:
        return {"predicted_n": 0, "predicted_ms": 0.0, "draft_n": 0, "draft_n_accepted": 0}, 0
    tokens = sum(size for _, size in timed)
    span = (timed[-1][0] - width_ok[0][0]) * 1000.0
    # the request's edges, over what its steady steps would cost for the same tokens (``edges``)
    step, per_step = span / len(timed), tokens / len(timed)
    first = (width_ok[0][0] - token_times[0]) * 1000.0 - width_ok[0][1] / per_step * step
    tail = len(token_times) - 1 - width_ok[0][1] - tokens
    last = (token_times[-1] - timed[-1][0]) * 1000.0 - tail / per_step * step
    return ({"predicted_n": 1 + tokens, "predicted_ms": span, "draft_n": k * len(timed),
             "draft_n_accepted": tokens - len(timed), EDGE_FIRST: first, EDGE_LAST: last}, len(timed) if k else 0)


def edges(raws: Mapping[Key, list[Timings]], max_k: int) -> dict[int, dict[str, Spread]]:
    """The request's edges as the whole-step rounds saw them (steady_steps' EDGE_FIRST, EDGE_LAST):
    per width K (0: the plain request), "first": what the first step after the prompt costs over a
    steady step, "last": what the steps after the last steady one cost over steady steps for their
    tokens, in ms a request. A K's "first" pools its full-acceptance and full-rejection requests;
    its "last" is its full-rejection requests' (they end on K capped tokens; a full-acceptance
    request ends on a full step: no capped one). Widths whose requests carried no edges (a server
    that stamps no tokens) are left out."""
    out: dict[int, dict[str, Spread]] = {}
    for k in range(0, max_k + 1):
        sides = [("plain", 0)] if k == 0 else [("accept", k), ("reject", k)]
        firsts = [float(tm[EDGE_FIRST]) for key in sides for tm, _ in raws.get(key, []) if EDGE_FIRST in tm]
        lasts = [float(tm[EDGE_LAST]) for tm, _ in raws.get(sides[-1], []) if EDGE_LAST in tm]
        if firsts and lasts:
            out[k] = {"first": Spread.of(firsts), "last": Spread.of(lasts)}
    return out


T = TypeVar("T")


def run_to_end(gen: Generator[Any, None, T]) -> T:
    """A request's generator run to its end (its progress passed over): what it returned."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def stable_rounds(label: str, measure: Callable[[], float | None], min_rounds: int, max_rounds: int,
                  target_rel: float, cancel: CancelToken) -> tuple[list[float], bool]:
    """Repeat ``measure`` until its median is stable (relative standard error below
    ``target_rel`` / 2 after ``min_rounds``) or ``max_rounds``: (the values, stable)."""
    xs: list[float] = []
    for _ in range(max_rounds):
        cancel.check()
        x = measure()
        if x is not None and x > 0:
            xs.append(x)
        if len(xs) >= min_rounds and rse_median(xs) < target_rel / 2:
            return xs, True
    if not xs:
        raise EngineError(f"the probe measured no step for {label}")
    return xs, False


class _Trials:
    """The requests of every setting and what each measured: ``xs`` the step (or, for the plain
    setting, the plain step) per request, ``raws`` the timings behind them."""

    def __init__(self, request: Request, t1: float, settings: list[Setting]):
        self.request, self.t1 = request, t1
        self.xs: dict[Key, list[float]] = {key: [] for key, *_ in settings}
        self.raws: dict[Key, list[Timings]] = {key: [] for key, *_ in settings}

    def one(self, key: Key, k: int, rates: list[float], n: int) -> float | None:
        tm, st = self.request(k, rates, n)
        self.raws[key].append((tm, st))
        if k == 0:
            pn = int(tm.get("predicted_n") or 0)
            return float(tm.get("predicted_ms") or 0.0) / (pn - 1) if pn > 1 else None
        return step_cost(tm, st, k, self.t1)


def request_tokens(side: str, k: int, steps: int) -> int:
    """The tokens of a request that times ``steps`` steps at width k: at full acceptance K + 1 a
    step (whole steps only: no capped draft), at full rejection one a step and the k a capped last
    draft leaves; a plain request (side "plain") one a step. The first token is the prompt's."""
    per_step = k + 1 if side == "accept" else 1
    return 1 + steps * per_step + (k if side == "reject" else 0)


def _settings(max_k: int, steps: int, interleave: bool) -> tuple[list[Setting], int, list[float]]:
    """Every setting the whole-step rounds time, the middle rate's K and its rates."""
    k_mid = max(1, (max_k + 1) // 2)
    mid_rates = [MID_ALPHA ** (i + 1) for i in range(k_mid)]
    settings: list[Setting] = []
    for k in range(1, max_k + 1):
        settings.append((("accept", k), k, [1.0] * k, request_tokens("accept", k, steps)))
        settings.append((("reject", k), k, [0.0] * k, request_tokens("reject", k, steps)))
    settings.append((("mid", k_mid), k_mid, mid_rates, 1 + steps * 2))
    if interleave:
        settings.append((("plain", 0), 0, [], request_tokens("plain", 0, steps)))
    return settings, k_mid, mid_rates


def whole_steps(request: Request, t1: float, max_k: int, steps: int, min_rounds: int, max_rounds: int,
                target_rel: float, cancel: CancelToken, interleave: bool = False, warmup_whole: bool = False,
                by_width: bool = False
                ) -> Generator[ProbeProgress, None, tuple[StepMs, dict[str, Any], bool, list[float] | None, StepMs]]:
    """The whole speculative step at K = 1..max_k at full acceptance and full rejection, and the
    middle-rate check at one K; ``request(k, rates, n)`` runs one request (k = 0: a plain one; the
    first of a setting is its warm-up: a few tokens, or with ``warmup_whole`` a whole request, as a
    fresh llama-server's first request is slower). One setting after the other until each is
    stable, or with ``interleave`` every setting once per round in a new random order, the plain
    step included, until all are stable: slow drift and busy spells then hit all settings alike, as
    they hit a sweep's interleaved arms (measured one after the other, each setting in its own
    window, a busy spell in one window moved that setting alone by 10-25 %); each step is then
    paired with its round's plain step and priced at the plain step's median. With ``by_width``
    the rounds go one K at a time (that K's settings and the plain step; the middle rate with its
    K), so only a few llama-servers need be up at once; the pairing carries across the widths.
    Returns (step_ms, mid_check, stable, the plain step's values when measured here, the requests'
    edges: ``edges``)."""
    settings, k_mid, mid_rates = _settings(max_k, steps, interleave)
    trials = _Trials(request, t1, settings)
    rounds = Rounds(min_rounds, max_rounds, target_rel)
    stable = True
    if interleave:
        stable = yield from _interleaved(trials, settings, max_k, rounds, cancel, warmup_whole, by_width)
    else:
        for key, k, rates, n in settings:
            request(k, rates, n if warmup_whole else min(n, 2 + k))  # warm-up
            trials.xs[key], ok = stable_rounds(f"K={k} at rates {rates_text(rates)}",
                                               lambda: trials.one(key, k, rates, n), min_rounds, max_rounds,
                                               target_rel, cancel)
            stable = stable and ok
            if key[0] == "reject":
                yield ProbeProgress(k, max_k, f"K={k}: step {statistics.median(trials.xs[('accept', k)]):.2f} ms "
                                    f"at full acceptance, {statistics.median(trials.xs[key]):.2f} ms at full rejection")
    step_ms = {k: {"accept": Spread.of(trials.xs[("accept", k)]), "reject": Spread.of(trials.xs[("reject", k)])}
               for k in range(1, max_k + 1)}
    mid = _mid_check(trials, step_ms, k_mid, mid_rates)
    yield ProbeProgress(max_k, max_k, f"middle rate at K={k_mid}: {mid['accepted_per_step']:.2f} accepted per "
                        f"step, step {mid['measured_ms']:.2f} ms, the line predicts {mid['predicted_ms']:.2f} ms")
    return step_ms, mid, stable, trials.xs.get(("plain", 0)), edges(trials.raws, max_k)


def _interleaved(trials: _Trials, settings: list[Setting], max_k: int, rounds: Rounds, cancel: CancelToken,
                 warmup_whole: bool, by_width: bool) -> Generator[ProbeProgress, None, bool]:
    """Every setting of a group once per round in a new random order, until all are stable (the
    rounds of whole_steps with ``interleave``); ``trials.xs`` then holds each step priced at the
    plain step's median. Returns whether every group was stable."""
    rng = random.Random(0)
    # each step is taken against the plain step of its own round (paired, as a sweep pairs its
    # arms' runs), then priced at the plain step's median: a busy spell over a round moves
    # the step and the plain step together and cancels
    ratios: dict[Key, list[float]] = {key: [] for key, *_ in settings}
    plain_s = [st for st in settings if st[0][0] == "plain"]
    groups = ([plain_s + [st for st in settings if st[1] == k] for k in range(1, max_k + 1)] if by_width
              else [settings])
    warmed: set[Key] = set()
    stable = True
    for group in groups:
        ok = False
        for key, k, rates, n in group:
            if key not in warmed:
                trials.request(k, rates, n if warmup_whole else min(n, 2 + k))  # warm-up
                warmed.add(key)
        for rnd in range(1, rounds.max_rounds + 1):
            order = group[:]
            rng.shuffle(order)
            this: dict[Key, float] = {}
            for key, k, rates, n in order:
                cancel.check()
                x = trials.one(key, k, rates, n)
                if x is not None and x > 0:
                    this[key] = x
            p = this.get(("plain", 0))
            for key, x in this.items():
                trials.xs[key].append(x)
                if p:
                    ratios[key].append(x / p)
            ok = all(rounds.stable(ratios[key]) for key, *_ in group if key[0] != "plain") \
                and rounds.stable(trials.xs[("plain", 0)])
            where = f"K={group[-1][1]}, " if by_width else ""
            yield ProbeProgress(rnd, rounds.max_rounds,
                                f"whole steps, {where}round {rnd}" + (" (stable)" if ok else ""))
            if ok:
                break
        stable = stable and ok
    if any(not ratios[key] for key, *_ in settings):
        raise EngineError("the probe measured no whole step for a setting")
    scale = statistics.median(trials.xs[("plain", 0)])
    for key, *_ in settings:
        if key[0] != "plain":
            trials.xs[key] = [r * scale for r in ratios[key]]
    return stable


def _mid_check(trials: _Trials, step_ms: StepMs, k_mid: int, mid_rates: list[float]) -> dict[str, Any]:
    """The middle rate's check: the step it measured against the straight line between full
    acceptance and full rejection at the drafts it accepted."""
    per_step = [int(tm.get("draft_n_accepted") or 0) / st for tm, st in trials.raws[("mid", k_mid)] if st]
    a = statistics.median(per_step) if per_step else 0.0
    full, none = step_ms[k_mid]["accept"].median, step_ms[k_mid]["reject"].median
    predicted = none + (full - none) * min(a, k_mid) / k_mid
    measured = statistics.median(trials.xs[("mid", k_mid)])
    return {"k": k_mid, "rates": [round(r, 6) for r in mid_rates], "accepted_per_step": a,
            "predicted_ms": predicted, "measured_ms": measured,
            "error": predicted / measured - 1.0 if measured else None}
