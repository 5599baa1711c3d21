"""The verdict, built once for every front end (``recommend``, ``--report``, the window's Results,
Export and Machine tabs): the analysis, the pick for the task mix and per task, the costs and where
they came from, the break-even curves, the model check and the llama-server command.

    build_verdict(records, *, cost_records=(), mix=None, caps=None, binary=None,
                  options=ExportOptions(), analysis=None) -> Verdict

One cost rule: a cost probe measured where the runs ran (same model, engine, backend, device set,
llama.cpp build; app.core.analysis.costs.matching_probe) at the depth nearest theirs, else costs
fitted from the sweep's own runs (``breakeven.costs_from_runs``), else none;
``Verdict.cost_source`` says which ("probe", "fitted from the runs" or None), ``cost_probe`` is
the probe that priced them and ``cost_note`` why no probe did (one line), ``cost_label`` both in
words. One rule for
which K get a curve: the sweep's measured K (1-4 when it measured no MTP arm) that the costs can
price. Rendering is in ``app.core.verdict.report``; for example::

    from app.core.verdict import ExportOptions, build_verdict, verdict_dict, verdict_text
    v = build_verdict(runs, cost_records=load_cost_records(path), mix="code=0.6,story=0.4",
                      caps=caps, binary=binary, options=ExportOptions(shell="powershell"))
    print(verdict_text(v))            # what `mtp-tuner recommend` prints
    json.dumps(verdict_dict(v))       # what `recommend --json` prints (and the window's JSON export)
    markdown_report(v)                # the report
    v.pick.reason, v.per_task, v.export.command if v.export else v.export_problem
    v.command("code").export.command  # one task's pick as a command (v.command() or "mix": the mix's)
    v.command("code", with_sampler=True)  # the same with the sampler the runs measured (off by default)
    v.curves, v.costs, v.cost_source, v.model_check.checks

For the Machine tab's probe: ``probe_sentence(cost_record)`` (or ``pays_sentence(costs)``).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

from app.core.analysis import breakeven, positions
from app.core.analysis.answer import SHORT, AnswerGain, answer_gains, gains_words, run_length
from app.core.analysis.advice import CLI_WORDS, Advice, say
from app.core.analysis.analysis import Analysis, analyze
from app.core.analysis.costs import matching_probe, run_setup
from app.core.analysis.decide import MIN_GAIN
from app.core.analysis.disturbed import Disturbance, disturbance, is_disturbed
from app.core.analysis.fidelity import baseline_finding
from app.core.analysis.findings import Finding
from app.core.analysis.placement import FEWER_LAYERS, ON_CPU
from app.core.analysis.provisional import (provisional_finding, provisional_reason, provisional_records,
                                          provisional_tasks)
from app.core.analysis.recommend import Pick, parse_mix, recommend
from app.core.analysis.repetition import NOT_SURE, repeating_tasks
from app.core.common.errors import UserError
from app.core.common.spec_modes import parts, takes_k
from app.core.engines.commands import Capabilities
from app.core.measure.placements import recorded_flags
from app.core.records.cost import CostRecord
from app.core.records.sampler import Sampler
from app.core.records.schema import RunRecord
from app.core.verdict.export import Export, ExportOptions, export_for, recorded_sampler, sampler_note
from app.core.verdict.workers import recorded_workers

PROBE, FITTED = "probe", "fitted from the runs"
CPU_MARK = "measured on CPU, not your GPU"  # the verdict's mark when the runs missed the machine's GPU
DEFAULT_KS = (1, 2, 3, 4)


@dataclasses.dataclass(frozen=True)
class ModelValidation:
    """The break-even model against the measurements: predicted vs measured speedup per cell."""

    checks: tuple[breakeven.ModelCheck, ...]
    # each measured K predicted from the task's other K by acceptance per draft position (runs
    # that counted it): predicted vs measured, and whether positions had to be extrapolated
    held_out: tuple[positions.HeldOutCheck, ...] = ()

    @property
    def max_abs_error(self) -> float | None:
        return max((abs(c.error) for c in self.checks), default=None)

    @property
    def max_abs_held_out_error(self) -> float | None:
        return max((abs(c.error) for c in self.held_out), default=None)


def _priced(k: int, costs: breakeven.Costs) -> bool:
    """Whether the costs know (or can extrapolate) the step cost at width k."""
    try:
        costs.step(k)
    except KeyError:
        return False
    return True


def check_cost_model(a: Analysis, costs: breakeven.Costs, records: Sequence[RunRecord] = ()) -> ModelValidation:
    """Check the break-even cost model against the runs: predicted speedup at each cell's measured
    alpha against its measured paired speedup (the cells whose K the costs can price; at the
    runs' answer length, the request's edges priced, where the costs have them); and, where
    runs counted acceptance per draft position, each K held out and predicted from the task's
    other K (positions.held_out_checks)."""
    out = []
    for c in a.cells:
        k = c.arm.k  # a draft-mtp arm has one
        if not c.arm.is_mtp or k is None or c.alpha is None or not c.ratio or not c.ratio.estimate \
                or not _priced(k, costs):
            continue
        length = run_length(records, c.arm) if costs.first_ms else None
        out.append(breakeven.ModelCheck(c.task, k, c.arm.p_min, c.alpha,
                                        breakeven.predicted_speedup(c.alpha, k, costs, length), c.ratio.estimate))
    return ModelValidation(tuple(out), tuple(positions.held_out_checks(a.cells, costs)))


def choose_costs(records: Sequence[RunRecord], cost_records: Iterable[CostRecord],
                 model_path: str | None) -> tuple[breakeven.Costs | None, str | None]:
    """(costs, their source): a probe measured where the runs ran, at the depth nearest the
    runs' context depth (the latest of equals), else fitted from the runs (see costs_and_why)."""
    costs, source, _, _ = costs_and_why(records, cost_records, model_path)
    return costs, source


def costs_and_why(records: Sequence[RunRecord], cost_records: Iterable[CostRecord], model_path: str | None
                  ) -> tuple[breakeven.Costs | None, str | None, CostRecord | None, str | None]:
    """(costs, their source, the probe that priced them, why no probe did: one line or None)."""
    probe, why = None, None
    if records:
        setup = dataclasses.replace(run_setup(records), model_path=model_path or records[-1].model_path)
        probe, why = matching_probe(cost_records, setup)
    if probe is not None:
        return breakeven.Costs.from_probe(probe), PROBE, probe, None
    fitted = breakeven.costs_from_runs(records)
    return (fitted, FITTED, None, why) if fitted is not None else (None, None, None, why)


def curve_ks(a: Analysis, costs: breakeven.Costs) -> list[int]:
    """The K that get a break-even curve: the measured draft-mtp ones (1-4 if none) the costs can price."""
    ks = sorted({arm.k for arm in a.arms if arm.is_mtp and arm.k}) or list(DEFAULT_KS)
    return [k for k in ks if _priced(k, costs)]


MIX = "mix"  # the scope of the user's task mix in Verdict.command (a task name otherwise)


@dataclasses.dataclass(frozen=True)
class Command:
    """The llama-server command for one scope: a task's pick, or the mix's (``scope`` MIX)."""

    scope: str
    pick: Pick
    export: Export | None  # None when it cannot be written (``problem`` says why)
    problem: str | None
    # what the sampler flags do to the server's chats, when they are written (sampler_note)
    sampler_note: str | None = None


@dataclasses.dataclass(frozen=True)
class ExportInputs:
    """What a verdict's commands were written with: the llama-server checked (or none) and the
    options, the sampler the runs measured (written only when asked)."""

    caps: Capabilities | None
    binary: str | None
    options: ExportOptions
    recorded: Sampler | None = None  # the runs' sampler (recorded_sampler), or None


@dataclasses.dataclass(frozen=True)
class Verdict:
    analysis: Analysis
    mix: Mapping[str, float]  # task -> weight, adding up to 1
    pick: Pick  # for the mix
    per_task: tuple[Pick, ...]
    costs: breakeven.Costs | None
    cost_source: str | None  # PROBE, FITTED or None
    curves: tuple[breakeven.Curve, ...]
    model_check: ModelValidation | None  # None without costs
    export: Export | None  # None when the command cannot be written (export_problem says why)
    export_problem: str | None
    model_path: str
    records: tuple[RunRecord, ...] = dataclasses.field(repr=False, compare=False, default=())
    # when the machine had a GPU but the runs ran (partly) on the CPU (see analysis.placement.placement_findings):
    # what happened and how to fix it; None otherwise. Every rendering shows them (gpu_warning), the
    # window's Export asks before it copies or saves the command.
    gpu_problem: str | None = None
    gpu_fix: str | Advice | None = None  # its parts: each front end words it (gpu_warning_said)
    # runs disturbed by other programs (None: none was); when too many were, the verdict is
    # withheld: the picks say so, with no arm, and there is no command
    disturbed: Disturbance | None = None
    # one command per task (per_task's order), each with its own pick's flags
    task_commands: tuple[Command, ...] = ()
    inputs: ExportInputs | None = dataclasses.field(repr=False, compare=False, default=None)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(p.scope for p in self.per_task)

    def command(self, scope: str | None = None, *, with_sampler: bool | None = None) -> Command:
        """The command for ``scope``: a task's pick, or the mix's (None, "" or MIX). With
        ``with_sampler`` other than the verdict's own choice, written again with (or without) the
        sampler the runs measured. A UserError naming the tasks for an unknown one."""
        if not scope or scope == MIX:
            written = self.inputs.options.sampler if self.inputs is not None and self.export is not None else None
            cmd = Command(MIX, self.pick, self.export, self.export_problem, sampler_note(written))
        else:
            found = next((c for c in self.task_commands if c.scope == scope), None)
            if found is None:
                raise UserError(f"no task {scope!r} in this sweep; its tasks: {', '.join(self.tasks)} "
                                f"(or {MIX}: your task mix)")
            cmd = found
        ins = self.inputs
        if ins is None or with_sampler is None or with_sampler == ins.options.with_sampler or self.withheld:
            return cmd
        options = dataclasses.replace(ins.options, with_sampler=with_sampler,
                                      sampler=ins.recorded if with_sampler else None)
        return _command(cmd.scope, cmd.pick, self.model_path, ins.caps, ins.binary, options)
    # the probe that priced the curves (None: none did), and why none did (one line, or None)
    cost_probe: CostRecord | None = dataclasses.field(default=None, repr=False, compare=False)
    cost_note: str | None = None
    # the tasks whose output is a loop (analysis.repetition): their picks are never "sure"
    repeating: tuple[str, ...] = ()
    # too many runs were disturbed, but pairs measured back to back under one load gave an answer
    # (analysis.provisional): the tasks whose picks are provisional, and why, with what to do
    provisional: tuple[str, ...] = ()
    provisional_why: str | None = None
    # what the mix's pick gains on an answer of 128 tokens and of the user's own length, the
    # request's edges priced (app.core.analysis.answer); () where the costs price no edges
    answers: tuple[AnswerGain, ...] = ()

    @property
    def answer_words(self) -> str | None:
        """"An answer of 128 tokens: 1.21x; of 1,024 tokens (your answer length): 1.29x (...)", or None."""
        return gains_words(self.answers)

    def is_provisional(self, scope: str | None = None) -> bool:
        """Whether ``scope``'s pick is provisional: a task's own, or for the mix (None, "" or MIX)
        any task it weighs."""
        return bool(set(self.provisional) & (set(self.mix) if not scope or scope == MIX else {scope}))

    def repeats(self, scope: str | None = None) -> bool:
        """Whether ``scope``'s pick stands on output that repeats itself: a task's own, or for the
        mix (None, "" or MIX) any task it weighs."""
        return bool(set(self.repeating) & (set(self.mix) if not scope or scope == MIX else {scope}))

    @property
    def cost_label(self) -> str | None:
        """Which costs priced the curves, in words (the window's label, the report's line)."""
        if self.cost_source == PROBE and self.cost_probe is not None:
            p = self.cost_probe
            return (f"priced by the cost probe {p.where()} (llama.cpp {p.llama_build}, depth {p.depth}, "
                    f"{p.timestamp_utc[:16].replace('T', ' ')})")
        if self.cost_source == FITTED:
            return "costs fitted from the runs" + (f": {self.cost_note}" if self.cost_note else
                                                   " (no cost probe of this model)")
        return None

    @property
    def unpriced(self) -> str | None:
        """The measured arms no costs price, in one line, or None: the cost probe and the runs'
        fitted costs time the draft-mtp step only, so an n-gram mode's drafts (free, of any length)
        and a combined mode's (the n-gram part's where the text repeats, the draft model's
        elsewhere) have no break-even curve; they are judged on their measured speedups alone."""
        labels = [arm.label for arm in self.analysis.arms
                  if arm.is_spec and any(not takes_k(part) for part in parts(arm.mode))]
        if not labels:
            return None
        return (f"not priced by the cost probe (it times the draft-mtp step only; n-gram drafts have no "
                f"break-even curve): {', '.join(labels)}, judged on their measured speedups")

    @property
    def withheld(self) -> str | None:
        """Why the verdict is withheld (the machine was busy), or None."""
        if self.disturbed is None or not self.disturbed.withheld or self.provisional_why is not None:
            return None
        return self.disturbed.withheld_reason()

    @property
    def gpu_warning(self) -> str | None:
        """CPU_MARK with the cause and the fix, when the runs missed the machine's GPU; else None."""
        return self.gpu_warning_said(CLI_WORDS)

    def gpu_warning_said(self, words: Mapping[str, str]) -> str | None:
        """gpu_warning with the fix's settings in one front end's words (app.core.analysis.advice)."""
        if self.gpu_problem is None:
            return None
        return f"{CPU_MARK}: {self.gpu_problem}; fix: {say(self.gpu_fix or '', words)}"


def build_verdict(records: Sequence[RunRecord], *, cost_records: Iterable[CostRecord] = (),
                  mix: str | Mapping[str, float] | None = None, caps: Capabilities | None = None,
                  binary: str | None = None, options: ExportOptions = ExportOptions(),
                  analysis: Analysis | None = None, sequential: float | None = None,
                  answer_tokens: int | None = None) -> Verdict:
    """The verdict on one sweep's runs. ``mix``: "code=0.6,story=0.4" text, or weights already
    parsed (default: equal over the measured tasks); a bad mix is a UserError. ``caps``/``binary``:
    the llama-server the flags are checked against (None: none was checked). ``analysis``: the
    runs' analysis when the caller already has it. ``sequential``: the runs are a sweep's that stopped
    once decided (adaptive, until decided), with this δ of "no gain worth having": the picks'
    intervals are the anytime ones it decided with (app.core.analysis.decide); None: as the records
    say (RunRecord.min_gain: a file written by such a sweep is judged as the sweep judged it).
    ``answer_tokens``: the user's answer length: the verdict says what the pick gains at it and at
    128 tokens (``answers``)."""
    records = tuple(records)
    if not records:
        raise UserError("no runs to judge")
    if sequential is None:
        sequential = next((r.min_gain for r in records if r.min_gain is not None), None)
    busy = disturbance(records)
    marked = provisional_tasks(records, busy) if busy is not None else ()
    counted = provisional_records(records, marked) if marked else None
    if counted is not None and busy is not None:  # a provisional answer from the pairs under one load
        a = analyze(counted)
        a = dataclasses.replace(a, findings=(*a.findings, provisional_finding(busy)))
    else:
        a = analysis if analysis is not None else analyze(records)
    marked = marked if counted is not None or (busy is not None and not busy.withheld) else ()
    why = provisional_reason(busy) if marked and busy is not None else None
    weights = parse_mix(mix, a.tasks) if mix is None or isinstance(mix, str) else dict(mix)
    pick, per_task = recommend(a, weights, anytime=sequential is not None,
                               min_gain=MIN_GAIN if sequential is None else sequential)
    loops = tuple(repeating_tasks(r for r in records if r.status == "ok" and not is_disturbed(r)))
    per_task = [_marked(_unsure(p, p.scope in loops), why if p.scope in marked else None) for p in per_task]
    pick = _marked(_unsure(pick, bool(set(loops) & set(weights))), why if set(marked) & set(weights) else None)
    model = records[-1].model_path
    thinking = {r.thinking for r in records}
    if options.thinking is None and len(thinking) == 1:  # the thinking setting the runs measured
        options = dataclasses.replace(options, thinking=thinking.pop())
    if options.base_argv is None and records[-1].server_args is not None:  # the user's flags, measured
        options = dataclasses.replace(options, base_argv=(binary or "llama-server", "-m", model,
                                                          *recorded_flags(records[-1].server_args, caps)))
    if options.rpc is None:  # the RPC workers the runs were split over
        options = dataclasses.replace(options, rpc=recorded_workers(records))
    recorded = recorded_sampler(records)
    if options.sampler is None and options.with_sampler:  # only when asked: the sampler the runs measured
        options = dataclasses.replace(options, sampler=recorded)
    mix_cmd = _command(MIX, pick, model, caps, binary, options)
    exp, problem = mix_cmd.export, mix_cmd.problem
    commands = tuple(_command(p.scope, p, model, caps, binary, options) for p in per_task)
    costs, source, probe, cost_note = costs_and_why([r for r in records if not is_disturbed(r)], cost_records, model)
    drift = baseline_finding(records, probe)  # the runs' baseline against the probe's plain step
    if drift is not None:
        a = dataclasses.replace(a, findings=(*a.findings, drift))
    curves: tuple[breakeven.Curve, ...] = ()
    check = None
    if costs is not None:
        curves = tuple(breakeven.curves(curve_ks(a, costs), costs))
        check = check_cost_model(a, costs, records)
    off_gpu = gpu_finding(a)
    if busy is not None and busy.withheld and counted is None:  # no pair to answer from: no pick, no command
        withheld = busy.withheld_reason()
        pick = dataclasses.replace(pick, arm=None, ratio=None, whole=None, whole_words=None,
                                   reason=f"{pick.scope}: {withheld}")
        per_task = [dataclasses.replace(p, arm=None, ratio=None, whole=None, whole_words=None,
                                        reason=f"{p.scope}: verdict withheld")
                    for p in per_task]
        exp, problem = None, withheld
        commands = tuple(Command(p.scope, p, None, withheld) for p in per_task)
    answers = answer_gains(a, records, pick.arm, weights, pick.ratio.estimate if pick.ratio else None, costs,
                           (SHORT, answer_tokens))
    return Verdict(a, weights, pick, tuple(per_task), costs, source, curves, check, exp, problem, model, records,
                   off_gpu.message if off_gpu else None, off_gpu.advice if off_gpu else None, busy, commands,
                   ExportInputs(caps, binary, options, recorded), cost_probe=probe, cost_note=cost_note,
                   repeating=loops, provisional=marked, provisional_why=why, answers=answers)


def _marked(pick: Pick, why: str | None) -> Pick:
    """A pick with its reason saying it is provisional, and why (``why`` None: as it is)."""
    return pick if why is None else dataclasses.replace(pick, reason=f"{pick.reason.rstrip('.')} ({why}).")


def _unsure(pick: Pick, loops: bool) -> Pick:
    """A pick that turns a mode on over output that repeats itself, with its reason saying it is
    not sure (a loop drafts well whatever the mode); any other pick as it is."""
    if not loops or pick.arm is None:
        return pick
    return dataclasses.replace(pick, reason=f"{pick.reason} ({NOT_SURE}; n-gram drafting looks good on loops)")


def _command(scope: str, pick: Pick, model: str, caps: Capabilities | None, binary: str | None,
             options: ExportOptions) -> Command:
    """The command for one pick; its problem instead when this shell cannot carry it."""
    try:
        return Command(scope, pick, export_for(pick, model, caps, binary, options), None, sampler_note(options.sampler))
    except UserError as e:  # e.g. a line break in the model path, which cmd cannot carry
        return Command(scope, pick, None, str(e))


def gpu_finding(a: Analysis) -> Finding | None:
    """The analysis' finding that the runs were off the machine's GPU (ran on the CPU, or put
    fewer layers on the GPU than fit), else None."""
    return next((f for f in a.findings if f.code in (ON_CPU, FEWER_LAYERS)), None)


def _pays(costs: breakeven.Costs, ks: Iterable[int] | None = None) -> list[tuple[int, float]]:
    """(width, break-even acceptance) of each width that can pay (default widths: those measured)."""
    ks = list(ks) if ks is not None else costs.widths()
    return [(k, a) for k in ks if (a := breakeven.break_even_alpha(k, costs)) is not None]


def probe_pays(rec: CostRecord) -> bool:
    """Whether a cost probe leaves any width that can pay (False: the probe alone says leave it off)."""
    return bool(_pays(breakeven.Costs.from_probe(rec)))


def pays_sentence(costs: breakeven.Costs, ks: Iterable[int] | None = None) -> str:
    """Where MTP can pay with these costs: the easiest width and each width's break-even
    acceptance (default widths: those the costs measured a verify pass for, K + 1 <= n)."""
    pays = _pays(costs, ks)
    if not pays:
        return ("MTP cannot pay on this machine: verifying costs more than drafts can save, even at "
                "100 % acceptance.")
    k, a = min(pays, key=lambda ka: ka[1])
    return (f"MTP can pay here at acceptance >= {100 * a:.0f} % for K = {k} (the easiest width); "
            + ", ".join(f"K={kk}: {100 * aa:.0f} %" for kk, aa in pays))


def probe_sentence(rec: CostRecord) -> str:
    """The verdict of a cost probe in one sentence, with where it was measured."""
    if not rec.prices_steps:
        return "This model has no MTP heads: only the verify cost was measured."
    return f"Measured {rec.where()}: " + pays_sentence(breakeven.Costs.from_probe(rec))
