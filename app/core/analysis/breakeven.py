"""Acceptance model and break-even model from measured costs.

Per-token acceptance alpha (i.i.d. approximation): a draft of width K is accepted up to the first
miss, so the expected accepted drafts per verification step are
``E[A](alpha, K) = alpha (1 - alpha^K) / (1 - alpha)`` and the measured acceptance rate
``accepted / drafted`` is ``E[A] / K``; alpha is found by inverting that (monotone) relation.

Predicted speedup at width K, from costs measured by the probe:

    S(alpha, K) = (1 + E[A](alpha, K)) * T(1) / (T(K+1) + K * T_draft + T_catchup(K+1))

i.e. tokens gained per step over the step's cost, against one plain decode per token. Costs from
the llama-server probe price the whole step instead (draft, verify, rollback, catch-up, as the
server runs it), measured at full acceptance and full rejection; a step that accepts ``a`` of its
K drafts costs ``reject(K) + (accept(K) - reject(K)) * a / K`` (the probe checks that line at a
middle rate). Where the
runs counted acceptance per draft position, app.core.analysis.positions gives E[A] from the
positions measured instead (real heads accept less at later positions), and predicts a width K
that was not measured.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Mapping, Sequence

from app.core.common.spec_modes import MTP
from app.core.records.schema import RunRecord

ALPHA_GRID = tuple(i / 100 for i in range(101))


def expected_accepted(alpha: float, k: int) -> float:
    if k <= 0:
        return 0.0
    if alpha >= 1.0:
        return float(k)
    if alpha <= 0.0:
        return 0.0
    return alpha * (1 - alpha ** k) / (1 - alpha)


def acceptance_rate(alpha: float, k: int) -> float:
    return expected_accepted(alpha, k) / k if k > 0 else 0.0


def infer_alpha(rate: float, k: int) -> float:
    """Per-token acceptance alpha from a measured accepted/drafted rate at width k."""
    if k <= 0:
        raise ValueError("k must be positive")
    rate = min(max(rate, 0.0), 1.0)
    if k == 1:
        return rate
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if acceptance_rate(mid, k) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_accepted_length(alpha: float, k: int) -> float:
    """Tokens produced per verification step (accepted drafts + the target's own token)."""
    return 1.0 + expected_accepted(alpha, k)


@dataclasses.dataclass(frozen=True)
class Costs:
    """Times in ms: target decode of n tokens (n = 1..), one draft step, MTP catch-up of n rows."""

    t_ms: Mapping[int, float]
    draft_ms: float
    catchup_ms: Mapping[int, float] = dataclasses.field(default_factory=dict)
    source: str = "probe"
    # whole speculative steps (the llama-server probe): K -> ms at full acceptance / full rejection
    step_accept_ms: Mapping[int, float] = dataclasses.field(default_factory=dict)
    step_reject_ms: Mapping[int, float] = dataclasses.field(default_factory=dict)
    # the request's edges (the probe's edge_ms): K -> ms a request's first step costs over a steady
    # one, and K -> ms its capped last steps cost over steady ones at full rejection; K = 0 the plain
    # request. Empty: steady steps only (what an answer of any length pays per token)
    first_ms: Mapping[int, float] = dataclasses.field(default_factory=dict)
    last_ms: Mapping[int, float] = dataclasses.field(default_factory=dict)

    @property
    def whole_steps(self) -> bool:
        return bool(self.step_accept_ms)

    def widths(self) -> list[int]:
        """The widths K these costs price as measured (verify passes of K + 1 tokens, or whole steps)."""
        if self.whole_steps:
            return sorted(self.step_accept_ms)
        return [n - 1 for n in sorted(self.t_ms) if n > 1]

    def verify(self, n: int) -> float:
        if n in self.t_ms:
            return self.t_ms[n]
        ns = sorted(self.t_ms)
        if n > ns[-1] and len(ns) >= 2:  # extrapolate linearly from the last two sizes
            a, b = ns[-2], ns[-1]
            return self.t_ms[b] + (self.t_ms[b] - self.t_ms[a]) * (n - b) / (b - a)
        raise KeyError(f"no verify cost for n={n}")

    def catchup(self, n: int) -> float:
        if n in self.catchup_ms:
            return self.catchup_ms[n]
        if self.catchup_ms:
            ns = sorted(self.catchup_ms)
            return self.catchup_ms[min(ns, key=lambda x: abs(x - n))]
        return self.draft_ms  # one MTP decode of a few rows costs about one draft step

    def step(self, k: int, accepted: float | None = None) -> float:
        """One verification step at width k that accepts ``accepted`` drafts on average (None:
        all of them; only whole-step costs depend on it)."""
        if self.whole_steps:
            if k not in self.step_accept_ms:
                raise KeyError(f"no step cost for K={k}")
            a = k if accepted is None else min(max(accepted, 0.0), float(k))
            rej = self.step_reject_ms.get(k, self.step_accept_ms[k])
            return rej + (self.step_accept_ms[k] - rej) * a / k
        return self.verify(k + 1) + k * self.draft_ms + self.catchup(k + 1)

    def edge(self, k: int, accepted: float | None = None) -> float:
        """ms one request pays at its edges over steady steps, at width k (0: a plain request) and
        ``accepted`` drafts a step (None: all): its first step's extra, and its capped last steps'
        extra as measured at full rejection, scaled to none at full acceptance (the probe's
        full-acceptance request ends on a full step). 0 where the probe measured no edges."""
        if k not in self.first_ms:
            return 0.0
        a = float(k) if accepted is None or k == 0 else min(max(accepted, 0.0), float(k))
        return self.first_ms[k] + self.last_ms.get(k, 0.0) * (1.0 - a / k if k else 1.0)

    @classmethod
    def from_probe(cls, rec) -> "Costs":
        if getattr(rec, "step_ms", None):
            plain = rec.plain_ms.median if getattr(rec, "plain_ms", None) else rec.t_ms[1].median
            edges = getattr(rec, "edge_ms", None) or {}
            full = 0 in edges  # the plain request's edges too, or none priced
            return cls({1: plain}, 0.0, {}, "probe",
                       {k: v["accept"].median for k, v in rec.step_ms.items()},
                       {k: v["reject"].median for k, v in rec.step_ms.items() if "reject" in v},
                       {k: v["first"].median for k, v in edges.items()} if full else {},
                       {k: v["last"].median for k, v in edges.items()} if full else {})
        return cls({n: s.median for n, s in rec.t_ms.items()},
                   rec.draft_ms.median if rec.draft_ms else 0.0,
                   {n: s.median for n, s in (getattr(rec, "catchup_ms", None) or {}).items()},
                   "probe")


def costs_from_runs(records: Sequence[RunRecord]) -> Costs | None:
    """Costs fitted from a sweep's own runs, when no probe was made: T(1) from the baseline's
    per-token time, and each K's whole step cost (verify + drafts + catch-up) from its runs'
    time per verification step (steps ~ drafted / K). Step cost does not depend on acceptance.
    Only draft-mtp runs price the steps (another mode's drafter costs differently)."""
    base = [1000.0 / r.tok_s for r in records if r.status == "ok" and r.arm_kind == "baseline" and r.tok_s]
    if not base:
        return None
    t1 = statistics.median(base)
    steps: dict[int, list[float]] = {}
    for r in records:
        if r.status != "ok" or not r.k or not r.tok_s or not r.draft_n or r.n_generated < 2:
            continue
        if r.spec_type not in (None, MTP):
            continue
        n_steps = r.draft_n / r.k
        plain = max(0.0, (r.n_generated - 1) - n_steps * (1 + (r.draft_accepted or 0) / n_steps))
        total_ms = (r.n_generated - 1) / r.tok_s * 1000.0 - plain * t1
        if n_steps > 0 and total_ms > 0:
            steps.setdefault(r.k, []).append(total_ms / n_steps)
    if not steps:
        return None
    t = {1: t1}
    for k, v in steps.items():
        t[k + 1] = statistics.median(v)
    return Costs(t, 0.0, {k + 1: 0.0 for k in steps}, "runs")


def speedup_at_length(mean_len: float, k: int, costs: Costs) -> float:
    """Speedup at width k when a verification step yields ``mean_len`` tokens on average (the
    i.i.d. alpha gives it through mean_accepted_length; per-position acceptance through
    app.core.analysis.positions)."""
    return mean_len * costs.verify(1) / costs.step(k, mean_len - 1.0)


def predicted_speedup(alpha: float, k: int, costs: Costs, n_tokens: int | None = None) -> float:
    """The speedup at width k and acceptance alpha: of steady steps (what a long answer pays), or
    with ``n_tokens`` of an answer of that many tokens, its request's edges priced (answer_speedup)."""
    mean_len = mean_accepted_length(alpha, k)
    if n_tokens is None:
        return speedup_at_length(mean_len, k, costs)
    return answer_speedup(mean_len, k, costs, n_tokens)


def answer_speedup(mean_len: float, k: int, costs: Costs, n_tokens: int) -> float:
    """The speedup of an answer of ``n_tokens`` tokens at width k, ``mean_len`` tokens a step: the
    decode after the first token, (n - 1) plain steps and the plain request's edges against
    (n - 1) / mean_len speculative steps and the speculative request's edges (Costs.edge). Where
    the probe measured no edges, the steady speedup."""
    n = max(n_tokens - 1, 1)
    base = n * costs.verify(1) + costs.edge(0)
    spec = n / mean_len * costs.step(k, mean_len - 1.0) + costs.edge(k, mean_len - 1.0)
    return base / spec if spec > 0 else speedup_at_length(mean_len, k, costs)


def break_even_alpha(k: int, costs: Costs) -> float | None:
    """The acceptance alpha at which MTP at width k just pays (S = 1); None if it never does."""
    if predicted_speedup(1.0, k, costs) < 1.0:
        return None
    if predicted_speedup(0.0, k, costs) >= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if predicted_speedup(mid, k, costs) < 1.0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclasses.dataclass(frozen=True)
class Curve:
    k: int
    alpha: tuple[float, ...]
    speedup: tuple[float, ...]
    break_even: float | None


def curves(ks: Sequence[int], costs: Costs, grid: Sequence[float] = ALPHA_GRID) -> list[Curve]:
    return [Curve(k, tuple(grid), tuple(predicted_speedup(a, k, costs) for a in grid),
                  break_even_alpha(k, costs)) for k in ks]


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    task: str
    k: int
    p_min: float | None
    alpha: float
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0
