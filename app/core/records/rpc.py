"""The RPC workers a sweep split its model over (llama.cpp's RPC backend), as results files keep them.

Every run record of such a sweep carries ``rpc`` (schema 8): the workers ("host:port", as
llama-server's ``--rpc`` took them) and each one's round-trip time in ms when the sweep started
(None: it did not answer). A worker serves one client at a time, so its round trip can be timed
only while no llama-server holds it: before the sweep's first server starts, and after its last
one stopped. The time at the end is therefore not in the run records, which were written by then:
the session appends one ``record_type: "rpc"`` line after the sweep (RpcRecord) with both times,
for the whole sweep. The run, cost and watch readers skip that line (each reads its own type);
records.reader.load_rpc_records reads it.

The addresses are private: the card says only how many workers and their round trip
(``link_text``), never where they are."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable

from app.core.records import check as C

RECORD_TYPE = "rpc"
MAX_WORKERS = 64  # more than any --rpc list takes (engines.server.rpc_worker.MAX_WORKERS)
MAX_ENDPOINT = 300  # a host name (253) and a port, bracketed
MAX_RTT_MS = 600_000.0  # ten minutes: no worker that slow answers at all


def rpc_field(workers: Iterable[str], rtt_start_ms: Iterable[float | None]) -> dict[str, Any]:
    """A run record's ``rpc``: the workers and their round trips at the sweep's start."""
    return {"workers": list(workers), "rtt_start_ms": rounded(rtt_start_ms)}


def rounded(times: Iterable[float | None]) -> list[float | None]:
    """Round trips as records keep them: to 0.1 µs."""
    return [None if t is None else round(t, 4) for t in times]


def _times(v: Any, name: str, n: int) -> list[float | None]:
    times = C.items(v, name, MAX_WORKERS)
    if len(times) != n:
        raise C.BadField(f"{name} has {len(times)} times for {n} workers")
    return [C.optional(C.number, t, f"{name}[{i}]", 0.0, MAX_RTT_MS) for i, t in enumerate(times)]


def check_rpc(v: Any, name: str = "rpc") -> dict[str, Any]:
    """``rpc`` as a record holds it, checked: at most MAX_WORKERS workers, each a short one-line
    text, and a time (or null) per worker, each within 0..MAX_RTT_MS. Raises check.BadField."""
    d = C.mapping(v, name)
    workers = [C.text(w, f"{name}.workers[{i}]", MAX_ENDPOINT)
               for i, w in enumerate(C.items(d.get("workers"), f"{name}.workers", MAX_WORKERS))]
    if not workers:
        raise C.BadField(f"{name}.workers is empty")
    out: dict[str, Any] = {"workers": workers,
                           "rtt_start_ms": _times(d.get("rtt_start_ms"), f"{name}.rtt_start_ms", len(workers))}
    if d.get("rtt_end_ms") is not None:
        out["rtt_end_ms"] = _times(d.get("rtt_end_ms"), f"{name}.rtt_end_ms", len(workers))
    return out


def bad_rpc(v: Any) -> str | None:
    """Why a run record's ``rpc`` is not one the app writes (check_rpc), or None."""
    try:
        check_rpc(v)
    except C.BadField as e:
        return str(e)
    return None


@dataclasses.dataclass(frozen=True)
class RpcRecord:
    """The line after a sweep over RPC workers: its workers' round trips at its start and its end."""

    schema_version: int
    record_type: str  # "rpc"
    run_id: str
    sweep_id: str
    timestamp_utc: str
    workers: tuple[str, ...]
    rtt_start_ms: tuple[float | None, ...]
    rtt_end_ms: tuple[float | None, ...]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self) | {"workers": list(self.workers),
                                                       "rtt_start_ms": list(self.rtt_start_ms),
                                                       "rtt_end_ms": list(self.rtt_end_ms)},
                          ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RpcRecord":
        """The record of a results file's JSON object; check.BadField naming the first bad field."""
        d = C.mapping(d, "the record")
        if d.get("record_type") != RECORD_TYPE:
            raise C.BadField(f"record_type is {C.describe(d.get('record_type'))}, not {RECORD_TYPE!r}")
        if d.get("rtt_end_ms") is None:
            raise C.BadField("no 'rtt_end_ms'")
        link = check_rpc(d, "the record")
        return cls(C.integer(d.get("schema_version"), "schema_version", 1, 99), RECORD_TYPE,
                   C.text(d.get("run_id"), "run_id", 200), C.text(d.get("sweep_id"), "sweep_id", 200),
                   C.timestamp(d.get("timestamp_utc"), "timestamp_utc"), tuple(link["workers"]),
                   tuple(link["rtt_start_ms"]), tuple(link["rtt_end_ms"]))


def link_text(links: Iterable[dict[str, Any] | None]) -> str:
    """What the card says of the workers (never where they are): "over 2 RPC workers, round trip
    0.3 ms" (a range where they differ); "" when the runs ran on this machine only."""
    found = [d for d in links if d]
    if not found:
        return ""
    n = max(len(d.get("workers") or ()) for d in found)
    times = sorted(t for d in found for t in d.get("rtt_start_ms") or () if isinstance(t, (int, float)))
    text = f"over {n} RPC worker{'s' if n != 1 else ''}"
    if not times:
        return text
    lo, hi = _ms(times[0]), _ms(times[-1])
    return f"{text}, round trip {lo} ms" if lo == hi else f"{text}, round trip {lo} to {hi} ms"


def _ms(t: float) -> str:
    """0.31 -> "0.31", 2.06 -> "2.1", 12.4 -> "12", 1234.5 -> "1235"."""
    return f"{t:.2g}" if t < 10 else f"{t:.0f}"
