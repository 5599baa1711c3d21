"""llama.cpp RPC workers the model is split over, as one typed value: ``Workers``, parsed once at
the door (the CLI's --rpc, the user's llama-server command, the Machine tab, a results file's
records), carried as such (EngineSettings.rpc, the server engine, the export), and written once
into llama-server's argv (``Workers.arg``), as llama.cpp parses --rpc once (common/arg.cpp)."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Iterable

from app.core.common.errors import UserError

DEFAULT_PORT = 50052  # upstream's default
MAX_WORKERS = 16  # endpoints in one --rpc list


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One worker's address as llama-server's ``--rpc`` takes it."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or ``localhost``: reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_endpoint(text: str) -> Endpoint:
    """``host:port`` (``[v6]:port`` for IPv6); UserError naming what is wrong."""
    t = text.strip()
    if t.startswith("["):
        host, sep, port = t[1:].partition("]:")
    else:
        host, sep, port = t.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"RPC worker {text[:80]!r}: expected HOST:PORT, e.g. 192.168.1.20:{DEFAULT_PORT}")
    if len(host) > 253 or any(c.isspace() or c in ",;/\\'\"`$" for c in host):
        raise UserError(f"RPC worker {text[:80]!r}: {host[:80]!r} is not a host name or address")
    return Endpoint(host, int(port))


class Workers(tuple[str, ...]):
    """The workers, each a checked ``host:port`` (its Endpoint's text, as llama-server's --rpc
    takes it), each once, at most MAX_WORKERS; a tuple of those texts, with ``endpoints`` (the
    parsed addresses) and ``arg`` (the --rpc value). Made only from Endpoints or by ``parse``;
    ``Workers(())``: none, said explicitly (this machine only, whatever a results file recorded)."""

    endpoints: tuple[Endpoint, ...]

    def __new__(cls, endpoints: Iterable[Endpoint]) -> Workers:
        eps = tuple(endpoints)
        if len(eps) > MAX_WORKERS:
            raise UserError(f"--rpc: {len(eps)} workers; at most {MAX_WORKERS}")
        if len(set(eps)) < len(eps):
            raise UserError("--rpc: a worker is named twice")
        self = super().__new__(cls, (str(e) for e in eps))
        self.endpoints = eps
        return self

    @classmethod
    def parse(cls, text: str | Iterable[str]) -> Workers:
        """``host:port[,host:port]`` (or its items), every one checked: UserError naming the bad one."""
        parts = [p for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
        if not parts:
            raise UserError("--rpc: name at least one worker, HOST:PORT[,HOST:PORT]")
        if len(parts) > MAX_WORKERS:
            raise UserError(f"--rpc: {len(parts)} workers; at most {MAX_WORKERS}")
        return cls(parse_endpoint(p) for p in parts)

    @property
    def arg(self) -> str:
        """The value of llama-server's ``--rpc``: the one place it is written."""
        return ",".join(self)

    def plus(self, more: Iterable[Endpoint]) -> Workers:
        """These workers and ``more`` (workers of our own, started for a sweep)."""
        return Workers((*self.endpoints, *more))
