"""The network probe: what the network costs a step when llama-server splits the model over llama.cpp
RPC workers (``mtp-tuner probe --rpc HOST:PORT --network``), measured so that another link can
be predicted (app.core.analysis.network).

A LatencyRelay (engines.server.relay) stands in front of each worker and the llama-servers name
the relays in their ``--rpc``. The relay's delay changes on open connections, so one server start
is timed at every delay: the plain step, and each K's whole step at full acceptance and at full
rejection (llama.cpp's synthetic acceptance, as the server probe times it: server_probe,
whole_step.step_cost), at no added delay and at each known delay (default 2 ms each way), the
delays in a new random order every round so drift falls on all of them alike. The slope of a step
against the round trip added (2 d) is the round trips a step, each round's step at a delay taken
against the same round's step at no delay (paired: a busy spell over a round cancels). Every step
is also timed with the workers named directly (no relay, a server of its own): the link as it is,
where the predictions for other links start (NetworkCost.direct_ms). The relay's own cost is per
message, not per round trip: through a 2 ms relay on loopback the plain step paid 2.2 ms more at no
delay, so taking it out of a K=4 step by its 15 round trips priced that step at half its time, and
predicted 1.65x at the link where K=4 ran at 0.55x. The link's own round-trip time comes from the
workers themselves (engines.server.rpc_check.rtt_ms), asked before any llama-server holds them.

A worker serves one client at a time, so one llama-server is up at a time: the plain one without
the relay, the plain one through it (its step prices the capped last steps of the others at the
same delay), each K's two through it and the same two without it, and the plain one without the
relay again.
``server_args`` are extra llama-server flags for every server (a placement of the draft, e.g.
``-ot "blk\\.4\\.=CPU"``), kept in the record.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from pathlib import Path
from typing import Iterator, Sequence

from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.common.spec_modes import MTP
from app.core.engines.backend_truth import Placement
from app.core.engines.server.engine import ServerEngine
from app.core.engines.server.process import ServerProcess
from app.core.engines.server.relay import MAX_DELAY_MS, LatencyRelay
from app.core.engines.server.rpc_check import rtt_ms
from app.core.common.workers import Endpoint, Workers
from app.core.measure.server_probe import (SYNTH_FLAG, ProbePrompts, check_engine, check_probe_args, probe_ctx,
                                           prompt_speeds, timed_request)
from app.core.measure.whole_step import ProbeProgress, Rounds, rates_text, request_tokens, step_cost
from app.core.records.arm import Arm
from app.core.records.cost import DEFAULT_DEPTH, MAX_DELAYS, CostRecord, NetworkCost, Spread, model_stamp
from app.core.records.schema import SCHEMA_VERSION, host_info, new_id, utc_now

DEFAULT_DELAYS = (2.0,)  # ms added each way when none are asked
DIRECT = -1.0  # the point timed without the relay (the workers named directly)
Setting = tuple[str, int]  # ("plain", 0) | ("accept", K) | ("reject", K)


def check_delays(delays: Sequence[float]) -> tuple[float, ...]:
    """0 and the delays asked (ms each way), each once, in order; UserError for one out of range."""
    out = {0.0}
    for d in delays:
        if not 0.0 < d <= MAX_DELAY_MS:
            raise UserError(f"--delays: {d:g} ms; each added delay must be above 0 and at most {MAX_DELAY_MS:g} ms")
        out.add(float(d))
    if len(out) < 2:
        raise UserError("--delays: name at least one delay above 0 (ms each way), e.g. 2")
    if len(out) > MAX_DELAYS:
        raise UserError(f"--delays: at most {MAX_DELAYS - 1} delays")
    return tuple(sorted(out))


def link_rtt(endpoints: Sequence[Endpoint]) -> float | None:
    """The link's round-trip time: the slowest worker's (each asked itself); None when one cannot
    be measured."""
    times = [rtt_ms(e) for e in endpoints]
    return None if any(t is None for t in times) else max(t for t in times if t is not None)


def run_network_probe(model: str, workers: Workers, *, server_bin: str | None = None,
                      delays: Sequence[float] = DEFAULT_DELAYS, mode: str = MTP, drafter: str | None = None,
                      max_k: int = 4, depth: int = DEFAULT_DEPTH, threads: int | None = None,
                      n_gpu_layers: str | None = None, server_args: Sequence[str] = (), min_rounds: int = 3,
                      max_rounds: int = 12, target_rel: float = 0.05, steps: int = 16,
                      cancel: CancelToken | None = None, log_dir: str | None = None,
                      user_args: tuple[str, ...] | None = None) -> Iterator[ProbeProgress | CostRecord]:
    """Yield progress, then the CostRecord: ``step_ms`` / ``plain_ms`` at the link as it is, and
    ``network`` the steps at each delay (see the module doc). UserError for settings it cannot run
    with; NoSyntheticAcceptance when the llama-server lacks the synthetic acceptance flags."""
    cancel = cancel or CancelToken()
    check_probe_args(model, drafter, mode, depth, max_k, min_rounds, max_rounds)
    points = check_delays(delays)
    endpoints = workers.endpoints
    rtt = link_rtt(endpoints)  # before a llama-server holds the workers (each serves one client)
    yield ProbeProgress(0, max_rounds, "the link's round trip: " + (f"{rtt:.3f} ms" if rtt is not None else
                                                                     "not measured (a worker did not answer)"))
    relays = [LatencyRelay(e).start() for e in endpoints]
    try:
        eng = ServerEngine(server_bin, ctx_size=probe_ctx(depth, steps, max_k), threads=threads,
                           n_gpu_layers=n_gpu_layers, extra_args=tuple(server_args), user_args=user_args,
                           log_dir=log_dir, pool_size=1, rpc=Workers(r.endpoint for r in relays))
        try:
            check_engine(eng, mode, drafter)
            probe = _NetworkProbe(eng, relays, workers.arg, str(model), mode, drafter, depth, steps,
                                  Rounds(min_rounds, max_rounds, target_rel), cancel)
            yield from probe.run(points, max_k)
            yield probe.record(points, max_k, rtt, len(endpoints), tuple(server_args))
        finally:
            eng.close()
    finally:
        for r in relays:
            r.close()


class _NetworkProbe:
    """One probe's servers and what they measured: ``xs[(setting, delay)]`` the step of each
    request (DIRECT: without the relay), and ``paired[(setting, delay)]`` each step at a delay
    less the step at no delay of the same round (the server's rounds visit every delay)."""

    def __init__(self, eng: ServerEngine, relays: list[LatencyRelay], direct: str, model: str, mode: str,
                 drafter: str | None, depth: int, steps: int, rounds: Rounds, cancel: CancelToken):
        self.eng, self.relays, self.direct, self.model = eng, relays, direct, model
        self.mode, self.drafter, self.depth, self.steps = mode, drafter, depth, steps
        self.rounds, self.cancel = rounds, cancel
        self.xs: dict[tuple[Setting, float], list[float]] = {}
        self.paired: dict[tuple[Setting, float], list[float]] = {}
        self.pp: list[float] = []
        self.stable = True
        self.placement: Placement | None = None
        self.prompts: ProbePrompts | None = None
        self.rng = random.Random(0)

    def server(self, setting: Setting, relayed: bool = True) -> ServerProcess:
        """The one server up (pool of one) for a setting, through the relays or without them."""
        side, k = setting
        arm = Arm(k, 0.0, self.mode, self.drafter) if k else Arm()
        cfg = self.eng.config_for(self.model, arm)
        extra = (SYNTH_FLAG, rates_text([1.0 if side == "accept" else 0.0] * k)) if k else ()
        cfg = dataclasses.replace(cfg, extra=cfg.extra + extra, rpc=cfg.rpc if relayed else self.direct)
        return self.eng.server(cfg, self.cancel)

    def one(self, srv: ServerProcess, setting: Setting, point: float) -> float | None:
        """One request's step at ``point`` (the relays set to it first)."""
        if point != DIRECT:
            for r in self.relays:
                r.delay_ms = point
        side, k = setting
        assert self.prompts is not None
        n = request_tokens(side, k, self.steps)
        tm, st = timed_request(srv, self.prompts.of(n), n, self.cancel, k=k)  # its steady steps
        if not k:
            pn = int(tm.get("predicted_n") or 0)
            return float(tm.get("predicted_ms") or 0.0) / (pn - 1) if pn > 1 else None
        return step_cost(tm, st, k, statistics.median(self.xs[(("plain", 0), point)]))

    def run(self, points: tuple[float, ...], max_k: int) -> Iterator[ProbeProgress]:
        direct = self.server(("plain", 0), relayed=False)
        self.placement = self.eng.placement_of(direct)
        self.prompts = ProbePrompts(direct, self.depth)
        self.pp = prompt_speeds(direct, self.prompts, self.cancel)  # at the link as it is
        yield from self.timed(direct, ("plain", 0), (DIRECT,))
        self.eng.discard(direct.cfg)
        settings = [("plain", 0)] + [(side, k) for k in range(1, max_k + 1) for side in ("accept", "reject")]
        for setting in settings:
            srv = self.server(setting)
            yield from self.timed(srv, setting, points)
            self.eng.discard(srv.cfg)
            if setting[1]:  # the same step at the link as it is: where predictions for other links start
                srv = self.server(setting, relayed=False)
                yield from self.timed(srv, setting, (DIRECT,))
                self.eng.discard(srv.cfg)
        # the plain step without the relay again: slow drift over the probe moves it as it moved the rest
        direct = self.server(("plain", 0), relayed=False)
        yield from self.timed(direct, ("plain", 0), (DIRECT,))

    def timed(self, srv: ServerProcess, setting: Setting, points: tuple[float, ...]) -> Iterator[ProbeProgress]:
        """Rounds of one server: every point once a round in a new order, until each is stable."""
        side, k = setting
        n = request_tokens(side, k, self.steps)
        assert self.prompts is not None
        timed_request(srv, self.prompts.of(n), n, self.cancel)  # warm-up: a fresh server's first request is slower
        for point in points:
            self.xs.setdefault((setting, point), [])
        label = "the plain step" if not k else f"K={k} at full {'acceptance' if side == 'accept' else 'rejection'}"
        ok = False
        for rnd in range(1, self.rounds.max_rounds + 1):
            order = list(points)
            self.rng.shuffle(order)
            this = {}
            for point in order:
                self.cancel.check()
                x = self.one(srv, setting, point)
                if x is not None and x > 0:
                    self.xs[(setting, point)].append(x)
                    this[point] = x
            for point, x in this.items():
                if point > 0 and 0.0 in this:
                    self.paired.setdefault((setting, point), []).append(x - this[0.0])
            ok = all(self.rounds.stable(self.xs[(setting, p)]) for p in points)
            if ok or rnd == self.rounds.max_rounds:
                break
        self.stable = self.stable and ok
        yield ProbeProgress(rnd, self.rounds.max_rounds, f"{label}: " + ", ".join(
            f"{statistics.median(self.xs[(setting, p)]):.2f} ms " + ("without the relay" if p == DIRECT else f"at +{p:g} ms")
            for p in points if self.xs[(setting, p)]))

    def spreads(self, setting: Setting, points: tuple[float, ...]) -> tuple[Spread, ...]:
        """The step at each point; at an added delay, each round's step less its step at no delay,
        put on the median at no delay: a busy spell or slow drift over a round moves both and
        cancels from the slope, as a sweep pairs its arms' runs."""
        for p in points:
            if not self.xs.get((setting, p)) or (p > 0 and not self.paired.get((setting, p))):
                raise UserError(f"the network probe measured no step for {setting[0]} K={setting[1]} at +{p:g} ms")
        out = []
        for p in points:
            if p > 0:
                base = statistics.median(self.xs[(setting, 0.0)])
                out.append(Spread.of([max(base + d, 1e-3) for d in self.paired[(setting, p)]]))
            else:
                out.append(Spread.of(self.xs[(setting, p)]))
        return tuple(out)

    def record(self, points: tuple[float, ...], max_k: int, rtt: float | None, workers: int,
               server_args: tuple[str, ...]) -> CostRecord:
        net = NetworkCost(delays_ms=points, plain_ms=self.spreads(("plain", 0), points),
                          step_ms={k: {side: self.spreads((side, k), points) for side in ("accept", "reject")}
                                   for k in range(1, max_k + 1)},
                          direct_plain_ms=self.spreads(("plain", 0), (DIRECT,))[0], link_rtt_ms=rtt,
                          workers=workers, server_args=server_args,
                          direct_ms={k: {side: self.spreads((side, k), (DIRECT,))[0] for side in ("accept", "reject")}
                                     for k in range(1, max_k + 1)})
        plain = net.direct_plain_ms
        path = Path(self.model)
        assert self.placement is not None
        return CostRecord(
            schema_version=SCHEMA_VERSION, record_type="cost", run_id=new_id(), engine="server",
            llama_build=self.eng.build, model_path=str(path.resolve()), model_size=path.stat().st_size,
            depth=self.depth, max_batch=max_k + 1, threads=self.eng.threads or 0,
            t_ms={1: plain}, ratio={1: Spread.of([1.0] * plain.n)}, draft_ms=None, catchup_ms=None,
            prompt_tok_s=Spread.of(self.pp or [0.0]), rounds=max(len(v) for v in self.xs.values()),
            stable=self.stable, timestamp_utc=utc_now(), host=host_info(), backend=self.placement.backend,
            devices=tuple(self.placement.devices), spec_type=self.mode,
            drafter=str(Path(self.drafter).resolve()) if self.drafter else None,
            step_ms=net.direct_ms,
            plain_ms=plain, network=net, **model_stamp(self.model))
