"""A finding of the analysis: a warning or confounder, with what to do about it."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Protocol

from app.core.records.arm import Arm
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class Finding:
    """A warning or confounder, with what to do about it."""

    code: str
    message: str
    fix: str


class Compared(Protocol):
    """What divergence_findings reads of a greedy run against the baseline's tokens
    (analysis.Equivalence, which imports this module)."""

    @property
    def task(self) -> str: ...
    @property
    def prompt_id(self) -> str: ...
    @property
    def arm(self) -> Arm: ...
    @property
    def equal(self) -> bool: ...
    @property
    def first_divergence(self) -> int | None: ...


def clock_findings(ok: Iterable[RunRecord]) -> list[Finding]:
    """Runs whose tok/s from the token arrival times is more than 2x from the engine's own figure:
    the tokens were read in bursts (a very fast model, or a machine too busy to read them as they
    came), so the app's clock measured the reading, not the decoding."""
    off = [r for r in ok if r.tok_s and r.tok_s_engine and not 0.5 <= r.tok_s / r.tok_s_engine <= 2.0]
    if not off:
        return []
    return [Finding("clock_mismatch", f"in {len(off)} run(s) the tok/s from the token arrival times differs "
                    "from the engine's own figure by more than 2x (tokens arrived in bursts: a very fast "
                    "model, or a machine too busy to read them as they came)",
                    "compare with the engine's figure (tok_s_engine), close other programs, or measure a "
                    "larger model")]


def divergence_findings(eq: Iterable[Compared]) -> list[Finding]:
    """Greedy runs whose output differs from the baseline's (``eq``: the analysis' Equivalence
    list): a llama.cpp build with a speculative-decoding bug."""
    bad = [e for e in eq if not e.equal]
    if not bad:
        return []
    e = bad[0]
    return [Finding("output_differs", f"MTP output differs from baseline at greedy in {len(bad)} run(s) "
                    f"(first: {e.task}/{e.prompt_id} {e.arm.label}, token {e.first_divergence})",
                    "this llama.cpp build may have an MTP bug: run mtp-tuner selftest and update")]


SAMPLED = "sampled: outputs differ by design"


def sampled_findings(ok: Iterable[RunRecord]) -> list[Finding]:
    """Speculative runs at temperature > 0: their output is not checked against the baseline's.
    llama.cpp keeps a draft while the target's own sample equals it, one draw per token, so with
    the same seed the tokens match only as far as the verify batch's logits equal one-token
    decoding's; where they do not, every later draw takes another path."""
    n = sum(1 for r in ok if r.arm_kind != "baseline" and (r.sampling or {}).get("temperature", 0) > 0)
    if not n:
        return []
    return [Finding("sampled_outputs", f"{SAMPLED}: {n} speculative run(s) sampled at temperature > 0, "
                    "so their output is not checked against the baseline (only greedy runs are)",
                    "to check this llama.cpp build's speculative output, measure at greedy too "
                    "(--temperatures 0,... or --sampler greedy)")]


def left_out_findings(ok: Iterable[RunRecord]) -> list[Finding]:
    """Arms the sweep left out before they ran because they would not fit in memory (the records'
    host "left_out", app.core.session.memory): the verdict cannot pick what was never measured."""
    left = dict.fromkeys(why for r in ok for why in (r.host or {}).get("left_out") or () if isinstance(why, str))
    return [Finding("left_out_memory", f"{why} (not measured)",
                    "free memory, use a smaller --ctx-size or a quantized KV cache, or give a larger --memory-limit")
            for why in left]
