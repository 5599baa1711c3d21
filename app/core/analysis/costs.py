"""Which cost probe prices a set of runs: only one measured where they ran. ``differs`` is the one
rule of it, for the verdict here, for watch (watch.costs) and for the adaptive sweep's reuse of
a recent probe (session.probes); each says why not in its own words.

A probe prices runs when it measured the same model, through the same engine, on the same
backend and device set, with the same llama.cpp build (and the same drafter, for a drafter's
mode); among those, the one at the context depth nearest the runs' (the latest of equals). A
field an older record does not keep (cost records before schema 5 have no backend or devices)
is not compared. Otherwise the verdict prices the runs with costs fitted from them, and
``matching_probe`` says why in one line, e.g. "the probe ran in process on the CPU; these runs
ran through llama-server on CUDA0".

    setup = run_setup(records)                       # where the runs ran
    probe, why = matching_probe(cost_records, setup)  # (CostRecord, None) or (None, "why not")
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from app.core.engines.base import EngineKind
from app.core.common.spec_modes import MTP
from app.core.records.cost import DEFAULT_DEPTH, CostRecord, where_text
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """Where runs ran (or a watched server runs, or an adaptive sweep will run), as a probe must
    match it to price them. None / (): not known, not compared."""

    model_path: str | None  # the model file's resolved path
    engine: str
    backend: str | None = None
    devices: tuple[str, ...] = ()
    llama_build: str | None = None
    depth: int = 0  # the runs' deepest context: matching_probe takes the probe nearest it
    drafter: str | None = None  # the drafter of the draft-mtp runs (None: the model's own heads)
    drafter_known: bool = True  # False: which drafter is not known (a watched server): not compared
    model_name: str | None = None  # the file's name alone (a server names a path on its own machine)
    model_size: int | None = None
    model_mtime_ns: int | None = None  # records.cost.model_stamp: the file's content
    model_head_sha256: str | None = None
    threads: int | None = None
    host: Mapping[str, Any] | None = None  # the machine (records.schema.host_info); None: another or not known

    def where(self) -> str:
        return where_text(self.engine, self.backend, self.devices)


@dataclasses.dataclass(frozen=True)
class Differs:
    """What keeps a probe from pricing a set-up: the first ``facet`` of FACETS that differs; for
    the host, ``detail`` says how (e.g. "CPU count 96 there, 2 here")."""

    facet: str
    detail: str = ""


# in the order differs() compares them: the model file first, then where and how it ran
FACETS = ("model", "size", "content", "engine", "backend", "devices", "build", "drafter", "threads", "host")


def differs(probe: CostRecord, setup: RunSetup) -> Differs | None:
    """The one rule of whether a cost record prices a set-up: it must have measured the same model
    file (path or name, size, content), through the same engine, on the same backend and devices,
    with the same llama.cpp build (same_build), the same drafter for a llama-server probe, the same
    threads, on the same machine (same_host); each compared only where both sides say. None when
    it prices it. The callers say why not in their own words (mismatch here; watch.costs.mismatch;
    session.probes.why_not) and add what is theirs alone (a probe's age, its widths, ...)."""
    stamp = (probe.model_mtime_ns, probe.model_head_sha256)
    facts = (
        ("model", (setup.model_path is not None and probe.model_path != setup.model_path)
         or (setup.model_name is not None and Path(probe.model_path).name != setup.model_name)),
        ("size", _known_apart(probe.model_size, setup.model_size)),
        ("content", any(_known_apart(a, b) for a, b in zip(stamp, (setup.model_mtime_ns, setup.model_head_sha256)))),
        ("engine", probe.engine != setup.engine),
        ("backend", _known_apart(probe.backend, setup.backend)),
        ("devices", bool(probe.devices and setup.devices and set(probe.devices) != set(setup.devices))),
        ("build", not same_build(probe.llama_build, setup.llama_build)),
        ("drafter", setup.drafter_known and probe.engine == EngineKind.SERVER
         and (probe.drafter or None) != (setup.drafter or None)),
        ("threads", setup.threads is not None and probe.threads != setup.threads),
    )
    for facet, apart in facts:
        if apart:
            return Differs(facet)
    why = same_host(probe.host or {}, setup.host) if setup.host is not None else None
    return Differs("host", why) if why else None


def _known_apart(a: object, b: object) -> bool:
    """Both sides say, and differently."""
    return a is not None and b is not None and a != b


def build_key(text: str | None) -> tuple[int | None, str | None]:
    """(build number, commit) from a build string as llama.cpp prints it anywhere:
    ``b11434-515e855`` (/props), ``b11434 (515e855)``, ``0.6.0-dev (build 0, commit unknown)``.
    A build number 0 or a commit "unknown" is no information."""
    if not text:
        return None, None
    m = re.search(r"\bb(\d+)\b|\bbuild\s*(\d+)", text)
    number = int(m.group(1) or m.group(2)) if m else None
    c = re.search(r"(?:commit\s*|[-(])([0-9a-f]{7,40})\b", text)
    return (number or None), (c.group(1) if c else None)


def same_build(a: str | None, b: str | None) -> bool:
    """Whether two build strings may name the same llama.cpp build. The same text is; otherwise
    their build numbers and commits (build_key) decide where both give one; a side that says its
    build is unknown (build 0, commit unknown: a development build) is not held against the other;
    two other texts (e.g. two llama-cpp-python versions) are two builds."""
    if not a or not b or a == b:
        return True
    (n1, c1), (n2, c2) = build_key(a), build_key(b)
    if (n1 and n2 and n1 != n2) or (c1 and c2 and not (c1.startswith(c2) or c2.startswith(c1))):
        return False
    if (n1 or c1) and (n2 or c2):
        return True
    return _says_unknown(a) or _says_unknown(b)


def _says_unknown(text: str) -> bool:
    return build_key(text) == (None, None) and re.search(r"\bb0\b|\bbuild\s*0\b|unknown", text) is not None


def same_host(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """Why two host descriptions (records.schema.host_info) are different machines, or None when
    they may be the same: CPU architecture and count, OS family, and GPUs where both list them."""
    for key, what in (("machine", "CPU architecture"), ("cpu_count", "CPU count")):
        if a.get(key) is not None and b.get(key) is not None and a[key] != b[key]:
            return f"{what} {a[key]} there, {b[key]} here"
    sa, sb = str(a.get("os") or "").split("-")[0], str(b.get("os") or "").split("-")[0]
    if sa and sb and sa != sb:
        return f"{sa} there, {sb} here"
    if "gpus" in a and "gpus" in b:
        ga = sorted(str(g.get("name")) for g in a["gpus"] or [] if isinstance(g, dict))
        gb = sorted(str(g.get("name")) for g in b["gpus"] or [] if isinstance(g, dict))
        if ga != gb:
            return f"GPUs {', '.join(ga) or 'none'} there, {', '.join(gb) or 'none'} here"
    return None


def run_setup(records: Sequence[RunRecord]) -> RunSetup:
    """Where the runs ran: the latest run's model, engine, backend, devices and build; the
    deepest context; the drafter of their draft-mtp runs."""
    if not records:
        raise ValueError("no runs")
    last = records[-1]
    placed = next((r for r in reversed(records) if r.backend is not None), last)
    drafter = next(((r.drafter or {}).get("path") for r in reversed(records)
                    if r.k and r.spec_type in (None, MTP)), None)
    return RunSetup(last.model_path, last.engine, placed.backend, tuple(placed.devices), last.llama_build,
                    max((r.depth for r in records), default=0), drafter)


def mismatch(probe: CostRecord, setup: RunSetup) -> str | None:
    """Why ``probe`` cannot price runs of ``setup`` (one line), or None when it can."""
    d = differs(probe, setup)
    if d is not None and d.facet in ("model", "size", "content"):
        return "the probe measured another model"
    if not probe.prices_steps:
        return "the probe measured no speculative step (the model has no MTP heads)"
    if d is None:
        return None
    if d.facet == "build":
        return f"the probe ran on llama.cpp {probe.llama_build}; these runs on {setup.llama_build}"
    if d.facet == "drafter":
        return ("the probe drafted with " + (probe.drafter or "the model's own MTP heads") + "; these runs with "
                + (setup.drafter or "the model's own MTP heads"))
    return f"the probe ran {probe.where()}; these runs ran {setup.where()}"


def matching_probe(cost_records: Iterable[CostRecord], setup: RunSetup) -> tuple[CostRecord | None, str | None]:
    """(the probe that prices runs of ``setup``, None) or (None, why none does: one line; None when
    there is no probe of this model at all). Among matching probes, the nearest depth to the
    runs' (at least DEFAULT_DEPTH), the latest of equals."""
    own = [c for c in cost_records if c.model_path == setup.model_path]
    if not own:
        return None, None
    ok = [c for c in own if mismatch(c, setup) is None]
    if not ok:
        return None, mismatch(own[-1], setup)
    depth = max(DEFAULT_DEPTH, setup.depth)
    return min(reversed(ok), key=lambda c: abs(c.depth - depth)), None
