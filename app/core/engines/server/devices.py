"""What devices a llama-server binary has: ``--list-devices``, read once per binary (same path and
modification time), as its capabilities are."""

from __future__ import annotations

import os

from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError, os_reason
from app.core.engines.backend_truth import CPU, BackendInfo, Device, parse_list_devices
from app.core.engines.server.binary import _run_quiet, probe_capabilities

_DEVICES_CACHE: dict[tuple[str, float], tuple[Device, ...]] = {}


def read_devices(binary: str, timeout: float = 60.0, cancel: CancelToken | None = None, *,
                 rpc: str | None = None) -> tuple[Device, ...]:
    """The non-CPU devices ``binary --list-devices`` prints (() for a CPU-only build, which prints
    "(none)"), asked now, not cached (a runtime being validated). ``rpc``: with these workers
    (``--rpc`` first: their devices as llama.cpp names them, RPC0, RPC1 ...). Raises EngineError
    when the binary does not answer with a device list."""
    rc, text = _run_quiet([binary, *(("--rpc", rpc) if rpc else ()), "--list-devices"], timeout, cancel)
    if rc != 0:
        tail = " / ".join(text.strip().splitlines()[-2:])
        raise EngineError(f"{binary}: --list-devices failed (exit code {rc}: {tail or 'no output'})")
    try:
        return parse_list_devices(text)
    except EngineError as e:
        raise EngineError(f"{binary}: {e}") from None


def list_devices(binary: str, timeout: float = 60.0, cancel: CancelToken | None = None) -> tuple[Device, ...]:
    """read_devices, once per binary (same path and modification time)."""
    try:
        key = (binary, os.stat(binary).st_mtime)
    except OSError as e:
        raise EngineError(f"{binary}: cannot read it ({os_reason(e)})") from None
    if key not in _DEVICES_CACHE:
        _DEVICES_CACHE[key] = read_devices(binary, timeout, cancel)
    return _DEVICES_CACHE[key]


def server_backends(binary: str, timeout: float = 60.0, cancel: CancelToken | None = None) -> BackendInfo:
    """The BackendInfo of a llama-server binary: its build and the devices --list-devices shows
    (the CPU is always there; llama-server does not list it)."""
    caps = probe_capabilities(binary, timeout, cancel)
    devices = list_devices(binary, timeout, cancel)
    backends = tuple(dict.fromkeys([d.backend for d in devices] + [CPU]))
    note = None if devices else "--list-devices: (none): a CPU-only build, or its GPU runtime is missing"
    return BackendInfo("server", caps.version, backends, devices + (Device(CPU, "", "cpu"),),
                       bool(devices), note)
