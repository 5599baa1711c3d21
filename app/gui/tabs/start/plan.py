"""The Start page's request: what "Tune for me" asks the session for.

- A model with MTP heads: an adaptive sweep (``AdaptiveOptions``) of draft-mtp over the widths the
  cost probe lets through (the demo's own K=1..3 on the demo model, else 1..8), stopping when every
  task is decided or at the budget (Quick), at most THOROUGH_REPS repetitions per candidate.
- A model without MTP heads, when the user asks for them: llama.cpp's n-gram modes (any GGUF; on
  llama-server), a plain sweep until decided (``until_decided``), 3 repetitions (Quick) or
  PLAIN_REPS.

Prompts (``prompts_for``, as the Sweep tab's): the demo model's own for its tasks, else the first
two of each built-in suite, and the user's prompts for their task types. The task mix is the weights the user declared."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.common.errors import UserError
from app.core.engines.base import EngineKind

from ...state import AppState

if TYPE_CHECKING:
    from app.core.session.request import SweepRequest

THOROUGH_REPS = 12  # at most this many repetitions per candidate (Thorough stops when decided)
PLAIN_REPS = 6  # the n-gram modes' plain sweep, Thorough
NGRAM_MODES = ("ngram-mod", "ngram-simple")  # drafting from the text itself: any GGUF (llama-server)
N_PREDICT = 128  # tokens per run of a real model (the demo: its own DEMO_TOKENS)


def tune_request(state: AppState, weights: dict[str, int], *, quick: bool, budget_s: float | None, ngram: bool,
                 engine: EngineKind) -> SweepRequest:
    """The SweepRequest for ``state``'s model, the declared ``weights`` (task -> weight) and the
    length chosen; ``engine``: the kind the device check chose (in-process without an answer)."""
    from app.core.calibrated.demo import DEMO_KS, DEMO_TOKENS, demo_prompts  # numpy: only to plan
    from app.core.measure.plan import Plan, make_arms, parse_int_list
    from app.core.measure.prompts import prompts_for
    from app.core.session.request import ADAPTIVE_KS, AdaptiveOptions, SweepRequest

    model = state.model
    tasks = list(weights)
    mix = ",".join(f"{t}={w}" for t, w in weights.items())
    demo_own = demo_prompts(model) or ()
    demo = any(p.task in tasks for p in demo_own)  # the demo model, asked for its own tasks
    prompts = tuple(prompts_for(tasks, demo_own, state.user_prompt_file(), per_task=1 if demo else 2))
    if ngram:
        plan = Plan(model=model, arms=make_arms([], modes=NGRAM_MODES), prompts=prompts, n_predict=N_PREDICT,
                    reps=3 if quick else PLAIN_REPS, warmup=1, engine=EngineKind.SERVER)
        return SweepRequest(plan, state.engine_settings(EngineKind.SERVER), None, mix=mix, until_decided=True,
                            choose_engine=True)
    ks = tuple(parse_int_list(DEMO_KS, "K")) if demo else ADAPTIVE_KS
    plan = Plan(model=model, arms=make_arms(ks), prompts=prompts, n_predict=DEMO_TOKENS if demo else N_PREDICT,
                reps=THOROUGH_REPS, warmup=1, engine=engine)
    adaptive = AdaptiveOptions(ks=ks, p_mins=(0.0,), max_reps=THOROUGH_REPS, budget_s=budget_s)
    return SweepRequest(plan, state.engine_settings(engine), adaptive, mix=mix)


def finish_request(state: AppState) -> SweepRequest:
    """"Finish when quiet": the shown sweep again, measuring in quiet moments only what it did not
    measure quietly (app.core.measure.resume), into its own results file, its quiet runs kept;
    a UserError when there is no such sweep (or its model or prompts are gone)."""
    from app.core.measure.plan import plan_again
    from app.core.measure.resume import resume_of
    from app.core.session.request import SweepRequest

    records = state.records
    if not records or state.results_path is None:
        raise UserError("no sweep with a results file to finish: run one first")
    plan = plan_again(records, prompt_file=state.user_prompt_file())
    return SweepRequest(plan, state.engine_settings(plan.engine), out=state.results_path,
                        resume=resume_of(records, plan))
