"""The verdict rendered: the text ``recommend`` prints, its JSON (one shape, also the window's JSON
export), and the Markdown report with the tables, build, hardware, model and settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable, Sequence

from app.core.analysis import breakeven
from app.core.analysis.advice import cli_words
from app.core.analysis.compare import threads_text
from app.core.analysis.recommend import Pick
from app.core.analysis.stats import Ratio
from app.core.analysis.fields import (EQUIVALENCE_FIELDS, HELD_OUT_FIELDS, MODEL_CHECK_FIELDS, cell_rows,
                                     json_cells, markdown_table, text_table)
from app.core.common.atomic import write_text_atomic
from app.core.engines.backend_truth import Placement
from app.core.machine.modelinfo import size_text
from app.core.records.arm import Arm
from app.core.records.cost import CostRecord
from app.core.records.schema import RunRecord
from app.core.common.atomic import check_writable, write_error
from app.core.common.text import markdown, printable
from app.core.verdict.verdict import CPU_MARK, MIX, PROBE, Command, ModelValidation, Verdict
from app.core.verdict.workers import worker_lines

MAX_DIFFERENCES = 20  # output differences listed in the report and the JSON


def format_breakeven(curves: Sequence[breakeven.Curve], validation: ModelValidation | None,
                     source: str | None = PROBE, checks: bool = True) -> str:
    """The break-even acceptance per K; with ``checks``, the model check and the held-out widths."""
    where = "from the cost probe" if source == PROBE else f"costs {source}"
    lines = [f"break-even ({where}): MTP pays at width K when per-token acceptance exceeds"]
    for cv in curves:
        be = "never (verify + draft cost more than the best case gains)" if cv.break_even is None \
            else f"alpha >= {cv.break_even:.2f}"
        lines.append(f"  K={cv.k}: {be}; best case {cv.speedup[-1]:.2f}x")
    if checks and validation and validation.checks:
        lines.append("model check (predicted vs measured speedup):")
        lines += _indented(text_table(validation.checks, MODEL_CHECK_FIELDS, rule=False))
    if checks and validation and validation.held_out:
        lines.append("held-out widths (acceptance per draft position of the other widths predicts each K):")
        lines += _indented(text_table(validation.held_out, HELD_OUT_FIELDS, rule=False))
    return "\n".join(lines)


def _indented(table: str) -> list[str]:
    return ["  " + ln.rstrip() for ln in table.splitlines()]


def _command_lines(c: Command) -> list[str]:
    """A command under its verdict line (indented), or why there is none."""
    if c.export is None:
        return [f"  (no command: {c.problem})"]
    return (["  " + c.export.command] + ([f"  note: {c.export.secret_note}"] if c.export.secret_note else [])
            + ([f"  note: {c.sampler_note}"] if c.sampler_note else [])
            + worker_lines(c.export.workers))


def _checked_lines(v: Verdict) -> list[str]:
    exp = v.export or next((c.export for c in v.task_commands if c.export), None)
    if exp is None:
        return []
    skipped = [f"(left out, not accepted by this llama-server: {', '.join(exp.skipped_flags)})"] \
        if exp.skipped_flags else []
    own = [f"(the command: {cli_words(exp.binary_note)})"] if exp.binary_note else []  # said once, not under each command
    return skipped + [f"(flags checked against: {exp.checked_against})"] + own


def warning_lines(v: Verdict) -> list[str]:
    """The warnings that weaken the verdict, each with its fix: the runs missed the GPU, the
    verdict is withheld, and the analysis' findings."""
    out = [f"!! {v.gpu_warning}"] if v.gpu_warning else []
    if v.withheld:
        out.append(f"!! {v.withheld}")
    if v.provisional_why:
        out.append(f"!! provisional answer ({', '.join(v.provisional)}): {v.provisional_why}")
    return out + [f"warning: {f.message} -> {f.fix}" for f in v.analysis.findings]


def verdict_lines(v: Verdict, commands: bool = True, findings: bool = True) -> list[str]:
    """The answer: each task's verdict line followed by its own command, then the mix's line and
    command (with ``commands``), and the warnings next to them (the analysis' findings only with
    ``findings``)."""
    mark = f"[{CPU_MARK}] " if v.gpu_warning else ""
    out: list[str] = []
    for c in (*v.task_commands, v.command()):
        out.append(mark + c.pick.reason)
        if c.scope == MIX and v.answer_words:
            out.append(f"  {v.answer_words}")
        if commands:
            out += _command_lines(c)
    if commands:
        out += _checked_lines(v)
    warnings = warning_lines(v)[:None if findings else bool(v.gpu_warning) + bool(v.withheld)
                                + bool(v.provisional_why)]
    return out + ([""] + warnings if warnings else [])


def verdict_text(v: Verdict, verbose: bool = False) -> str:
    """What ``mtp-tuner recommend`` prints: the verdict lines with their commands and warnings
    first, then the per-cell table and the break-even acceptance; with ``verbose`` also the
    model check and the held-out widths."""
    out = verdict_lines(v)
    out += ["", text_table(v.analysis.cells)]
    if v.curves:
        out += ["", format_breakeven(v.curves, v.model_check, v.cost_source, checks=verbose)]
    if v.cost_label:
        out.append(f"({v.cost_label})")
    if v.unpriced:
        out.append(f"({v.unpriced})")
    return "\n".join(out)


def scope_text(v: Verdict, scope: str) -> str:
    """What ``recommend --for SCOPE`` prints: that task's (or the mix's) verdict line, its command
    and the warnings."""
    c = v.command(scope)
    out = [(f"[{CPU_MARK}] " if v.gpu_warning else "") + c.pick.reason, *_command_lines(c)]
    if c.export is not None:
        out += [ln for ln in _checked_lines(v)]
    warnings = warning_lines(v)
    return "\n".join(out + ([""] + warnings if warnings else []))


def ratio_dict(r: Ratio | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {"estimate": r.estimate, "lo": r.lo, "hi": r.hi, "n_pairs": r.n_pairs, "verdict": r.verdict}


def _costs_dict(c: breakeven.Costs | None) -> dict[str, Any] | None:
    if c is None:
        return None
    d: dict[str, Any] = {"t_ms": {str(n): t for n, t in sorted(c.t_ms.items())}, "draft_ms": c.draft_ms,
         "catchup_ms": {str(n): t for n, t in sorted(c.catchup_ms.items())}}
    if c.whole_steps:
        d["step_ms"] = {str(k): {"accept": c.step_accept_ms[k], "reject": c.step_reject_ms.get(k)}
                        for k in sorted(c.step_accept_ms)}
    return d


def _probe_dict(p: CostRecord | None) -> dict[str, Any] | None:
    """Where the probe that priced the curves ran."""
    if p is None:
        return None
    return {"run_id": p.run_id, "engine": p.engine, "backend": p.backend, "devices": list(p.devices),
            "llama_build": p.llama_build, "depth": p.depth, "timestamp_utc": p.timestamp_utc}


def verdict_dict(v: Verdict, setting: str = "") -> dict[str, Any]:
    """The verdict as JSON data: ``recommend --json`` and the window's JSON export; ``setting``,
    the label of the verdict's setting when the sweep has several, goes on each cell."""
    a, exp = v.analysis, v.export
    bad = [e for e in a.equivalence if not e.equal]
    return {
        # "whole_answer": the speedup with prompt processing and the first token counted, only where
        # it differs from "speedup" (decode alone) by more than recommend.CLOCK_GAP
        "recommendation": {**_arm_dict(v.pick.arm), "reason": v.pick.reason, "speedup": ratio_dict(v.pick.ratio),
                           **_whole_dict(v.pick), "provisional": v.is_provisional()},
        "per_task": [{"task": c.scope, **_arm_dict(c.pick.arm), "reason": c.pick.reason,
                      "speedup": ratio_dict(c.pick.ratio), **_whole_dict(c.pick), "provisional": v.is_provisional(c.scope),
                      **command_dict(c)} for c in v.task_commands],
        "provisional": v.provisional_why,  # why the picks marked provisional are (None: none is)
        "mix": dict(v.mix),
        "model": v.model_path,
        "command": exp.command if exp else None, "argv": list(exp.argv) if exp else None,
        "shell": exp.shell if exp else None, "preset": exp.preset if exp else None,
        "checked_against": exp.checked_against if exp else None,
        "skipped_flags": list(exp.skipped_flags) if exp else [],
        "export_problem": v.export_problem,
        "sampler_note": v.command().sampler_note,
        "findings": [f.as_dict() for f in a.findings],
        "measured_on_cpu": v.gpu_warning is not None,
        "gpu_warning": v.gpu_warning,
        "cost_source": v.cost_source,
        "cost_probe": _probe_dict(v.cost_probe),
        "cost_note": v.cost_note,
        "costs": _costs_dict(v.costs),
        "break_even": [{"k": cv.k, "alpha": cv.break_even} for cv in v.curves] if v.curves else None,
        "model_check": None if v.model_check is None else cell_rows(v.model_check.checks, MODEL_CHECK_FIELDS),
        # what the mix's pick gains on an answer of 128 tokens and of the user's length (edges priced)
        "answers": [{"tokens": g.tokens, "speedup": g.speedup, "own": g.own} for g in v.answers],
        "held_out": None if v.model_check is None else cell_rows(v.model_check.held_out, HELD_OUT_FIELDS),
        "tasks": list(a.tasks),
        "cells": json_cells(a.cells, setting),
        "equivalence": {"compared": len(a.equivalence), "equal": len(a.equivalence) - len(bad),
                        "differences": cell_rows(bad[:MAX_DIFFERENCES], EQUIVALENCE_FIELDS)},
        # only when n-gram or combined arms were measured: that no costs price them (Verdict.unpriced)
        **({"unpriced": v.unpriced} if v.unpriced else {}),
        # only when runs were disturbed by other programs: how many, the busiest, whether withheld
        **({"disturbed": disturbed_dict(v), "withheld": v.withheld} if v.disturbed is not None else {}),
    }


def disturbed_dict(v: Verdict) -> dict[str, Any]:
    """The disturbed runs in the JSON, "withheld" as the verdict has it (not when answered provisionally)."""
    assert v.disturbed is not None
    d = v.disturbed.as_dict()
    return d | {"withheld": v.withheld is not None, "message": v.withheld or v.provisional_why or d["message"]}


def command_dict(c: Command) -> dict[str, Any]:
    """A scope's command in the JSON: command, argv, export_problem, sampler_note, secret_note (a
    command that reads a secret from a variable: set it), binary_note (it names the tuner's own
    llama-server), and over RPC
    workers each worker's own command (workers: endpoint, argv, command, note)."""
    return {"command": c.export.command if c.export else None, "argv": list(c.export.argv) if c.export else None,
            "export_problem": c.problem, "sampler_note": c.sampler_note,
            **({"secret_note": c.export.secret_note} if c.export and c.export.secret_note else {}),
            **({"binary_note": cli_words(c.export.binary_note)} if c.export and c.export.binary_note else {}),
            **({"workers": [dataclasses.asdict(w) | {"argv": list(w.argv)} for w in c.export.workers]}
               if c.export and c.export.workers else {})}


def scope_dict(v: Verdict, scope: str) -> dict[str, Any]:
    """``recommend --for SCOPE --json``: that task's (or the mix's) pick and command."""
    c = v.command(scope)
    exp = c.export
    return {"for": c.scope, **_arm_dict(c.pick.arm), "reason": c.pick.reason, "speedup": ratio_dict(c.pick.ratio),
            **command_dict(c), "shell": exp.shell if exp else None, "preset": exp.preset if exp else None,
            "checked_against": exp.checked_against if exp else None,
            "skipped_flags": list(exp.skipped_flags) if exp else [], "model": v.model_path,
            "gpu_warning": v.gpu_warning, "findings": [f.as_dict() for f in v.analysis.findings],
            "provisional": v.is_provisional(scope), **({"withheld": v.withheld} if v.withheld else {})}


def _whole_dict(pick: Pick) -> dict[str, Any]:
    return {"whole_answer": ratio_dict(pick.whole)} if pick.whole is not None else {}


def _arm_dict(arm: Arm | None) -> dict[str, Any]:
    """A pick's arm in the JSON: mtp (draft-mtp picked), speculative (any mode picked), mode
    (llama.cpp's --spec-type, None: leave it off), K, p_min, drafter, draft_sampling."""
    if arm is None:
        return {"mtp": False, "speculative": False, "k": None, "p_min": None, "mode": None, "drafter": None,
                "draft_sampling": None}
    return {"mtp": arm.is_mtp, "speculative": True, "k": arm.k, "p_min": arm.p_min, "mode": arm.mode,
            "drafter": arm.drafter, "draft_sampling": arm.draft_sampling}


def _fence(shell: str) -> str:
    return {"powershell": "powershell", "cmd": "bat"}.get(shell, "bash")


def markdown_report(v: Verdict) -> str:
    """The verdict as a Markdown report."""
    a, exp, records = v.analysis, v.export, v.records
    r0 = records[-1]
    lines = ["# MTP Tuner report", ""]
    if v.gpu_warning:
        lines += [f"> **Warning: {CPU_MARK}.** {v.gpu_problem}; fix: {cli_words(v.gpu_fix or '')}", ""]
    if v.withheld:
        lines += [f"> **Warning: {v.withheld}.**", ""]
    if v.provisional_why:
        lines += [f"> **Provisional answer ({', '.join(v.provisional)}):** {v.provisional_why}.", ""]
    lines += [f"**Recommendation:** {v.pick.reason}", ""]
    lines += [f"- {p.reason}" for p in v.per_task]
    lines += ["", "## Command", ""]
    if exp is None:
        lines += [f"No command: {v.export_problem}.", ""]
    else:
        lines += [f"```{_fence(exp.shell)}", exp.command, "```", ""]
        if exp.workers:
            lines += ["First, each RPC worker on its own machine:", "", f"```{_fence(exp.shell)}",
                      *(w.command for w in exp.workers), "```", "", *(f"- {w.endpoint}: {w.note}" for w in exp.workers),
                      ""]
        lines.append(f"Flags checked against: {exp.checked_against}.")
        if exp.skipped_flags:
            lines.append(f"Left out (this llama-server does not accept them): {', '.join(exp.skipped_flags)}.")
        lines += ["", "llama-server preset (INI):", "", "```ini", exp.preset.rstrip(), "```", ""]
    if v.task_commands and any(c.export for c in v.task_commands):
        lines += ["### Per task", ""]
        for c in v.task_commands:
            lines += [f"{c.pick.reason}", ""]
            lines += [f"```{_fence(c.export.shell)}", c.export.command, "```", ""] if c.export else \
                [f"No command: {c.problem}.", ""]
    lines += ["## Measurements", "", markdown_table(a.cells), ""]
    lines += [f"- warning: {f.message} -> {f.fix}" for f in a.findings]
    if a.findings:
        lines.append("")
    if v.curves:
        lines += ["## Break-even model", "", "```", format_breakeven(v.curves, v.model_check, v.cost_source),
                  "```", ""] + ([f"Costs: {v.cost_label}.", ""] if v.cost_label else [])
    if v.unpriced:
        lines += [v.unpriced[0].upper() + v.unpriced[1:] + ".", ""]
    if a.equivalence:
        bad = [e for e in a.equivalence if not e.equal]
        lines += ["## Output equivalence (greedy)", "",
                  f"{len(a.equivalence) - len(bad)} of {len(a.equivalence)} speculative runs produced exactly the "
                  "baseline's tokens." + ("" if not bad else " Differences:"), ""]
        if bad:
            lines.append(markdown_table(bad[:MAX_DIFFERENCES], EQUIVALENCE_FIELDS))
        lines.append("")
    lines += ["## Setup", "",
              f"- model: {markdown(r0.model_path, 400)} ({size_text(r0.model_size)})",
              f"- llama.cpp: {markdown(r0.llama_build)}; engine: {markdown(r0.engine)}"
              + (f", {threads_text(records)}" if threads_text(records) else ""),
              *_drafter_lines(records),
              f"- host: {markdown(r0.host.get('os', '?'))}, {markdown(r0.host.get('cpu_count', '?'))} CPUs"
              + "".join(f", GPU {markdown(g.get('name'))}" for g in r0.host.get("gpus") or () if isinstance(g, dict)),
              f"- ran on: {_ran_on(r0)}",
              f"- sampling: {markdown(r0.sampling, 400)}; n_predict {r0.n_predict}",
              f"- runs: {len(records)} ({sum(1 for r in records if r.status != 'ok')} failed)",
              "- task mix: " + ", ".join(f"{markdown(t)} {100 * w:.0f}%" for t, w in v.mix.items()),
              "- speedup: geometric mean of paired (interleaved) MTP/baseline ratios, 95 % t interval "
              "on the log ratios", ""]
    return "\n".join(lines)


def _drafter_lines(records: Iterable[RunRecord]) -> list[str]:
    """One Setup line per drafter file the sweep used (schema 3)."""
    seen = {r.drafter["path"]: r.drafter for r in records if r.drafter and r.drafter.get("path")}
    out = []
    for p, d in seen.items():
        size = d.get("size")
        out.append(f"- drafter: {markdown(p, 400)} ({markdown(d.get('arch', '?'))}, "
                   f"{size_text(size if isinstance(size, int) else 0)}, "
                   f"sha256 {markdown(str(d.get('sha256') or '?')[:12])})")
    return out


def _ran_on(r: RunRecord) -> str:
    """Where a record's engine ran the model (schema 2), in words."""
    p = Placement.of_record(r)
    return "not recorded (a results file from before schema 2)" if p is None else p.text()


def write_report(path: str, text: str) -> Path:
    """Write the report atomically; a UserError names the file and the cause when it cannot be."""
    p = check_writable(path, "report")
    try:
        write_text_atomic(p, printable(text))  # the last guard: no raw control character in the file
    except OSError as e:
        raise write_error(p, e, "report") from None
    return p
