"""The host a sweep's records name: the machine's description, its GPUs from the hardware
snapshot and how many of the model's layers the memory fit puts on the first of them, so the
analysis can hold where the runs really ran against where they could have."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from app.core.engines.base import Engine
from app.core.machine import modelinfo
from app.core.measure.plan import Plan
from app.core.records.schema import host_info

if TYPE_CHECKING:
    from app.core.machine.hardware import HardwareSnapshot


def host_of(plan: Plan, engine: Engine, info: modelinfo.ModelInfo,
            hardware: HardwareSnapshot | None) -> dict[str, Any]:
    """host_info with the GPUs of ``hardware`` (taken now when None) and, when there is one, how
    many layers the memory fit puts on it (``gpu_layers_fit``; "all" when the whole model fits).
    ``info``: the model's summary, read once by the pre-flight."""
    from app.core.machine import fit, hardware as hw_mod  # deferred: only when a sweep starts

    hw = hardware if hardware is not None else hw_mod.snapshot()
    gpus = [{"vendor": g.vendor, "name": g.name, "vram_total": g.vram_total, "vram_free": g.vram_free}
            for g in hw.gpus]
    host = host_info(gpus, hw.unified_memory)
    if plan.left_out:  # arms the sweep left out before it ran (memory), with why
        host["left_out"] = list(plan.left_out)
    if hw.gpus:
        with contextlib.suppress(Exception):  # the fit is advice: a model it cannot read has none
            g = hw.gpus[0]
            ctx = engine.ctx_size or info.context_length or 4096
            drafter = next((a.drafter for a in plan.arms if a.drafter), None)  # the first: what a sweep has
            f = fit.fit(info, g.vram_free or g.vram_total, ctx=ctx, mtp=any(a.own_heads for a in plan.arms),
                        ram_available=hw.ram_available, drafter=modelinfo.inspect(drafter) if drafter else None)
            if f.verdict == "fits" or "--n-cpu-moe" in f.flags:
                host["gpu_layers_fit"] = "all"
            elif "-ngl" in f.flags:
                host["gpu_layers_fit"] = int(f.flags[f.flags.index("-ngl") + 1])
    return host
