"""Where the runs ran against what the machine had: the confounder that blocks a wrong answer
(a GPU machine measured on its CPU, or with fewer layers on the GPU than the memory fit said)."""

from __future__ import annotations

from typing import Sequence

from app.core.engines.base import EngineKind
from app.core.analysis.advice import ALL_LAYERS, RUNTIME, SERVER_ENGINE, Advice, Setting
from app.core.analysis.findings import Finding
from app.core.common.gpus import is_gpu_vendor
from app.core.engines.backend_truth import Placement
from app.core.records.schema import RunRecord

ON_CPU, FEWER_LAYERS = "measured_on_cpu", "fewer_gpu_layers"


def _host_gpu(r: RunRecord) -> str | None:
    """The name of the GPU the record's host had when it was measured (schema 2), else None."""
    gpus = r.host.get("gpus") if isinstance(r.host, dict) else None
    for g in gpus or ():
        if isinstance(g, dict) and is_gpu_vendor(g.get("vendor")):
            return str(g.get("name") or g.get("vendor"))
    return None


def _fit_layers(r: RunRecord) -> int | None:
    """How many layers the memory fit put on the GPU when the runs were measured, if it said."""
    want = r.host.get("gpu_layers_fit")
    if want == "all":
        return r.layers_total
    return want if isinstance(want, int) and not isinstance(want, bool) else None


def placement_findings(ok: Sequence[RunRecord]) -> list[Finding]:
    """The machine had a GPU (as the records' host recorded it at measurement time) but the runs
    ran on the CPU, or put fewer layers on the GPU than the memory fit said: the speeds are not
    the GPU's, and neither is a verdict built on them. Records without placement (schema 1) or
    without a GPU give no finding."""
    on_gpu_host = [r for r in ok if _host_gpu(r)]
    if not on_gpu_host:
        return []
    out = []
    cpu = [r for r in on_gpu_host if (p := Placement.of_record(r)) is not None and p.on_cpu]
    if cpu:
        r = cpu[0]
        if r.engine == EngineKind.INPROCESS:
            fix = Advice(("the in-process engine's llama-cpp-python is a CPU build: measure with the llama-server "
                          "engine and a GPU build of llama.cpp (", Setting(SERVER_ENGINE), " <CUDA, Vulkan or Metal "
                          "llama-server>; ", Setting(RUNTIME), "), or install a GPU build of "
                          "llama-cpp-python; then measure again"))
        else:
            fix = Advice(("use a llama-server whose --list-devices shows the GPU (a CUDA, Vulkan or Metal build; "
                          "on Windows its CUDA runtime DLLs must be beside it; ", Setting(RUNTIME), "), "
                          "do not pass -ngl 0, then measure again"))
        out.append(Finding(ON_CPU, f"this machine has a GPU ({_host_gpu(r)}) but {len(cpu)} of "
                           f"{len(on_gpu_host)} run(s) ran on the CPU ({r.engine} engine, {r.llama_build}): "
                           "the speeds and the verdict are the CPU's, not your GPU's", fix))
    cpu_ids = set(map(id, cpu))  # not `r not in cpu`: a list's == on every record, quadratic in a large sweep
    fewer = [r for r in on_gpu_host if id(r) not in cpu_ids and r.offloaded_layers is not None
             and (want := _fit_layers(r)) is not None and r.offloaded_layers < want]
    if fewer:
        r = fewer[0]
        want = _fit_layers(r)
        out.append(Finding(FEWER_LAYERS, f"{len(fewer)} run(s) put only {r.offloaded_layers} of "
                           f"{r.layers_total or '?'} layers on the GPU ({_host_gpu(r)}) where the memory fit "
                           f"puts {want} there: part of the model ran on the CPU",
                           Advice(("offload all layers (", Setting(ALL_LAYERS, str(want)), "); close programs "
                                   "holding GPU memory; then measure again"))))
    return out
