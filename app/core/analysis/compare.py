"""Two sweeps side by side (mtp-tuner compare, e.g. before and after a llama.cpp update): the
per-cell comparison, and which settings differ between them."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import PurePath
from typing import Sequence

from app.core.analysis.analysis import Analysis, CellStats
from app.core.machine.modelinfo import size_text
from app.core.records.arm import Arm
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One task and arm in two sweeps (e.g. before and after a llama.cpp update)."""

    task: str
    arm: Arm
    a: CellStats | None
    b: CellStats | None

    @property
    def tok_s_change(self) -> float | None:
        """b's median tok/s over a's (1.10 = 10 % faster in b)."""
        if self.a and self.b and self.a.tok_s.median and self.b.tok_s.median:
            return self.b.tok_s.median / self.a.tok_s.median
        return None

    @property
    def verdict_changed(self) -> bool:
        return bool(self.a and self.b and self.a.verdict != self.b.verdict)


def _same_arm(arm: Arm) -> Arm:
    """What makes two sweeps' arms the same arm: mode, K, p_min and the drafter's file name (the
    same drafter in another folder, or on another machine, is the same arm; a changed file is a
    set-up change, which setting_changes reports by its sha256)."""
    return dataclasses.replace(arm, drafter=PurePath(arm.drafter).name) if arm.drafter else arm


def compare(a: Analysis, b: Analysis) -> list[Comparison]:
    """Every task/arm of either sweep, in a's order then b's new ones."""
    cells_a = {(c.task, _same_arm(c.arm)): c for c in reversed(a.cells)}  # the first of equal keys
    cells_b = {(c.task, _same_arm(c.arm)): c for c in reversed(b.cells)}
    keys = list(dict.fromkeys([(c.task, c.arm) for c in a.cells] + [(c.task, c.arm) for c in b.cells]))
    out, seen = [], set()
    for t, arm in keys:
        key = (t, _same_arm(arm))
        if key not in seen:
            seen.add(key)
            out.append(Comparison(t, arm, cells_a.get(key), cells_b.get(key)))
    return out


_PLAIN = (str, int, bool, float, type(None))


def _plain_key(d) -> tuple | None:
    """A hashable stand-in for a dict that equals another's only where json.dumps(sort_keys=True)
    writes the same text (str keys; values of exactly str, int, bool, None, or float with the sign
    of zero), else None."""
    if type(d) is not dict:
        return None
    out = []
    for k, v in d.items():
        t = type(v)
        if type(k) is not str or t not in _PLAIN:
            return None
        out.append((k, t, v, math.copysign(1.0, v) if t is float else 0))
    return tuple(out)


def _once(fmt, key):
    """``fmt`` for each distinct ``key(r)`` once (a large file repeats the same few values);
    directly where the key is None."""
    seen: dict = {}

    def f(r):
        k = key(r)
        if k is None:
            return fmt(r)
        if k not in seen:
            seen[k] = fmt(r)
        return seen[k]
    return f


NOT_RECORDED = "not recorded"  # the backend of schema 1 records (written before it was recorded)
_BUILD_KEYS = ("llama.cpp build", "backend")


def _setup(records: Sequence[RunRecord], keys: Sequence[str] | None = None) -> dict[str, str]:
    """The set-up of a sweep, each line the sorted distinct values of its ok runs (all runs when
    none is ok); only ``keys`` where given."""
    ok = [r for r in records if r.status == "ok"] or list(records)

    def values(f) -> str:  # a field that says None for a run has nothing to say of it
        return ", ".join(sorted({str(v) for r in ok if (v := f(r)) is not None})) or "-"

    fields = _setup_fields()
    return {k: values(fields[k]) for k in (fields if keys is None else keys)}


def _setup_fields() -> dict:
    """What each set-up line shows of a run (fresh each call: the _once caches live for one _setup)."""
    return {
        "llama.cpp build": lambda r: r.llama_build,
        "backend": lambda r: r.backend or NOT_RECORDED,  # schema 2: CPU, CUDA, Metal, Vulkan...
        "engine": lambda r: r.engine,
        "model": _once(lambda r: f"{PurePath(r.model_path).name} ({size_text(r.model_size)})",
                       lambda r: (r.model_path, r.model_size)
                       if type(r.model_path) is str and type(r.model_size) is int else None),
        # the speculative runs' drafter file (the baseline has none to say)
        "drafter": _once(lambda r: None if r.arm == "baseline" else
                         f"{PurePath(str(r.drafter.get('path'))).name} (sha256 {str(r.drafter.get('sha256'))[:12]})"
                         if r.drafter else "none",
                         lambda r: (r.arm == "baseline", r.drafter.get("path"), r.drafter.get("sha256"))
                         if r.drafter else r.arm == "baseline"),
        "tokens per run": lambda r: r.n_predict,
        "sampling": _once(lambda r: json.dumps(r.sampling, sort_keys=True), lambda r: _plain_key(r.sampling)),
        "prompts": lambda r: f"{r.task}/{r.prompt_id}",
        "machine": lambda r: f"{r.host.get('os', '?')}, {r.host.get('cpu_count', '?')} CPUs",
    }


def setting_changes(a: Sequence[RunRecord], b: Sequence[RunRecord]) -> list[tuple[str, str, str]]:
    """What differs between the set-ups of two sweeps, as (what, in a, in b): the llama.cpp build
    first (the usual reason to compare: MTP speed changes between builds) and the backend it ran
    on, then engine, model, drafter, generation settings, prompts and machine. Empty when only the measurements differ.
    The backend only where both sweeps recorded it: an old (schema 1) file against a new one of the
    same build is no change."""
    sa, sb = _setup(a), _setup(b)
    out = []
    for key in sa:
        if key == "backend" and NOT_RECORDED in (sa[key], sb[key]):
            continue
        if sa[key] != sb[key]:
            if key == "prompts":  # long lists: say how they differ
                pa, pb = set(sa[key].split(", ")), set(sb[key].split(", "))
                out.append((key, f"{len(pa)} prompts", f"{len(pb)} prompts, {len(pb - pa)} not in A, "
                                                        f"{len(pa - pb)} of A's missing"))
            else:
                out.append((key, sa[key], sb[key]))
    return out


def _recorded_backends(setup: dict[str, str]) -> list[str]:
    return [x for x in setup["backend"].split(", ") if x != NOT_RECORDED]


def _build_text(setup: dict[str, str]) -> str:
    """A sweep's llama.cpp build(s), with the backend its runs ran on where the records say
    (schema 2): "b6123 (abc1234) on CUDA"."""
    backends = _recorded_backends(setup)
    build = setup["llama.cpp build"]
    return f"{build} on {', '.join(backends)}" if backends else build


def builds(a: Sequence[RunRecord], b: Sequence[RunRecord]) -> dict[str, object]:
    """The two sweeps' builds, named whether or not they differ (re-tuning after a llama.cpp
    update starts from this line): {"a": ..., "b": ..., "changed": bool}. Changed: another
    llama.cpp build, or another backend where both sweeps recorded one (the same tag on CUDA,
    then Vulkan, is another binary); an old file without backends against a new one of the same
    build is the same build."""
    sa, sb = _setup(a, _BUILD_KEYS), _setup(b, _BUILD_KEYS)
    ka, kb = _recorded_backends(sa), _recorded_backends(sb)
    changed = sa["llama.cpp build"] != sb["llama.cpp build"] or bool(ka and kb and ka != kb)
    return {"a": _build_text(sa), "b": _build_text(sb), "changed": changed}


def format_builds(b: dict[str, object]) -> str:
    return f"llama.cpp builds: A {b['a']}; B {b['b']}" + (" (changed)" if b["changed"] else " (the same)")


def format_changes(changes: list[tuple[str, str, str]]) -> str:
    if not changes:
        return "same set-up (build, backend, engine, model, drafter, settings, prompts, machine): only the measurements differ"
    return "set-up differs: " + "; ".join(f"{what}: {x} -> {y}" for what, x, y in changes)
