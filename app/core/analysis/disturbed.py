"""Runs disturbed by other programs (the flag "disturbed", app.core.measure.busy): how many, which
program was busiest, and whether the verdict must be withheld. The analysis leaves disturbed runs
out (and the speculative runs whose nearest baseline was disturbed); this says so."""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Iterable

from app.core.analysis.findings import Finding
from app.core.analysis.settings import setting_of
from app.core.common.text import shown
from app.core.measure.busy import BUSY_SHARE, DISTURBED, MAX_DISTURBED_SHARE, pct
from app.core.measure.quiet import MODE_SHIFT
from app.core.measure.busy_counters import NAME_LIMIT
from app.core.records.schema import RunRecord


def is_disturbed(r: RunRecord) -> bool:
    return DISTURBED in r.flags


@dataclasses.dataclass(frozen=True)
class Disturbance:
    """``runs`` of ``of`` finished runs were disturbed; ``top``: the program most often busiest
    in them, with its mean share of the CPU there (``top_cpu``)."""

    runs: int
    of: int
    top: str | None = None
    top_cpu: float | None = None
    superseded: int = 0  # of ``runs``, those measured again quietly (the same run: a re-run, a resume)

    @property
    def share(self) -> float:
        return self.runs / self.of if self.of else 0.0

    @property
    def withheld(self) -> bool:
        """More than MAX_DISTURBED_SHARE of the runs were disturbed and not measured again quietly:
        no verdict as it stands (a provisional one at most: app.core.analysis.provisional)."""
        left, of = self.runs - self.superseded, self.of - self.superseded
        return bool(of) and left / of > MAX_DISTURBED_SHARE

    def top_text(self) -> str:
        return f" (top: {self.top} {pct(self.top_cpu)})" if self.top else ""

    def sentence(self) -> str:
        """"the machine was busy: 14 of 40 runs disturbed by other programs (top: chrome 61 %)"."""
        return (f"the machine was busy: {self.runs} of {self.of} runs disturbed by other programs"
                f"{self.top_text()}")

    def withheld_reason(self) -> str:
        return (f"verdict withheld: {self.sentence()}, more than {pct(MAX_DISTURBED_SHARE)} of the runs; "
                "close them or run again")

    def as_dict(self) -> dict[str, object]:
        return {"runs": self.runs, "of": self.of, "share": round(self.share, 4), "top": self.top,
                "top_cpu": self.top_cpu, "threshold": BUSY_SHARE, "max_share": MAX_DISTURBED_SHARE,
                "withheld": self.withheld, "message": self.withheld_reason() if self.withheld else self.sentence()}


def disturbance(records: Iterable[RunRecord]) -> Disturbance | None:
    """The disturbed runs among the finished ones, or None when none was."""
    ok = [r for r in records if r.status == "ok"]
    hit = [r for r in ok if is_disturbed(r)]
    if not hit:
        return None
    again = len(hit) - len(unsettled(ok))
    tops: dict[str, list[float]] = collections.defaultdict(list)
    for r in hit:
        t = r.other_top or {}
        name, cpu = t.get("name"), t.get("cpu")
        if isinstance(name, str) and name.strip():  # a name from a results file: one line, bounded
            tops[shown(name, NAME_LIMIT)].append(float(cpu) if isinstance(cpu, (int, float)) and math.isfinite(cpu)
                                                  else 0.0)
    if not tops:
        return Disturbance(len(hit), len(ok), superseded=again)
    name = max(tops, key=lambda n: (len(tops[n]), sum(tops[n])))
    return Disturbance(len(hit), len(ok), name, round(sum(tops[name]) / len(tops[name]), 4), again)


def _slot(r: RunRecord) -> tuple[object, ...]:
    """The run a record measured: its task, prompt, repetition, arm and setting."""
    return r.task, r.prompt_id, r.rep, r.measured_arm, setting_of(r)


def unsettled(records: Iterable[RunRecord]) -> list[RunRecord]:
    """The finished disturbed runs not measured again quietly (no quiet run of the same slot)."""
    ok = [r for r in records if r.status == "ok"]
    quiet = {_slot(r) for r in ok if not is_disturbed(r)}
    return [r for r in ok if is_disturbed(r) and _slot(r) not in quiet]


def disturbed_findings(records: Iterable[RunRecord], skipped_pairs: int) -> list[Finding]:
    """A finding when runs were disturbed: they (and ``skipped_pairs`` speculative runs whose
    baseline was disturbed) are left out of the numbers."""
    d = disturbance(records)
    if d is None:
        return []
    pairs = f", and {skipped_pairs} run(s) paired with a disturbed baseline," if skipped_pairs else ""
    return [Finding("disturbed", f"{d.sentence()}: other programs took more than {pct(BUSY_SHARE)} of the CPU "
                    f"(or GPU) during them; they{pairs} are left out of the numbers",
                    "close the busy programs while measuring, or run again")]


def mode_shift_findings(records: Iterable[RunRecord]) -> list[Finding]:
    """A finding when runs were measured after the machine changed speed mid-sweep (the flag
    MODE_SHIFT: the baseline anchor stayed slower past the quiet gate's hold). They pair with the
    baselines measured beside them, at the same speed, so they stay in the numbers; the finding
    says how many, since a speedup can differ between a machine's two speeds."""
    ok = [r for r in records if r.status == "ok"]
    shifted = sum(MODE_SHIFT in r.flags for r in ok)
    if not shifted:
        return []
    return [Finding("mode_shift", f"{shifted} of {len(ok)} runs were measured after the machine changed speed "
                    "mid-sweep (the baseline stayed more than 10 % slower past the hold); each pairs with a "
                    "baseline measured at the same speed", "run again when the machine is steady")]
