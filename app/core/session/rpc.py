"""The RPC workers of a sweep (llama.cpp's RPC backend: the model split over other machines'
devices), as the session owns them:

- the workers it starts itself on loopback (``SweepRequest.rpc_local``: the RPC path tried on one
  machine), stopped when the sweep finishes, is cancelled or fails, and on Linux when this process
  is killed (engines.server.rpc_worker.RpcWorker: its own process group, dead with us);
- every worker's round trip, timed when the sweep starts and when it ends
  (engines.server.rpc_check.rtt_ms).

A worker serves one client at a time, so it is timed only while no llama-server holds it: before
the engine's first server starts and after the engine closed. The start's times go into every run
record (``rpc``); the end's exist only once every run record is written, so they go into one
``record_type: "rpc"`` line after the runs (records.rpc.RpcRecord), with the start's beside them."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from app.core.common.errors import UserError
from app.core.engines.base import Engine, EngineSettings
from app.core.engines.server.binary import find_server_binary
from app.core.engines.server.rpc_check import rtt_ms, worker_info
from app.core.common.workers import MAX_WORKERS, Workers
from app.core.engines.server.rpc_worker import RpcWorker, find_worker, worker_problem
from app.core.records.rpc import RECORD_TYPE, RpcRecord, rounded, rpc_field
from app.core.records.schema import SCHEMA_VERSION, new_id, utc_now
from app.core.records.writer import ResultsWriter
from app.core.session.request import SweepRequest

RTT_ROUNDS = 5  # round trips per worker, their median kept
RPC_ENGINE = ("engine: llama-server, for the RPC workers (only llama-server splits a model over them; the "
              "in-process engine cannot)")


def checked_workers(settings: EngineSettings, local: int) -> Workers | None:
    """The workers of ``settings`` (checked at the door: Workers), with room for the ``local``
    ones of our own (their binary found beside the llama-server); None: no workers."""
    if local < 0 or local > MAX_WORKERS:
        raise UserError(f"--rpc-local: from 1 to {MAX_WORKERS} workers, not {local}")
    given = settings.rpc or ()
    if len(given) + local > MAX_WORKERS:
        raise UserError(f"{len(given) + local} RPC workers; at most {MAX_WORKERS}")
    if local:
        problem = worker_problem(find_server_binary(settings.server_bin))
        if problem:
            raise UserError(problem)
    return settings.rpc or None


@contextlib.contextmanager
def local_workers(request: SweepRequest) -> Iterator[SweepRequest]:
    """The request with ``rpc_local`` workers of our own started on loopback and added to its
    workers; they are stopped when the ``with`` ends, however it ends."""
    if not request.rpc_local:
        yield request
        return
    server = find_server_binary(request.engine.server_bin)
    binary = find_worker(server)
    if binary is None:
        raise UserError(worker_problem(server) or "no RPC worker")
    workers: list[RpcWorker] = []
    try:
        for _ in range(request.rpc_local):
            workers.append(RpcWorker(binary, threads=request.engine.threads).start())  # the sweep's threads
        ours = [w.endpoint for w in workers]
        rpc = request.engine.rpc.plus(ours) if request.engine.rpc else Workers(ours)
        yield dataclasses.replace(request, engine=dataclasses.replace(request.engine, rpc=rpc), rpc_local=0)
    finally:
        for w in workers:
            w.stop()


class Link:
    """The workers of one sweep and their round trips: timed at ``Link(workers)`` (before the
    engine's first server; a worker that cannot be reached then is a UserError naming it, before
    any llama-server is started), given to the runner for the run records (``field``), and timed again
    at ``end`` (after the engine closed), into the "rpc" line after the runs."""

    def __init__(self, workers: Workers):
        self.workers = workers
        infos = [worker_info(e, rounds=RTT_ROUNDS) for e in workers.endpoints]
        down = next((i for i in infos if not i.reachable), None)
        if down is not None:  # llama-server would hang on it, or abort with llama.cpp's own words
            raise UserError(f"RPC worker {down.endpoint} cannot be reached at the sweep's start: {down.error}; start "
                            "it (ggml-rpc-server -H HOST -p PORT on that machine) or leave it out")
        self.rtt_start_ms = tuple(i.rtt_ms for i in infos)

    def times(self) -> tuple[float | None, ...]:
        """Each worker's round trip in ms now (None: it did not answer)."""
        return tuple(rtt_ms(e, RTT_ROUNDS) for e in self.workers.endpoints)

    @property
    def field(self) -> dict[str, Any]:
        """The workers and their round trips at the start, as every run record keeps them (the
        runner's ``link``)."""
        return rpc_field(self.workers, self.rtt_start_ms)

    def end(self, engine: Engine, writer: ResultsWriter | None, sweep_id: str | None) -> None:
        """Close the engine (its servers let the workers go), time them again and append the "rpc"
        line to ``writer`` (None, or no run's sweep: nothing written)."""
        engine.close()
        if writer is None or sweep_id is None:
            return
        writer.append_line(RpcRecord(SCHEMA_VERSION, RECORD_TYPE, new_id(), sweep_id, utc_now(), self.workers,
                                     tuple(rounded(self.rtt_start_ms)), tuple(rounded(self.times()))).to_json())


def link_of(settings: EngineSettings) -> Link | None:
    """The sweep's workers timed now, or None when it has none."""
    return Link(settings.rpc) if settings.rpc else None
