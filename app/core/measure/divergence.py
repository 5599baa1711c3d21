"""A greedy speculative run whose tokens leave the baseline's, looked at where they part (issue 55).

At greedy a speculative mode must write the baseline's tokens, but only as far as the target's
logits in a verify batch equal those of one-token decoding: on real weights the batch shape changes
the sums' order, and where the baseline's two most likely tokens were nearly tied the other one can
win. So the sweep keeps the latest greedy baseline run of each prompt and setting; when a greedy
speculative run of the same prompt differs from it, the engine reads the baseline's two most likely
tokens at the first difference (Engine.top_two: the baseline's answer generated again up to there,
one token at a time as its run decoded it, with the probabilities), off the clock, and the run's
record keeps them (its ``divergence``).
The analysis then tells a near tie (numerical) from a confident token that changed (suspicious).

    seen = Divergences()
    rec = seen.look(key, spec.arm, rec, engine, model, spec.sampler, cancel)  # its divergence added
"""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable

from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError
from app.core.engines.base import Engine
from app.core.records.arm import Arm
from app.core.records.sampler import Sampler
from app.core.records.schema import RunRecord, first_divergence


def greedy(r: RunRecord) -> bool:
    return bool((r.sampling or {}).get("temperature", 0) == 0)


class Divergences:
    """The latest greedy baseline run of each prompt and setting, and the look at a greedy
    speculative run that leaves it."""

    def __init__(self) -> None:
        self.baselines: dict[Hashable, RunRecord] = {}

    def look(self, key: Hashable, arm: Arm, rec: RunRecord, engine: Engine, model: str, sampler: Sampler,
             cancel: CancelToken) -> RunRecord:
        """``rec`` (a finished run of ``arm`` under ``sampler``; ``key``: its prompt and setting), with its
        ``divergence`` when it is a greedy speculative run whose tokens leave the baseline's."""
        if rec.status != "ok" or not greedy(rec):
            return rec
        if arm.is_baseline:
            self.baselines[key] = rec
            return rec
        base = self.baselines.get(key)
        if base is None or base.prompt_tokens != rec.prompt_tokens:
            return rec
        d = first_divergence(rec.output_tokens, base.output_tokens)
        if d is None or d >= len(base.output_tokens) or d >= len(rec.output_tokens):
            return rec  # equal, or one ended first: no token of both to compare
        div: dict[str, Any] = {"at": d, "baseline": base.output_tokens[d], "arm": rec.output_tokens[d]}
        try:
            top = engine.top_two(model, base.prompt_tokens, base.output_tokens[:d], sampler, cancel)
        except EngineError:
            top = None
        if top is not None:
            div |= top.as_dict()
        return dataclasses.replace(rec, divergence=div)
