"""The watch record: what ``mtp-tuner watch`` saw of a running llama-server over one window (its
speculative counters' deltas, read from ``/metrics``), and what it predicted from them. One JSON
line with ``record_type: "watch"`` in a results file; the run and cost readers skip it (they read
their own record types only), so files holding one stay readable by older versions."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

RECORD_TYPE = "watch"


def mode_of(spec_types: str | None) -> str:
    """The speculative mode a server runs, from /slots' "speculative.types" ("none,draft-mtp")."""
    if spec_types is None:
        return "mode unknown"
    kinds = [t for t in spec_types.split(",") if t and t != "none"]
    return ",".join(kinds) if kinds else "no speculation"


@dataclasses.dataclass(frozen=True)
class WatchPrediction:
    k: int  # 0: off (plain decoding)
    speedup: float
    lo: float
    hi: float
    extrapolated: bool  # needed positions beyond the ones the server drafts


@dataclasses.dataclass(frozen=True)
class WatchRecord:
    schema_version: int
    record_type: str  # "watch"
    run_id: str
    timestamp_utc: str
    url: str  # the server watched (no key: a key never reaches a record)
    model_path: str  # as the server reports it (/props)
    llama_build: str | None  # the server's build_info (/props)
    spec_types: str | None  # "none,draft-mtp" (/slots), None where the server does not say
    server_k: int | None  # the draft width the server runs (its per-position series' length)
    seconds: float  # the window's length
    restarts: int  # server restarts or counter resets seen (each started a new window)
    requests: int  # requests seen finishing in /slots (at least this many)
    generated: int  # tokens generated (tokens_predicted_total)
    draft_steps: int  # verification steps (spec_decode_num_drafts_total)
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...]
    decode_tok_s: float | None  # generated tokens over the server's own generation time
    cost_run_id: str | None  # the cost record that priced the predictions; None: no prediction
    predicted: tuple[WatchPrediction, ...]
    recommendation_k: int | None  # None: no recommendation (too few steps, no matching costs)
    reason: str
    host: dict[str, Any]

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["accepted_per_pos"] = list(self.accepted_per_pos)
        d["predicted"] = [dataclasses.asdict(p) for p in self.predicted]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "WatchRecord":
        kw: dict[str, Any] = {f.name: d.get(f.name) for f in dataclasses.fields(cls)}
        kw["accepted_per_pos"] = tuple(int(x) for x in d.get("accepted_per_pos") or ())
        kw["predicted"] = tuple(WatchPrediction(**p) for p in d.get("predicted") or ())
        kw["host"] = dict(d.get("host") or {})
        return cls(**kw)
