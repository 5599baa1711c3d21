"""The options of the network probe and its prediction: ``probe --rpc HOST:PORT --network
[--delays 1,3]`` and ``recommend --rtt 0.3,5`` (app.core.measure.network, app.core.analysis.network)."""

from __future__ import annotations

import argparse
from typing import Callable

from app.cli.options import number
from app.core.engines.server.relay import MAX_DELAY_MS
from app.core.records.cost import MAX_DELAYS, MAX_RTT_MS


def ms_list(lo: float, hi: float, most: int) -> Callable[[str], tuple[float, ...]]:
    """An argparse type: comma-separated times in ms, each above ``lo`` and at most ``hi``, at most
    ``most`` of them."""
    one = number(lo, hi, lo_open=True)

    def conv(text: str) -> tuple[float, ...]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or len(parts) > most:
            raise argparse.ArgumentTypeError(f"expected 1 to {most} times in ms, comma-separated, got {text!r}")
        return tuple(one(p) for p in parts)
    return conv


def add_network(p: argparse.ArgumentParser) -> None:
    """probe's --network and --delays."""
    p.add_argument("--network", action="store_true",
                   help="with --rpc: time the plain step and each K's step through a loopback relay in front of each "
                        "worker, at no added delay and at --delays, and without the relay; say the round trips a "
                        "step, how much of it waits on the network, and the speedup predicted at other round-trip "
                        "times (--rtt); the widest K is 4 unless --max-batch says")
    p.add_argument("--delays", type=ms_list(0.0, MAX_DELAY_MS, MAX_DELAYS - 1), default=(2.0,), metavar="MS[,MS]",
                   help="--network: the delays the relay adds each way, in ms (default 2; a round trip then costs "
                        "twice as much more)")
    add_rtt(p)


def add_rtt(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rtt", type=ms_list(0.0, MAX_RTT_MS, 16), default=(), metavar="MS[,MS]",
                   help="round-trip times to predict the speedup over RPC at, in ms (e.g. 0.3,5: a wired LAN and "
                        "Wi-Fi; default: those two), from the latest network probe of the model (probe --network)")
