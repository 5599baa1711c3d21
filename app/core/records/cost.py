"""The cost-probe record: what a speculative step costs on this machine, and where it was measured.

Two probes write it. In process (app.core.measure.probe): a verify pass of n tokens, one draft
step and the MTP catch-up, each timed apart. Through llama-server (app.core.measure.server_probe):
the whole speculative step at each width K (draft, verify, rollback, catch-up), timed with
llama.cpp's synthetic acceptance at full acceptance and at full rejection (``step_ms``), the
plain decode step (``t_ms[1]``) and one middle rate that checks the interpolation between the two
(``mid_check``). Both say where they ran (schema 5): engine, backend, devices and llama.cpp build,
as run records do; the verdict prices runs only with a probe of the same set-up
(app.core.analysis.costs.matching_probe). The network probe (app.core.measure.network) writes the
same record over llama.cpp RPC workers: ``step_ms`` and ``plain_ms`` with the workers named
directly, and in ``network`` the same steps through a loopback relay at each added delay
(NetworkCost), from which app.core.analysis.network derives the round trips per step. Read back
from results files by app.core.records.reader."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import numpy as np

from app.core.records import check as C

DEFAULT_DEPTH = 64  # the probe's context depth when none is asked (a sweep at depth 0 is priced by it)

# What a cost record may hold (CostRecord.from_dict): a record outside these is no measurement and
# is left out, never priced with. The widths are the app's (measure.plan: K from 1 to 64, the
# probe's --max-batch at most 64); a verify of K drafts checks K + 1 tokens.
MAX_K = 64
MAX_N = MAX_K + 1
MIN_MS, MAX_MS = 1e-6, 3.6e6  # one step between a nanosecond and an hour
MAX_RATIO = 1e6  # T(n)/T(1)
MAX_TOK_S = 1e9  # prompt tokens per second (as schema.MAX_TOK_S)
MAX_CONTEXT = 2**24  # tokens of context (llama.cpp's n_ctx is an int32; no model trains past this)
MAX_THREADS = 2**16
MAX_WORKERS = 16  # as engines.server.rpc_worker.MAX_WORKERS (records sit below the engines)
MAX_DELAYS = 8  # delays one network probe adds (0 and a few known ones)
MAX_RTT_MS = 2 * 1000.0  # a round trip through the relay at its largest delay (relay.MAX_DELAY_MS each way)
MAX_ERROR = 1e3  # the middle check's relative error: past it, no interpolation was checked
HEAD_BYTES = 8 * 2**20  # the start of a model file the probe's content stamp hashes (header and first tensors)


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
class NetworkCost:
    """What the network probe measured through a loopback relay in front of each RPC worker: the
    plain step and each K's whole step (full acceptance, full rejection) at every delay the relay
    added each way (``delays_ms``, 0 first; a round trip then costs 2 d more), and the plain step
    with the workers named directly (``direct_plain_ms``), as each K's step (``direct_ms``): the link as
    it is, which the predictions for the user's own links start from (the relay's own cost is per
    message, not per round trip, so it cannot be taken out of the steps through it by their round
    trips: a step of many small messages pays it many times)."""

    delays_ms: tuple[float, ...]
    plain_ms: tuple[Spread, ...]  # the plain step at each delay
    step_ms: dict[int, dict[str, tuple[Spread, ...]]]  # K -> "accept" / "reject" -> the step at each delay
    direct_plain_ms: Spread  # the plain step without the relay
    link_rtt_ms: float | None  # the link's own round-trip time to the workers (the slowest); None: not measured
    workers: int  # how many workers (never their addresses)
    server_args: tuple[str, ...] = ()  # the extra llama-server flags it ran with (a placement), as given
    # K -> "accept" / "reject" -> the step without the relay; None in the first records of this kind
    direct_ms: dict[int, dict[str, Spread]] | None = None

    def line(self, points: tuple[Spread, ...]) -> tuple[float, float]:
        """(the step in ms through the relay at no added delay, the round trips a step): the
        least-squares line of the points' medians against the round trip the relay added (2 d).
        A slope below 0 (noise over a link that costs nothing) is 0 round trips."""
        xs = np.asarray([2.0 * d for d in self.delays_ms])
        ys = np.asarray([p.median for p in points])
        slope = float(np.polyfit(xs, ys, 1)[0]) if len(xs) >= 2 else 0.0
        slope = max(0.0, slope)
        return float(np.mean(ys) - slope * np.mean(xs)), slope

    @property
    def relay_ms(self) -> float:
        """What the relay itself adds to one round trip (its threads and copies): the plain step
        through it at no delay against the plain step without it, over the plain step's round
        trips (0 when the plain step makes none)."""
        start, trips = self.line(self.plain_ms)
        return max(0.0, (start - self.direct_plain_ms.median) / trips) if trips > 0 else 0.0

    def at_link(self, points: tuple[Spread, ...], direct: Spread | None = None) -> Spread:
        """The step of these points as the link costs it without the relay: ``direct``, timed so,
        when there is one; else the measurements at no added delay less the relay's own cost of
        each round trip (an estimate that reads many-message steps too cheap)."""
        if direct is not None:
            return direct
        first = points[0]
        cut = min(self.line(points)[1] * self.relay_ms, 0.9 * first.p10)
        return Spread(first.median - cut, first.p10 - cut, first.p90 - cut, first.n)


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
    t_ms: dict[int, Spread]  # n -> Spread of one target decode of n tokens (logits on every row)
    ratio: dict[int, Spread]  # n -> Spread of T(n)/T(1), paired within rounds
    draft_ms: Spread | None  # one MTP draft step (decode 1 token + h row, argmax, h copy)
    catchup_ms: dict[int, Spread] | None  # n -> Spread of the MTP catch-up decode of n rows (after a verify)
    prompt_tok_s: Spread
    rounds: int
    stable: bool
    timestamp_utc: str
    host: dict[str, Any]
    # schema 5: where it was measured, as run records keep it (None / (): not recorded, older files)
    backend: str | None = None  # "CPU", "CUDA", "Metal", "Vulkan", ...
    devices: tuple[str, ...] = ()
    spec_type: str | None = None  # the speculative mode the step costs are of ("draft-mtp")
    drafter: str | None = None  # the drafter GGUF that drafted (None: the model's own MTP heads)
    # the whole speculative step at width K (llama-server probe): {K: {"accept": Spread, "reject": Spread}}
    # in ms per verification step, at full acceptance and at full rejection
    step_ms: dict[int, dict[str, Spread]] | None = None
    # the plain decode step in the same loop (the baseline's step, what step_ms is priced against)
    plain_ms: Spread | None = None
    # the interpolation checked at one middle rate: {"k", "rates", "accepted_per_step",
    # "predicted_ms", "measured_ms", "error"}
    mid_check: dict[str, Any] | None = None
    # the model file's content when it was probed (model_stamp): its modification time in ns and
    # the sha256 of its first HEAD_BYTES; None in records made before (probe reuse never takes those)
    model_mtime_ns: int | None = None
    model_head_sha256: str | None = None
    # the network probe's steps through the relay at each added delay (NetworkCost); None: no RPC
    network: NetworkCost | None = None
    # the request's edges (measure.whole_step.edges): {K: {"first": Spread, "last": Spread}}, K = 0 the
    # plain request; ms a request over what steady steps cost for the same tokens (may be below 0)
    edge_ms: dict[int, dict[str, Spread]] | None = None

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
        if self.edge_ms is not None:
            d["edge_ms"] = {str(k): {w: dataclasses.asdict(s) for w, s in v.items()} for k, v in self.edge_ms.items()}
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CostRecord":
        """The record of a results file's JSON object. Raises ValueError (check.BadField) naming the
        first field that is missing, of another type than declared, or beyond what a probe measures:
        a cost that is not a finite number within MIN_MS..MAX_MS, a count out of range, a width
        beyond MAX_K, a time that does not parse, a middle check that is not finite."""
        if not isinstance(d, dict):
            raise C.BadField("the record is not a JSON object")
        for name in ("t_ms", "ratio", "prompt_tok_s"):
            if name not in d:
                raise C.BadField(f"no {name!r}")
        g = d.get
        kw: dict[str, Any] = dict(
            schema_version=C.integer(g("schema_version"), "schema_version", 1, 99),
            record_type=C.text(g("record_type", "cost"), "record_type", 16),
            run_id=C.text(g("run_id"), "run_id", 200), engine=C.text(g("engine"), "engine", 32),
            llama_build=C.text(g("llama_build"), "llama_build", 512), model_path=C.text(g("model_path"), "model_path"),
            model_size=C.integer(g("model_size"), "model_size"),
            depth=C.integer(g("depth"), "depth", 0, MAX_CONTEXT),
            max_batch=C.integer(g("max_batch"), "max_batch", 0, MAX_N),
            threads=C.integer(g("threads"), "threads", 0, MAX_THREADS),
            t_ms=_spreads(g("t_ms"), "t_ms", 1, MAX_N),
            ratio=_spreads(g("ratio"), "ratio", 1, MAX_N, 1 / MAX_RATIO, MAX_RATIO),
            draft_ms=_opt_spread(g("draft_ms"), "draft_ms"),
            catchup_ms=_spreads(g("catchup_ms"), "catchup_ms", 1, MAX_N) if g("catchup_ms") else None,
            prompt_tok_s=_spread(g("prompt_tok_s"), "prompt_tok_s", 0.0, MAX_TOK_S, above=False),
            rounds=C.integer(g("rounds"), "rounds"), stable=C.flag(g("stable"), "stable"),
            timestamp_utc=C.timestamp(g("timestamp_utc"), "timestamp_utc"), host=C.host(g("host")),
            backend=C.optional(C.text, g("backend"), "backend", 64),
            devices=tuple(C.text(x, "devices[]", 512) for x in C.items(g("devices") or [], "devices", 64)),
            spec_type=C.optional(C.text, g("spec_type"), "spec_type", 64),
            drafter=C.optional(C.text, g("drafter"), "drafter"),
            step_ms=_steps(g("step_ms")) if g("step_ms") else None, plain_ms=_opt_spread(g("plain_ms"), "plain_ms"),
            mid_check=_mid_check(g("mid_check")),
            model_mtime_ns=C.optional(C.integer, g("model_mtime_ns"), "model_mtime_ns", 0, 2**63),
            model_head_sha256=C.optional(_sha256, g("model_head_sha256"), "model_head_sha256"),
            network=_network(g("network")), edge_ms=_edges(g("edge_ms")) if g("edge_ms") else None)
        if kw["record_type"] != "cost":
            raise C.BadField(f"record_type is {C.describe(kw['record_type'])}, not 'cost'")
        if 1 not in kw["t_ms"] or set(kw["ratio"]) != set(kw["t_ms"]):
            raise C.BadField("t_ms has no T(1), or ratio is not of the same sizes")
        return cls(**kw)


def _spread(v: Any, name: str, lo: float = MIN_MS, hi: float = MAX_MS, *, above: bool = True) -> Spread:
    m = C.mapping(v, name)
    median, p10, p90 = (C.number(m.get(q), f"{name}.{q}", lo, hi, above=above) for q in ("median", "p10", "p90"))
    return Spread(median, p10, p90, C.integer(m.get("n"), f"{name}.n"))


def _opt_spread(v: Any, name: str) -> Spread | None:
    return None if v is None else _spread(v, name)


def _spreads(v: Any, name: str, lo_key: int, hi_key: int, lo: float = MIN_MS, hi: float = MAX_MS) -> dict[int, Spread]:
    return {C.int_key(k, name, lo_key, hi_key): _spread(s, f"{name}[{k}]", lo, hi)
            for k, s in C.mapping(v, name).items()}


def _steps(v: Any) -> dict[int, dict[str, Spread]]:
    out = {}
    for k, both in C.mapping(v, "step_ms").items():
        m = C.mapping(both, f"step_ms[{k}]")
        out[C.int_key(k, "step_ms", 1, MAX_K)] = {w: _spread(m.get(w), f"step_ms[{k}].{w}")
                                                  for w in ("accept", "reject")}
    return out


def _edges(v: Any) -> dict[int, dict[str, Spread]]:
    """The request's edges: per K (0 to MAX_K) a "first" and a "last" spread, each within an hour
    either way (an edge may cost less than the steady steps it replaces)."""
    out = {}
    for k, both in C.mapping(v, "edge_ms").items():
        m = C.mapping(both, f"edge_ms[{k}]")
        out[C.int_key(k, "edge_ms", 0, MAX_K)] = {
            w: _spread(m.get(w), f"edge_ms[{k}].{w}", -MAX_MS, MAX_MS, above=False) for w in ("first", "last")}
    return out


def _network(v: Any) -> NetworkCost | None:
    """The network probe's part: one finite delay (0 to relay's MAX_DELAY_MS) per point, 0 first,
    each step a spread per point, widths within MAX_K."""
    if v is None:
        return None
    m = C.mapping(v, "network")
    delays = tuple(C.number(x, "network.delays_ms[]", 0.0, MAX_RTT_MS / 2)
                   for x in C.items(m.get("delays_ms"), "network.delays_ms", MAX_DELAYS))
    if len(delays) < 2 or delays[0] != 0.0 or len(set(delays)) < len(delays):
        raise C.BadField("network.delays_ms is not 0 and at least one other delay, each once")

    def per_delay(x: Any, name: str) -> tuple[Spread, ...]:
        spreads = tuple(_spread(s, f"{name}[]") for s in C.items(x, name, MAX_DELAYS))
        if len(spreads) != len(delays):
            raise C.BadField(f"{name} has {len(spreads)} points for {len(delays)} delays")
        return spreads

    steps = {}
    for k, both in C.mapping(m.get("step_ms"), "network.step_ms").items():
        w = C.mapping(both, f"network.step_ms[{k}]")
        steps[C.int_key(k, "network.step_ms", 1, MAX_K)] = {
            side: per_delay(w.get(side), f"network.step_ms[{k}].{side}") for side in ("accept", "reject")}
    return NetworkCost(
        delays_ms=delays, plain_ms=per_delay(m.get("plain_ms"), "network.plain_ms"), step_ms=steps,
        direct_plain_ms=_spread(m.get("direct_plain_ms"), "network.direct_plain_ms"),
        link_rtt_ms=C.optional(C.number, m.get("link_rtt_ms"), "network.link_rtt_ms", 0.0, MAX_RTT_MS),
        workers=C.integer(m.get("workers"), "network.workers", 1, MAX_WORKERS),
        server_args=tuple(C.text(x, "network.server_args[]", 512)
                          for x in C.items(m.get("server_args") or [], "network.server_args", 64)),
        direct_ms=None if m.get("direct_ms") is None else {
            C.int_key(k, "network.direct_ms", 1, MAX_K): {
                side: _spread(C.mapping(both, f"network.direct_ms[{k}]").get(side), f"network.direct_ms[{k}].{side}")
                for side in ("accept", "reject")}
            for k, both in C.mapping(m.get("direct_ms"), "network.direct_ms").items()})


def _mid_check(v: Any) -> dict[str, Any] | None:
    """The middle-rate check as the probe writes it; a NaN or infinite error is no check that held."""
    if v is None:
        return None
    m = dict(C.mapping(v, "mid_check"))
    m["error"] = C.optional(C.number, m.get("error"), "mid_check.error", -MAX_ERROR, MAX_ERROR)
    if m["error"] is not None:
        C.integer(m.get("k"), "mid_check.k", 1, MAX_K)
        C.number(m.get("accepted_per_step"), "mid_check.accepted_per_step", 0.0, MAX_K)
        for q in ("predicted_ms", "measured_ms"):
            C.number(m.get(q), f"mid_check.{q}", 0.0, MAX_MS)
    if "rates" in m:
        for x in C.items(m["rates"], "mid_check.rates", MAX_K):
            C.number(x, "mid_check.rates[]", 0.0, 1.0)
    return m


def _sha256(v: Any, name: str) -> str:
    s = C.text(v, name, 64)
    if len(s) != 64 or s.strip("0123456789abcdef"):
        raise C.BadField(f"{name} is {C.describe(v)}, not a sha256 in hex")
    return s


def model_stamp(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a probe keeps of its model file's content, as the record's fields: the file's
    modification time in ns (model_mtime_ns) and the sha256 of its first HEAD_BYTES
    (model_head_sha256), so that a file changed in place at the same size is not taken for the one
    probed. Raises OSError when the file cannot be read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        mtime = os.fstat(f.fileno()).st_mtime_ns
        h.update(f.read(HEAD_BYTES))
    return {"model_mtime_ns": mtime, "model_head_sha256": h.hexdigest()}
