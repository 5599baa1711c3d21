"""One resume request for every front end (``bench --resume RESULTS``, the window's "Finish when
quiet"): the sweep of a results file finished as it ran, measuring only what it did not measure
quietly (app.core.measure.resume), or refused in one sentence that both front ends show alike.

What is refused, before anything runs:

- a count in the file beyond what a sweep plans (a repetition, token count, depth or K:
  measure.plan.planned_counts), naming the file's line and the field;
- a sweep whose runs name more than one model or engine (measure.plan.mixed_problem);
- a sweep made with the user's own llama-server flags or --axis values (they are not carried
  over), and the user's own command given now (the sweep is finished with the flags it ran with);
- another engine than the sweep's;
- a sweep split over RPC workers that the user did not name again, or workers named for a sweep
  that ran on this machine only (where_problem): the workers a results file names are never
  dialled.

While a resume runs, its results file is locked (resume_lock, taken by session.sweep.run): a
second resume of the same file is refused at once in one line, instead of planning from the same
runs and measuring everything again."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Iterator, Sequence

from app.core.common.errors import UserError
from app.core.common.filelock import exclusive
from app.core.common.text import shown
from app.core.engines.base import EngineKind, EngineSettings
from app.core.measure.plan import Names, plan_again, planned_counts
from app.core.measure.resume import resume_of
from app.core.records.reader import load_records
from app.core.records.schema import RunRecord
from app.core.records.sweeps import select_sweep
from app.core.session.request import SweepRequest
from app.core.verdict.workers import recorded_workers

SERVER_FLAGS = ("this sweep ran with your own llama-server command's flags or --axis values, which a resumed "
                "sweep does not carry over: run it again with them instead")
OWN_COMMAND = ("a resumed sweep runs with the flags it ran with; your own llama-server command does not combine "
               "with it (leave out --server-command; in the window, clear the command box)")
WORKERS = "RPC workers (--rpc HOST:PORT,... or --rpc-local N; in the window, the Machine tab's)"


def where_problem(recorded: Sequence[str] | None, named: bool, to: str) -> str | None:
    """Why a sweep cannot be measured again (``to``: "finish it", "confirm it") where the user
    asks: it was split over ``recorded`` workers and none are named now, or it ran on this machine
    only and workers are named; None when it can. The recorded workers are never used themselves:
    a results file is outside text, and a worker there would receive the model's tensors."""
    if recorded and not named:
        return (f"this sweep was split over RPC workers; name them again to {to} there ({WORKERS}): the workers "
                "a results file names are never dialled")
    if named and not recorded:
        return f"this sweep ran on this machine only, where it is measured again: {WORKERS} do not combine with it"
    return None


@dataclasses.dataclass(frozen=True)
class Planned:
    """One sweep of a results file to plan again: its runs, the lines left out (each a sentence
    with its line) and which sweep was taken when the file holds several (None: it holds one)."""

    runs: list[RunRecord]
    problems: list[str]
    note: str | None


def planned_sweep(path: str | os.PathLike[str], sweep: str | None = None) -> Planned:
    """The runs of one sweep of a results file (the latest, or ``sweep`` by id) to plan again; a
    count beyond what a sweep plans refuses the file in one line naming its line and field
    (measure.plan.planned_counts)."""
    problems: list[str] = []
    records = load_records(path, problems, mtp_times=False, refuse=planned_counts)
    if not records:
        raise UserError(f"{path}: no runs in this results file")
    runs, _chosen, note = select_sweep(records, sweep, where=str(path))
    return Planned(runs, problems, note)


def resume_request(path: str | os.PathLike[str], settings: EngineSettings, *, sweep: str | None = None,
                   prompt_file: str | None = None, engine: EngineKind | str | None = None,
                   warmup: int | None = None, rpc_local: int = 0,
                   names: Names | None = None) -> tuple[SweepRequest, Planned]:
    """The request that finishes the sweep of ``path`` (its latest, or ``sweep``) with the user's
    ``settings`` now (context, threads, GPU layers, binary, logs, the workers named again;
    ``user_args`` set: the user's own command given, refused), and what was read (its notes to
    show); every refusal of the module one UserError."""
    planned = planned_sweep(path, sweep)
    records = planned.runs
    if any(r.server_args is not None for r in records):
        raise UserError(SERVER_FLAGS)
    if settings.user_args is not None:
        raise UserError(OWN_COMMAND)
    ran = records[-1].engine
    if engine is not None and EngineKind.parse(engine) is not EngineKind.parse(ran):
        raise UserError(f"this sweep ran on the {EngineKind.parse(ran).value} engine, where it is finished; "
                        f"the {EngineKind.parse(engine).value} engine does not combine with it")
    problem = where_problem(recorded_workers(records), bool(settings.rpc or rpc_local), "finish it")
    if problem:
        raise UserError(problem)
    plan = plan_again(records, prompt_file=prompt_file, engine=engine, names=names)
    if warmup is not None:
        plan = dataclasses.replace(plan, warmup=warmup)
    return SweepRequest(plan, dataclasses.replace(settings, kind=plan.engine), out=Path(path), strict_modes=True,
                        resume=resume_of(records, plan), rpc_local=rpc_local), planned


@contextlib.contextmanager
def resume_lock(request: SweepRequest) -> Iterator[None]:
    """Hold the resume lock of the request's results file while it runs (nothing for a sweep that
    resumes nothing): a second resume of the same file is refused at once (filelock.LockBusy, a
    UserError), naming the process that holds it."""
    if request.resume is None or request.out is None:
        yield
        return
    real = Path(os.path.realpath(request.out))
    name = shown(request.out, 200).replace("{", "{{").replace("}", "}}")
    with exclusive(real.with_name(real.name + ".resume.lock"),
                   f"{name}: another resume of this results file is running (pid {{pid}}); let it finish, then "
                   "resume again if anything is left"):
        yield
