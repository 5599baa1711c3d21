"""Acceptance per draft position, and the break-even model built on it.

What is counted (llama.cpp, tools/server/server-context.cpp, and the in-process loop the same
way): each verification of a non-empty draft is one step (``spec_decode_num_drafts``); in a step
that accepted n drafts, positions 0..n-1 each count one (``n_accepted_per_pos``, K long). So
``accepted[i] / steps`` is the share of steps whose first i + 1 drafts were all accepted (what
llama-server's log prints as "acc per pos", and what users report as "70/45/33/21 % at positions
1-4"). A draft cut short (p_min, the end of n_predict) still counts as a step.

The model: the conditional acceptance ``c_i = accepted[i] / accepted[i-1]`` (``accepted[-1]`` =
steps) is pooled over the arms of one task whose draft reaches position i (K > i). A width K
then accepts ``E[A](K) = sum_{j=1..K} prod_{i<j} c_i`` drafts per step. Positions beyond the
measured ones take the last measured conditional (a flat tail), and :meth:`PositionModel.extrapolates`
says when a prediction needed that. Records without per-position counts (older files) have no
position model; the i.i.d. alpha of ``breakeven`` still serves them.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, NamedTuple, Protocol, Sequence

from app.core.analysis import breakeven
from app.core.analysis.stats import Ratio
from app.core.records.arm import Arm
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class PositionCounts:
    """Per-position counts pooled over runs: accepted drafts at each position, verification steps."""

    accepted: tuple[int, ...]
    steps: int
    runs: int

    @property
    def rates(self) -> tuple[float, ...]:
        """Share of steps that accepted position i (and every position before it)."""
        return tuple(a / self.steps for a in self.accepted) if self.steps else ()

    @property
    def mean_accepted(self) -> float | None:
        """Accepted drafts per verification step."""
        return sum(self.accepted) / self.steps if self.steps else None


def pool(records: Iterable[RunRecord]) -> PositionCounts | None:
    """The good runs' per-position counts added up (runs without counts left out); None if none."""
    acc: list[int] = []
    steps = runs = 0
    for r in records:
        if r.status != "ok" or not r.accepted_per_pos or r.draft_steps is None:
            continue
        if len(acc) < len(r.accepted_per_pos):
            acc.extend([0] * (len(r.accepted_per_pos) - len(acc)))
        for i, n in enumerate(r.accepted_per_pos):
            acc[i] += n
        steps += r.draft_steps
        runs += 1
    return PositionCounts(tuple(acc), steps, runs) if runs else None


@dataclasses.dataclass(frozen=True)
class PositionModel:
    """Conditional acceptance per position (c_0, c_1, ...) from the widths in ``ks``."""

    conditional: tuple[float, ...]
    ks: tuple[int, ...]

    @property
    def measured(self) -> int:
        """How many positions were measured."""
        return len(self.conditional)

    def extrapolates(self, k: int) -> bool:
        """Whether width k needs positions beyond the measured ones."""
        return k > self.measured

    def at(self, i: int) -> float:
        """c_i; past the measured positions, the last measured one (flat tail)."""
        return self.conditional[min(i, self.measured - 1)]

    def rates(self, k: int) -> tuple[float, ...]:
        """Share of steps accepting positions 0..k-1 (the product of the conditionals)."""
        out, p = [], 1.0
        for i in range(k):
            p *= self.at(i)
            out.append(p)
        return tuple(out)

    def expected_accepted(self, k: int) -> float:
        return sum(self.rates(k))

    def speedup(self, k: int, costs: breakeven.Costs) -> float:
        return breakeven.speedup_at_length(1.0 + self.expected_accepted(k), k, costs)


def fit(counts: Mapping[int, PositionCounts]) -> PositionModel | None:
    """The position model from per-width counts {K: pooled counts}; None when no position has a
    step to judge it by. Position i pools the widths K > i; it stops at the first position that
    no step reached."""
    cond: list[float] = []
    i = 0
    while True:
        num = den = 0
        for k, c in counts.items():
            if k > i and len(c.accepted) > i:
                num += c.accepted[i]
                den += c.accepted[i - 1] if i else c.steps
        if den <= 0:
            break
        cond.append(num / den)
        i += 1
    return PositionModel(tuple(cond), tuple(sorted(counts))) if cond else None


@dataclasses.dataclass(frozen=True)
class RunModel:
    """Acceptance of a drafter model's drafts (draft-simple) from where its steps start.

    Under greedy decoding a separate drafter's draft at a text position is its greedy token given
    the true prefix (while the drafts before it matched, they were the true tokens), so whether
    it matches is a property of the text: matches come in runs (easy stretches, hard ones). A step
    starts right after the previous step's last token: after a rejection, at a token the drafter
    missed (state 0); after a full acceptance, after the target's own next token, which the
    drafter would have matched with probability ``follow`` (state 1). A wide K spends more of its
    steps in hard stretches (an easy one is crossed in few steps), so its first position accepts
    less often than a narrow K's: truncating K=6's per-position rates (PositionModel) read K=1..5
    low on real text (the Qwen2.5-Coder pair's story, -8.5 % in tokens per step at K=4).

    The model: a match follows a match with probability ``follow`` and a miss with probability
    ``after_miss`` (a two-state Markov chain over the text); a step's start state follows its
    own chain (stationary: ``start_full``), and the expected drafts accepted per step at K is
    ``first_rate(K) * sum(follow**i, i < K)``."""

    after_miss: float  # P(match | the token before missed)
    follow: float  # P(match | the token before matched)

    def start_full(self, k: int) -> float:
        """The share of steps at width k that start after a fully accepted step whose next token
        matched (state 1)."""
        q0 = self.after_miss * self.follow ** (k - 1)  # a full acceptance from state 0
        q1 = self.follow ** k  # ... from state 1
        leave = 1.0 - q1 * self.follow
        if leave <= 1e-12:
            return 1.0
        ratio = q0 * self.follow / leave
        return ratio / (1.0 + ratio)

    def first_rate(self, k: int) -> float:
        """The share of steps at width k that accept their first draft."""
        full = self.start_full(k)
        return (1.0 - full) * self.after_miss + full * self.follow

    def rates(self, k: int) -> tuple[float, ...]:
        """Share of steps accepting positions 0..k-1."""
        first = self.first_rate(k)
        return tuple(first * self.follow ** i for i in range(k))

    def expected_accepted(self, k: int) -> float:
        return sum(self.rates(k))

    def speedup(self, k: int, costs: breakeven.Costs) -> float:
        return breakeven.speedup_at_length(1.0 + self.expected_accepted(k), k, costs)


def fit_runs(counts: PositionCounts, k: int) -> RunModel | None:
    """The run model from one width's per-position counts: ``follow`` as the pooled continuation
    past the first position (positions 1..k-1 over 0..k-2, kept under 1 by half a step so that a
    miss stays possible), ``after_miss`` as the value whose stationary first-position rate at
    width k is the one measured. None below K=2 (no continuation to count) or without steps."""
    acc = counts.accepted[:k]
    if k < 2 or len(acc) < 2 or not counts.steps or not acc[0]:
        return None
    trials = sum(acc[:-1])
    follow = min(sum(acc[1:]) / trials, 1.0 - 0.5 / trials)
    first = acc[0] / counts.steps
    lo, hi = 0.0, 1.0
    for _ in range(60):  # first_rate rises with after_miss where runs cluster (follow >= after_miss)
        mid = (lo + hi) / 2
        if RunModel(mid, follow).first_rate(k) < first:
            lo = mid
        else:
            hi = mid
    return RunModel((lo + hi) / 2, follow)


class Cell(Protocol):
    """What the position models read of a cell (analysis.CellStats, which imports this module)."""

    @property
    def task(self) -> str: ...
    @property
    def arm(self) -> Arm: ...
    @property
    def positions(self) -> PositionCounts | None: ...
    @property
    def ratio(self) -> Ratio | None: ...


class _MtpCell(NamedTuple):
    """What the models use of a draft-mtp cell: its per-position counts and its speedup."""

    positions: PositionCounts
    ratio: Ratio | None


def _mtp_groups(cells: Iterable[Cell]) -> dict[tuple[str, float], dict[int, _MtpCell]]:
    """draft-mtp cells with per-position counts, by (task, p_min), each {K: cell}."""
    out: dict[tuple[str, float], dict[int, _MtpCell]] = {}
    for c in cells:
        pos = c.positions
        if c.arm.is_mtp and c.arm.k and pos is not None and pos.steps:
            out.setdefault((c.task, c.arm.p_min or 0.0), {})[c.arm.k] = _MtpCell(pos, c.ratio)
    return out


def task_models(cells: Iterable[Cell], ks: Sequence[int] | None = None) -> dict[tuple[str, float], PositionModel]:
    """{(task, p_min): position model} from the draft-mtp cells (only the widths in ``ks``, if given)."""
    out = {}
    for key, by_k in _mtp_groups(cells).items():
        m = fit({k: c.positions for k, c in by_k.items() if ks is None or k in ks})
        if m is not None:
            out[key] = m
    return out


def task_rates(cells: Iterable[Cell]) -> dict[str, tuple[float, ...]]:
    """Per task: the share of steps accepting each draft position (index 0: the first draft),
    pooled over its draft-mtp arms at the lowest p_min measured (position i over the arms with
    K > i). What the Results tab plots."""
    groups = _mtp_groups(cells)
    lowest: dict[str, float] = {}
    for task, p in groups:
        lowest[task] = min(p, lowest.get(task, p))
    out = {}
    for task, p in lowest.items():
        by_k = groups[(task, p)]
        rates, i = [], 0
        while True:
            reach = [c.positions for k, c in by_k.items() if k > i and len(c.positions.accepted) > i]
            steps = sum(pc.steps for pc in reach)
            if not steps:
                break
            rates.append(sum(pc.accepted[i] for pc in reach) / steps)
            i += 1
        if rates:
            out[task] = tuple(rates)
    return out


@dataclasses.dataclass(frozen=True)
class HeldOutCheck:
    """A width the model did not see: predicted from the other widths' positions vs measured."""

    task: str
    k: int
    p_min: float
    fit_ks: tuple[int, ...]
    predicted: float  # speedup
    measured: float
    predicted_accepted: float  # drafts accepted per step
    measured_accepted: float | None
    extrapolated: bool  # the prediction needed positions beyond the fitted ones

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def held_out_checks(cells: Sequence[Cell], costs: breakeven.Costs,
                    fit_ks: Sequence[int] | None = None) -> list[HeldOutCheck]:
    """Each measured draft-mtp width K predicted from the other widths of its task and p_min
    (``fit_ks``: from those widths only, predicting the rest), against its measured speedup.
    Widths the costs cannot price, and cells without a speedup, are left out."""
    out = []
    for (task, p), by_k in _mtp_groups(cells).items():
        for k, cell in sorted(by_k.items()):
            if fit_ks is not None:
                if k in fit_ks:
                    continue
                use = [kk for kk in by_k if kk in fit_ks]
            else:
                use = [kk for kk in by_k if kk != k]
            model = fit({kk: by_k[kk].positions for kk in use})
            if model is None or not cell.ratio or not cell.ratio.estimate:
                continue
            try:
                pred = model.speedup(k, costs)
            except KeyError:  # no verify cost for this width
                continue
            out.append(HeldOutCheck(task, k, p, tuple(sorted(use)), pred, cell.ratio.estimate,
                                    model.expected_accepted(k), cell.positions.mean_accepted, model.extrapolates(k)))
    return out
