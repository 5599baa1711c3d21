"""Per-task summary of a sweep's records: baseline and each MTP arm, acceptance and speedup.

Medians of our own decode tok/s; acceptance pooled over runs (accepted / drafted); speedup as the
median of per-(prompt, repetition) ratios of interleaved MTP and baseline runs.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Iterable

from .analysis import nearest_baseline
from .results import RunRecord


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


def arm_key(r: RunRecord) -> tuple:
    return (-1, 0.0) if r.k is None else (r.k, r.p_min or 0.0)


def arm_name(k: int | None, p_min: float | None) -> str:
    if k is None:
        return "baseline"
    return f"K={k}" + (f" p={p_min:g}" if p_min else "")


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(records: Iterable[RunRecord]) -> list[Cell]:
    recs = list(records)
    tasks = list(dict.fromkeys(r.task for r in recs))
    cells: list[Cell] = []
    for task in tasks:
        tr = [r for r in recs if r.task == task]
        base_runs: dict[str, list[RunRecord]] = {}
        for r in tr:
            if r.k is None and r.status == "ok" and r.tok_s:
                base_runs.setdefault(r.prompt_id, []).append(r)
        for key in sorted({arm_key(r) for r in tr}):
            rs = [r for r in tr if arm_key(r) == key]
            ok = [r for r in rs if r.status == "ok"]
            k = None if key[0] == -1 else key[0]
            p_min = None if k is None else key[1]
            drafted = sum(r.draft_n or 0 for r in ok)
            accepted = sum(r.draft_accepted or 0 for r in ok)
            ratios = []
            for r in ok:
                b = nearest_baseline(r, base_runs.get(r.prompt_id, [])) if k is not None else None
                if b is not None and r.tok_s:
                    ratios.append(r.tok_s / b.tok_s)
            cells.append(Cell(
                task=task, arm=arm_name(k, p_min), k=k, p_min=p_min, n_runs=len(ok),
                n_failed=len(rs) - len(ok),
                tok_s_median=_median([r.tok_s for r in ok if r.tok_s]),
                tok_s_engine_median=_median([r.tok_s_engine for r in ok if r.tok_s_engine]),
                acceptance=accepted / drafted if drafted else None,
                speedup=_median(ratios) if k is not None else None,
                not_engaged=sum(1 for r in ok if "mtp_not_engaged" in r.flags)))
    return cells


def format_table(cells: list[Cell]) -> str:
    head = f"{'task':<16} {'arm':<12} {'runs':>4} {'tok/s':>8} {'engine':>8} {'accept':>7} {'speedup':>8}  notes"
    lines = [head, "-" * len(head)]
    for c in cells:
        notes = []
        if c.n_failed:
            notes.append(f"{c.n_failed} failed")
        if c.not_engaged:
            notes.append(f"MTP NOT ENGAGED in {c.not_engaged} run(s)")
        lines.append(
            f"{c.task:<16} {c.arm:<12} {c.n_runs:>4} {_fmt(c.tok_s_median, '8.1f')} "
            f"{_fmt(c.tok_s_engine_median, '8.1f')} "
            f"{_fmt(None if c.acceptance is None else 100 * c.acceptance, '6.1f')}{'%' if c.acceptance is not None else ' '} "
            f"{_fmt(c.speedup, '7.2f')}{'x' if c.speedup is not None else ' '}  {'; '.join(notes)}")
    return "\n".join(lines)


def _fmt(x: float | None, spec: str) -> str:
    width = int(spec.split(".")[0])
    return format(x, spec) if x is not None else "-".rjust(width)
