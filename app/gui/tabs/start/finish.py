"""The Start page's "Finish when quiet": the shown sweep again, measuring only what it did not
measure quietly, through the core's one resume request (app.core.session.resume), the one
``bench --resume`` makes: what the CLI refuses is refused here, in the same sentence."""

from __future__ import annotations

from app.core.common.errors import UserError
from app.core.engines.base import EngineKind
from app.core.session.request import SweepRequest

from ...state import AppState


def finish_request(state: AppState) -> SweepRequest:
    """"Finish when quiet": the shown sweep again, measuring in quiet moments only what it did not
    measure quietly, into its own results file, its quiet runs kept, with the window's engine
    settings (its RPC workers, the user's command: refused when the sweep did not run so); a
    UserError when there is no such sweep or the core refuses it."""
    from app.core.session.resume import resume_request

    records = state.records
    if not records or state.results_path is None:
        raise UserError("no sweep with a results file to finish: run one first")
    return resume_request(state.results_path, state.engine_settings(EngineKind.SERVER),
                          sweep=records[-1].sweep_id, prompt_file=state.user_prompt_file())[0]
