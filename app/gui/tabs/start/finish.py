"""The Start page's "Finish when quiet": the shown sweep again, measuring only what it did not
measure quietly (app.core.measure.resume)."""

from __future__ import annotations

from app.core.common.errors import UserError
from app.core.session.request import SweepRequest

from ...state import AppState


def finish_request(state: AppState) -> SweepRequest:
    """"Finish when quiet": the shown sweep again, measuring in quiet moments only what it did not
    measure quietly (app.core.measure.resume), into its own results file, its quiet runs kept;
    a UserError when there is no such sweep (or its model or prompts are gone)."""
    from app.core.measure.plan import plan_again
    from app.core.measure.resume import resume_of

    records = state.records
    if not records or state.results_path is None:
        raise UserError("no sweep with a results file to finish: run one first")
    plan = plan_again(records, prompt_file=state.user_prompt_file())
    return SweepRequest(plan, state.engine_settings(plan.engine), out=state.results_path,
                        resume=resume_of(records, plan))
