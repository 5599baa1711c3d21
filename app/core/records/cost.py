"""The cost-probe record: what a verify pass of n tokens and one draft step cost on this machine
(measured by app.core.measure.probe; read back from results files by app.core.records.reader)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

DEFAULT_DEPTH = 64  # the probe's context depth when none is asked (a sweep at depth 0 is priced by it)


@dataclasses.dataclass(frozen=True)
class Spread:
    median: float
    p10: float
    p90: float
    n: int

    @classmethod
    def of(cls, xs: list[float]) -> "Spread":
        a = np.asarray(xs, dtype=float)
        return cls(float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90)), len(xs))

    @property
    def rel_width(self) -> float:
        return (self.p90 - self.p10) / self.median if self.median else float("inf")


@dataclasses.dataclass(frozen=True)
class CostRecord:
    schema_version: int
    record_type: str  # "cost"
    run_id: str
    engine: str
    llama_build: str
    model_path: str
    model_size: int
    depth: int  # tokens of context before the measured passes
    max_batch: int
    threads: int
    t_ms: dict  # n -> Spread of one target decode of n tokens (logits on every row)
    ratio: dict  # n -> Spread of T(n)/T(1), paired within rounds
    draft_ms: Spread | None  # one MTP draft step (decode 1 token + h row, argmax, h copy)
    catchup_ms: dict | None  # n -> Spread of the MTP catch-up decode of n rows (after a verify)
    prompt_tok_s: Spread
    rounds: int
    stable: bool
    timestamp_utc: str
    host: dict

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["t_ms"] = {str(k): dataclasses.asdict(v) for k, v in self.t_ms.items()}
        d["ratio"] = {str(k): dataclasses.asdict(v) for k, v in self.ratio.items()}
        if self.catchup_ms is not None:
            d["catchup_ms"] = {str(k): dataclasses.asdict(v) for k, v in self.catchup_ms.items()}
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "CostRecord":
        kw = {f.name: d.get(f.name) for f in dataclasses.fields(cls)}
        kw["t_ms"] = {int(k): Spread(**v) for k, v in d["t_ms"].items()}
        kw["ratio"] = {int(k): Spread(**v) for k, v in d["ratio"].items()}
        kw["draft_ms"] = Spread(**d["draft_ms"]) if d.get("draft_ms") else None
        kw["catchup_ms"] = ({int(k): Spread(**v) for k, v in d["catchup_ms"].items()}
                            if d.get("catchup_ms") else None)
        kw["prompt_tok_s"] = Spread(**d["prompt_tok_s"])
        return cls(**kw)
