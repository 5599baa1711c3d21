"""Is the output a loop? A base model on raw prompts often answers by repeating itself ("1. 1. 1.
...", the prompt again). Every n-gram drafter then drafts at full acceptance, and the sweep measures
a real speedup on text nobody wants: the verdict must say so, and never call such a cell sure.

The measure is the distinct 4-gram share of each run's generated tokens (distinct 4-token
sequences / all of them): 1.0 when nothing repeats, near 0 for a loop. What decided the threshold
(docs/methodology.md, "Repetition"): the calibrated models' outputs are all at 1.00; Gemma 3 270M
(a base model) on the built-in prompts, raw, over 96 tokens gave story 0.04-0.55 (median 0.18),
tongue-twisters 0.15-0.23, code 0.31-0.95 (median 0.54). Ordinary prose and code repeat far less
than half their 4-grams, so an answer whose share is below REPEATS_BELOW is a loop (a prompt's
answer: the median over its runs). A task is called a loop when at least LOOPING_FROM of its prompts'
answers are (issue 55): SmolLM2-135M-Instruct loops on the 3 Japanese stories of 7, which a median
over the task's runs (0.99) hid, while its n-gram speedup pooled them.

    tasks = repeating_tasks(ok_runs)     # {task: the looping prompts' median share} of the looping tasks
    f = repetition_finding(ok_runs)      # a Finding, or None
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Iterable, Iterator, Sequence

from app.core.analysis.findings import Finding
from app.core.records.schema import RunRecord

CODE = "repeats"
N = 4  # the n-gram: long enough that ordinary text seldom repeats one, short enough for short outputs
REPEATS_BELOW = 0.5  # a median distinct share below this: more than half the output's 4-grams repeat
MIN_TOKENS = 24  # fewer generated tokens (21 4-grams) say too little to call it a loop
# a task loops when at least this share of its prompts' answers loop: its speedup pools every prompt,
# so a quarter of looping answers already carries it (SmolLM2-135M loops on 3 of the 7 stories, the
# Japanese ones, at a median share of 0.99 over the task: docs/methodology.md, "Repetition")
LOOPING_FROM = 0.25
MESSAGE = "the model repeats itself"
FIX = "use an instruct model or your own prompts"
NOT_SURE = "not sure: the output repeats itself"


def distinct_share(tokens: Sequence[int], n: int = N) -> float | None:
    """Distinct n-grams / all n-grams of ``tokens``; None for fewer than MIN_TOKENS tokens."""
    if len(tokens) < max(n, MIN_TOKENS):
        return None
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams)


def prompt_shares(runs: Iterable[tuple[str, str, Sequence[int]]]) -> dict[str, dict[str, float]]:
    """{task: {prompt: the median distinct share of its runs}} over ``runs`` (task, prompt,
    generated tokens) long enough to judge."""
    shares: dict[tuple[str, str], list[float]] = defaultdict(list)
    for task, prompt, tokens in runs:
        s = distinct_share(tokens)
        if s is not None:
            shares[(task, prompt)].append(s)
    out: dict[str, dict[str, float]] = {}
    for (task, prompt), v in shares.items():
        out.setdefault(task, {})[prompt] = statistics.median(v)
    return out


def looping_prompts(runs: Iterable[tuple[str, str, Sequence[int]]]) -> dict[str, list[str]]:
    """{task: its prompts whose answer loops (median share below REPEATS_BELOW)}, every judged task."""
    return {t: [p for p, m in by.items() if m < REPEATS_BELOW] for t, by in prompt_shares(runs).items()}


def repeating_shares(runs: Iterable[tuple[str, str, Sequence[int]]]) -> dict[str, tuple[int, int, float]]:
    """{task: (prompts that loop, prompts judged, the looping prompts' median share)} for each task
    where at least LOOPING_FROM of the prompts loop."""
    out = {}
    for task, by in prompt_shares(runs).items():
        loops = [m for m in by.values() if m < REPEATS_BELOW]
        if loops and len(loops) >= LOOPING_FROM * len(by):
            out[task] = (len(loops), len(by), statistics.median(loops))
    return out


def _runs(ok: Iterable[RunRecord]) -> Iterator[tuple[str, str, Sequence[int]]]:
    # every arm: at greedy a speculative run writes the baseline's tokens, and sampled runs are outputs too
    return ((r.task, r.prompt_id, r.output_tokens) for r in ok)


def repeating_tasks(ok: Iterable[RunRecord]) -> dict[str, float]:
    """{task: the looping prompts' median distinct share} for each task where at least
    LOOPING_FROM of the prompts' answers loop (repeating_shares), over the finished runs."""
    return {t: m for t, (_, _, m) in repeating_shares(_runs(ok)).items()}


def repetition_finding(ok: Iterable[RunRecord]) -> Finding | None:
    """The warning when some task's output is a loop (its tasks named, so that each line of the
    verdict carries it), else None."""
    loops = repeating_shares(_runs(ok))
    if not loops:
        return None
    which = ", ".join(f"{t}: {m:.0%} of its 4-token sequences distinct"
                      + (f" in {n} of its {of} prompts" if of > 1 else "") for t, (n, of, m) in loops.items())
    return Finding(CODE, f"{MESSAGE} ({which}): n-gram drafting looks good on loops, so these speedups are "
                   "not what real text would get", FIX)
