"""The Start page's "How long": the flow's time on this machine (the core's flow_estimate: the
whole wall time of a run here, overheads included, else the measured decode speed), and the Quick
and Thorough labels that say it (plain words until the speed is known)."""

from __future__ import annotations

from app.core.common.units import duration
from app.core.session.clock import flow_estimate, tok_s_known
from app.core.session.request import SweepRequest
from app.core.session.tune import QUICK_S

from ...state import AppState


def flow_time(state: AppState, request: SweepRequest) -> float | None:
    """The flow's time here (the core's flow_estimate, as `tune` says it); None while unknown."""
    if tok_s_known(request.plan.model, state.probe_record, state.records) is None:
        return None
    return flow_estimate(request, state.probe_record, state.records)


def how_long_texts(quick: float | None, thorough: float | None) -> tuple[str, str]:
    """The Quick and Thorough labels, with the times when known."""
    return (f"Quick ({duration(quick, 'about')} here, at most {duration(QUICK_S)})"
            if quick is not None and quick < QUICK_S else "Quick (about 2 minutes)",
            f"Thorough (until decided: {duration(thorough, 'about')} or more here)"
            if thorough is not None else "Thorough (until decided)")
