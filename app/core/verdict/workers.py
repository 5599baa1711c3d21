"""The RPC workers' side of an exported command. The main command carries ``--rpc`` with the
workers (those the sweep measured, or those named to ``recommend --rpc``); each worker gets its
own command line, ``ggml-rpc-server -H HOST -p PORT``, to be started on the machine at that
address before llama-server. A worker beyond this machine gets llama.cpp's warning: the RPC
backend is unauthenticated, so it belongs on a network the user trusts."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from app.core.common.errors import UserError
from app.core.common.workers import Workers
from app.core.engines.render import render
from app.core.engines.server.rpc_worker import REMOTE_WARNING, WORKER_NAMES, find_worker
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class WorkerCommand:
    """One worker's own command: where it runs, its argv, the line for the shell and what to know."""

    endpoint: str  # "host:port", as the main command's --rpc names it
    argv: tuple[str, ...]
    command: str
    note: str


def worker_commands(rpc: Workers, binary: str | None, shell: str) -> tuple[WorkerCommand, ...]:
    """Each worker's command line for ``shell``: the worker of the same llama.cpp as ``binary``
    (by its name, ggml-rpc-server or an older build's rpc-server; its folder is the other
    machine's), bound to the address the main command reaches it at."""
    found = find_worker(binary) if binary else None
    name = Path(found).name if found else WORKER_NAMES[0]
    out = []
    for e in rpc.endpoints:
        argv = (name, "-H", e.host, "-p", str(e.port))
        if e.loopback:
            note = "start it on this machine before llama-server"
        else:
            note = (f"start it on the machine at {e.host} before llama-server (the command runs there). "
                    + REMOTE_WARNING.format(where=str(e)))
        out.append(WorkerCommand(str(e), argv, render(list(argv), shell), note))
    return tuple(out)


def recorded_workers(records: Sequence[RunRecord]) -> Workers | None:
    """The workers the latest of ``records`` was split over (records.rpc), None: this machine only
    (or workers a file names that are no workers: the file's door, parsed as the CLI's --rpc)."""
    workers = (records[-1].rpc or {}).get("workers") if records else None
    try:
        return Workers.parse(workers) if workers else None
    except UserError:
        return None


def worker_lines(workers: Sequence[WorkerCommand], indent: str = "  ", shell: str | None = None) -> list[str]:
    """The workers' commands as text under the main command (none: no lines). With ``shell``,
    every line is a comment of that shell (``REM`` for cmd, ``#`` for the others): the box that
    shows the command stays a script that runs on this machine, the workers' lines being for theirs."""
    if not workers:
        return []
    mark = ("REM " if shell == "cmd" else "# ") if shell else ""
    out = [f"{mark}{indent}before it, start each RPC worker on its own machine:"]
    for w in workers:
        out += [f"{mark}{indent}  {w.command}", f"{mark}{indent}    {w.note}"]
    return out
