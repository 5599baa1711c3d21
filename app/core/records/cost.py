"""The cost-probe record: what a speculative step costs on this machine, and where it was measured.

Two probes write it. In process (app.core.measure.probe): a verify pass of n tokens, one draft
step and the MTP catch-up, each timed apart. Through llama-server (app.core.measure.server_probe):
the whole speculative step at each width K (draft, verify, rollback, catch-up), timed with
llama.cpp's synthetic acceptance at full acceptance and at full rejection (``step_ms``), the
plain decode step (``t_ms[1]``) and one middle rate that checks the interpolation between the two
(``mid_check``). Both say where they ran (schema 5): engine, backend, devices and llama.cpp build,
as run records do; the verdict prices runs only with a probe of the same set-up
(app.core.analysis.costs.matching_probe). Read back from results files by app.core.records.reader."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

DEFAULT_DEPTH = 64  # the probe's context depth when none is asked (a sweep at depth 0 is priced by it)


def where_text(engine: str, backend: str | None, devices: tuple[str, ...]) -> str:
    """Where runs or a probe ran, in words: "in process on the CPU", "through llama-server on CUDA0 (H200)"."""
    how = "through llama-server" if engine == "server" else "in process"
    if backend == "CPU":
        return f"{how} on the CPU"
    on = ", ".join(devices) or backend
    return f"{how} on {on}" if on else how


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
    # schema 5: where it was measured, as run records keep it (None / (): not recorded, older files)
    backend: str | None = None  # "CPU", "CUDA", "Metal", "Vulkan", ...
    devices: tuple[str, ...] = ()
    spec_type: str | None = None  # the speculative mode the step costs are of ("draft-mtp")
    drafter: str | None = None  # the drafter GGUF that drafted (None: the model's own MTP heads)
    # the whole speculative step at width K (llama-server probe): {K: {"accept": Spread, "reject": Spread}}
    # in ms per verification step, at full acceptance and at full rejection
    step_ms: dict | None = None
    # the plain decode step in the same loop (the baseline's step, what step_ms is priced against)
    plain_ms: Spread | None = None
    # the interpolation checked at one middle rate: {"k", "rates", "accepted_per_step",
    # "predicted_ms", "measured_ms", "error"}
    mid_check: dict | None = None

    @property
    def prices_steps(self) -> bool:
        """Whether it measured what a speculative step costs (a draft step, or whole steps)."""
        return bool(self.draft_ms) or bool(self.step_ms)

    def where(self) -> str:
        """Where it ran, in words: "in process on the CPU", "through llama-server on CUDA0 (...)"."""
        return where_text(self.engine, self.backend, self.devices)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["t_ms"] = {str(k): dataclasses.asdict(v) for k, v in self.t_ms.items()}
        d["ratio"] = {str(k): dataclasses.asdict(v) for k, v in self.ratio.items()}
        if self.catchup_ms is not None:
            d["catchup_ms"] = {str(k): dataclasses.asdict(v) for k, v in self.catchup_ms.items()}
        d["devices"] = list(self.devices)
        if self.step_ms is not None:
            d["step_ms"] = {str(k): {w: dataclasses.asdict(s) for w, s in v.items()} for k, v in self.step_ms.items()}
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
        kw["devices"] = tuple(d.get("devices") or ())
        kw["plain_ms"] = Spread(**d["plain_ms"]) if d.get("plain_ms") else None
        kw["step_ms"] = ({int(k): {w: Spread(**s) for w, s in v.items()} for k, v in d["step_ms"].items()}
                         if d.get("step_ms") else None)
        for f in dataclasses.fields(cls):  # a field an older file does not have: its default
            if kw[f.name] is None and f.default is not dataclasses.MISSING and f.name not in d:
                kw[f.name] = f.default
        return cls(**kw)
