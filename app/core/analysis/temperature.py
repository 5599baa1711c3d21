"""Acceptance against temperature: per task, the pooled acceptance of its
speculative runs at each temperature the sweep measured. The sweep runs every arm at every
temperature, so each point pools the same arms."""

from __future__ import annotations

from typing import Iterable

from app.core.records.schema import RunRecord


def acceptance_by_temperature(records: Iterable[RunRecord]) -> dict[str, list[tuple[float, float]]]:
    """Per task (in the sweep's order): (temperature, accepted / drafted) over its good speculative
    runs that drafted, by rising temperature; a task with no such run is left out."""
    pooled: dict[str, dict[float, list[int]]] = {}
    for r in records:
        if r.status != "ok" or r.arm_kind == "baseline" or not r.draft_n:
            continue
        t = float((r.sampling or {}).get("temperature", 0.0))
        acc = pooled.setdefault(r.task, {}).setdefault(t, [0, 0])
        acc[0] += r.draft_accepted or 0
        acc[1] += r.draft_n
    return {task: [(t, a / n) for t, (a, n) in sorted(by_t.items())] for task, by_t in pooled.items()}
