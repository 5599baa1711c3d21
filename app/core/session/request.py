"""What a front end asks of a sweep: the plan, the engine settings, the adaptive options (or none)
and where the results go."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app.core.analysis.decide import MIN_GAIN
from app.core.engines.base import EngineSettings
from app.core.measure.axes import Axis
from app.core.measure.plan import Plan
from app.core.measure.resume import Resume

# the draft widths an adaptive sweep considers when none are given: its probe drops those that
# cannot pay on this machine, so a wide range costs one probe, not runs
ADAPTIVE_KS = tuple(range(1, 9))
MIN_PROMPT_ROOM = 64  # context left for the prompt (and drafts) besides the generated tokens
# an adaptive sweep with no budget runs until decided, at most this many repetitions of a
# candidate unless asked otherwise (said before it starts): a plain sweep's repetitions are no cap
ADAPTIVE_MAX_REPS = 12


@dataclasses.dataclass(frozen=True)
class AdaptiveOptions:
    """An adaptive sweep (app.core.session.adaptive) instead of the plan's grid: the draft widths
    and p_min values it may measure, and the most repetitions per candidate. It stops by itself
    when every task of the mix is decided (app.core.analysis.decide); ``budget_s`` (wall time) or
    ``budget_tokens`` (generated tokens) end it earlier, and it then says what is decided and what
    is not (with a budget, ``max_reps`` is at least adaptive.BUDGET_MAX_REPS). ``reprobe``: measure
    the costs anew instead of reusing a recent probe of the same set-up. ``started``: the clock
    reading (time.monotonic) the budget counts from, when the flow began before the sweep (the
    window's device check, the engine's start); None: the sweep's own start."""

    ks: tuple[int, ...] = ADAPTIVE_KS
    p_mins: tuple[float, ...] = (0.0,)
    max_reps: int = 2
    budget_s: float | None = None
    budget_tokens: int | None = None
    # probe the costs again even when a recent probe of the same set-up is in the results folder
    # (app.core.session.probes: in process only)
    reprobe: bool = False
    started: float | None = None


@dataclasses.dataclass(frozen=True)
class SweepRequest:
    """One sweep. ``engine``'s kind and context size are set by ``prepare`` from the plan (its
    engine, its depths); ``out`` None: a new file in the results folder. ``mix`` is the user's task
    mix (it weighs the adaptive pick; checked either way). ``keep_results`` False: no results file
    (a confirm run). ``strict_modes``: a mode the engine cannot run stops the session before any
    run (the CLI) instead of dropping its arms while the rest runs (the window). ``choose_engine``:
    the user chose no engine, so ``prepare`` picks one for the modes (in-process unless a mode
    needs llama-server; then every arm runs there). ``until_decided`` (a plain sweep): the grid in
    rounds of one repetition, stopping once every task is decided or at the plan's repetitions.
    ``memory_limit``: the bytes an arm may take; an arm predicted to need more is left out
    (app.core.session.memory; None: the machine's free memory).
    ``resume``: an earlier sweep finished (app.core.measure.resume): only its runs not measured
    quietly, into its own sweep (``out`` is its results file). ``axes``: server flags swept as
    settings of their own (app.core.measure.axes, checked), the whole plan once per value, every
    value's runs in one sweep (``sweep_id``; None: a new one). ``rpc_local``: RPC workers of our
    own to start on loopback for the sweep, besides ``engine.rpc``'s (app.core.session.rpc: the
    RPC path tried on one machine), stopped when it ends, however it ends. ``placements``: where
    drafting runs over the workers (app.core.measure.placements: "auto" or names), each a setting
    of the sweep as an axis value, made once the workers are up (their devices named).
    ``min_gain``: δ, the least gain worth turning speculation on for (a sweep that stops once
    decided ends a task "no gain worth having" when no setting can be δ faster: app.core.analysis.decide).
    ``budget_s``: a plain sweep run until decided stops at this wall time (Quick's), counted from
    ``started`` (time.monotonic; None: its own start), and says it stopped at the budget."""

    plan: Plan
    engine: EngineSettings = EngineSettings()
    adaptive: AdaptiveOptions | None = None
    mix: str | None = None
    out: Path | None = None
    keep_results: bool = True
    strict_modes: bool = False
    choose_engine: bool = False
    until_decided: bool = False
    memory_limit: int | None = None
    resume: Resume | None = None
    axes: tuple[Axis, ...] = ()
    sweep_id: str | None = None
    rpc_local: int = 0
    placements: tuple[str, ...] = ()
    min_gain: float = MIN_GAIN
    budget_s: float | None = None
    started: float | None = None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A request that passed every pre-check, with what the front end should say about it (the
    engine chosen for the modes, the context grown for the depths)."""

    request: SweepRequest
    notes: tuple[str, ...] = ()
