"""The best joint setting of a sweep with server flags as axes (``bench --axis "-ub=256,512"``,
app.core.measure.axes): each value is judged on its own (its verdict: its best K and its speedup
over its own baseline, since the flag changes plain decoding too), then priced against the
reference, the user's command as it is (the setting measured first: the user's own value of the
flag, else the axis' first value, without speculation)::

    jv = joint_verdict(records, mix="code=0.6,story=0.4")
    jv.sentence   # "--n-cpu-moe 24 with K=3: 1.41x (95% CI 1.30-1.52) over your command as it is (...)"
    jv.best.verdict.export.command   # the user's command with the winning value and the picked flags

A value's price against the reference pairs each of its runs (of its pick's arm, or of its
baseline when it picks none) with the reference's baseline run of the same task, prompt and
repetition; the tasks are weighed by the mix as the pick for the mix is (analysis.recommend).

A sweep of placements of the draft over RPC workers (measure.placements) is one of this kind: its
sentence names the placement that pays over the link, one surely faster than llama.cpp's own split
without speculation (its interval above 1), or says that nothing does (then the command is the
reference's: no placement is advised on noise)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

from app.core.analysis.disturbed import is_disturbed
from app.core.analysis.settings import Setting, flag_difference, setting_label, setting_of
from app.core.analysis.stats import Ratio, combine_ratios, paired_ratio
from app.core.common.units import ratio
from app.core.engines.commands import Capabilities
from app.core.engines.user_command import help_flags
from app.core.measure.axes import Axis, with_value
from app.core.measure.placements import ADVICE, LABELS, MOVES_TRUNK, placement_in, recorded_flags
from app.core.records.cost import CostRecord
from app.core.records.schema import RunRecord
from app.core.verdict.export import ExportOptions
from app.core.verdict.verdict import Verdict, build_verdict


PLACED = {label: name for name, label in LABELS.items()}  # a placement's name by its label


@dataclasses.dataclass(frozen=True)
class AxisValue:
    """One setting of the axes: what sets it apart (``-ub 128``), its own verdict and its pick's
    speedup over the reference's baseline (None: no pair)."""

    label: str
    verdict: Verdict
    over_reference: Ratio | None

    @property
    def setting(self) -> str:
        """"-ub 128 with K=2", "-ub 128 with speculation off"."""
        arm = self.verdict.pick.arm
        return f"{self.label} with {arm.label if arm is not None else 'speculation off'}"


@dataclasses.dataclass(frozen=True)
class JointVerdict:
    """Every setting of the axes, the reference first, and the best of them against the reference."""

    values: tuple[AxisValue, ...]
    best: AxisValue

    @property
    def reference(self) -> AxisValue:
        return self.values[0]

    @property
    def placements(self) -> bool:
        """Whether the settings are placements of the draft over RPC workers and nothing else
        (measure.placements: each label a placement's)."""
        return all(v.label in PLACED for v in self.values)

    @property
    def sentence(self) -> str:
        if self.placements:
            return self._where()
        return (f"{self.best.setting}: {_fmt(self.best.over_reference)} over your command as it is "
                f"({self.reference.label}, speculation off)")

    def _where(self) -> str:
        """The placement that pays over this link, or that none does (the reference: llama.cpp's
        own split without speculation)."""
        best, ref = self.best, self.reference
        advice = ADVICE[PLACED[best.label]]
        over = f"{_fmt(best.over_reference)} over {ref.label} without speculation"
        if best.verdict.pick.arm is not None:
            return f"over this link {advice}: {best.verdict.pick.arm.label} {over}"
        if any(v.verdict.pick.arm is not None for v in self.values):
            return f"over this link {advice} and leave speculation off: {over}, faster than any placement with it"
        return ("over this link nothing pays: no placement makes speculation faster; leave it off"
                + (f" and {advice} ({over})" if best is not ref else ""))

    def lines(self) -> list[str]:
        """The joint pick, each value's own result, and the winning command."""
        out = [f"{'where drafting runs' if self.placements else 'best joint setting'}: {self.sentence}"]
        for v in self.values:
            own = v.verdict.pick
            what = (f"{own.arm.label}, {_fmt(own.ratio)} over its own baseline" if own.arm is not None else
                    "speculation off (no setting reliably faster than its own baseline)")
            out.append(f"  {v.label}{' (reference)' if v is self.reference else ''}: {what}; "
                       f"{_fmt(v.over_reference)} over the reference")
        exp = self.best.verdict.export
        out.append(f"command: {exp.command}" if exp is not None else
                   f"no command: {self.best.verdict.export_problem or 'none written'}")
        return out


    def as_dict(self) -> dict[str, Any]:
        """``recommend --json``'s "joint": the sentence, the best setting, each value's own result
        (its pick and speedup over its own baseline) and over the reference, and the command."""
        exp = self.best.verdict.export
        return {"sentence": self.sentence, "best": self.best.label, "reference": self.reference.label,
                "placement": PLACED[self.best.label] if self.placements else None,
                "values": [{"setting": v.label, "pick": v.verdict.pick.arm.label if v.verdict.pick.arm else "off",
                            "speedup": _est(v.verdict.pick.ratio) if v.verdict.pick.arm else None,
                            "over_reference": _est(v.over_reference),
                            "lo": v.over_reference.lo if v.over_reference else None,
                            "hi": v.over_reference.hi if v.over_reference else None} for v in self.values],
                "argv": list(exp.argv) if exp is not None else None,
                "command": exp.command if exp is not None else None}


def _est(r: Ratio | None) -> float | None:
    return r.estimate if r is not None else None


def _fmt(r: Ratio | None) -> str:
    if r is None or r.estimate is None:
        return "no estimate"
    return ratio(r.estimate) + (f" (95% CI {r.lo:.2f}-{r.hi:.2f})" if r.lo is not None and r.hi is not None else "")


def axis_groups(records: Sequence[RunRecord]) -> list[list[RunRecord]] | None:
    """The runs of each server-flags setting in the order first measured (the reference first),
    when the sweep's settings differ in their server flags only and there are several; else None."""
    groups: dict[Setting, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(setting_of(r), []).append(r)
    if len(groups) < 2 or len({key[:3] for key in groups}) > 1:
        return None
    return list(groups.values())


def joint_verdict(records: Sequence[RunRecord], *, mix: str | Mapping[str, float] | None = None,
                  cost_records: Iterable[CostRecord] = (), caps: Capabilities | None = None,
                  binary: str | None = None, options: ExportOptions = ExportOptions()) -> JointVerdict | None:
    """The joint verdict of a sweep measured at several server-flag settings (None when it was
    not); each setting's verdict built as build_verdict builds one, its command from
    ``setting_options``."""
    ok = [r for r in records if r.status == "ok"]
    groups = axis_groups(ok)
    if groups is None:
        return None
    costs = tuple(cost_records)
    values = [(setting_label(runs, ok), build_verdict(runs, mix=mix, cost_records=costs, caps=caps, binary=binary,
                                                      options=setting_options(options, runs, ok, caps)), runs)
              for runs in groups]
    weights = values[0][1].mix
    ref_base = [r for r in groups[0] if r.arm_kind == "baseline" and not is_disturbed(r)]
    judged = tuple(AxisValue(label, v, _over(runs, v, ref_base, weights)) for label, v, runs in values)
    pool = judged
    if all(a.label in PLACED for a in judged):  # a placement is advised only when it is surely faster, and
        # without speculation only one that moves the trunk's layers: the others move what only drafting uses
        pool = tuple(a for a in judged if a is judged[0] or _surely_faster(a.over_reference) and (
            a.verdict.pick.arm is not None or PLACED[a.label] in MOVES_TRUNK))
    best = max(pool, key=lambda a: (a.over_reference.estimate or 0) if a.over_reference else 0)
    return JointVerdict(judged, best)


def _surely_faster(r: Ratio | None) -> bool:
    return r is not None and r.lo is not None and r.lo > 1


def _over(runs: Sequence[RunRecord], v: Verdict, ref_base: Sequence[RunRecord],
          weights: Mapping[str, float]) -> Ratio | None:
    """The speedup of ``v``'s pick (its baseline when none) over the reference's baseline runs,
    paired by task, prompt and repetition, the tasks weighed by ``weights``."""
    arm = v.pick.arm
    base = {(b.task, b.prompt_id, b.rep): b for b in reversed(ref_base)}  # the first of equals
    by_prompt = {(b.task, b.prompt_id): b for b in reversed(ref_base)}
    parts = []
    for task, w in weights.items():
        pairs = []
        for r in runs:
            if r.task != task or is_disturbed(r) or (r.measured_arm != arm if arm else r.arm_kind != "baseline"):
                continue
            b = base.get((task, r.prompt_id, r.rep)) or by_prompt.get((task, r.prompt_id))
            if b is not None and r.tok_s and b.tok_s:
                pairs.append((r.tok_s, b.tok_s))
        if not pairs:
            return None
        parts.append((w, paired_ratio(pairs)))
    return combine_ratios(parts) if parts else None


def setting_options(options: ExportOptions, runs: Sequence[RunRecord], sweep: Sequence[RunRecord],
                     caps: Capabilities | None) -> ExportOptions:
    """``options`` for one setting's ``runs`` of ``sweep``: the user's own command (``base_argv``)
    with the server flags that set the setting apart (an axis value) in place of its own."""
    if options.base_argv is None:
        return options
    diff = flag_difference(runs[0].server_args or (), {r.server_args or () for r in sweep})
    return dataclasses.replace(options, base_argv=with_setting(options.base_argv, diff, caps))


def with_setting(base_argv: tuple[str, ...], diff: Sequence[tuple[str, ...]],
                 caps: Capabilities | None) -> tuple[str, ...]:
    """The user's command with a setting's flags (``diff``: [("-ub", "128")], settings.flag_difference)
    in place of its own, each flag known by every spelling this llama-server's --help gives it; a
    placement's flags (measure.placements) after it, as the sweep ran them (an ``-ot`` adds to the
    user's own). ``diff`` is a results file's: a flag the rule does not keep, or with a secret in
    it, is left out (placements.recorded_flags)."""
    diff = [g for g in diff if recorded_flags(g, caps) == tuple(g)]
    specs = help_flags(caps.help_text) if caps is not None else {}
    _, rest = placement_in(diff)
    out = base_argv
    for group in rest:
        spec = specs.get(group[0])
        axis = Axis(group[0], group[1:], spec.aliases if spec is not None else frozenset({group[0]}))
        out = with_value(out, axis, " ".join(group[1:]))
    return (*out, *(a for g in diff if g not in rest for a in g))
