"""What an answer of a given length gains: the measured speedup carried to another answer length by
the break-even model with the request's edges priced (breakeven.answer_speedup).

Each request pays its edges once: its first step after the prompt and its capped last steps cost
more (or less) than steady steps (the cost probe's ``edge_ms``). A short answer pays them over few
tokens, a long one over many, so the same setting gains less on a 64-token answer than on a
1,024-token one where the edges cost milliseconds against sub-millisecond steps (the H200 check:
1.5-4.5 ms a request). The runs measured one length (their ``n_predict``); the gain at length N is
their measured speedup times the model's speedup at N over its speedup at the measured length
(the model's steady part cancels; only the edges' share moves it). Without edges in the costs
(an older probe, costs fitted from the runs, a server that stamps no tokens) no length is said.

Pure: costs and cells in, numbers and words out.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Iterable, Mapping

from app.core.analysis import breakeven
from app.core.analysis.analysis import Analysis
from app.core.records.arm import Arm
from app.core.records.schema import RunRecord

SHORT = 128  # the length every verdict speaks of
MAX_TOKENS = 1_048_576  # the longest answer length asked (as a results file's n_predict)


@dataclasses.dataclass(frozen=True)
class AnswerGain:
    tokens: int
    speedup: float
    own: bool = False  # the user's own answer length (not the 128 every verdict says)


def answer_length_of(v: object) -> int | None:
    """A stored answer length (the window's setting, read back: a whole number of tokens from 1 to
    MAX_TOKENS, as text or a number), else None (not set, or not such a number)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        n = v
    elif isinstance(v, str) and v.strip().isdigit() and len(v.strip()) <= 8:
        n = int(v.strip())
    else:
        return None
    return n if 1 <= n <= MAX_TOKENS else None


def gain_at(measured: float, mean_len: float, k: int, costs: breakeven.Costs, measured_tokens: int,
            tokens: int) -> float:
    """The measured speedup (at ``measured_tokens`` a request) carried to ``tokens`` a request."""
    at = breakeven.answer_speedup(mean_len, k, costs, tokens)
    base = breakeven.answer_speedup(mean_len, k, costs, measured_tokens)
    return measured * at / base


def run_length(records: Iterable[RunRecord], arm: Arm | None = None) -> int | None:
    """The tokens a request of these runs generated (the median; only ``arm``'s when given)."""
    runs = [r.n_generated for r in records if r.status == "ok" and r.n_generated
            and (arm is None or r.measured_arm == arm)]
    return int(statistics.median(runs)) if runs else None


def answer_gains(a: Analysis, records: Iterable[RunRecord], arm: Arm | None, weights: Mapping[str, float],
                 measured: float | None, costs: breakeven.Costs | None,
                 lengths: Iterable[int | None]) -> tuple[AnswerGain, ...]:
    """The gains of ``arm`` (a draft-mtp width) at 128 tokens and at the user's own length (the
    last of ``lengths``, when given), for the tasks ``weights`` weighs: each task's tokens a step
    from its measured acceptance, weighted; the runs' length, the median of the arm's answers.
    () when the costs price no edges or nothing was measured."""
    if arm is None or arm.k is None or not arm.is_mtp or measured is None or costs is None or not costs.first_ms:
        return ()
    cells = [(w, c) for t, w in weights.items() if (c := a.cell(t, arm)) is not None and c.alpha is not None]
    measured_tokens = run_length(records, arm)
    if not cells or measured_tokens is None:
        return ()
    total = sum(w for w, _ in cells)
    mean_len = sum(w * breakeven.mean_accepted_length(c.alpha or 0.0, arm.k) for w, c in cells) / total
    try:
        out = {}
        for i, n in enumerate(lengths):
            if n is not None and n not in out:
                out[n] = AnswerGain(n, gain_at(measured, mean_len, arm.k, costs, measured_tokens, n), own=i > 0)
    except KeyError:  # the costs price no step at this width
        return ()
    return tuple(out.values())


def gains_words(gains: Iterable[AnswerGain]) -> str | None:
    """"An answer of 128 tokens: 1.21x; of 1,024 tokens (your answer length): 1.29x (each request's
    first and last steps priced)", or None."""
    parts = [f"{g.tokens:,} tokens{' (your answer length)' if g.own else ''}: {g.speedup:.2f}x" for g in gains]
    if not parts:
        return None
    return "An answer of " + "; of ".join(parts) + " (each request's first and last steps priced by the cost probe)"
