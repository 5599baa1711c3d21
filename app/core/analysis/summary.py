"""Per-task summary of a sweep's records: baseline and each MTP arm, acceptance and speedup.

Medians of our own decode tok/s; acceptance pooled over runs (accepted / drafted); speedup as in
the analysis: geometric mean of paired ratios of interleaved MTP and baseline runs.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Iterable

from app.core.analysis.analysis import analyze, arm_of
from app.core.analysis.fields import Field, text_table
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class Cell:
    task: str
    arm: str  # "baseline" or "K=2" / "K=2 p=0.5"
    k: int | None
    p_min: float | None
    n_runs: int
    n_failed: int
    tok_s_median: float | None
    tok_s_engine_median: float | None
    acceptance: float | None
    speedup: float | None
    not_engaged: int


def summarize(records: Iterable[RunRecord]) -> list[Cell]:
    """The CLI's table, taken from the analysis (one computation for bench and recommend)."""

    recs = list(records)
    cells: list[Cell] = []
    for c in analyze(recs).cells:
        engine = [r.tok_s_engine for r in recs if r.status == "ok" and r.task == c.task
                  and arm_of(r) == c.arm and r.tok_s_engine]
        cells.append(Cell(
            task=c.task, arm=c.arm.label, k=c.arm.k, p_min=c.arm.p_min if c.arm.k is not None else None, n_runs=c.tok_s.n,
            n_failed=c.n_failed, tok_s_median=c.tok_s.median,
            tok_s_engine_median=statistics.median(engine) if engine else None,
            acceptance=c.acceptance, speedup=c.ratio.estimate if c.ratio else None,
            not_engaged=c.not_engaged))
    return cells


def _fmt(x: float | None, spec: str) -> str:
    width = int(spec.split(".")[0])
    return format(x, spec) if x is not None else "-".rjust(width)


def _notes(c: Cell) -> str:
    notes = []
    if c.n_failed:
        notes.append(f"{c.n_failed} failed")
    if c.not_engaged:
        notes.append(f"MTP NOT ENGAGED in {c.not_engaged} run(s)")
    return " " + "; ".join(notes)


# bench's table: the analysis's cells with the engine's own tok/s and notes (fields.Field, as every table)
SUMMARY_FIELDS: tuple[Field, ...] = (
    Field("task", "task", lambda c: c.task, width=16),
    Field("arm", "arm", lambda c: c.arm, width=12),
    Field("n_runs", "runs", lambda c: c.n_runs, width=4, align=">"),
    Field("tok_s_median", "tok/s", lambda c: c.tok_s_median, lambda c: _fmt(c.tok_s_median, "8.1f"), 8, ">"),
    Field("tok_s_engine_median", "engine", lambda c: c.tok_s_engine_median,
          lambda c: _fmt(c.tok_s_engine_median, "8.1f"), 8, ">"),
    Field("acceptance", "accept", lambda c: c.acceptance,
          lambda c: _fmt(None if c.acceptance is None else 100 * c.acceptance, "6.1f")
          + ("%" if c.acceptance is not None else " "), 7, ">"),
    Field("speedup", "speedup", lambda c: c.speedup,
          lambda c: _fmt(c.speedup, "7.2f") + ("x" if c.speedup is not None else " "), 8, ">"),
    Field(None, " notes", text=_notes),
)


def format_table(cells: list[Cell]) -> str:
    return text_table(cells, SUMMARY_FIELDS)
