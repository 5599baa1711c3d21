"""From results to a verdict, once for every front end: ``recommend``, ``bench``'s closing summary,
``tune``, the window's Results tab, its story and Export all call :func:`judge`, and only render
what it returns. Its ingredients, each taken in one place:

- the runs, split by setting (analysis.settings.split_by_setting: runs pair only within one);
- the cost records that price them (:func:`cost_records_of`: the results file's own, or a
  ``--probe`` file), the same for every setting;
- the llama-server the commands are checked against, looked up once (:func:`find_server`);
- one verdict per setting (build_verdict), and the joint verdict of a sweep of server-flag
  settings or placements (verdict.joint), built with the same costs, server and options.

::

    costs, notes = cost_records_of(path)
    j = judge(runs, cost_records=costs, mix="code=0.6,story=0.4", server=find_server(None))
    j.verdict                      # the first setting's Verdict (the only one for most sweeps)
    [(s.label, s.verdict) for s in j.settings]
    j.joint                        # JointVerdict or None
    j.picks()                      # each task's pick and speedup, per setting (bench --json's "picks")
    judgement_dict(j)              # recommend --json, tune --json's "verdict"
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

from app.core.analysis.analysis import Analysis
from app.core.analysis.settings import setting_label, split_by_setting
from app.core.common.errors import UserError
from app.core.engines.commands import Capabilities
from app.core.records.cost import CostRecord
from app.core.records.reader import load_cost_records
from app.core.records.schema import RunRecord
from app.core.verdict.export import ExportOptions
from app.core.verdict.joint import JointVerdict, joint_verdict, setting_options
from app.core.verdict.report import verdict_dict
from app.core.verdict.verdict import Verdict, build_verdict


@dataclasses.dataclass(frozen=True)
class Server:
    """The llama-server a verdict's commands are checked against: its capabilities and binary
    (both None: none was found, or none was asked for)."""

    caps: Capabilities | None = None
    binary: str | None = None


def find_server(explicit: str | None = None, *, cached_only: bool = False) -> Server:
    """The llama-server to check the commands against, its ``--help`` read once: the one asked
    for (an error when it cannot be used), else the one found, else none. ``cached_only`` (the
    window, which reads a binary's flags on a worker): the capabilities already read, else None
    with the binary, and a binary asked for that is not there is no error."""
    # the server module only when asked (it is the heaviest of the engines to import)
    from app.core.engines.server.binary import cached_capabilities, find_server_binary, probe_capabilities

    try:
        binary = find_server_binary(explicit)
    except UserError:
        if explicit and not cached_only:
            raise
        return Server()
    if cached_only:
        return Server(cached_capabilities(binary), binary)
    try:
        return Server(probe_capabilities(binary), binary)
    except UserError:
        if explicit:
            raise
        return Server()


def cost_records_of(path: str, probe: str | None = None) -> tuple[list[CostRecord], list[str]]:
    """(the cost records that price a results file's runs, one warning per record or problem left
    out): the file's own, or ``probe``'s (recommend --probe: a UserError when it holds none that
    can be used). A results file whose cost records cannot be read prices with the runs' own."""
    left_out: list[str] = []
    try:
        costs = load_cost_records(probe or path, left_out)
        if probe and not costs and left_out:  # the probe file asked for holds no usable probe
            raise UserError(f"{left_out[0]}; --probe {probe} holds no usable cost probe")
    except UserError as e:
        if probe:  # the probe file asked for is unusable: say so and stop
            raise
        return [], [f"{e}; the break-even curves use the runs' own costs"]
    return costs, left_out


@dataclasses.dataclass(frozen=True)
class Judged:
    """One setting's verdict; ``label`` says what sets it apart ("" when the sweep has one)."""

    label: str
    verdict: Verdict


@dataclasses.dataclass(frozen=True)
class Judgement:
    """The verdicts of one sweep: per setting (all of them, or the one asked for), the joint
    verdict, and what priced and checked them."""

    settings: tuple[Judged, ...]
    labels: tuple[str, ...]  # every setting's label ("" for a sweep of one setting)
    joint: JointVerdict | None
    cost_records: tuple[CostRecord, ...]
    server: Server
    mix_error: str | None = None  # the task mix could not weigh this sweep: equal weights (lenient_mix)
    runs: tuple[RunRecord, ...] = dataclasses.field(default=(), repr=False, compare=False)  # every run judged

    @property
    def verdict(self) -> Verdict:
        """The first setting's verdict (the one asked for, or a sweep's only one)."""
        return self.settings[0].verdict

    def picks(self) -> list[dict[str, Any]]:
        """Each task's pick and its speedup over baseline, per setting: one row per task and
        setting, marked provisional or not, with its reason and the costs that priced its verdict
        (Verdict.cost_source)."""
        return [{"task": p.scope, "setting": s.label or None, "pick": p.arm.label if p.arm else "off",
                 "speedup": p.ratio.estimate if p.ratio else None, "lo": p.ratio.lo if p.ratio else None,
                 "hi": p.ratio.hi if p.ratio else None, "provisional": s.verdict.is_provisional(p.scope),
                 "reason": p.reason, "costs": s.verdict.cost_source}
                for s in self.settings for p in s.verdict.per_task]


OptionsFor = Callable[[Sequence[RunRecord]], ExportOptions]


def judge(records: Sequence[RunRecord], *, cost_records: Iterable[CostRecord] = (), mix: str | None = None,
          server: Server = Server(), options: ExportOptions = ExportOptions(), options_for: OptionsFor | None = None,
          setting: int | None = None, joint: bool = True, analysis: Analysis | None = None,
          lenient_mix: bool = False, sequential: float | None = None, answer_tokens: int | None = None) -> Judgement:
    """The verdicts of one sweep's runs. ``options``: the commands' (``base_argv``, the user's own
    command, takes each setting's flags: verdict.joint.setting_options), or ``options_for`` a
    setting's runs. ``setting``: judge only that setting (the window's choice, clamped; None:
    every one). ``joint``: also the joint verdict of a sweep of several server-flag settings.
    ``analysis``: the judged setting's analysis when the caller has it. A mix this sweep cannot
    weigh is a UserError, or with ``lenient_mix`` equal weights and ``mix_error``. ``sequential``:
    the runs are a sweep's that stopped once decided, judged on anytime intervals with that δ
    (build_verdict). ``answer_tokens``: the user's answer length (each verdict says what its pick
    gains at it and at 128 tokens)."""
    records = list(records)
    if not records:
        raise UserError("no runs to judge")
    costs = tuple(cost_records)
    groups = list(split_by_setting(records).values())
    labels = tuple(setting_label(g, records) for g in groups) if len(groups) > 1 else ("",)
    chosen = list(range(len(groups))) if setting is None else [max(0, min(setting, len(groups) - 1))]

    def opts(runs: Sequence[RunRecord]) -> ExportOptions:
        return options_for(runs) if options_for is not None else setting_options(options, runs, records, server.caps)

    def build(weights: str | None) -> tuple[tuple[Judged, ...], JointVerdict | None]:
        judged = tuple(Judged(labels[i], build_verdict(groups[i], cost_records=costs, mix=weights, caps=server.caps,
                                                       binary=server.binary, options=opts(groups[i]),
                                                       analysis=analysis if setting is not None else None,
                                                       sequential=sequential, answer_tokens=answer_tokens))
                       for i in chosen)
        jv = joint_verdict(records, cost_records=costs, mix=weights, caps=server.caps, binary=server.binary,
                           options=options) if joint else None
        return judged, jv

    mix_error = None
    try:
        judged, jv = build(mix)
    except UserError as e:
        if not lenient_mix or not mix:
            raise
        mix_error = str(e)  # a mix this sweep cannot weigh: equal weights, and why
        judged, jv = build(None)
    return Judgement(judged, labels, jv, costs, server, mix_error, tuple(records))


def judgement_dict(j: Judgement, one: Callable[[Verdict, str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The verdicts as JSON (``recommend --json``, ``tune --json``'s "verdict"): a sweep of one
    setting as its verdict (verdict_dict, or ``one``); of several, each under "settings" with its
    label, and the joint verdict under "joint"."""
    render = one or verdict_dict
    if len(j.settings) == 1 and len(j.labels) == 1:
        return render(j.verdict, "")
    return {"settings": [{"setting": s.label, **render(s.verdict, s.label)} for s in j.settings],
            **({"joint": j.joint.as_dict()} if j.joint is not None else {})}
