"""``recommend --rtt``: the sweep's own acceptance put on the network probe's lines
(app.core.analysis.network), so the verdict says how much of each step waits on the network and
what speedup each K would give over the links the user types."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from app.core.analysis.network import latest_network, network_text
from app.core.records.cost import CostRecord
from app.core.verdict.verdict import Verdict

NO_PROBE = ("no network probe of this model in the results: run mtp-tuner probe --rpc HOST:PORT --network "
            "--out (this results file) to predict other round-trip times")


def sweep_alphas(v: Verdict) -> dict[int, float]:
    """Each measured K's per-token acceptance alpha as the sweep measured it: the mean over the
    tasks of their draft-mtp cells at that K, weighted by the task mix (the arm without a
    confidence threshold where the sweep ran one, else its arms alike)."""
    cells = [c for c in v.analysis.cells if c.arm.is_mtp and c.arm.k and c.alpha is not None]
    out = {}
    for k in sorted({c.arm.k for c in cells if c.arm.k}):
        at_k = [c for c in cells if c.arm.k == k]
        plain = [c for c in at_k if not c.arm.p_min] or at_k
        weights = [v.mix.get(c.task, 0.0) for c in plain]
        if sum(weights) <= 0:
            weights = [1.0] * len(plain)
        out[k] = sum(w * (c.alpha or 0.0) for w, c in zip(weights, plain)) / sum(weights)
    return out


def rtt_lines(v: Verdict, cost_records: Iterable[CostRecord], typed: Sequence[float]) -> list[str]:
    """The network part of the verdict at the round trips typed (ms), or why there is none."""
    model = str(Path(v.model_path).resolve())
    rec = latest_network([c for c in cost_records if str(Path(c.model_path).resolve()) == model])
    if rec is None:
        return [NO_PROBE]
    alphas = sweep_alphas(v)
    if not alphas:
        return ["the sweep measured no draft-mtp acceptance to predict with"]
    return network_text(rec, typed, alphas, "the acceptance this sweep measured (" + ", ".join(
        f"K={k} {100 * a:.0f} %" for k, a in alphas.items()) + " a token)")
