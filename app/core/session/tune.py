""""Tune for me": the one flow the Start page and ``mtp-tuner tune`` run, as a session request.

- A model with MTP heads: an adaptive sweep (``AdaptiveOptions``) of draft-mtp over the widths the
  cost probe lets through (the demo's own K=1..3 on the demo model, else 1..8), stopping when every
  task is decided or at the budget (Quick: ``QUICK_S``, counted from the flow's start, the device
  check, the probe and the pilot included), at most ``THOROUGH_REPS`` repetitions per candidate.
- A model without MTP heads, when the user asks for them: llama.cpp's n-gram modes (any GGUF; on
  llama-server), a plain sweep until decided (``until_decided``), 3 repetitions (Quick) or
  ``PLAIN_REPS``.

Prompts (``prompts_for``, as the Sweep tab's): the demo model's own for its tasks, else the first
two of each built-in suite, and the user's prompts for their task types. The task mix is the
weights the user declared (``parse_uses``: "code,story" or "code=0.7,story=0.3")."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from app.core.analysis.decide import MIN_GAIN
from app.core.analysis.recommend import parse_mix
from app.core.common.errors import UserError
from app.core.engines.base import EngineKind, EngineSettings
from app.core.session.request import ADAPTIVE_KS, ADAPTIVE_MAX_REPS, AdaptiveOptions, SweepRequest

QUICK_S = 120.0  # Quick: about 2 minutes, from the click (or the command) to the answer
THOROUGH_REPS = ADAPTIVE_MAX_REPS  # at most this many repetitions per candidate (Thorough stops when decided)
PLAIN_REPS = 6  # the n-gram modes' plain sweep, Thorough
NGRAM_MODES = ("ngram-mod", "ngram-simple")  # drafting from the text itself: any GGUF (llama-server)
N_PREDICT = 128  # tokens per run of a real model (the demo: its own DEMO_TOKENS)


def parse_uses(text: str) -> dict[str, float]:
    """What the model is used for: "code,story" (equal weights) or "code=0.7,story=0.3"; a weight
    of 0 leaves a task out. Checked as a task mix (parse_mix); the weights as given."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise UserError("--for: name at least one use, e.g. code or code,story or code=0.7,story=0.3")
    given = ",".join(p if "=" in p else f"{p}=1" for p in parts)
    tasks = tuple(p.split("=", 1)[0].strip() for p in parts)
    try:
        parse_mix(given, tasks)  # every weight checked, one line each
    except UserError as e:
        raise UserError(str(e).replace("--mix:", "--for:", 1)) from None
    weights = {t: float(p.split("=", 1)[1]) if "=" in p else 1.0 for t, p in zip(tasks, parts)}
    return {t: w for t, w in weights.items() if w > 0}


def mix_text(weights: Mapping[str, float]) -> str:
    """The weights as a task mix: "code=1,story=1"."""
    return ",".join(f"{t}={w:g}" for t, w in weights.items())


def tune_request(model: str, weights: Mapping[str, float], *, quick: bool, ngram: bool = False,
                 engine: EngineKind = EngineKind.INPROCESS, settings: EngineSettings | None = None,
                 user_prompts: str | None = None, quick_s: float = QUICK_S,
                 started: float | None = None, min_gain: float = MIN_GAIN) -> SweepRequest:
    """The SweepRequest for ``model``, the declared ``weights`` (task -> weight) and the length
    chosen; ``engine``: the kind the device check chose (in-process without an answer);
    ``settings``: the engine settings (threads, GPU layers, llama-server); ``user_prompts``: the
    user's prompt file; ``started``: the clock reading (time.monotonic) the flow began at, which
    Quick's budget counts from; ``min_gain``: δ, the least gain worth having (app.core.analysis.decide)."""
    from app.core.calibrated.demo import DEMO_KS, DEMO_TOKENS, demo_prompts  # numpy: only to plan
    from app.core.measure.plan import Plan, make_arms, parse_int_list
    from app.core.measure.prompts import prompts_for

    settings = settings or EngineSettings()
    tasks = list(weights)
    mix = mix_text(weights)
    demo_own = demo_prompts(model) or ()
    demo = any(p.task in tasks for p in demo_own)  # the demo model, asked for its own tasks
    prompts = tuple(prompts_for(tasks, demo_own, user_prompts, per_task=1 if demo else 2))
    if ngram:
        plan = Plan(model=model, arms=make_arms([], modes=NGRAM_MODES), prompts=prompts, n_predict=N_PREDICT,
                    reps=3 if quick else PLAIN_REPS, warmup=1, engine=EngineKind.SERVER)
        return SweepRequest(plan, _kind(settings, EngineKind.SERVER), None, mix=mix, until_decided=True,
                            choose_engine=True, min_gain=min_gain)
    ks = tuple(parse_int_list(DEMO_KS, "K")) if demo else ADAPTIVE_KS
    plan = Plan(model=model, arms=make_arms(ks), prompts=prompts, n_predict=DEMO_TOKENS if demo else N_PREDICT,
                reps=THOROUGH_REPS, warmup=1, engine=engine)
    adaptive = AdaptiveOptions(ks=ks, p_mins=(0.0,), max_reps=THOROUGH_REPS, budget_s=quick_s if quick else None,
                               started=started)
    return SweepRequest(plan, _kind(settings, engine), adaptive, mix=mix, min_gain=min_gain)


def _kind(settings: EngineSettings, kind: EngineKind) -> EngineSettings:
    """``settings`` for an engine of ``kind`` (the llama-server binary only for llama-server)."""
    return dataclasses.replace(settings, kind=kind, server_bin=settings.server_bin if kind is EngineKind.SERVER
                               else None)
