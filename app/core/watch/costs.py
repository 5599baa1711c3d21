"""Which cost record may price a watched server. ``mismatch`` holds a record to the server through
the one rule of app.core.analysis.costs (same model file, a probe made through llama-server,
and, where both sides say, the same build, backend, devices and host); ``find_costs`` picks the
newest record that passes it, or says why none did and how to make one.

Records are checked as they are read (records.cost.CostRecord.from_dict): a record whose costs
are not finite, positive, bounded times (NaN, 0, -1, 1e308), whose fields are not of their types,
or whose middle check is NaN is left out with one warning naming its file and line, and never
prices a server. For a model file on this machine, a record that kept the file's content hash
(records.cost.model_stamp) must match it: a file changed in place at the same size is another
model. Older records without the hash are held to the name and size, as before (watch cannot
probe by itself; the refusal would leave every older probe unusable)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Sequence

from app.core.analysis.costs import RunSetup, differs
from app.core.engines.base import EngineKind
from app.core.common.errors import UserError
from app.core.common.paths import results_dir
from app.core.records.cost import CostRecord, model_stamp
from app.core.records.reader import load_cost_records


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """What the watched server says of itself (``/props``), and where it runs."""

    url: str
    model_path: str | None
    build: str | None  # /props build_info, e.g. "b11434-515e855"
    local: bool  # on this machine (127.0.0.1, localhost): its device is this one
    backend: str | None = None  # not in /props today; compared where a caller knows it
    devices: tuple[str, ...] = ()


def mismatch(rec: CostRecord, server: ServerInfo, here: dict[str, Any]) -> str | None:
    """Why ``rec`` cannot price ``server`` (one sentence), or None when it can: the one rule of
    app.core.analysis.costs (differs) over what the server says of itself; its model file, size
    and content, and its machine (``here``: records.schema.host_info) only for a local server."""
    if not server.model_path:  # nothing to hold the probe's model against: any probe would "match"
        return (f"the server does not say which model it runs (/props has no model_path), so the probe "
                f"{rec.run_id} cannot be matched to it")
    want, have = Path(server.model_path).name, Path(rec.model_path).name
    local = Path(server.model_path)
    here_file = server.local and local.is_absolute() and local.is_file()
    size = local.stat().st_size if here_file else None
    setup = RunSetup(None, EngineKind.SERVER.value, server.backend, tuple(server.devices), server.build,
                     drafter_known=False, model_name=want, model_size=size,
                     model_head_sha256=_head_sha256(local) if here_file and rec.model_head_sha256 else None,
                     host=here if server.local else None)
    d = differs(rec, setup)
    if d is None:
        return None
    said = {
        "engine": (f"the probe {rec.run_id} ran {'in process' if rec.engine == 'inprocess' else f'on {rec.engine}'}, "
                   "not through llama-server: its costs are not this server's"),
        "model": f"the probe {rec.run_id} priced {have}; the server runs {want}",
        "size": f"the probe {rec.run_id} priced another {have} ({rec.model_size} bytes, this one has {size})",
        "content": f"the probe {rec.run_id} priced another {have} (the file changed since, at the same size)",
        "build": f"the probe {rec.run_id} ran llama.cpp {rec.llama_build}; the server is {server.build}",
        "backend": f"the probe {rec.run_id} ran on {rec.backend}; the server on {server.backend}",
        "devices": f"the probe {rec.run_id} ran on {', '.join(rec.devices)}; the server on {', '.join(server.devices)}",
        "host": f"the probe {rec.run_id} was made on another device ({d.detail})",
    }
    return said.get(d.facet, f"the probe {rec.run_id} differs from the server in its {d.facet}")


def _head_sha256(path: Path) -> str | None:
    """The model file's content hash (records.cost.model_stamp), read once per file state: every
    cost record of the results folder is held against the same file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _stamped_hash(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _stamped_hash(path: str, _mtime_ns: int, _size: int) -> str | None:
    try:
        return str(model_stamp(path)["model_head_sha256"])
    except OSError:
        return None


def how_to_probe(server: ServerInfo) -> str:
    model = server.model_path or "MODEL.gguf"
    return (f"make one on the server's machine with `mtp-tuner probe --model {model} --engine server "
            "--out RESULTS.jsonl` and pass it with --costs RESULTS.jsonl")


def candidate_files(costs: str | None) -> list[Path]:
    if costs:
        p = Path(costs).expanduser()
        if not p.is_file():
            raise UserError(f"{p}: results file not found (--costs)")
        return [p]
    folder = results_dir()
    try:
        return sorted(folder.glob("*.jsonl"), key=lambda f: f.stat().st_mtime, reverse=True)
    except OSError:
        return []


def find_costs(server: ServerInfo, here: dict[str, Any], files: Sequence[Path] | None = None,
               costs: str | None = None) -> tuple[CostRecord | None, str]:
    """The newest cost record that may price ``server`` and a line saying which; or None and
    why none may (with how to make one)."""
    paths = list(files) if files is not None else candidate_files(costs)
    records: list[tuple[CostRecord, Path]] = []
    for p in paths:
        try:
            records += [(r, p) for r in load_cost_records(p)]
        except UserError:
            if costs:
                raise
            continue  # another kind of file in the results folder
    where = str(paths[0]) if costs and paths else f"the results folder ({results_dir()})"
    if not records:
        return None, f"no cost record in {where}: {how_to_probe(server)}"
    records.sort(key=lambda rp: rp[0].timestamp_utc or "", reverse=True)
    reasons = []
    for rec, p in records:
        why = mismatch(rec, server, here)
        if why is None:
            return rec, f"priced by the probe {rec.run_id} of {p.name}, {rec.timestamp_utc[:16]}"
        reasons.append(why)
    more = f" ({len(reasons) - 1} more refused)" if len(reasons) > 1 else ""
    return None, f"no cost record in {where} matches this server: {reasons[0]}{more}; {how_to_probe(server)}"

