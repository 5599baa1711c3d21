"""Which cost probe prices a set of runs: only one measured where they ran.

A probe prices runs when it measured the same model, through the same engine, on the same
backend and device set, with the same llama.cpp build (and the same drafter, for a drafter's
mode); among those, the one at the context depth nearest the runs' (the latest of equals). A
field an older record does not keep (cost records before schema 5 have no backend or devices)
is not compared. Otherwise the verdict prices the runs with costs fitted from them, and
``matching_probe`` says why in one line, e.g. "the probe ran in process on the CPU; these runs
ran through llama-server on CUDA0".

    setup = run_setup(records)                       # where the runs ran
    probe, why = matching_probe(cost_records, setup)  # (CostRecord, None) or (None, "why not")
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from app.core.engines.base import EngineKind
from app.core.common.spec_modes import MTP
from app.core.records.cost import DEFAULT_DEPTH, CostRecord, where_text
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """Where a set of runs ran, as a probe must match it. None / (): not known."""

    model_path: str
    engine: str
    backend: str | None = None
    devices: tuple[str, ...] = ()
    llama_build: str | None = None
    depth: int = 0
    drafter: str | None = None  # the drafter of the draft-mtp runs (None: the model's own heads)

    def where(self) -> str:
        return where_text(self.engine, self.backend, self.devices)


def run_setup(records: Sequence[RunRecord]) -> RunSetup:
    """Where the runs ran: the latest run's model, engine, backend, devices and build; the
    deepest context; the drafter of their draft-mtp runs."""
    if not records:
        raise ValueError("no runs")
    last = records[-1]
    placed = next((r for r in reversed(records) if r.backend is not None), last)
    drafter = next(((r.drafter or {}).get("path") for r in reversed(records)
                    if r.k and r.spec_type in (None, MTP)), None)
    return RunSetup(last.model_path, last.engine, placed.backend, tuple(placed.devices), last.llama_build,
                    max((r.depth for r in records), default=0), drafter)


def mismatch(probe: CostRecord, setup: RunSetup) -> str | None:
    """Why ``probe`` cannot price runs of ``setup`` (one line), or None when it can."""
    if probe.model_path != setup.model_path:
        return "the probe measured another model"
    if not probe.prices_steps:
        return "the probe measured no speculative step (the model has no MTP heads)"
    if probe.engine != setup.engine or (probe.backend and setup.backend and probe.backend != setup.backend) \
            or (probe.devices and setup.devices and set(probe.devices) != set(setup.devices)):
        return f"the probe ran {probe.where()}; these runs ran {setup.where()}"
    if probe.llama_build and setup.llama_build and probe.llama_build != setup.llama_build:
        return f"the probe ran on llama.cpp {probe.llama_build}; these runs on {setup.llama_build}"
    if probe.engine == EngineKind.SERVER and (probe.drafter or None) != (setup.drafter or None):
        return ("the probe drafted with " + (probe.drafter or "the model's own MTP heads") + "; these runs with "
                + (setup.drafter or "the model's own MTP heads"))
    return None


def matching_probe(cost_records: Iterable[CostRecord], setup: RunSetup) -> tuple[CostRecord | None, str | None]:
    """(the probe that prices runs of ``setup``, None) or (None, why none does: one line; None when
    there is no probe of this model at all). Among matching probes, the nearest depth to the
    runs' (at least DEFAULT_DEPTH), the latest of equals."""
    own = [c for c in cost_records if c.model_path == setup.model_path]
    if not own:
        return None, None
    ok = [c for c in own if mismatch(c, setup) is None]
    if not ok:
        return None, mismatch(own[-1], setup)
    depth = max(DEFAULT_DEPTH, setup.depth)
    return min(reversed(ok), key=lambda c: abs(c.depth - depth)), None
