"""The verdict in one place: recommendation, exported command, break-even model, and a Markdown
report with the tables, build, hardware, model and settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from app.core.analysis import breakeven
from app.core.analysis.analysis import Analysis, format_analysis
from app.core.engines.commands import (Capabilities, FLAG_SPELLINGS, ServerConfig, build_server_argv, render,
                       render_preset)
from app.core.analysis.recommend import Pick
from app.core.records.schema import RunRecord

# what a current llama.cpp accepts, for rendering when no binary is at hand to ask
CURRENT_FLAGS = frozenset(s for spellings in FLAG_SPELLINGS.values() for s in spellings[:1])
CURRENT_CAPS = Capabilities(flags=CURRENT_FLAGS, version="current llama.cpp (not checked)",
                            spec_types=frozenset({"draft-mtp"}))


@dataclasses.dataclass(frozen=True)
class Export:
    argv: tuple[str, ...]
    shell: str
    command: str
    preset: str
    checked_against: str  # the binary whose --help was read, or a note
    skipped_flags: tuple[str, ...]


def export_command(pick: Pick, model: str, caps: Capabilities | None, binary: str | None, *,
                   shell: str = "bash", ctx_size: int = 8192, n_gpu_layers: str | None = None,
                   flash_attn: str | None = None, cache_type_k: str | None = None,
                   cache_type_v: str | None = None) -> Export:
    caps = caps or CURRENT_CAPS
    binary = binary or "llama-server"
    cfg = ServerConfig(model=model, spec_k=pick.arm.k if pick.arm else None,
                       p_min=pick.arm.p_min if pick.arm else None, ctx_size=ctx_size,
                       n_gpu_layers=n_gpu_layers, flash_attn=flash_attn, cache_type_k=cache_type_k,
                       cache_type_v=cache_type_v)
    skipped: list[str] = []
    argv = build_server_argv(binary, cfg, caps, skipped=skipped)
    return Export(tuple(argv), shell, render(argv, shell), render_preset(argv),
                  caps.version if caps is not CURRENT_CAPS else "no llama-server binary was checked",
                  tuple(skipped))


@dataclasses.dataclass(frozen=True)
class ModelValidation:
    checks: tuple[breakeven.ModelCheck, ...]

    @property
    def max_abs_error(self) -> float | None:
        return max((abs(c.error) for c in self.checks), default=None)


def validate_model(a: Analysis, costs: breakeven.Costs) -> ModelValidation:
    """Predicted speedup at each cell's measured alpha against its measured paired speedup."""
    out = []
    for c in a.cells:
        if c.arm.k is None or c.alpha is None or not c.ratio or not c.ratio.estimate:
            continue
        out.append(breakeven.ModelCheck(c.task, c.arm.k, c.arm.p_min, c.alpha,
                                        breakeven.predicted_speedup(c.alpha, c.arm.k, costs), c.ratio.estimate))
    return ModelValidation(tuple(out))


def format_breakeven(curves: Sequence[breakeven.Curve], validation: ModelValidation | None) -> str:
    lines = ["break-even (from the cost probe): MTP pays at width K when per-token acceptance exceeds"]
    for cv in curves:
        be = "never (verify + draft cost more than the best case gains)" if cv.break_even is None \
            else f"alpha >= {cv.break_even:.2f}"
        lines.append(f"  K={cv.k}: {be}; best case {cv.speedup[-1]:.2f}x")
    if validation and validation.checks:
        lines.append("model check (predicted vs measured speedup):")
        for ch in validation.checks:
            lines.append(f"  {ch.task:<15} K={ch.k}: alpha {ch.alpha:.2f}, predicted {ch.predicted:.2f}x, "
                         f"measured {ch.measured:.2f}x ({100 * ch.error:+.0f} %)")
    return "\n".join(lines)


def markdown_report(records: Sequence[RunRecord], a: Analysis, mix_pick: Pick, per_task: Sequence[Pick],
                    exp: Export, curves: Sequence[breakeven.Curve] | None,
                    validation: ModelValidation | None, mix: dict) -> str:
    r0 = records[-1]
    lines = ["# MTP Tuner report", "",
             f"**Recommendation:** {mix_pick.reason}", ""]
    lines += [f"- {p.reason}" for p in per_task]
    lines += ["", "## Command", "", f"```{'powershell' if exp.shell == 'powershell' else 'bat' if exp.shell == 'cmd' else 'bash'}",
              exp.command, "```", "", f"Flags checked against: {exp.checked_against}."]
    if exp.skipped_flags:
        lines.append(f"Left out (this llama-server does not accept them): {', '.join(exp.skipped_flags)}.")
    lines += ["", "llama-server preset (INI):", "", "```ini", exp.preset.rstrip(), "```", "",
              "## Measurements", "", "```", format_analysis(a), "```", ""]
    if curves:
        lines += ["## Break-even model", "", "```", format_breakeven(curves, validation), "```", ""]
    if a.equivalence:
        bad = [e for e in a.equivalence if not e.equal]
        lines += ["## Output equivalence (greedy)", "",
                  f"{len(a.equivalence) - len(bad)} of {len(a.equivalence)} MTP runs produced exactly the "
                  "baseline's tokens." + ("" if not bad else " Differences:"), ""]
        lines += [f"- {e.task}/{e.prompt_id} {e.arm.label} rep {e.rep}: first differs at token "
                  f"{e.first_divergence}" for e in bad[:20]]
        lines.append("")
    lines += ["## Setup", "",
              f"- model: `{r0.model_path}` ({r0.model_size / 2**30:.2f} GiB)",
              f"- llama.cpp: {r0.llama_build}; engine: {r0.engine}",
              f"- host: {r0.host.get('os', '?')}, {r0.host.get('cpu_count', '?')} CPUs",
              f"- sampling: {r0.sampling}; n_predict {r0.n_predict}",
              f"- runs: {len(records)} ({sum(1 for r in records if r.status != 'ok')} failed)",
              f"- task mix: " + ", ".join(f"{t} {100 * w:.0f}%" for t, w in mix.items()),
              f"- speedup: geometric mean of paired (interleaved) MTP/baseline ratios, 95 % t interval "
              "on the log ratios", ""]
    return "\n".join(lines)


def write_report(path: str, text: str) -> Path:
    """Write the report atomically; a UserError names the file and the cause when it cannot be."""
    from app.core.common.atomic import write_text_atomic
    from app.core.records.writer import check_writable, write_error

    p = check_writable(path, "report")
    try:
        write_text_atomic(p, text)
    except OSError as e:
        raise write_error(p, e, "report") from None
    return p


def ratio_dict(r) -> dict | None:
    if r is None:
        return None
    return {"estimate": r.estimate, "lo": r.lo, "hi": r.hi, "n_pairs": r.n_pairs, "verdict": r.verdict}


CELL_COLUMNS = ("task", "arm", "k", "p_min", "runs", "tok_s_median", "tok_s_p10", "tok_s_p90", "speedup",
                "speedup_lo", "speedup_hi", "verdict", "acceptance", "alpha", "mean_accepted_len", "failed")


def cell_rows(a: Analysis) -> list[dict]:
    """One row per task and arm: the Results table as data (CSV and JSON exports)."""
    rows = []
    for c in a.cells:
        r = c.ratio
        rows.append({"task": c.task, "arm": c.arm.label, "k": c.arm.k, "p_min": c.arm.p_min, "runs": c.tok_s.n,
                     "tok_s_median": c.tok_s.median, "tok_s_p10": c.tok_s.p10, "tok_s_p90": c.tok_s.p90,
                     "speedup": r.estimate if r else None, "speedup_lo": r.lo if r else None,
                     "speedup_hi": r.hi if r else None, "verdict": c.verdict, "acceptance": c.acceptance,
                     "alpha": c.alpha, "mean_accepted_len": c.mean_accepted_len, "failed": c.n_failed})
    return rows


def cells_csv(a: Analysis) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CELL_COLUMNS, lineterminator="\n")
    w.writeheader()
    for row in cell_rows(a):
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def analysis_dict(a: Analysis) -> dict:
    return {"cells": cell_rows(a),
            "equivalence": [dataclasses.asdict(e) | {"arm": e.arm.label} for e in a.equivalence],
            "findings": [dataclasses.asdict(f) for f in a.findings], "tasks": list(a.tasks)}
