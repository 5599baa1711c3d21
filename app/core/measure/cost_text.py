"""A cost record as text (the probe's table: verify cost T(n)/T(1), draft step, the whole step per
K and the middle-rate check) and appended to a results file: what `mtp-tuner probe` prints and
keeps, for both probes' records."""

from __future__ import annotations

from pathlib import Path

from app.core.common.text import shown
from app.core.engines.base import EngineKind
from app.core.measure.whole_step import MID_TOLERANCE
from app.core.records.cost import CostRecord
from app.core.records.writer import append_line


def save_cost_record(path: str | Path, rec: CostRecord) -> None:
    """Append the cost record to a results file (a UserError naming the file when it cannot)."""
    append_line(path, rec.to_json())


def format_probe(rec: CostRecord) -> str:
    lines = [f"cost probe: {shown(rec.model_path, 400)}" + (f" with drafter {shown(rec.drafter, 400)}" if rec.drafter else ""),
             f"measured {rec.where()}, llama.cpp {rec.llama_build}",
             f"depth {rec.depth}, {rec.threads or 'default'} threads, {rec.rounds} rounds"
             f"{'' if rec.stable else ' (not fully stable: more rounds or a quieter machine would help)'}",
             f"prompt processing: {rec.prompt_tok_s.median:.0f} tok/s"]
    if rec.engine == EngineKind.SERVER and rec.step_ms:
        return "\n".join(lines + _format_steps(rec) + _format_network(rec))
    lines += [f"{'n':>3} {'T(n) ms':>9} {'p10-p90':>15} {'T(n)/T(1)':>10} {'p10-p90':>13}"]
    for n in sorted(rec.t_ms):
        t, r = rec.t_ms[n], rec.ratio[n]
        lines.append(f"{n:>3} {t.median:>9.2f} {t.p10:>7.2f}-{t.p90:<7.2f} {r.median:>10.2f} "
                     f"{r.p10:>6.2f}-{r.p90:<6.2f}")
    if rec.draft_ms:
        d = rec.draft_ms
        lines.append(f"draft step: {d.median:.2f} ms (p10-p90 {d.p10:.2f}-{d.p90:.2f}), "
                     f"{d.median / rec.t_ms[1].median:.0%} of T(1)")
    else:
        lines.append("draft step: - (the model has no MTP heads)")
    if rec.step_ms:
        lines += _format_steps(rec)
    return "\n".join(lines)


def _format_steps(rec: CostRecord) -> list[str]:
    """The llama-server probe's whole steps: per K at full acceptance and full rejection, against
    the plain step, and the middle-rate check."""
    assert rec.step_ms is not None
    t1 = rec.plain_ms or rec.t_ms[1]
    out = [f"plain decode step: {t1.median:.2f} ms (p10-p90 {t1.p10:.2f}-{t1.p90:.2f})",
           "whole speculative step (draft, verify, rollback, catch-up), ms:",
           f"{'K':>3} {'accept all':>11} {'p10-p90':>15} {'reject all':>11} {'p10-p90':>15} {'/plain':>7}"]
    for k in sorted(rec.step_ms):
        a, r = rec.step_ms[k]["accept"], rec.step_ms[k]["reject"]
        out.append(f"{k:>3} {a.median:>11.2f} {a.p10:>7.2f}-{a.p90:<7.2f} {r.median:>11.2f} "
                   f"{r.p10:>7.2f}-{r.p90:<7.2f} {a.median / t1.median:>7.2f}")
    mc = rec.mid_check
    if mc and mc.get("error") is not None:
        ok = abs(mc["error"]) <= MID_TOLERANCE
        out.append(f"middle rate at K={mc['k']} ({mc['accepted_per_step']:.2f} accepted per step): measured "
                   f"{mc['measured_ms']:.2f} ms, the line between the two predicts {mc['predicted_ms']:.2f} ms "
                   f"({100 * mc['error']:+.1f} %: " + ("interpolation holds)" if ok else
                                                       f"beyond {100 * MID_TOLERANCE:.0f} %, a noisy machine?)"))
    return out


def _format_network(rec: CostRecord) -> list[str]:
    """The network probe's steps through the relay at each delay added each way (the table above
    is the link as it is, the relay's own cost taken out)."""
    net = rec.network
    if net is None:
        return []
    head = "".join(f"{f'+{d:g} ms':>10}" for d in net.delays_ms)
    out = [f"through the relay, ms a step (plain without it: {net.direct_plain_ms.median:.2f}), delay added each way:",
           f"{'':>13}{head}", f"{'plain':>13}" + "".join(f"{s.median:>10.2f}" for s in net.plain_ms)]
    for k in sorted(net.step_ms):
        for side, label in (("accept", "accept all"), ("reject", "reject all")):
            out.append(f"{f'K={k} {label}':>13}" + "".join(f"{s.median:>10.2f}" for s in net.step_ms[k][side]))
    return out
