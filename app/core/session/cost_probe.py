"""The cost probe's one entry point: what a speculative step costs where a sweep runs, measured
with the engine it runs on. The CLI's ``probe``, the Machine tab and the adaptive sweep call
``probe_costs`` (or ``probe_where`` with an engine already made); the two probes below it are
imported by nothing else (an import-linter contract keeps them to this package).

Where the cost code lives, read in this order:

- ``session.cost_probe`` (here): which probe runs, with which settings.
- ``measure.probe``: the probe in process: verify passes of n tokens, the draft step, the MTP
  catch-up, then the whole step in the engine's own decode loop; its llama.cpp calls are
  ``engines.probe_decode``'s (the only place the probe touches llama.cpp).
- ``measure.server_probe``: the probe through llama-server: the whole step at each K with
  llama.cpp's synthetic acceptance, on the server's device.
- ``measure.network``: the same steps over llama.cpp RPC workers, each behind a loopback relay
  at added delays: the round trips a step (``probe_network`` here); ``analysis.network`` predicts
  another link from them.
- ``measure.whole_step``: the rounds both probes time the whole step with, and ``step_cost``.
- ``records.cost``: the CostRecord both write (where it was measured, what it costs), read back
  checked; ``measure.cost_text`` prints one and appends it to a results file.
- ``analysis.costs``: the one rule that says whether a cost record prices a set-up (``differs``),
  used by the verdict (``matching_probe``), by watch (``watch.costs``) and by the adaptive sweep's
  reuse of a recent probe (``session.probes``); ``analysis.breakeven`` turns a record into
  predicted speedups.

    for event in probe_costs(settings, "model.gguf", depth=64, max_k=8):
        ...  # ProbeProgress events, then the CostRecord
"""

from __future__ import annotations

import functools
from typing import Iterator, Sequence

from app.core.common.cancel import CancelToken
from app.core.common.spec_modes import MTP
from app.core.common.errors import UserError
from app.core.engines.base import Engine, EngineKind, EngineSettings
from app.core.measure.whole_step import ProbeProgress
from app.core.records.cost import DEFAULT_DEPTH, CostRecord

ProbeEvent = ProbeProgress | CostRecord


def probe_costs(settings: EngineSettings, model: str, *, depth: int = DEFAULT_DEPTH, max_k: int = 8,
                drafter: str | None = None, min_rounds: int = 5, max_rounds: int = 25, target_rel: float = 0.05,
                cancel: CancelToken | None = None, mode: str = MTP) -> Iterator[ProbeEvent]:
    """Progress, then the CostRecord of ``model`` at context ``depth`` for the draft widths
    K = 1..``max_k``, measured with the engine of ``settings`` (its kind, threads, GPU layers;
    llama-server: its binary, log folder and the user's own flags, and ``drafter`` for a drafter's
    step; ``mode``: the speculative mode whose step is timed, llama-server only: draft-mtp, or
    draft-simple with a separate ``drafter``, whose whole step is its K draft steps and the
    target's verify). Rounds repeat
    from ``min_rounds`` to ``max_rounds`` until each median's relative error is below
    ``target_rel`` / 2. A generator: nothing runs before the first event is asked for."""
    if EngineKind.parse(settings.kind) is EngineKind.SERVER:
        from app.core.measure.server_probe import run_server_probe  # starts llama-servers: only when used

        if settings.user_args is not None:  # the user's own llama-server flags, as the sweep's servers had
            run_server_probe = functools.partial(run_server_probe, user_args=settings.user_args)
        if settings.rpc:  # the RPC workers the model is split over, as the sweep's servers had them
            run_server_probe = functools.partial(run_server_probe, rpc=settings.rpc)
        yield from run_server_probe(model, server_bin=settings.server_bin, drafter=drafter, mode=mode, depth=depth,
                                    max_k=max_k, threads=settings.threads, n_gpu_layers=settings.n_gpu_layers,
                                    min_rounds=min_rounds, max_rounds=max_rounds, target_rel=target_rel,
                                    cancel=cancel, log_dir=settings.log_dir)
        return
    if drafter or mode != MTP:
        raise UserError("a drafter's step is probed through llama-server only (--engine server)")
    from app.core.measure.probe import run_probe  # numpy and llama.cpp: only when probing

    yield from run_probe(model, depth=depth, max_batch=max_k + 1, threads=settings.threads,
                         n_gpu_layers=settings.n_gpu_layers, min_rounds=min_rounds, max_rounds=max_rounds,
                         target_rel=target_rel, cancel=cancel)


def probe_network(settings: EngineSettings, model: str, *, delays: Sequence[float] = (2.0,), max_k: int = 4,
                  depth: int = DEFAULT_DEPTH, drafter: str | None = None, server_args: Sequence[str] = (),
                  min_rounds: int = 3, max_rounds: int = 12, target_rel: float = 0.05,
                  cancel: CancelToken | None = None) -> Iterator[ProbeEvent]:
    """Progress, then the CostRecord with its network part: the steps of ``model`` split over the
    workers of ``settings.rpc`` (llama-server only), each worker behind a relay at no added delay
    and at each of ``delays`` (ms each way), and the plain step without the relay.
    ``server_args``: extra llama-server flags for every server (a placement of the draft)."""
    if not settings.rpc:
        raise UserError("the network probe needs the RPC workers the model is split over (--rpc HOST:PORT)")
    if EngineKind.parse(settings.kind) is not EngineKind.SERVER:
        raise UserError("the network probe runs through llama-server (--engine server)")
    from app.core.measure.network import run_network_probe  # starts llama-servers: only when used

    yield from run_network_probe(model, settings.rpc, server_bin=settings.server_bin, delays=delays,
                                 drafter=drafter, max_k=max_k, depth=depth, threads=settings.threads,
                                 n_gpu_layers=settings.n_gpu_layers, server_args=server_args,
                                 min_rounds=min_rounds, max_rounds=max_rounds, target_rel=target_rel,
                                 cancel=cancel, log_dir=settings.log_dir, user_args=settings.user_args)


def probe_where(engine: Engine, model: str, *, depth: int, max_k: int, rounds: int,
                cancel: CancelToken | None = None) -> Iterator[ProbeEvent]:
    """``probe_costs`` with the settings of ``engine`` (its own: Engine.settings), in at most ``rounds`` rounds
    (at least three): the adaptive sweep's probe, at its deepest context and widest K."""
    return probe_costs(engine.settings, model, depth=depth, max_k=max_k, min_rounds=min(rounds, 3),
                       max_rounds=rounds, cancel=cancel)
