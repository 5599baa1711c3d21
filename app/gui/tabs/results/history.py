"""Past sweeps as the Results tab lists them: by what they are (model, tasks, draft widths, when,
runs, and how the sweep ended), not by file name.

The records say what ran; how a sweep ended (cancelled, no run finished) is known only to the window that
ran it, so it keeps that per results file in its settings (``sweep_status``). A file made by the
CLI, or before the window kept a status, is listed without one. Each file's description is read
once per (size, modification time)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QSettings

from app.core.common.spec_modes import MTP
from app.core.common.errors import UserError
from app.core.common import jsonsafe
from app.core.common.text import printable
from app.core.records.schema import RunRecord
from app.core.records.sweeps import sweeps_of

STATUS_KEY = "sweep_status"  # QSettings: {results file: "cancelled" | "no run finished" | "complete"}
_cache: dict[str, tuple[tuple[int, float], str]] = {}


def describe(records: Sequence[RunRecord], status: str | None = None) -> str:
    """"calibrated-tiny….gguf · code, story · K=1,2 · 12-02 01:50 · 24 runs · cancelled": the
    latest sweep of these records."""
    sweeps = sweeps_of(records)
    if not sweeps:
        return "no runs" + (f" · {status}" if status else "")
    sw = sweeps[-1]
    runs = [r for r in records if r.sweep_id == sw.sweep_id]
    tasks = ", ".join(dict.fromkeys(r.task for r in runs))
    ks = sorted({r.k for r in runs if r.k})
    modes = sorted({r.spec_type for r in runs if r.spec_type and r.spec_type not in ("none", MTP)})
    what = ("K=" + ",".join(str(k) for k in ks)) if ks else ""
    if modes:
        what = ", ".join(filter(None, [what, *modes]))
    when = sw.last_utc[5:16].replace("T", " ")
    ok = sum(1 for r in runs if r.status == "ok")
    parts = [Path(sw.model_path).name, tasks, what or "baseline only", f"{when} UTC", f"{ok} runs"]
    if len(sweeps) > 1:
        parts.append(f"+{len(sweeps) - 1} older sweep(s) in the file")
    if status and status != "complete":
        parts.append(status)
    return printable(" · ".join(p for p in parts if p), one_line=True)


def file_label(path: Path, status: str | None = None) -> str:
    """The history list's text for one results file (its file name when it cannot be read)."""
    from app.core.records.reader import load_records  # msgspec's decoders: only when the list is made

    try:
        st = path.stat()
        key = (st.st_size, st.st_mtime)
        hit = _cache.get(str(path))
        if hit is not None and hit[0] == key:
            text = hit[1]
        else:
            records = load_records(path, [])
            text = describe(records) if records else _probe_only(path)
            _cache[str(path)] = (key, text)
    except (OSError, UserError):
        return printable(path.name, one_line=True) + " · unreadable"
    if status and status != "complete":
        text += f" · {status}"
    return text


def _probe_only(path: Path) -> str:
    """A file with no run: a sweep the cost probe decided (no width can pay), or an empty one."""
    from app.core.records.reader import load_cost_records

    costs = load_cost_records(path)
    if not costs:
        return printable(path.name, one_line=True) + " · no runs"
    c = costs[-1]
    when = c.timestamp_utc[5:16].replace("T", " ")
    return printable(" · ".join(p for p in (Path(c.model_path).name, "cost probe only, no run",
                                            f"{when} UTC" if when else "") if p), one_line=True)


def statuses(settings: QSettings) -> dict[str, str]:
    raw = settings.value(STATUS_KEY, "")
    try:
        out = jsonsafe.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in out.items()} if isinstance(out, dict) else {}


def set_status(settings: QSettings, path: Path | str, status: str) -> None:
    """Remember how the sweep that wrote ``path`` ended (the last few hundred files)."""
    out = statuses(settings)
    out.pop(str(path), None)
    out[str(path)] = status
    settings.setValue(STATUS_KEY, json.dumps(dict(list(out.items())[-500:])))

