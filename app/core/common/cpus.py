"""The CPUs this process may run on, and their physical cores: the thread count both engines run
llama.cpp with when nobody chose one (what users run: llama-server's own default, -t unset, is its
physical cores too, common/common.cpp common_cpu_get_num_math)."""

from __future__ import annotations

import os


def allowed_cpus() -> list[int] | None:
    """The CPUs this process may run on (its affinity), or None where the OS does not say."""
    try:
        return sorted(os.sched_getaffinity(0))  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):
        return None


def physical_cores() -> int:
    """The physical cores among the CPUs this process may run on (llama.cpp gains nothing from a
    core's second hardware thread)."""
    logical = len(allowed_cpus() or ()) or os.cpu_count() or 1
    try:
        import psutil

        phys = psutil.cpu_count(logical=False) or logical
        all_logical = psutil.cpu_count(logical=True) or logical
    except Exception:  # noqa: BLE001 - not known: count each CPU
        return logical
    return max(1, min(phys, round(logical * phys / all_logical)))
