"""Which engines this machine has and which one a sweep uses by default: each engine's backends
and devices (engine_backends: the in-process library asked, llama-server --list-devices), in words
(format_engine_backends), and the engine that runs on the user's GPU (choose_engine).

The backend facts themselves (Device, Placement, BackendInfo and their parsers) live in
engines.backend_truth, which every engine module may import; they are re-exported here."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterable

from app.core.common.errors import EngineError
from app.core.common.gpus import is_gpu_vendor
from app.core.engines.base import EngineKind
from app.core.engines.backend_truth import (CPU, BackendInfo, Device, Placement, backend_of, layers_total,
                                        parse_list_devices, parse_load_log)

if TYPE_CHECKING:  # for annotations only
    from app.core.machine.hardware import HardwareSnapshot

__all__ = ["CPU", "BackendInfo", "Device", "Placement", "backend_of", "layers_total", "parse_list_devices",
           "parse_load_log", "INPROCESS", "SERVER", "ENGINE_LABELS", "EngineChoice", "choose_engine",
           "engine_backends", "engine_backends_dict", "engine_choice", "format_engine_backends", "host_gpu_names"]


def engine_backends(server_bin: str | None = None) -> list[tuple[str, BackendInfo | None, str | None]]:
    """Per engine, what it has and will use: (engine, its BackendInfo or None, why it is None).
    The in-process engine asks its own llama-cpp-python; llama-server is asked (--list-devices)
    when a binary is found (``server_bin``, else the usual search)."""
    from app.core.engines.llama_backend import inprocess_backends  # deferred: loads llama.cpp
    from app.core.engines.server.binary import find_server_binary
    from app.core.engines.server.devices import server_backends

    out: list[tuple[str, BackendInfo | None, str | None]] = []
    try:
        out.append((INPROCESS, inprocess_backends(), None))
    except EngineError as e:
        out.append((INPROCESS, None, str(e)))
    try:
        out.append((SERVER, server_backends(find_server_binary(server_bin)), None))
    except EngineError as e:
        out.append((SERVER, None, str(e)))
    return out


ENGINE_LABELS: dict[str, str] = {EngineKind.INPROCESS: "in-process (llama-cpp-python)",
                                 EngineKind.SERVER: "llama-server"}


def format_engine_backends(rows: list[tuple[str, BackendInfo | None, str | None]]) -> str:
    """The engines' devices as ``hw`` prints them and the Machine tab shows them."""
    lines = ["engines (the device each will really use):"]
    for engine, info, why in rows:
        label = ENGINE_LABELS.get(engine, engine)
        if info is None:
            lines.append(f"  {label}: not available ({why})")
            continue
        lines.append(f"  {label}: {info.will_use()}")
        lines.append(f"    build {info.build}; backends {', '.join(info.backends) or 'none'}; "
                     f"GPU offload {'yes' if info.gpu_offload else 'no'}")
    return "\n".join(lines)


def engine_backends_dict(rows: list[tuple[str, BackendInfo | None, str | None]]) -> list[dict[str, Any]]:
    return [info.to_dict() if info is not None else {"engine": engine, "error": why}
            for engine, info, why in rows]


# ------------------------------------------------------------------------------------------
# the engine that matches the GPU

INPROCESS, SERVER = EngineKind.INPROCESS, EngineKind.SERVER


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """The engine a sweep should use by default, why, and per engine the device it would measure
    on (``sentences``: "will measure on: ...")."""

    kind: EngineKind
    reason: str
    sentences: dict[str, str]  # per engine kind
    on_gpu: bool  # the chosen engine runs on a GPU

    def sentence(self, kind: EngineKind | str | None = None) -> str:
        return self.sentences.get(kind or self.kind, f"will measure on: not known ({kind} was not asked)")


def _short_build(build: str) -> str:
    """"b6123 (abc1234)" -> "b6123"; llama-cpp-python's "0.3.16" stays."""
    return build.split(" (")[0].strip() or build


def _gpu_words(info: BackendInfo) -> str:
    return ", ".join(d.description or d.name for d in info.gpus)


def _engine_sentence(kind: EngineKind, info: BackendInfo | None, why: str | None, host_gpu: str | None,
                     runtime: str | None) -> str:
    not_yours = f", not your {host_gpu}" if host_gpu else ""
    if info is None:
        return f"will measure on: nothing; the {ENGINE_LABELS[kind]} engine is not available ({why})"
    backend = info.gpus[0].backend if info.gpus else CPU
    if kind == INPROCESS:
        if info.gpus:
            return f"will measure on: {_gpu_words(info)} (in-process {info.build}, {backend})"
        what = "this build has no GPU backend" if not info.gpu_offload else "this build found no GPU device"
        return f"will measure on: CPU (in-process; {what}){not_yours}"
    source = f"llama-server {_short_build(info.build)}" + (f", runtime {runtime}" if runtime else "")
    if info.gpus:
        return f"will measure on: {_gpu_words(info)} via {source} ({backend})"
    return f"will measure on: CPU ({source}; --list-devices shows no GPU){not_yours}"


def choose_engine(host_gpus: Iterable[str], inprocess: tuple[BackendInfo | None, str | None],
                  server: tuple[BackendInfo | None, str | None], *, runtime: str | None = None) -> EngineChoice:
    """The engine that runs on the user's GPU: in-process when its llama-cpp-python offloads to a
    GPU (a Metal build on a Mac, a CUDA build), else llama-server when its build lists a GPU (the
    selected runtime, or the llama-server found), else in-process on the CPU (llama-server on the
    CPU when the in-process engine is missing). ``host_gpus``: the GPU names of the hardware
    snapshot (for "not your GPU"); each engine as (its BackendInfo, or None and why); ``runtime``:
    the name of the selected runtime when llama-server is that one. Pure: no process is run."""
    host = [g for g in host_gpus if g]
    host_gpu = host[0] if host else None
    (ip, ip_why), (sv, sv_why) = inprocess, server
    sentences: dict[str, str] = {INPROCESS: _engine_sentence(INPROCESS, ip, ip_why, host_gpu, None),
                 SERVER: _engine_sentence(SERVER, sv, sv_why, host_gpu, runtime)}
    if ip is not None and ip.gpus:
        return EngineChoice(INPROCESS, f"in-process: its llama-cpp-python build offloads to {_gpu_words(ip)}",
                            sentences, True)
    ip_state = ("the in-process build has no GPU backend" if ip is not None
                else f"the in-process engine is not available ({ip_why})")
    if sv is not None and sv.gpus:
        what = f"the selected runtime {runtime}" if runtime else f"llama-server {_short_build(sv.build)}"
        return EngineChoice(SERVER, f"llama-server: {ip_state}; {what} lists {_gpu_words(sv)}", sentences, True)
    sv_state = ("llama-server's --list-devices shows no GPU" if sv is not None
                else f"no llama-server ({sv_why})")
    fix = (" To measure your GPU, get a GPU build of llama.cpp ('Get llama.cpp for this machine', "
           "Machine tab).") if host_gpu else ""
    kind = INPROCESS if ip is not None or sv is None else SERVER
    if not host_gpu:
        return EngineChoice(kind, f"no GPU in this machine: {ENGINE_LABELS[kind]} on the CPU", sentences, False)
    return EngineChoice(kind, f"no engine here runs on your {host_gpu}: {ip_state}, and {sv_state}.{fix}",
                        sentences, False)


def host_gpu_names(hw: HardwareSnapshot) -> list[str]:
    """The names of a hardware snapshot's GPUs (app.core.machine.hardware.HardwareSnapshot)."""
    return [g.name or g.vendor for g in getattr(hw, "gpus", ()) if is_gpu_vendor(g.vendor)]


def engine_choice(host_gpus: Iterable[str], rows: list[tuple[str, BackendInfo | None, str | None]],
                  runtime: str | None = None) -> EngineChoice:
    """choose_engine on the rows of engine_backends."""
    by = {engine: (info, why) for engine, info, why in rows}
    missing = (None, "not asked")
    return choose_engine(host_gpus, by.get(INPROCESS, missing), by.get(SERVER, missing), runtime=runtime)
