"""Context depth: neutral text put before a task prompt, so that a run decodes at a target depth.

Assistants and coding tools decode thousands of tokens deep, where verify cost and acceptance
differ from a short prompt's. :func:`at_depth` puts ``depth`` tokens (at least, by the engine's own
tokenizer) of neutral context before the task prompt. The context is plain descriptive prose:
varied sentences (no sentence repeated), no instructions, questions, code or digits, so it adds
depth without changing what the task asks. Deterministic: the same depth and tokenizer give the
same text. No Qt, no engine: the caller passes the token counter (the engine's tokenizer).
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from app.core.common.errors import UserError

TokenCounter = Callable[[str], int]

SEPARATOR = "\n\n"  # between the context and the task prompt
MAX_DEPTH = 1 << 20
PROMPT_ROOM = 512  # context for the task prompt and its chat template besides the depth

_ADJ = ("quiet", "narrow", "old", "wide", "green", "grey", "warm", "cold", "small", "tall", "distant",
        "bright", "pale", "wooden", "stone", "busy", "empty", "sunlit", "misty", "low")
_NOUN = ("river", "road", "bridge", "garden", "harbour", "market", "hill", "library", "station",
         "orchard", "meadow", "village", "forest", "tower", "field", "lake", "square", "valley",
         "lighthouse", "workshop", "courtyard", "path", "farm", "chapel")
_VERB = ("lies beside", "runs past", "looks over", "stands near", "leads towards", "curves around",
         "sits below", "faces", "borders", "rises above", "opens onto", "winds through")
_WHEN = ("in the early morning", "after the rain", "on most summer evenings", "during the winter",
         "at noon", "when the wind turns", "in late autumn", "before the market opens",
         "as the tide comes in", "under a clear sky", "through the long afternoon", "at dusk")
_AFTER = ("Birds gather on the {n} roofs.", "A few people walk slowly along the {n} edge.",
          "The light changes colour over the {n}.", "Nobody hurries there.",
          "The air smells of cut grass and {a} stone.", "Its {n} is painted a {a} shade of blue.",
          "Some visitors stop to read the {a} signs.", "The sound of water carries a long way.",
          "A bell rings somewhere in the {n}.", "Leaves collect in the corners of the {n}.")


def neutral_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` different neutral sentences, the same list for the same seed (and each list a prefix
    of the longer ones)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        a1, a2 = rng.choice(_ADJ), rng.choice(_ADJ)
        n1, n2 = rng.choice(_NOUN), rng.choice(_NOUN)
        s = f"The {a1} {n1} {rng.choice(_VERB)} the {a2} {n2} {rng.choice(_WHEN)}."
        if rng.random() < 0.4:
            s += " " + rng.choice(_AFTER).format(n=rng.choice(_NOUN), a=rng.choice(_ADJ))
        if s in seen:
            continue
        seen.add(s)
        out.append(s)
    return out


def neutral_text(n: int, seed: int = 0) -> str:
    """The first ``n`` neutral sentences as text (what :func:`neutral_context` returns)."""
    return _join(neutral_sentences(n, seed))


def _join(sentences: list[str]) -> str:
    # a paragraph every few sentences, as text reads
    return "".join(s + ("\n\n" if (i + 1) % 6 == 0 else " ") for i, s in enumerate(sentences)).rstrip()


def neutral_context(depth: int, count_tokens: TokenCounter, seed: int = 0) -> str:
    """The shortest run of whole neutral sentences that counts at least ``depth`` tokens with
    ``count_tokens`` (with the separator that follows it); "" for depth 0."""
    if depth < 0 or depth > MAX_DEPTH:
        raise UserError(f"the context depth must be between 0 and {MAX_DEPTH}, got {depth}")
    if depth == 0:
        return ""

    cache: dict[int, int] = {}

    def tokens(n: int) -> int:
        if n not in cache:
            cache[n] = int(count_tokens(_join(pool[:n]) + SEPARATOR))
        return cache[n]

    # a first estimate from a sample, then a bracket and a binary search (a few tokenizer calls)
    pool = neutral_sentences(64, seed)
    per = max(tokens(64) / 64, 1.0)
    hi = max(1, int(depth / per * 1.1) + 2)
    while True:
        if len(pool) < hi:
            pool = neutral_sentences(hi, seed)
        if tokens(hi) >= depth:
            break
        hi *= 2
    lo = 0  # tokens(lo) < depth (an empty context has none of them)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tokens(mid) >= depth:
            hi = mid
        else:
            lo = mid
    return _join(pool[:hi])


def at_depth(prompt_text: str, depth: int, count_tokens: TokenCounter, seed: int = 0) -> str:
    """``prompt_text`` with ``depth`` tokens (at least) of neutral context before it; the prompt
    itself unchanged when ``depth`` is 0."""
    ctx = neutral_context(depth, count_tokens, seed)
    return ctx + SEPARATOR + prompt_text if ctx else prompt_text


def parse_depths(text: str, what: str = "the context depth") -> tuple[int, ...]:
    """``"0,4096,16k"`` -> (0, 4096, 16384): the depths of a sweep, in the order given, each once.
    ``what``: the setting as the caller's user knows it ("--depth", "Context depth"), which an
    error names."""
    out: list[int] = []
    for part in (p.strip().lower() for p in str(text).split(",")):
        if not part:
            continue
        mult = 1024 if part.endswith("k") else 1
        try:
            value = int(part[:-1] if mult > 1 else part) * mult
        except ValueError:
            raise UserError(f"{what} takes whole token counts like 0,4096,16k; got {part!r}") from None
        if value < 0 or value > MAX_DEPTH:
            raise UserError(f"{what} must be between 0 and {MAX_DEPTH}, got {value}")
        out.append(value)
    if not out:
        raise UserError(f"{what} needs at least one value (0: no added context)")
    return tuple(dict.fromkeys(out))


def ctx_for(ctx_size: int, depths: Sequence[int], n_predict: int) -> int:
    """The context size a sweep at ``depths`` needs: ``ctx_size`` grown to the deepest depth, the
    prompt and the generated tokens (0, the model's own context, stays 0)."""
    deepest = max(depths, default=0)
    if not ctx_size or not deepest:
        return ctx_size
    return max(ctx_size, deepest + PROMPT_ROOM + n_predict)
