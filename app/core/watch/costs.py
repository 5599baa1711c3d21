"""Which cost record may price a watched server. ``mismatch`` is the one matching predicate (same
model file, a probe made through llama-server, and, where both sides say, the same build,
backend, devices and host); ``find_costs`` picks the newest record that passes it, or says why
none did and how to make one.

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
import re
from pathlib import Path
from typing import Any, Sequence

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


def _same_host(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Why two host descriptions are different machines, or None when they may be the same."""
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


def mismatch(rec: CostRecord, server: ServerInfo, here: dict[str, Any]) -> str | None:
    """Why ``rec`` cannot price ``server`` (one sentence), or None when it can. ``here``: this
    machine's host description (app.core.records.schema.host_info), the device of a local server.

    The one predicate: the lead may swap it for the shared one of app.core.analysis (issue 28)."""
    engine = getattr(rec, "engine", None)
    if engine != EngineKind.SERVER:
        return (f"the probe {rec.run_id} ran {'in process' if engine == 'inprocess' else f'on {engine}'}, "
                "not through llama-server: its costs are not this server's")
    if not server.model_path:  # nothing to hold the probe's model against: any probe would "match"
        return (f"the server does not say which model it runs (/props has no model_path), so the probe "
                f"{rec.run_id} cannot be matched to it")
    want, have = Path(server.model_path).name, Path(rec.model_path).name
    if want != have:
        return f"the probe {rec.run_id} priced {have}; the server runs {want}"
    local = Path(server.model_path)
    if server.local and local.is_absolute() and local.is_file() and rec.model_size:
        if local.stat().st_size != rec.model_size:
            return f"the probe {rec.run_id} priced another {have} ({rec.model_size} bytes, this one has {local.stat().st_size})"
        if rec.model_head_sha256 and _head_sha256(local) not in (None, rec.model_head_sha256):
            return f"the probe {rec.run_id} priced another {have} (the file changed since, at the same size)"
    (n1, c1), (n2, c2) = build_key(rec.llama_build), build_key(server.build)
    if (n1 and n2 and n1 != n2) or (c1 and c2 and not (c1.startswith(c2) or c2.startswith(c1))):
        return f"the probe {rec.run_id} ran llama.cpp {rec.llama_build}; the server is {server.build}"
    backend = getattr(rec, "backend", None)
    if backend and server.backend and backend != server.backend:
        return f"the probe {rec.run_id} ran on {backend}; the server on {server.backend}"
    devices = tuple(getattr(rec, "devices", None) or ())
    if devices and server.devices and devices != tuple(server.devices):
        return f"the probe {rec.run_id} ran on {', '.join(devices)}; the server on {', '.join(server.devices)}"
    if server.local:
        why = _same_host(rec.host or {}, here)
        if why:
            return f"the probe {rec.run_id} was made on another device ({why})"
    return None


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

