"""The verdict rendered: the text ``recommend`` prints, its JSON (one shape, also the window's JSON
export), and the Markdown report with the tables, build, hardware, model and settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from app.core.analysis import breakeven
from app.core.analysis.fields import (EQUIVALENCE_FIELDS, HELD_OUT_FIELDS, MODEL_CHECK_FIELDS, cell_rows,
                                     format_analysis, json_cells, markdown_table, text_table)
from app.core.common.atomic import write_text_atomic
from app.core.engines.placement import Placement
from app.core.machine.modelinfo import size_text
from app.core.common.atomic import check_writable, write_error
from app.core.verdict.verdict import CPU_MARK, PROBE, ModelValidation, Verdict

MAX_DIFFERENCES = 20  # output differences listed in the report and the JSON


def format_breakeven(curves: Sequence[breakeven.Curve], validation: ModelValidation | None,
                     source: str | None = PROBE) -> str:
    where = "from the cost probe" if source == PROBE else f"costs {source}"
    lines = [f"break-even ({where}): MTP pays at width K when per-token acceptance exceeds"]
    for cv in curves:
        be = "never (verify + draft cost more than the best case gains)" if cv.break_even is None \
            else f"alpha >= {cv.break_even:.2f}"
        lines.append(f"  K={cv.k}: {be}; best case {cv.speedup[-1]:.2f}x")
    if validation and validation.checks:
        lines.append("model check (predicted vs measured speedup):")
        lines += _indented(text_table(validation.checks, MODEL_CHECK_FIELDS, rule=False))
    if validation and validation.held_out:
        lines.append("held-out widths (acceptance per draft position of the other widths predicts each K):")
        lines += _indented(text_table(validation.held_out, HELD_OUT_FIELDS, rule=False))
    return "\n".join(lines)


def _indented(table: str) -> list[str]:
    return ["  " + ln.rstrip() for ln in table.splitlines()]


def verdict_text(v: Verdict) -> str:
    """What ``mtp-tuner recommend`` prints."""
    out = [format_analysis(v.analysis)]
    if v.gpu_warning:
        out.append(f"\n!! {v.gpu_warning}")
    if v.withheld:
        out.append(f"\n!! {v.withheld}")
    if v.curves:
        out.append("\n" + format_breakeven(v.curves, v.model_check, v.cost_source))
    out.append("\n" + (f"[{CPU_MARK}] " if v.gpu_warning else "") + v.pick.reason)
    out += ["  " + p.reason for p in v.per_task]
    exp = v.export
    if exp is None:
        out.append(f"\n(no command: {v.export_problem})")
        return "\n".join(out)
    out.append(f"\n{exp.command}")
    if exp.skipped_flags:
        out.append(f"(left out, not accepted by this llama-server: {', '.join(exp.skipped_flags)})")
    out.append(f"(flags checked against: {exp.checked_against})")
    return "\n".join(out)


def ratio_dict(r) -> dict | None:
    if r is None:
        return None
    return {"estimate": r.estimate, "lo": r.lo, "hi": r.hi, "n_pairs": r.n_pairs, "verdict": r.verdict}


def _costs_dict(c: breakeven.Costs | None) -> dict | None:
    if c is None:
        return None
    return {"t_ms": {str(n): t for n, t in sorted(c.t_ms.items())}, "draft_ms": c.draft_ms,
            "catchup_ms": {str(n): t for n, t in sorted(c.catchup_ms.items())}}


def verdict_dict(v: Verdict, setting: str = "") -> dict:
    """The verdict as JSON data: ``recommend --json`` and the window's JSON export; ``setting``,
    the label of the verdict's setting when the sweep has several, goes on each cell."""
    a, exp = v.analysis, v.export
    bad = [e for e in a.equivalence if not e.equal]
    return {
        "recommendation": {**_arm_dict(v.pick.arm), "reason": v.pick.reason, "speedup": ratio_dict(v.pick.ratio)},
        "per_task": [{"task": p.scope, **_arm_dict(p.arm), "reason": p.reason,
                      "speedup": ratio_dict(p.ratio)} for p in v.per_task],
        "mix": dict(v.mix),
        "model": v.model_path,
        "command": exp.command if exp else None, "argv": list(exp.argv) if exp else None,
        "shell": exp.shell if exp else None, "preset": exp.preset if exp else None,
        "checked_against": exp.checked_against if exp else None,
        "skipped_flags": list(exp.skipped_flags) if exp else [],
        "export_problem": v.export_problem,
        "findings": [dataclasses.asdict(f) for f in a.findings],
        "measured_on_cpu": v.gpu_warning is not None,
        "gpu_warning": v.gpu_warning,
        "cost_source": v.cost_source,
        "costs": _costs_dict(v.costs),
        "break_even": [{"k": cv.k, "alpha": cv.break_even} for cv in v.curves] if v.curves else None,
        "model_check": None if v.model_check is None else cell_rows(v.model_check.checks, MODEL_CHECK_FIELDS),
        "held_out": None if v.model_check is None else cell_rows(v.model_check.held_out, HELD_OUT_FIELDS),
        "tasks": list(a.tasks),
        "cells": json_cells(a.cells, setting),
        "equivalence": {"compared": len(a.equivalence), "equal": len(a.equivalence) - len(bad),
                        "differences": cell_rows(bad[:MAX_DIFFERENCES], EQUIVALENCE_FIELDS)},
        # only when runs were disturbed by other programs: how many, the busiest, whether withheld
        **({"disturbed": v.disturbed.as_dict(), "withheld": v.withheld} if v.disturbed is not None else {}),
    }


def _arm_dict(arm) -> dict:
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
        lines += [f"> **Warning: {CPU_MARK}.** {v.gpu_problem}; fix: {v.gpu_fix}", ""]
    if v.withheld:
        lines += [f"> **Warning: {v.withheld}.**", ""]
    lines += [f"**Recommendation:** {v.pick.reason}", ""]
    lines += [f"- {p.reason}" for p in v.per_task]
    lines += ["", "## Command", ""]
    if exp is None:
        lines += [f"No command: {v.export_problem}.", ""]
    else:
        lines += [f"```{_fence(exp.shell)}", exp.command, "```", "", f"Flags checked against: {exp.checked_against}."]
        if exp.skipped_flags:
            lines.append(f"Left out (this llama-server does not accept them): {', '.join(exp.skipped_flags)}.")
        lines += ["", "llama-server preset (INI):", "", "```ini", exp.preset.rstrip(), "```", ""]
    lines += ["## Measurements", "", markdown_table(a.cells), ""]
    lines += [f"- warning: {f.message} -> {f.fix}" for f in a.findings]
    if a.findings:
        lines.append("")
    if v.curves:
        lines += ["## Break-even model", "", "```", format_breakeven(v.curves, v.model_check, v.cost_source),
                  "```", ""]
    if a.equivalence:
        bad = [e for e in a.equivalence if not e.equal]
        lines += ["## Output equivalence (greedy)", "",
                  f"{len(a.equivalence) - len(bad)} of {len(a.equivalence)} MTP runs produced exactly the "
                  "baseline's tokens." + ("" if not bad else " Differences:"), ""]
        if bad:
            lines.append(markdown_table(bad[:MAX_DIFFERENCES], EQUIVALENCE_FIELDS))
        lines.append("")
    lines += ["## Setup", "",
              f"- model: `{r0.model_path}` ({size_text(r0.model_size)})",
              f"- llama.cpp: {r0.llama_build}; engine: {r0.engine}",
              *_drafter_lines(records),
              f"- host: {r0.host.get('os', '?')}, {r0.host.get('cpu_count', '?')} CPUs"
              + "".join(f", GPU {g.get('name')}" for g in r0.host.get("gpus") or () if isinstance(g, dict)),
              f"- ran on: {_ran_on(r0)}",
              f"- sampling: {r0.sampling}; n_predict {r0.n_predict}",
              f"- runs: {len(records)} ({sum(1 for r in records if r.status != 'ok')} failed)",
              "- task mix: " + ", ".join(f"{t} {100 * w:.0f}%" for t, w in v.mix.items()),
              "- speedup: geometric mean of paired (interleaved) MTP/baseline ratios, 95 % t interval "
              "on the log ratios", ""]
    return "\n".join(lines)


def _drafter_lines(records) -> list[str]:
    """One Setup line per drafter file the sweep used (schema 3)."""
    seen = {r.drafter["path"]: r.drafter for r in records if r.drafter and r.drafter.get("path")}
    return [f"- drafter: `{p}` ({d.get('arch', '?')}, {size_text(d.get('size') or 0)}, "
            f"sha256 {str(d.get('sha256') or '?')[:12]})" for p, d in seen.items()]


def _ran_on(r) -> str:
    """Where a record's engine ran the model (schema 2), in words."""
    p = Placement.of_record(r)
    return "not recorded (a results file from before schema 2)" if p is None else p.text()


def write_report(path: str, text: str) -> Path:
    """Write the report atomically; a UserError names the file and the cause when it cannot be."""
    p = check_writable(path, "report")
    try:
        write_text_atomic(p, text)
    except OSError as e:
        raise write_error(p, e, "report") from None
    return p
