"""A provisional answer from a busy machine's runs, instead of none (issue 39).

When more than busy.MAX_DISTURBED_SHARE of a sweep's runs (or of one task's) were disturbed by
other programs, the verdict is not withheld while some pairs can still be compared: a speculative run and its
baseline measured back to back (within stats.MAX_PAIR_GAP_S) under the same load (the others'
share of the CPU, and of the GPU where measured, within SAME_LOAD of each other) slowed alike, so
their ratio still says something. The answer counts those pairs with the quiet ones, and every
task that had a disturbed run is marked provisional, with the reason ("measured while cc1plus was
busy: provisional; run again when quiet to confirm"). A sweep can then be finished when the
machine is quiet (``bench --resume``): it measures again only what was not measured quietly.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from app.core.analysis.analysis import _Pairing, _times, arm_of  # the analysis' own pairing of runs
from app.core.analysis.advice import RESUME, Advice, Setting
from app.core.analysis.disturbed import Disturbance, disturbance, is_disturbed, unsettled
from app.core.analysis.findings import Finding
from app.core.analysis.settings import setting_of
from app.core.analysis.stats import MAX_PAIR_GAP_S
from app.core.measure.busy import DISTURBED
from app.core.records.schema import RunRecord

SAME_LOAD = 0.10  # two runs' loads (others' share of the CPU, of the GPU) this close: the same load
PROVISIONAL = "provisional"


def _load(r: RunRecord) -> tuple[float, float]:
    return (r.other_cpu or 0.0, r.other_gpu or 0.0)


def same_load(a: RunRecord, b: RunRecord) -> bool:
    """Whether two runs ran under the same load: the others' CPU and GPU shares within SAME_LOAD."""
    return all(abs(x - y) <= SAME_LOAD for x, y in zip(_load(a), _load(b)))


def nearest_baselines(records: Sequence[RunRecord]) -> dict[int, tuple[RunRecord, float]]:
    """Each finished speculative run's baseline as the analysis pairs it, disturbed or not (the
    one of its prompt and setting measured closest in time), with the seconds between them:
    ``id(run) -> (baseline, gap)``."""
    runs = list(records)
    pairing = _Pairing(runs, _times())
    out: dict[int, tuple[RunRecord, float]] = {}
    for r in runs:
        if r.status != "ok" or not arm_of(r).is_spec:
            continue
        key = (r.task, r.prompt_id, setting_of(r))
        b = pairing._nearest(key, r) if key in pairing.base_runs else None
        if b is not None:
            out[id(r)] = (b, abs(pairing.ts(r) - pairing.ts(b)))
    return out


def provisional_tasks(records: Sequence[RunRecord], busy: Disturbance) -> tuple[str, ...]:
    """The tasks answered provisionally: when too many of all the runs were disturbed, every task
    with a disturbed run; else each task too many of whose own runs were (a task measured only
    while a compiler ran gets an answer too, the others keep theirs from their quiet runs)."""
    tasks = busy_tasks(records)
    if busy.withheld:
        return tasks
    return tuple(t for t in tasks if (d := disturbance([r for r in records if r.task == t])) is not None and d.withheld)


def provisional_records(records: Sequence[RunRecord], tasks: Sequence[str]) -> list[RunRecord] | None:
    """The runs a provisional verdict stands on: those of ``tasks`` with their disturbed mark taken
    off, less the speculative runs whose baseline ran under another load or far apart (their pair
    says nothing), and the other tasks' runs as they are; or None when no pair with a disturbed run
    is left to count (nothing to add to the quiet runs)."""
    near = nearest_baselines(records)
    out, counted = [], False
    for r in records:
        if r.task not in tasks:
            out.append(r)
            continue
        pair = near.get(id(r))
        if pair is not None:
            b, gap = pair
            if (is_disturbed(r) or is_disturbed(b)) and (gap > MAX_PAIR_GAP_S or not same_load(r, b)):
                continue
            counted = counted or is_disturbed(r) or is_disturbed(b)
        out.append(dataclasses.replace(r, flags=tuple(f for f in r.flags if f != DISTURBED)) if is_disturbed(r) else r)
    return out if counted else None


def busy_tasks(records: Sequence[RunRecord]) -> tuple[str, ...]:
    """The tasks with a disturbed finished run not measured again quietly."""
    return tuple(dict.fromkeys(r.task for r in unsettled(records)))


def provisional_reason(busy: Disturbance) -> str:
    """"measured while cc1plus was busy, 50 of 82 runs disturbed: provisional; run again when quiet to confirm"."""
    who = f"{busy.top} was busy" if busy.top else "other programs were busy"
    return f"measured while {who}, {busy.runs} of {busy.of} runs disturbed: provisional; run again when quiet to confirm"


def provisional_finding(busy: Disturbance) -> Finding:
    return Finding(PROVISIONAL, f"{busy.sentence()}: the answer counts the pairs measured back to back under "
                   f"the same load, so it is provisional",
                   Advice(("run again when the machine is quiet (", Setting(RESUME), " measures only "
                           "what was not measured quietly)")))
