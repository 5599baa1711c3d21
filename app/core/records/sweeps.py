"""The sweeps in a results file's records, and picking one, so that one verdict never pools two
models or two set-ups."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Sequence

from app.core.common.errors import UserError
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class SweepInfo:
    """One sweep found in a results file: its id, model, when it ran and how many runs."""

    sweep_id: str
    model_path: str
    engine: str
    llama_build: str
    first_utc: str
    last_utc: str
    n_runs: int

    @property
    def label(self) -> str:
        return (f"{self.sweep_id} ({Path(self.model_path).name}, {self.engine}, {self.n_runs} runs, "
                f"{self.last_utc[:16].replace('T', ' ')} UTC)")


def sweeps_of(records: Sequence[RunRecord]) -> list[SweepInfo]:
    """The sweeps in these records, oldest first (by their last run)."""
    groups: dict[str, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(r.sweep_id, []).append(r)
    out = [SweepInfo(sid, rs[-1].model_path, rs[-1].engine, rs[-1].llama_build,
                     min(r.timestamp_utc for r in rs), max(r.timestamp_utc for r in rs), len(rs))
           for sid, rs in groups.items()]
    return sorted(out, key=lambda s: s.last_utc)


def select_sweep(records: Sequence[RunRecord], sweep: str | None = None, model: str | None = None,
                 where: str = "") -> tuple[list[RunRecord], SweepInfo | None, str | None]:
    """The runs of one sweep, so that one verdict never pools two models or two set-ups.

    ``sweep`` picks by id (a unique prefix is enough), ``model`` by model path (or file name);
    among what is left the latest sweep is taken. Returns (its runs, which sweep, a sentence
    saying which was chosen when the file held more than one, else None)."""
    all_sweeps = sweeps_of(records)
    if not all_sweeps:
        return [], None, None
    cands = all_sweeps
    if sweep:
        cands = [s for s in cands if s.sweep_id.startswith(sweep)]
        if not cands:
            raise UserError(f"{where}: no sweep {sweep!r}; it holds "
                            + ", ".join(s.label for s in all_sweeps))
        if len(cands) > 1:
            raise UserError(f"{where}: {sweep!r} names {len(cands)} sweeps ("
                            + ", ".join(s.sweep_id for s in cands) + "); give more of the id")
    if model:
        want = os.path.normcase(os.path.abspath(os.path.expanduser(model)))
        same = [s for s in cands if os.path.normcase(os.path.abspath(s.model_path)) == want]
        by_name = [s for s in cands if Path(s.model_path).name == Path(model).name]
        cands = same or by_name
        if not cands:
            raise UserError(f"{where}: no sweep of model {model!r}; it holds "
                            + ", ".join(s.label for s in all_sweeps))
    chosen = cands[-1]
    runs = [r for r in records if r.sweep_id == chosen.sweep_id]
    note = None
    if len(all_sweeps) > 1:
        models = {s.model_path for s in all_sweeps}
        what = f"{len(all_sweeps)} sweeps" + (f" of {len(models)} models" if len(models) > 1 else "")
        how = "the latest" if not (sweep or model) else "the one asked for"
        others = [s.sweep_id for s in all_sweeps if s is not chosen]
        note = f"{where} holds {what}; showing {how}: {chosen.label}; the others: {', '.join(others)}"
    return runs, chosen, note
