""""Tune for me": the one flow the Start page and ``mtp-tuner tune`` run, as a session request.

- A model with MTP heads: an adaptive sweep (``AdaptiveOptions``) of draft-mtp over the widths the
  cost probe lets through (the demo's own K=1..3 on the demo model, else 1..8), stopping when every
  task is decided or at the budget (Quick: ``QUICK_S``, counted from the flow's start, the device
  check, the probe and the pilot included), at most ``THOROUGH_REPS`` repetitions per candidate.
- A model without MTP heads (``arms``: session.tune_arms decides it, once per model), or when the
  user asks for them (``ngram``): llama.cpp's n-gram modes (any GGUF; on llama-server), a plain
  sweep until decided (``until_decided``), 3 repetitions (Quick) or ``PLAIN_REPS``; Quick's budget
  ends it as it ends the adaptive one (the request's ``budget_s``), and Quick sends one prompt a task
  there (two in Thorough): its plan is one round of every setting once a task.
- A drafter model (``drafters``: mode -> file, a Gemma 4 assistant for draft-mtp or a small model
  for draft-simple; or the one tune_arms found): those modes at ``tune_arms.DRAFTER_KS`` on
  llama-server and (Thorough) with the n-gram modes their combination with ngram-mod, in the same
  plain sweep (the adaptive sweep measures the model's own heads only). Quick measures fewer there
  (tune_arms: the drafter at K=2, no combination), since one round of the whole set outlasts its
  budget on a real model, and spreads its first round over the tasks (``Plan.spread_first``).

The engine (``tune_engine``): the one the user named, else the device check's (``device_check``:
each engine asked which device it uses, and the one that runs on the machine's GPU chosen, as the
Machine tab shows it), in-process without an answer. The user's llama-server command and RPC
workers run on llama-server whatever the check says (session.sweep.prepare).

Prompts (``prompts_for``, as the Sweep tab's): the demo model's own for its tasks, else the first
two of each built-in suite, and the user's prompts for their task types. The task mix is the
weights the user declared (``parse_uses``: "code,story" or "code=0.7,story=0.3")."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Mapping

from app.core.analysis.decide import MIN_GAIN
from app.core.analysis.recommend import parse_mix
from app.core.common.errors import UserError
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.devices import BackendInfo, EngineChoice, engine_choice, host_gpu_names
from app.core.session.request import ADAPTIVE_KS, ADAPTIVE_MAX_REPS, AdaptiveOptions, SweepRequest
from app.core.session.tune_arms import TuneArms, drafter_ks, plain_modes

if TYPE_CHECKING:  # for annotations only
    from app.core.machine.hardware import HardwareSnapshot

QUICK_S = 120.0  # Quick: about 2 minutes, from the click (or the command) to the answer
THOROUGH_REPS = ADAPTIVE_MAX_REPS  # at most this many repetitions per candidate (Thorough stops when decided)
PLAIN_REPS = 6  # the n-gram modes' plain sweep, Thorough
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


BackendRow = tuple[str, BackendInfo | None, str | None]  # an engine, its backends, or why it has none


def ask_engines(server_bin: str | None) -> tuple[list[BackendRow], str | None]:
    """Each engine asked which backends and devices it uses (engines.devices.engine_backends:
    llama.cpp loaded, llama-server --list-devices run), and the name of the installed runtime when
    its llama-server is the one found (None otherwise)."""
    from app.core.engines.devices import engine_backends  # loads llama.cpp: only when asked
    from app.core.engines.server.binary import find_server_binary
    from app.core.machine import runtime_store

    rows = engine_backends(server_bin)
    rt = runtime_store.selected()
    try:
        used: str | None = find_server_binary(server_bin)
    except UserError:
        used = None
    return rows, (rt.name if rt is not None and used == str(rt.server) else None)


def device_check(server_bin: str | None, hardware: HardwareSnapshot | None = None) -> EngineChoice:
    """The device check of the tune flow: the engine that runs on this machine's GPU (``hardware``:
    its snapshot, read when not given), each engine asked (ask_engines)."""
    if hardware is None:
        from app.core.machine.hardware import snapshot

        hardware = snapshot()
    rows, runtime = ask_engines(server_bin)
    return engine_choice(host_gpu_names(hardware), rows, runtime)


def tune_engine(choice: EngineChoice | None, asked: EngineKind | None = None) -> EngineKind:
    """The engine the flow measures on: the one the user named (``asked``), else the device
    check's ``choice`` (a CPU-only llama-cpp-python beside a llama-server that lists the GPU:
    llama-server), else in-process."""
    if asked is not None:
        return asked
    return EngineKind.parse(choice.kind) if choice is not None else EngineKind.INPROCESS


def tune_request(model: str, weights: Mapping[str, float], *, quick: bool, ngram: bool = False,
                 engine: EngineKind = EngineKind.INPROCESS, settings: EngineSettings | None = None,
                 user_prompts: str | None = None, quick_s: float = QUICK_S,
                 started: float | None = None, drafters: Mapping[str, str] | None = None,
                 min_gain: float = MIN_GAIN, arms: TuneArms | None = None) -> SweepRequest:
    """The SweepRequest for ``model``, the declared ``weights`` (task -> weight) and the length
    chosen; ``engine``: the kind tune_engine chose;
    ``settings``: the engine settings (threads, GPU layers, llama-server); ``user_prompts``: the
    user's prompt file; ``started``: the clock reading (time.monotonic) the flow began at, which
    Quick's budget counts from; ``drafters``: the drafter model per mode (none: the model's own
    heads); ``min_gain``: δ, the least gain worth having (app.core.analysis.decide); ``arms``: what
    session.tune_arms decided for the model (without MTP heads: the n-gram modes and the drafter
    found or given, and their combination)."""
    from app.core.calibrated.demo import DEMO_KS, DEMO_TOKENS, demo_prompts  # numpy: only to plan
    from app.core.measure.plan import Plan, make_arms, parse_int_list
    from app.core.measure.prompts import prompts_for

    settings = settings or EngineSettings()
    tasks = list(weights)
    mix = mix_text(weights)
    demo_own = demo_prompts(model) or ()
    demo = any(p.task in tasks for p in demo_own)  # the demo model, asked for its own tasks
    if arms is not None and (arms.ngram or arms.drafters):
        ngram, drafters = ngram or arms.ngram, {**arms.drafters, **(drafters or {})}
    plain = bool(ngram or drafters)
    # Quick's plain sweep: one prompt a task, a plan of one round (every setting once a task) rather
    # than two prompts' 16 runs, of which the 1.5B Qwen on 2 cores measured 7 in 2 minutes
    one = demo or (quick and plain)
    prompts = tuple(prompts_for(tasks, demo_own, user_prompts, per_task=1 if one else 2))
    if plain:
        modes, files = plain_modes(ngram, dict(drafters or {}), quick)
        plan = Plan(model=model, arms=make_arms(list(drafter_ks(quick)), modes=modes, drafters=files), prompts=prompts,
                    n_predict=N_PREDICT, reps=3 if quick else PLAIN_REPS, warmup=1, engine=EngineKind.SERVER,
                    spread_first=quick)  # every task its baseline and the drafter before the other settings
        return SweepRequest(plan, _kind(settings, EngineKind.SERVER), None, mix=mix, until_decided=True,
                            choose_engine=True, min_gain=min_gain, budget_s=quick_s if quick else None,
                            started=started)
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
