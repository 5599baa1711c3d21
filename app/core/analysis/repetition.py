"""Is the output a loop? A base model on raw prompts often answers by repeating itself ("1. 1. 1.
...", the prompt again). Every n-gram drafter then drafts at full acceptance, and the sweep measures
a real speedup on text nobody wants: the verdict must say so, and never call such a cell sure.

The measure is the distinct 4-gram share of each run's generated tokens (distinct 4-token
sequences / all of them): 1.0 when nothing repeats, near 0 for a loop. What decided the threshold
(docs/methodology.md, "Repetition"): the calibrated models' outputs are all at 1.00; Gemma 3 270M
(a base model) on the built-in prompts, raw, over 96 tokens gave story 0.04-0.55 (median 0.18),
tongue-twisters 0.15-0.23, code 0.31-0.95 (median 0.54). Ordinary prose and code repeat far less
than half their 4-grams, so a task whose runs' median share is below REPEATS_BELOW is called a loop.

    tasks = repeating_tasks(ok_runs)     # {task: median share} of the looping tasks
    f = repetition_finding(ok_runs)      # a Finding, or None
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Iterable, Sequence

from app.core.analysis.findings import Finding
from app.core.records.schema import RunRecord

CODE = "repeats"
N = 4  # the n-gram: long enough that ordinary text seldom repeats one, short enough for short outputs
REPEATS_BELOW = 0.5  # a median distinct share below this: more than half the output's 4-grams repeat
MIN_TOKENS = 24  # fewer generated tokens (21 4-grams) say too little to call it a loop
MESSAGE = "the model repeats itself"
FIX = "use an instruct model or your own prompts"
NOT_SURE = "not sure: the output repeats itself"


def distinct_share(tokens: Sequence[int], n: int = N) -> float | None:
    """Distinct n-grams / all n-grams of ``tokens``; None for fewer than MIN_TOKENS tokens."""
    if len(tokens) < max(n, MIN_TOKENS):
        return None
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams)


def repeating_tasks(ok: Iterable[RunRecord]) -> dict[str, float]:
    """{task: the median distinct share of its runs} for each task whose median is below
    REPEATS_BELOW, over the finished runs long enough to judge (every arm: at greedy a speculative
    run writes the baseline's tokens, and sampled runs are outputs too)."""
    shares: dict[str, list[float]] = defaultdict(list)
    for r in ok:
        s = distinct_share(r.output_tokens)
        if s is not None:
            shares[r.task].append(s)
    medians = {t: statistics.median(v) for t, v in shares.items()}
    return {t: m for t, m in medians.items() if m < REPEATS_BELOW}


def repetition_finding(ok: Iterable[RunRecord]) -> Finding | None:
    """The warning when some task's output is a loop (its tasks named, so that each line of the
    verdict carries it), else None."""
    loops = repeating_tasks(ok)
    if not loops:
        return None
    which = ", ".join(f"{t}: {m:.0%} of its 4-token sequences distinct" for t, m in loops.items())
    return Finding(CODE, f"{MESSAGE} ({which}): n-gram drafting looks good on loops, so these speedups are "
                   "not what real text would get", FIX)
