"""The watch record: what ``mtp-tuner watch`` saw of a running llama-server over one window (its
speculative counters' deltas, read from ``/metrics``), and what it predicted from them. One JSON
line with ``record_type: "watch"`` in a results file; the run and cost readers skip it (they read
their own record types only), so files holding one stay readable by older versions."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from app.core.records import check as C

RECORD_TYPE = "watch"
# What a watch record may hold (WatchRecord.from_dict): a record outside these is left out. The
# draft positions a server counts (its --draft-max) and the widths predicted (at most the cost
# probe's, records.cost.MAX_K) are far below MAX_POSITIONS; a speedup past MAX_SPEEDUP is no
# prediction; a window longer than MAX_SECONDS (a year) was never watched.
MAX_POSITIONS = 1024
MAX_SPEEDUP = 1e3
MAX_SECONDS = 366 * 86400.0
MAX_TOK_S = 1e9


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
        """The record of a results file's JSON object. Raises ValueError (check.BadField) naming the
        first field that is missing, of another type than declared or beyond its bounds (records.check)."""
        if not isinstance(d, dict):
            raise C.BadField("the record is not a JSON object")
        g = d.get

        def count(name: str) -> int:
            return C.integer(g(name), name)

        kw: dict[str, Any] = dict(
            schema_version=C.integer(g("schema_version"), "schema_version", 1, 99),
            record_type=C.text(g("record_type"), "record_type", 16), run_id=C.text(g("run_id"), "run_id", 200),
            timestamp_utc=C.timestamp(g("timestamp_utc"), "timestamp_utc"), url=C.text(g("url"), "url", 2048),
            model_path=C.text(g("model_path"), "model_path"),
            llama_build=C.optional(C.text, g("llama_build"), "llama_build", 512),
            spec_types=C.optional(C.text, g("spec_types"), "spec_types", 512),
            server_k=C.optional(C.integer, g("server_k"), "server_k", 0, MAX_POSITIONS),
            seconds=C.number(g("seconds"), "seconds", 0.0, MAX_SECONDS),
            restarts=count("restarts"), requests=count("requests"), generated=count("generated"),
            draft_steps=count("draft_steps"), draft_tokens=count("draft_tokens"), accepted=count("accepted"),
            accepted_per_pos=tuple(C.integer(x, "accepted_per_pos[]")
                                   for x in C.items(g("accepted_per_pos") or [], "accepted_per_pos", MAX_POSITIONS)),
            decode_tok_s=C.optional(C.number, g("decode_tok_s"), "decode_tok_s", 0.0, MAX_TOK_S),
            cost_run_id=C.optional(C.text, g("cost_run_id"), "cost_run_id", 200),
            predicted=tuple(_prediction(p, i) for i, p in
                            enumerate(C.items(g("predicted") or [], "predicted", MAX_POSITIONS + 1))),
            recommendation_k=C.optional(C.integer, g("recommendation_k"), "recommendation_k", 0, MAX_POSITIONS),
            reason=C.text(g("reason"), "reason"), host=C.host(g("host") or {}))
        if kw["record_type"] != RECORD_TYPE:
            raise C.BadField(f"record_type is {C.describe(kw['record_type'])}, not {RECORD_TYPE!r}")
        return cls(**kw)


def _prediction(p: Any, i: int) -> WatchPrediction:
    m = C.mapping(p, f"predicted[{i}]")
    speedup, lo, hi = (C.number(m.get(q), f"predicted[{i}].{q}", 0.0, MAX_SPEEDUP) for q in ("speedup", "lo", "hi"))
    return WatchPrediction(C.integer(m.get("k"), f"predicted[{i}].k", 0, MAX_POSITIONS), speedup, lo, hi,
                           C.flag(m.get("extrapolated"), f"predicted[{i}].extrapolated"))
