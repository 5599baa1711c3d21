"""A cost probe made earlier on this machine, reused by the adaptive sweep instead of probing again.

The in-process probe times the whole speculative step at every K and takes minutes on a CPU
(3-6 min for the bench-size model on 2 cores), longer than the runs that decide a quick sweep. A
probe made here recently measured the same thing, so an adaptive sweep in process takes the
newest one that:

- measured the same model file (path, size and content: its modification time and the hash of
  its first megabytes, records.cost.model_stamp), in process, with the same llama.cpp build and
  thread count, on this machine (the same OS family, architecture and CPU count): the one rule of
  analysis.costs.differs;
- at the sweep's context depth, every K the sweep may draft (whole steps), less than
  ``MAX_AGE_H`` ago;
- passed its own middle-rate check (the straight line between full acceptance and full
  rejection held within whole_step.MID_TOLERANCE) where it made one.

A probe recorded before probes kept the model's content stamp is not taken: nothing says the file
it measured is the one there now (a model re-quantised or re-downloaded in place keeps its path and
often its size), and probing again costs minutes, a wrong price a whole sweep. Records are checked
as they are read (records.cost: a cost that is not a finite, positive, bounded time is no record),
so a planted or damaged record is left out with a warning naming its file and line, never priced
with.

It says which probe it took and how to measure again (``--reprobe``; the window's "Probe the
costs again"). llama-server sweeps always probe: where the server runs (which device, how many
layers on it) is a start-up setting the record cannot be held against before the server starts.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Sequence

from app.core.analysis.costs import RunSetup, differs
from app.core.common.paths import results_dir
from app.core.engines.base import Engine, EngineKind
from app.core.measure.plan import Plan
from app.core.measure.whole_step import MID_TOLERANCE
from app.core.records.cost import DEFAULT_DEPTH, CostRecord, model_stamp
from app.core.records.reader import load_cost_records
from app.core.records.schema import host_info

MAX_AGE_H = 24.0  # a probe older than this is measured again (drivers, load, thermal state change)
MAX_FILES = 50  # the newest results files looked at


def _age_h(rec: CostRecord, now: dt.datetime) -> float | None:
    try:
        t = dt.datetime.fromisoformat(rec.timestamp_utc.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return (now - t).total_seconds() / 3600


ModelFile = tuple[str, int, dict[str, Any]]
# why a probe of another set-up (analysis.costs.differs) does not price this sweep, in a few words
_SAID = {"model": "another model file", "size": "another model file", "content": "the model file changed since",
         "engine": "not an in-process probe of an in-process sweep", "build": "another llama.cpp build",
         "threads": "another thread count", "host": "another machine"}


def _model_file(plan: Plan) -> ModelFile | None:
    """The sweep's model file as a probe records it (resolved path, size, content stamp), or None:
    unreadable."""
    path = Path(plan.model)
    try:
        return str(path.resolve()), path.stat().st_size, model_stamp(path)
    except OSError:
        return None


def why_not(rec: CostRecord, plan: Plan, engine: Engine, ks: Sequence[int], now: dt.datetime,
            here: dict[str, Any] | None = None, model_file: ModelFile | None = None) -> str | None:
    """Why ``rec`` cannot price this adaptive sweep in place of a new probe (a few words), or None.
    ``here`` (host_info) and ``model_file`` (_model_file) when the caller has them already."""
    found = model_file or _model_file(plan)
    if found is None:
        return "the model file cannot be read"
    model, size, stamp = found
    if engine.kind is not EngineKind.INPROCESS:
        return "not an in-process probe of an in-process sweep"
    setup = RunSetup(model, EngineKind.INPROCESS.value, llama_build=engine.build, model_size=size,
                     model_mtime_ns=stamp["model_mtime_ns"], model_head_sha256=stamp["model_head_sha256"],
                     threads=engine.threads or 0, host=here if here is not None else host_info())
    if rec.model_mtime_ns is None or rec.model_head_sha256 is None:
        return "made before probes kept the model's content"
    d = differs(rec, setup)
    if d is not None:
        return _SAID.get(d.facet, f"another {d.facet}")
    if rec.depth != max(DEFAULT_DEPTH, *plan.depths):
        return "another context depth"
    if not rec.step_ms or max(int(k) for k in rec.step_ms) < max(ks):
        return "not every width timed"
    age = _age_h(rec, now)
    if age is None or age < 0 or age > MAX_AGE_H:
        return f"older than {MAX_AGE_H:.0f} h"
    mc = rec.mid_check or {}
    if mc.get("error") is not None and not abs(float(mc["error"])) <= MID_TOLERANCE:  # NaN fails too
        return "its middle-rate check failed"
    return None


def reusable_probe(plan: Plan, engine: Engine, ks: Sequence[int], folder: Path | None = None,
                   extra: Sequence[Path] = (), now: dt.datetime | None = None,
                   problems: list[str] | None = None) -> tuple[CostRecord | None, str, Path | None]:
    """(the newest probe that may price this sweep, the sentence that says so, the file it is in)
    or (None, "", None).
    Looks in ``extra`` files and the newest MAX_FILES results files of ``folder`` (default: the
    results folder); a file that cannot be read is passed over, a cost record that is not one
    (records.cost) left out and said in ``problems`` (else the log), once, with its file and line."""
    if engine.kind is not EngineKind.INPROCESS:
        return None, "", None
    now = now or dt.datetime.now(dt.timezone.utc)
    folder = folder if folder is not None else results_dir()
    try:  # a file last written before the oldest probe that may serve cannot hold one
        recent = [(p.stat().st_mtime, p) for p in folder.glob("*.jsonl")]
        since = now.timestamp() - MAX_AGE_H * 3600
        files = [p for t, p in sorted(recent, reverse=True) if t >= since][:MAX_FILES]
    except OSError:
        files = []
    here, model_file = host_info(), _model_file(plan)
    if model_file is None:
        return None, "", None
    best: CostRecord | None = None
    source: Path | None = None
    for f in dict.fromkeys(Path(x) for x in [*extra, *files]):
        try:
            recs = load_cost_records(f, problems)
        except Exception:  # noqa: BLE001 - an unreadable or foreign file: not a source of probes
            continue
        for rec in recs:
            newer = best is None or rec.timestamp_utc > best.timestamp_utc
            if newer and why_not(rec, plan, engine, ks, now, here, model_file) is None:
                best, source = rec, f
    if best is None:
        return None, "", None
    age = _age_h(best, now) or 0.0
    when = f"{age * 60:.0f} min ago" if age < 1 else f"{age:.1f} h ago"
    said = (f"costs from the probe made {when} (same model, build, threads and depth, on this machine): "
            "not probed again (--reprobe, or the window's \"Probe the costs again\", measures anew)")
    return best, said, source


__all__ = ["reusable_probe", "why_not", "MAX_AGE_H"]
