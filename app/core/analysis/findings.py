"""A finding of the analysis: a warning or confounder, with what to do about it (its advice: plain
words, or parts naming settings that each front end words: app.core.analysis.advice)."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Protocol

from app.core.analysis.advice import CTX_SIZE, GREEDY, MEMORY_LIMIT, SELFTEST, Advice, Setting, cli_words
from app.core.records.arm import Arm
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class Finding:
    """A warning or confounder, with what to do about it (``advice``; ``fix``: in the CLI's words)."""

    code: str
    message: str
    advice: str | Advice

    @property
    def fix(self) -> str:
        return cli_words(self.advice)

    def as_dict(self) -> dict[str, str]:
        """As results JSON carries it: the code, the message and the fix in the CLI's words."""
        return {"code": self.code, "message": self.message, "fix": self.fix}


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
    @property
    def margin(self) -> float | None: ...


CLOCK_OFF = 2.0  # a run's tok/s further than this factor from the engine's own figure times the reading


def clock_off(r: RunRecord) -> bool:
    """The run's tok/s from the token arrival times is more than CLOCK_OFF from the engine's own
    figure: the tokens were read in bursts, so the app's clock measured the reading, not the decoding."""
    return bool(r.tok_s and r.tok_s_engine) and not 1 / CLOCK_OFF <= (r.tok_s or 0) / (r.tok_s_engine or 1) <= CLOCK_OFF


def untimed(r: RunRecord) -> RunRecord:
    """``r`` without its tok/s where that measured the reading (clock_off): no speed, never an impossible one."""
    return dataclasses.replace(r, tok_s=None) if clock_off(r) else r


def clock_findings(ok: Iterable[RunRecord]) -> list[Finding]:
    """Runs whose tok/s from the token arrival times is more than 2x from the engine's own figure:
    the tokens were read in bursts (a very fast model, or a machine too busy to read them as they
    came), so the app's clock measured the reading, not the decoding; their speeds are left out."""
    off = [r for r in ok if clock_off(r)]
    if not off:
        return []
    worst = max(off, key=lambda r: max((r.tok_s or 0) / (r.tok_s_engine or 1), (r.tok_s_engine or 0) / (r.tok_s or 1)))
    return [Finding("clock_mismatch", f"in {len(off)} run(s) the tok/s from the token arrival times differs "
                    "from the engine's own figure by more than 2x (tokens arrived in bursts: a very fast "
                    "model, or a machine too busy to read them as they came), so their speeds are left out "
                    f"(worst: {worst.tok_s:,.1f} tok/s against the engine's {worst.tok_s_engine:,.1f})",
                    "close other programs and measure again, or measure a larger model")]


# a greedy divergence where the baseline's two most likely tokens were nearly tied (a top-2
# probability margin under NUMERICAL_BELOW: a logit change of d moves p1 - p2 by at most d / 2) is
# numerical; one where the baseline's token was confident (CONFIDENT_FROM or more: over half the
# probability, ahead by that much) is suspicious. Between them no verdict either way: batch shapes
# can move a margin further than 0.05 (a prompt-sized batch moved one of SmolLM2 Q4_1's by 0.14,
# docs/methodology.md), but not a confident token's.
NUMERICAL_BELOW = 0.05
CONFIDENT_FROM = 0.5


def divergence_margin(r: RunRecord, at: int | None) -> float | None:
    """The baseline's top-2 probability margin where a greedy run left its tokens (the record's
    ``divergence``, measure.divergence), when it was read at ``at``; None otherwise. A file's
    values are checked: probabilities in [0, 1], the top one first."""
    div = r.divergence
    if at is None or not isinstance(div, dict) or div.get("at") != at:
        return None
    top, second = div.get("top"), div.get("second")
    if not (isinstance(top, list) and isinstance(second, list) and len(top) == len(second) == 2):
        return None
    p1, p2 = top[1], second[1]
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 <= p <= 1.0 for p in (p1, p2)):
        return None
    return float(p1) - float(p2) if p1 >= p2 else None


def mode_name(arm: Arm) -> str:
    """The speculative mode as a divergence message names it."""
    return "MTP (draft-mtp)" if arm.is_mtp else arm.mode


def divergence_findings(eq: Iterable[Compared]) -> list[Finding]:
    """Greedy runs whose output differs from the baseline's (``eq``: the analysis' Equivalence
    list), told apart by the baseline's top-2 margin where they part: numerical (a near tie that
    batch shapes can turn), suspicious (a confident token changed: this llama.cpp build's mode may
    be wrong), or not explained (no margin read, or in between). Each names the mode."""
    bad = [e for e in eq if not e.equal]
    numerical = [e for e in bad if e.margin is not None and e.margin < NUMERICAL_BELOW]
    suspicious = [e for e in bad if e.margin is not None and e.margin >= CONFIDENT_FROM]
    other = [e for e in bad if e.margin is None or NUMERICAL_BELOW <= e.margin < CONFIDENT_FROM]
    out = []
    if numerical:
        widest = max(e.margin or 0.0 for e in numerical)
        out.append(Finding("output_differs_numerical",
                           f"{_modes(numerical)} output differs from the baseline at greedy in {len(numerical)} "
                           f"run(s), numerical: the two top tokens were within {widest:.3f} where they parted "
                           f"({_first(numerical)})",
                           "nothing to fix: on real weights a verify batch sums in another order than one-token "
                           "decoding, so a near tie can go the other way; the speedups stand"))
    if suspicious:
        modes = _modes(suspicious)
        out.append(Finding("output_differs",
                           f"{modes} output differs from the baseline at greedy in {len(suspicious)} run(s), "
                           f"suspicious: the baseline's token was confident where they parted ({_first(suspicious)})",
                           Advice((f"this llama.cpp build may have {'an' if modes[0] in 'aeiouMNn' else 'a'} {modes} "
                                   "bug: ", Setting(SELFTEST), " and update llama.cpp"))))
    if other:
        why = ("the margin there was not read" if all(e.margin is None for e in other)
               else "the two top tokens were not tied there, nor the baseline's token confident")
        out.append(Finding("output_differs",
                           f"{_modes(other)} output differs from the baseline at greedy in {len(other)} run(s) "
                           f"({_first(other)}; {why})",
                           Advice((Setting(SELFTEST), " (its calibrated models check the tokens exactly); on real "
                                   "weights batch shapes change the numerics, so a near tie can go the other way"))))
    return out


def _modes(bad: list[Compared]) -> str:
    return ", ".join(dict.fromkeys(mode_name(e.arm) for e in bad))


def _first(bad: list[Compared]) -> str:
    e = bad[0]
    return (f"first: {e.task}/{e.prompt_id} {e.arm.label}, token {e.first_divergence}"
            + ("" if e.margin is None else f", top-2 margin {e.margin:.3f}"))


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
                    Advice(("to check this llama.cpp build's speculative output, measure at greedy too (",
                            Setting(GREEDY), ")")))]


def left_out_findings(ok: Iterable[RunRecord]) -> list[Finding]:
    """Arms the sweep left out before they ran because they would not fit in memory (the records'
    host "left_out", app.core.session.memory): the verdict cannot pick what was never measured."""
    left = dict.fromkeys(why for r in ok for why in (r.host or {}).get("left_out") or () if isinstance(why, str))
    return [Finding("left_out_memory", f"{why} (not measured)",
                    Advice(("free memory, use a smaller ", Setting(CTX_SIZE), " or a quantized KV cache, or give a "
                            "larger ", Setting(MEMORY_LIMIT))))
            for why in left]
