"""Per-task summary of a sweep's records: baseline and each MTP arm, acceptance and speedup (the
cells of ``bench --json``; bench's printed table is the analysis's, from the one field list).

Medians of our own decode tok/s; acceptance pooled over runs (accepted / drafted); speedup as in
the analysis: geometric mean of paired ratios of interleaved MTP and baseline runs.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Iterable

from app.core.analysis.analysis import Analysis, analyze, arm_of
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class Cell:
    task: str
    arm: str  # "baseline", "K=2" / "K=2 p=0.5" (draft-mtp), "draft-simple K=2", "ngram-mod"
    k: int | None
    p_min: float | None
    n_runs: int
    n_failed: int
    tok_s_median: float | None
    tok_s_engine_median: float | None
    acceptance: float | None
    speedup: float | None
    not_engaged: int
    mode: str = "draft-mtp"  # llama.cpp's --spec-type ("none": the baseline)


def summarize(records: Iterable[RunRecord], analysis: Analysis | None = None) -> list[Cell]:
    """The CLI's table, taken from the analysis (one computation for bench and recommend):
    ``analysis`` where the caller has analysed these records already, else analysed here."""

    recs = list(records)
    cells: list[Cell] = []
    for c in (analysis if analysis is not None else analyze(recs)).cells:
        engine = [r.tok_s_engine for r in recs if r.status == "ok" and r.task == c.task
                  and arm_of(r) == c.arm and r.tok_s_engine]
        cells.append(Cell(
            task=c.task, arm=c.arm.label, k=c.arm.k, p_min=c.arm.p_min if c.arm.k is not None else None, n_runs=c.tok_s.n,
            n_failed=c.n_failed, tok_s_median=c.tok_s.median,
            tok_s_engine_median=statistics.median(engine) if engine else None,
            acceptance=c.acceptance, speedup=c.ratio.estimate if c.ratio else None,
            not_engaged=c.not_engaged, mode=c.arm.mode))
    return cells
