"""make_engine (and make_inprocess): the one place an engine is built from EngineSettings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.common.errors import UserError
from app.core.engines.base import Engine, EngineKind, EngineSettings

if TYPE_CHECKING:  # type names only: the engine modules load when an engine is made
    from app.core.engines.inprocess import InProcessEngine


def gpu_layers_count(ngl: str | None) -> int:
    """-ngl text as the in-process engine's layer count: "auto", "all" and None mean every layer."""
    if ngl in (None, "auto", "all"):
        return -1
    try:
        n = int(ngl)
    except ValueError:
        raise UserError(f"GPU layers must be a count, auto or all, got {ngl!r}") from None
    if n < -1:
        raise UserError(f"GPU layers must be -1 or more, got {n}")
    return n


def make_engine(settings: EngineSettings) -> Engine:
    """The engine of ``settings``; the caller owns it and must ``close()`` it (or use ``with``)."""
    kind = EngineKind.parse(settings.kind)
    if kind is EngineKind.SERVER:
        from app.core.engines.server.engine import ServerEngine  # spawns processes: loaded only when used

        return ServerEngine(settings.server_bin, ctx_size=settings.ctx_size, threads=settings.threads,
                            n_gpu_layers=settings.n_gpu_layers, log_dir=settings.log_dir,
                            user_args=settings.user_args, rpc=settings.rpc)
    return make_inprocess(settings)


def make_inprocess(settings: EngineSettings) -> InProcessEngine:
    """The in-process engine of ``settings`` (whatever their kind), for callers that use more of it
    than the Engine protocol (the cost probe's raw contexts)."""
    from app.core.engines.inprocess import InProcessEngine  # loads llama.cpp: only when used

    return InProcessEngine(ctx_size=settings.ctx_size, threads=settings.threads,
                           n_gpu_layers=gpu_layers_count(settings.n_gpu_layers), max_k=settings.max_k)
