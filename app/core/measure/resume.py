"""A sweep finished when the machine is quiet (``bench --resume RESULTS``, the window's "Finish when
quiet"): its quiet runs are kept, and only what is missing is measured, into the same file and
sweep.

What is measured again is whole groups: a group is one repetition of one prompt at one setting
(sampler, thinking, depth) with the arms the sweep ran there (the baseline and its speculative
arms back to back, as the plan interleaves them). A group with a disturbed or failed run is
measured again whole, so that each new speculative run has a quiet baseline beside it; a prompt
missing from a repetition that other prompts of its task reached (of any task, in a plain
sweep's grid, where every group has the same arms: a sweep stopped part-way) is measured with
that repetition's arms. Groups whose runs were all quiet are reused as they are.
The old disturbed runs stay in the file, marked; measured again quietly, they no longer count
against the verdict (app.core.analysis.disturbed).

    plan = plan_again(records)                 # the sweep's arms, prompts, settings
    todo = resume_of(records, plan)
    run_sweep(plan, engine, writer, sweep_id=todo.sweep_id, only=todo.wanted)
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from app.core.measure.busy import DISTURBED
from app.core.measure.plan import Plan, RunSpec
from app.core.records.arm import Arm
from app.core.records.sampler import SettingKey, setting_key
from app.core.records.schema import RunRecord

# a group: task, prompt id, repetition, and the setting (sampler values, thinking, depth)
Group = tuple[str, str, int, SettingKey, bool | None, int]


def _group(r: RunRecord) -> Group:
    return r.task, r.prompt_id, r.rep, setting_key(r.sampling), r.thinking, r.depth


@dataclasses.dataclass(frozen=True)
class Resume:
    """What a resumed sweep measures: each group to measure again with its arms; ``reused``: the
    quiet runs kept; ``sweep_id``: the sweep the new runs belong to."""

    sweep_id: str
    groups: Mapping[Group, frozenset[Arm]]
    reused: int
    raw: bool = False
    ignore_eos: bool = False
    earlier: tuple[RunRecord, ...] = dataclasses.field(default=(), repr=False, compare=False)  # the sweep's runs

    @property
    def runs(self) -> int:
        """The runs to measure."""
        return sum(len(arms) for arms in self.groups.values())

    def wanted(self, spec: RunSpec) -> bool:
        """Whether the plan's run ``spec`` is one to measure (the runner's ``only``)."""
        sampling = {**spec.sampler.to_dict(), "raw": self.raw, "ignore_eos": self.ignore_eos}
        key = (spec.prompt.task, spec.prompt.id, spec.rep, setting_key(sampling), spec.thinking, spec.depth)
        return spec.arm in self.groups.get(key, frozenset())


def resume_of(records: Sequence[RunRecord], plan: Plan) -> Resume:
    """What of ``plan`` (the sweep's own, plan_again) to measure again: the groups of ``records``
    with a disturbed or failed run, and the prompts missing from a repetition their task reached
    (see the module)."""
    by_group: dict[Group, list[RunRecord]] = {}
    for r in records:
        by_group.setdefault(_group(r), []).append(r)
    todo: dict[Group, frozenset[Arm]] = {}
    for g, rs in by_group.items():
        quiet = {r.measured_arm for r in rs if r.status == "ok" and DISTURBED not in r.flags}
        ran = frozenset(r.measured_arm for r in rs) | {Arm()}
        if not ran <= quiet:  # a run not measured quietly: the whole group again
            todo[g] = ran
    # the repetitions each task reached, with their arms; a plain sweep's grid (every group the same
    # arms) reached them for every task
    task_reps: dict[tuple[str, int], set[Arm]] = {}
    for (task, _, rep, *_rest), rs in by_group.items():
        task_reps.setdefault((task, rep), set()).update(r.measured_arm for r in rs)
    if len({frozenset(r.measured_arm for r in rs) for rs in by_group.values()}) == 1:
        task_reps = {(p.task, rep): arms for p in plan.prompts for (_, rep), arms in task_reps.items()}
    for p in plan.prompts:
        for (task, rep), arms in task_reps.items():
            if task != p.task:
                continue
            for sampler, thinking, depth in plan.settings():
                sampling = {**sampler.to_dict(), "raw": plan.raw, "ignore_eos": plan.ignore_eos}
                g = (task, p.id, rep, setting_key(sampling), thinking, depth)
                if g not in by_group:
                    todo[g] = frozenset(arms) | {Arm()}
    reused = sum(1 for g, rs in by_group.items() if g not in todo for r in rs if r.status == "ok")
    sweep_id = records[-1].sweep_id if records else ""
    return Resume(sweep_id, todo, reused, plan.raw, plan.ignore_eos, tuple(records))
