"""Round trips a step, how much of a step waits on the network, and the speedup at another
round-trip time, from the network probe's record (records.cost.NetworkCost; measure.network).

Each step over RPC is a straight line in the link's round-trip time R (ms):

    step(R) = compute + round_trips * R

The probe timed each step through a relay at added round trips of 2 d: the slope is the round
trips a step. It also timed each step without the relay (NetworkCost.direct_ms): the link as it
is, at R0, the link's own round trip measured from the workers (taken as 0 when it was not), so
compute = direct - round_trips * R0. Through the relay a step also pays the relay's own cost
(``Line.relay_ms``, per step: the relay costs per message, and a step may send many), which
only the check against the relay's own delays needs. At another R every cost goes along its line, and breakeven turns the costs
into a speedup at the acceptance the sweep measured (a step that accepts a of its K drafts costs
reject + (accept - reject) a / K, its round trips likewise), so a slower link is priced without
being there:

    model = network_model(cost_record)        # None when the record has no network part
    model.speedup(2, alpha=0.7, rtt_ms=5.0)   # K=2 at 70 % acceptance over a 5 ms link
    explain(model, 5.0, {2: 0.7})             # "K=2: 6.0 round trips a step, 74 % of the step ..."
    predictions(model, [("Wi-Fi", 5.0)], {2: 0.7})
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

from app.core.analysis import breakeven
from app.core.records.cost import CostRecord, Spread

# the links a prediction names when the user types none: a wired LAN and Wi-Fi, round trips in ms
TYPICAL_LINKS = (("a wired LAN", 0.3), ("Wi-Fi", 5.0))


@dataclasses.dataclass(frozen=True)
class Line:
    """A step in ms against the round-trip time R: ``compute_ms`` at R = 0, ``round_trips`` more ms
    for each ms of R."""

    compute_ms: float
    round_trips: float
    relay_ms: float = 0.0  # what the probe's relay added to this step at no delay (its own cost)

    def at(self, rtt_ms: float) -> float:
        return self.compute_ms + self.round_trips * rtt_ms

    def waiting(self, rtt_ms: float) -> float:
        """The share of the step at ``rtt_ms`` that is waiting on the network."""
        step = self.at(rtt_ms)
        return self.round_trips * rtt_ms / step if step > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class NetworkModel:
    """The plain step and each K's whole step (full acceptance, full rejection) as lines in R."""

    plain: Line
    accept: Mapping[int, Line]
    reject: Mapping[int, Line]
    link_rtt_ms: float | None  # the link the probe ran over (None: not measured, taken as 0)
    relay_ms: float  # the relay's own cost on the plain step (what it adds at no delay)

    def widths(self) -> list[int]:
        return sorted(self.accept)

    def step(self, k: int, accepted: float) -> Line:
        """The step at width k that accepts ``accepted`` drafts on average (as breakeven.Costs.step)."""
        a = min(max(accepted, 0.0), float(k)) / k
        acc, rej = self.accept[k], self.reject[k]
        return Line(rej.compute_ms + (acc.compute_ms - rej.compute_ms) * a,
                    rej.round_trips + (acc.round_trips - rej.round_trips) * a,
                    rej.relay_ms + (acc.relay_ms - rej.relay_ms) * a)

    def costs(self, rtt_ms: float) -> breakeven.Costs:
        """The step costs over a link of round trip ``rtt_ms``, as the break-even model takes them."""
        return breakeven.Costs({1: self.plain.at(rtt_ms)}, 0.0, {}, "network",
                               {k: ln.at(rtt_ms) for k, ln in self.accept.items()},
                               {k: ln.at(rtt_ms) for k, ln in self.reject.items()})

    def speedup(self, k: int, alpha: float, rtt_ms: float) -> float:
        return float(breakeven.predicted_speedup(alpha, k, self.costs(rtt_ms)))

    def tok_s(self, k: int | None, accepted: float, rtt_ms: float) -> float:
        """Decode tokens per second at width k (None: the baseline) over a link of ``rtt_ms``, when
        a step accepts ``accepted`` drafts on average (breakeven.expected_accepted of an alpha, or
        as runs counted them)."""
        if not k:
            return 1000.0 / self.plain.at(rtt_ms)
        return 1000.0 * (1.0 + accepted) / self.step(k, accepted).at(rtt_ms)

    def relay_tok_s(self, k: int | None, accepted: float, delay_ms: float) -> float:
        """As ``tok_s``, through the probe's relay at ``delay_ms`` each way (its own cost included):
        what checks the lines against a delay the probe did not use."""
        line = self.plain if not k else self.step(k, accepted)
        step = line.at((self.link_rtt_ms or 0.0) + 2.0 * delay_ms) + line.relay_ms
        return 1000.0 * (1.0 + (accepted if k else 0.0)) / step


def network_model(rec: CostRecord) -> NetworkModel | None:
    """The lines of a network probe's record (None: a record without a network part)."""
    net = rec.network
    if net is None:
        return None
    r0 = net.link_rtt_ms or 0.0

    def line(points: tuple[Spread, ...], direct: Spread | None) -> Line:
        start, trips = net.line(points)
        if direct is None:  # a record before direct_ms: the relay's cost estimated per round trip
            return Line(start - trips * (r0 + net.relay_ms), trips, trips * net.relay_ms)
        return Line(direct.median - trips * r0, trips, start - direct.median)

    def direct(k: int, side: str) -> Spread | None:
        return net.direct_ms[k][side] if net.direct_ms and k in net.direct_ms else None

    plain = line(net.plain_ms, net.direct_plain_ms)
    return NetworkModel(plain, {k: line(v["accept"], direct(k, "accept")) for k, v in net.step_ms.items()},
                        {k: line(v["reject"], direct(k, "reject")) for k, v in net.step_ms.items()}, net.link_rtt_ms,
                        plain.relay_ms)


def latest_network(cost_records: Iterable[CostRecord], model_path: str | None = None) -> CostRecord | None:
    """The latest cost record with a network part (of ``model_path`` when given)."""
    found = None
    for rec in cost_records:
        if rec.network is not None and (model_path is None or rec.model_path == model_path):
            found = rec
    return found


def _alpha(alphas: Mapping[int, float] | float, k: int) -> float | None:
    return float(alphas) if isinstance(alphas, (int, float)) else alphas.get(k)


def ms(x: float) -> str:
    """A round-trip time as the sentences write it: 0.031, 0.3, 5, 12, 150."""
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def explain(model: NetworkModel, rtt_ms: float, alphas: Mapping[int, float] | float) -> list[str]:
    """A sentence for the baseline and for each K (at its acceptance alpha; a K without one is left
    out): the round trips a step and how much of the step waits on the network at ``rtt_ms``."""
    at = f"at {ms(rtt_ms)} ms"
    out = [f"baseline: {model.plain.round_trips:.1f} round trips a token, {100 * model.plain.waiting(rtt_ms):.0f} % "
           f"of the step is waiting on the network {at}"]
    for k in model.widths():
        alpha = _alpha(alphas, k)
        if alpha is None:
            continue
        line = model.step(k, breakeven.expected_accepted(alpha, k))
        out.append(f"K={k}: {line.round_trips:.1f} round trips a step, {100 * line.waiting(rtt_ms):.0f} % of the "
                   f"step is waiting on the network {at} (at {100 * alpha:.0f} % acceptance)")
    return out


def predictions(model: NetworkModel, links: Sequence[tuple[str, float]],
                alphas: Mapping[int, float] | float) -> list[str]:
    """One line per link (name, round trip in ms): each K's predicted speedup over the baseline
    on that link, e.g. "Wi-Fi at 5 ms: K=1 0.92x, K=2 0.81x"."""
    out = []
    for name, rtt in links:
        parts = [f"K={k} {model.speedup(k, a, rtt):.2f}x" for k in model.widths()
                 if (a := _alpha(alphas, k)) is not None]
        if parts:
            out.append(f"{name} at {ms(rtt)} ms: " + ", ".join(parts))
    return out


def links_of(model: NetworkModel, typed: Sequence[float] = ()) -> list[tuple[str, float]]:
    """The links to predict for: the one measured ("your link"), then the round trips the user typed
    ("yours"), or TYPICAL_LINKS when none."""
    out = [("your link (measured)", model.link_rtt_ms)] if model.link_rtt_ms is not None else []
    out += [("yours", r) for r in typed] if typed else list(TYPICAL_LINKS)
    return out


def network_text(rec: CostRecord, typed: Sequence[float], alphas: Mapping[int, float] | float,
                 acceptance: str) -> list[str]:
    """What ``probe --network`` and ``recommend --rtt`` print for a network record: where it ran,
    the sentences of ``explain`` at the link measured (or the first link typed), and the
    predictions on the links of ``links_of``; ``acceptance`` says where ``alphas`` came from."""
    model = network_model(rec)
    net = rec.network
    if model is None or net is None:
        return []
    link = (f"the link's round trip {ms(net.link_rtt_ms)} ms" if net.link_rtt_ms is not None
            else "the link's round trip not measured (taken as 0)")
    flags = f", with {' '.join(net.server_args)}" if net.server_args else ""
    head = (f"Over RPC ({net.workers} worker{'s' if net.workers != 1 else ''}{flags}; {link}; each step timed "
            f"without the probe's relay too, which added {model.relay_ms:.2f} ms to the plain step):")
    rtt = model.link_rtt_ms if model.link_rtt_ms is not None else (typed[0] if typed else TYPICAL_LINKS[0][1])
    lines = [head] + ["  " + s for s in explain(model, rtt, alphas)]
    lines.append(f"Predicted speedup over the baseline at {acceptance}:")
    lines += ["  " + s for s in predictions(model, links_of(model, typed), alphas)]
    return lines
