"""The sweep's arms against the memory they will need (app.core.machine.arm_memory), before any
starts: an arm that would not fit is left out with its sentence ("K=4 skipped: needs 5.2 GiB,
4.0 GiB free") instead of being started to fail to load."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from app.core.common.cancel import CancelToken
from app.core.common.errors import ModelFileError, UserError
from app.core.engines import dry_run
from app.core.engines.base import EngineSettings
from app.core.engines.commands import FLAG_SPELLINGS
from app.core.machine import arm_memory, modelinfo
from app.core.machine.drafter import DrafterInfo
from app.core.machine.fit import FitSummary, Sized, fit_summary
from app.core.machine.hardware import HardwareSnapshot
from app.core.machine.modelinfo import KV_BYTES
from app.core.measure.plan import Plan
from app.core.records.arm import Arm
from app.core.session.request import AdaptiveOptions


def machine_limit(settings: EngineSettings) -> tuple[int | None, str, bool]:
    """(bytes an arm may take, the word for them, whether they are the GPU's alone) when the user
    gave no limit: the GPU's free memory when -ngl puts layers there by count or all; with -ngl
    unset llama.cpp's own --fit moves layers to system RAM until the rest fits, so the GPU's free
    memory and the RAM available together; without a GPU the RAM available. None: not known."""
    from app.core.machine.hardware import snapshot  # deferred: only a sweep that checks memory looks

    hw = snapshot()
    gpu = hw.gpus[0] if hw.gpus else None
    free = (gpu.vram_free or gpu.vram_total) if gpu else None
    if free is None:
        return hw.ram_available, "of RAM available", False
    if settings.n_gpu_layers in (None, "auto", "-1"):
        return free + (hw.ram_available or 0), "free on the GPU and in RAM", False
    return free, "free on the GPU", settings.n_gpu_layers != "0"


# the llama-server flags that size an arm's memory: LoadSettings' field for each (FLAG_SPELLINGS'
# names), and -ub, which the app never sets itself
_SIZING = {"ctx_size": "ctx", "n_gpu_layers": "n_gpu_layers", "cache_type_k": "cache_type_k",
           "cache_type_v": "cache_type_v", "draft_cache_type_k": "draft_cache_type_k",
           "draft_cache_type_v": "draft_cache_type_v", "flash_attn": "flash_attn"}
_UBATCH = ("--ubatch-size", "-ub")


def load_settings(settings: EngineSettings, server_args: Sequence[str] = ()) -> arm_memory.LoadSettings:
    """What sizes an arm's memory: the engine settings' context and -ngl, and the user's own
    llama-server flags (``server_args``: argv without the binary, "--flag value" or
    "--flag=value") on top: -c, -ngl, -ctk/-ctv, -ctkd/-ctvd, -ub, -fa. A cache type llama.cpp does
    not list is left at f16 (llama-server itself refuses it)."""
    spelled = {s: field for option, field in _SIZING.items() for s in FLAG_SPELLINGS[option]}
    spelled.update(dict.fromkeys(_UBATCH, "n_ubatch"))
    values: dict[str, Any] = {"ctx": settings.ctx_size, "n_gpu_layers": settings.n_gpu_layers}
    args = list(server_args)
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        field = spelled.get(flag)
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
        if field is None or value is None:
            continue
        if field in ("ctx", "n_ubatch") and value.isdigit():
            values[field] = int(value)
        elif field == "n_gpu_layers" or value in KV_BYTES or (field == "flash_attn" and value in dry_run.FLASH_ATTN):
            values[field] = value
    return arm_memory.LoadSettings(**values)


def sized(info: modelinfo.ModelInfo, arm: Arm, load: arm_memory.LoadSettings,
          drafter: modelinfo.ModelInfo | None = None, gpu: bool = False) -> arm_memory.ArmMemory:
    """One arm's memory (sized_arms)."""
    return sized_arms(info, [arm], load, {arm.drafter: drafter} if arm.drafter and drafter else {}, gpu)[arm]


def sized_arms(info: modelinfo.ModelInfo, arms: Sequence[Arm], load: arm_memory.LoadSettings,
               drafters: dict[str, modelinfo.ModelInfo], gpu: bool = False) -> dict[Arm, arm_memory.ArmMemory]:
    """Each arm's memory: its caches and compute buffers from llama.cpp's own dry run of the
    contexts llama-server makes (app.core.engines.dry_run, all arms in one child process), the
    header model where the library cannot size them; each ArmMemory's ``source`` says which."""
    return sized_arms_at(info, arms, [load], drafters, gpu)[0]


def sized_arms_at(info: modelinfo.ModelInfo, arms: Sequence[Arm], loads: Sequence[arm_memory.LoadSettings],
                  drafters: dict[str, modelinfo.ModelInfo], gpu: bool = False, cancel: CancelToken | None = None
                  ) -> list[dict[Arm, arm_memory.ArmMemory]]:
    """sized_arms under each of ``loads`` (e.g. two contexts), all in one dry run's child (ended
    by ``cancel``: then the header model sizes them)."""
    jobs = []
    for load in loads:
        for arm in arms:
            mode = arm.mode if arm.is_spec else None
            drafter = drafters.get(arm.drafter) if arm.drafter else None
            own_mtp = "draft-mtp" in arm_memory.modes_of(mode) and drafter is None and info.has_mtp
            jobs.append(dry_run.Job(info.path, mode, arm.k, load, arm.drafter if drafter is not None else None,
                                    own_mtp, info.arch in arm_memory.RS_ROLLBACK_ARCHS))
    answers = dry_run.arm_parts_apart(jobs, cancel)
    by = dry_run.source() if any(answers) else arm_memory.HEADER_MODEL
    out: list[dict[Arm, arm_memory.ArmMemory]] = [{} for _ in loads]
    for i, (job, parts) in enumerate(zip(jobs, answers)):
        arm = arms[i % len(arms)]
        drafter = drafters.get(arm.drafter) if arm.drafter else None
        out[i // len(arms)][arm] = arm_memory.predict(info, job.mode, arm.k, job.settings, drafter, gpu=gpu,
                                                      sized=parts, sized_by=by if parts else arm_memory.HEADER_MODEL)
    return out


def sized_fit_summary(m: modelinfo.ModelInfo, hw: HardwareSnapshot, *, ctx: int = 8192, cache_type: str = "f16",
                      k: int = 3, drafter: DrafterInfo | None = None, cancel: CancelToken | None = None
                      ) -> FitSummary:
    """``inspect``'s and the Model tab's fit (machine.fit.fit_summary) with each fit's caches and
    compute buffers sized as the sweep's memory check sizes its arms (sized_arms: llama.cpp's own
    dry run, the header model where the library cannot), at ``ctx`` and at twice it: every part
    grows along a line in -c, so the largest context that fits is read along it. Each fit's
    ``sized_by`` says which sized it."""
    arms = {"baseline": Arm()}
    if m.has_mtp:
        arms["mtp"] = Arm(k, mode="draft-mtp")
    drafters = {}
    if drafter is not None and drafter.info is not None:
        arms["drafter"] = Arm(k, mode=drafter.modes[0], drafter=drafter.path)
        drafters[drafter.path] = drafter.info
    loads = [arm_memory.LoadSettings(ctx=c, cache_type_k=cache_type, cache_type_v=cache_type) for c in (ctx, 2 * ctx)]
    at, twice = sized_arms_at(m, list(arms.values()), loads, drafters, gpu=bool(hw.gpus), cancel=cancel)
    sized: dict[str, Sized | None] = {}
    for name, arm in arms.items():
        a, b = at[arm], twice[arm]
        if a.source == arm_memory.HEADER_MODEL or b.source == arm_memory.HEADER_MODEL:
            sized[name] = None  # the header model sizes it in fit itself, as before
            continue
        sized[name] = Sized(a.parts, {p: (b.parts[p] - v) / ctx for p, v in a.parts.items()}, a.source)
    return fit_summary(m, hw, ctx=ctx, cache_type=cache_type, k=k, drafter=drafter, sized=sized)


def fit_arms(plan: Plan, settings: EngineSettings, limit: int | None,
             adaptive: AdaptiveOptions | None = None,
             server_args: Sequence[str] = ()) -> tuple[Plan, AdaptiveOptions | None]:
    """The plan without the arms (and the adaptive sweep without the draft widths) that would
    not fit in ``limit`` bytes (None: the machine's, machine_limit), each left out with its
    sentence in ``plan.left_out``; ``server_args``: the user's own llama-server flags
    (load_settings). A baseline that does not fit a given limit is a UserError
    (nothing can run). Under the machine's own limit the baseline's weights are left to llama.cpp,
    which maps them from disk or moves layers off the GPU by itself; but what it allocates whole
    (the KV cache, the recurrent state, the compute buffers: a -c of 100000000 asks for tens of
    GiB) is bounded as the arms are, a UserError past that limit."""
    where, on_gpu, given = "free", False, limit is not None
    if limit is None:
        limit, where, on_gpu = machine_limit(settings)
        if limit is None:
            return plan, adaptive
    try:
        info = modelinfo.inspect(plan.model)
        drafters = {a.drafter: modelinfo.inspect(a.drafter) for a in plan.arms if a.drafter}
    except ModelFileError:  # the pre-flight says what is wrong with the file, in its place
        return plan, adaptive
    load = load_settings(settings, server_args)

    every = [Arm(), *plan.arms, *(Arm(k) for k in (adaptive.ks if adaptive is not None else ()))]
    memory = sized_arms(info, list(dict.fromkeys(every)), load, drafters, on_gpu)  # one dry run for all

    def reason(arm: Arm) -> str | None:
        mem = memory[arm]
        return arm_memory.fit_reason(arm.label, mem.on_device if on_gpu else mem.total, limit, where, mem.source)

    base = reason(Arm())
    if base is not None and not given:  # llama.cpp may still run it (mmap, its own --fit): not ours to refuse
        mem = memory[Arm()]  # ... but for the weights only: the rest is allocated whole
        unmapped = arm_memory.fit_reason("baseline", max(0, (mem.on_device if on_gpu else mem.total)
                                                         - mem.parts["weights"]), limit, where, mem.source)
        if unmapped is not None:
            raise UserError(f"the model itself does not fit: its context and buffers besides the weights "
                            f"{unmapped.replace('baseline skipped: ', '')} (a smaller -c or a quantized KV "
                            "cache would; --memory-limit sets the limit)")
        return plan, adaptive
    if base is not None:
        raise UserError(f"the model itself does not fit: {base.replace('baseline skipped: ', '')}"
                        " (a smaller -c, a quantized KV cache or a smaller quant would)")
    left: dict[Arm, str] = {a: r for a in plan.arms if a.is_spec and (r := reason(a))}
    if adaptive is not None:
        wide = {k: r for k in adaptive.ks if (r := reason(Arm(k)))}
        if wide:
            left.update({Arm(k): r for k, r in wide.items()})
            adaptive = dataclasses.replace(adaptive, ks=tuple(k for k in adaptive.ks if k not in wide))
            if not adaptive.ks:
                raise UserError("no draft width fits in memory: " + next(iter(wide.values())))
    if not left:
        return plan, adaptive
    arms = tuple(a for a in plan.arms if a not in left)
    return dataclasses.replace(plan, arms=arms, left_out=plan.left_out + tuple(left.values())), adaptive
