"""Cost probe through llama-server: the real speculative step at each draft width K, timed on the
device the sweep runs on (``mtp-tuner probe --engine server``).

llama.cpp's synthetic acceptance (``--spec-synth-rates P0,P1,...``, benchmarking only) replaces
the verify decision with set per-position acceptance, so the whole server loop (draft, verify,
rollback, catch-up) runs at an acceptance we choose, whatever the drafts are. Per K the probe
times that step at full acceptance (rates 1,...,1) and at full rejection (0,...,0); at one middle
rate (i.i.d. ``MID_ALPHA``: position i accepted with probability alpha^(i+1)) it checks that a step
costs what the straight line between the two predicts for the drafts it accepted. A baseline
server gives the prompt speed and the plain decode step. Each setting needs its own server (the
flag is a start-up option). One K at a time, that K's servers (full acceptance, full rejection,
the middle rate) and the baseline stay up, each warmed by one whole request, and every round
visits them and the plain step in a new random order until every median is stable, as a sweep
interleaves its arms: each step is paired with its round's plain step (whole_step.whole_steps), so
drift between the widths cancels too. One setting after the other, each in its own window, a
busy spell moved one setting alone by 10-25 % on a shared machine; that order is kept only where
four servers do not fit in memory (then the plain step is measured before and after them).

Every request is centred on the probe's depth (its prompt ends half its length before it;
whole_step.centred_prompt_len): a request at full acceptance is K + 1 times longer than one at full
rejection, and started at the depth it would be measured deeper than the plain step it is set
against. A step's cost comes from the server's own clock: with ``timings_per_token`` every token
arrives with the server's stamp (its ``predicted_ms`` so far; the tokens of one step share it), and
a request is read as the in-process probe reads its own (``whole_step.steady_steps``): its steps
after the first that drafted the full width. Left out: the first step after the prompt (tens of
ms from request to request) and the last ones, which draft fewer tokens (llama-server caps a draft
at the tokens left) or none. Where a server sends no stamps, the request's totals are read
instead: ``predicted_ms`` spans the N - 1 steps after the first token, /metrics counts the
verification steps that drafted, and the capped last steps are priced on the line from the plain
step to the full one (``whole_step.step_cost``).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any, Iterator, Sequence

from app.core.common.workers import Workers
from app.core.common.spec_modes import MTP
from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError, UserError
from app.core.engines.server.engine import ServerEngine
from app.core.engines.server.process import ServerProcess
from app.core.machine.gguf_info import check_gguf_file
from app.core.measure.whole_step import (FILLER, ProbeProgress, centred_prompt_len, rates_text, run_to_end,
                                         stable_rounds, steady_steps, whole_steps, Timings)
from app.core.records.arm import Arm
from app.core.records.cost import DEFAULT_DEPTH, CostRecord, Spread, model_stamp
from app.core.records.sampler import greedy
from app.core.records.schema import SCHEMA_VERSION, host_info, new_id, utc_now

SYNTH_FLAG = "--spec-synth-rates"

class NoSyntheticAcceptance(UserError):
    """The llama-server lacks the synthetic acceptance flags: the step cannot be timed at a set
    acceptance (one line; the verdict then prices runs with costs fitted from them)."""


def synth_problem(flags: frozenset[str] | set[str], binary: str = "this llama-server") -> str | None:
    """Why this binary cannot run the probe (no ``--spec-synth-rates`` in its --help), or None."""
    if SYNTH_FLAG in flags:
        return None
    return (f"{binary} has no {SYNTH_FLAG} (llama.cpp's synthetic acceptance, in builds since late 2026), "
            "so the speculative step cannot be timed through it; the verdict prices llama-server runs "
            "with costs fitted from the runs")


def check_probe_args(model: str, drafter: str | None, mode: str, depth: int, max_k: int, min_rounds: int,
                     max_rounds: int) -> None:
    """UserError for settings no whole-step probe can run with (shared with the network probe),
    said before any server starts."""
    if max_k < 1 or max_k > 16:
        raise UserError(f"the widest K must be between 1 and 16, got {max_k}")
    if depth < 1:
        raise UserError(f"--depth must be at least 1, got {depth}")
    if min_rounds < 1 or max_rounds < min_rounds:
        raise UserError("the probe needs at least one round")
    if mode == MTP and not drafter:  # a clear line before a server fails to start with it
        problem = check_gguf_file(model).mtp_problem()
        if problem:
            raise UserError(f"{problem}; the probe times the draft-mtp step, which needs the model's own MTP heads "
                            "or a drafter (--drafter)")


def probe_ctx(depth: int, steps: int, max_k: int) -> int:
    """The context a whole-step probe's servers need: the depth and its longest request."""
    return max(512, depth + 1 + steps * (max_k + 1) + max_k + 128)


def check_engine(eng: ServerEngine, mode: str, drafter: str | None) -> None:
    """NoSyntheticAcceptance or UserError when this llama-server cannot time the step of ``mode``."""
    problem = synth_problem(eng.caps.flags, eng.binary)
    if problem:
        raise NoSyntheticAcceptance(problem)
    problem = eng.mode_problem(Arm(1, 0.0, mode, drafter))
    if problem:
        raise UserError(problem)


class ProbePrompts:
    """The probe's prompts from the model's own tokens of FILLER: ``pp`` for the prompt speed,
    ``of(n)`` a request of n tokens centred on the depth (whole_step.centred_prompt_len)."""

    def __init__(self, srv: ServerProcess, depth: int):
        text_toks = srv.tokenize(FILLER, add_special=False)
        if not text_toks:
            raise EngineError("the model's tokenizer gave no tokens for the probe's text")
        self.depth = depth
        self.filler = text_toks * (max(depth, 128) // len(text_toks) + 1)
        self.pp = self.filler[:max(depth, 128)]

    def of(self, n: int) -> list[int]:
        return self.filler[:centred_prompt_len(self.depth, n)]


def prompt_speeds(srv: ServerProcess, prompts: ProbePrompts, cancel: CancelToken) -> list[float]:
    """Three prompt-processing speeds (tok/s) as the server reports them (none when it does not)."""
    pp = []
    for _ in range(3):
        cancel.check()
        tm, _ = timed_request(srv, prompts.pp, 1, cancel)
        if tm.get("prompt_per_second"):
            pp.append(float(tm["prompt_per_second"]))
    return pp


def timed_request(srv: ServerProcess, prompt: list[int], n: int, cancel: CancelToken,
                  k: int | None = None) -> Timings:
    """One completion of ``n`` tokens (end of generation ignored): its timings and the verification
    steps that drafted. With ``k`` (the width its server drafts, 0 for a plain one), over its steady
    steps alone, read from the server's own stamp on every token (whole_step.steady_steps: the
    first step after the prompt and the capped last steps left out, as the in-process probe reads
    its requests); without ``k``, or where the server stamps no tokens, its whole timings and
    the drafting steps /metrics counted (0 for a baseline)."""
    before = srv.spec_counters()
    raw = run_to_end(srv.stream_completion(prompt, n, greedy(), cancel, ignore_eos=True, server_times=k is not None))
    stamps = raw.get("server_times")
    if k is not None and stamps and len(stamps) == len(raw["tokens"]):
        return steady_steps(stamps, k, n)
    after = srv.spec_counters()
    steps = 0
    if after is not None and after.drafts is not None:
        steps = after.drafts - (before.drafts if before is not None and before.drafts is not None else 0)
    return raw["timings"], steps


def run_server_probe(model: str, *, server_bin: str | None = None, drafter: str | None = None,
                     mode: str = MTP, depth: int = DEFAULT_DEPTH, max_k: int = 8,
                     threads: int | None = None, n_gpu_layers: str | None = None, min_rounds: int = 5,
                     max_rounds: int = 25, target_rel: float = 0.05, steps: int = 24,
                     cancel: CancelToken | None = None, log_dir: str | None = None,
                     user_args: tuple[str, ...] | None = None,
                     rpc: Workers | None = None) -> Iterator[ProbeProgress | CostRecord]:
    """Yield progress, then the CostRecord (see the module doc). Raises NoSyntheticAcceptance
    when the binary lacks the synthetic acceptance flags, UserError when it cannot run the mode
    (no MTP heads, no drafter option)."""
    cancel = cancel or CancelToken()
    check_probe_args(model, drafter, mode, depth, max_k, min_rounds, max_rounds)
    eng = ServerEngine(server_bin, ctx_size=probe_ctx(depth, steps, max_k), threads=threads,
                       n_gpu_layers=n_gpu_layers, pool_size=None, log_dir=log_dir,
                       user_args=user_args, rpc=rpc)  # the user's own flags, as the sweep's servers
    try:
        check_engine(eng, mode, drafter)
        yield from _probe(eng, str(model), drafter, mode, depth, max_k, min_rounds, max_rounds, target_rel,
                          steps, cancel)
    finally:
        eng.close()


def _probe(eng: ServerEngine, model: str, drafter: str | None, mode: str, depth: int, max_k: int,
           min_rounds: int, max_rounds: int, target_rel: float, steps: int,
           cancel: CancelToken) -> Iterator[ProbeProgress | CostRecord]:
    def server(arm: Arm, extra: tuple[str, ...] = ()) -> ServerProcess:
        cfg = dataclasses.replace(eng.config_for(model, arm), extra=eng.extra_args + extra)
        return eng.server(cfg, cancel)

    # the baseline: the prompt speed, a first plain step; every request's prompt centres it on `depth`
    base = server(Arm())
    placement = eng.placement_of(base)
    prompts = ProbePrompts(base, depth)
    prompt = prompts.of  # a request of n tokens, centred on the depth
    timed_request(base, prompt(1 + steps), 1 + steps, cancel)  # warm-up: a whole request (a fresh server's first is slower)
    pp = prompt_speeds(base, prompts, cancel)
    yield ProbeProgress(0, max_rounds, f"prompt processing {statistics.median(pp):.0f} tok/s" if pp else
                        "prompt processing: not reported")

    def plain() -> float | None:
        tm, _ = timed_request(base, prompt(1 + steps), 1 + steps, cancel, k=0)
        return float(tm["predicted_ms"]) / (int(tm["predicted_n"]) - 1) if int(tm.get("predicted_n") or 0) > 1 else None

    # a first plain step: what the capped last steps of a request are priced against
    t1s, stable = stable_rounds("the plain step", plain, min(min_rounds, 3), min(min_rounds, 3), target_rel, cancel)
    t1 = statistics.median(t1s)
    yield ProbeProgress(0, max_rounds, f"plain decode step {t1:.2f} ms (a first look)")

    # every round visits the plain step and one K's settings (full acceptance, full rejection, the
    # middle rate at its K) in a new random order, as a sweep interleaves its arms; each setting is
    # a server start-up option, so the plain server and that K's servers (up to three) are up at
    # once. Where even these do not fit in memory, one setting after the other.
    limit = eng.ready_limit(model, 4)
    interleave = limit is None or limit >= 4
    if not interleave:
        eng.discard(base.cfg)
        eng.pool_size = 1
    current: dict[tuple[int, tuple[float, ...]], ServerProcess] = {}

    def request(k: int, rates: Sequence[float], n: int) -> Timings:
        if k == 0:
            return timed_request(server(Arm()), prompt(n), n, cancel, k=0)
        key = (k, tuple(rates))
        if key not in current or not current[key].alive():
            for old in [o for o in current if not interleave or o[0] != k]:  # the servers of another K go
                eng.discard(current.pop(old).cfg)
            current[key] = server(Arm(k, 0.0, mode, drafter), (SYNTH_FLAG, rates_text(rates)))
        return timed_request(current[key], prompt(n), n, cancel, k=k)

    step_ms, mid, stable_steps, plains, edge_ms = yield from whole_steps(request, t1, max_k, steps, min_rounds, max_rounds,
                                                               target_rel, cancel, interleave=interleave,
                                                               warmup_whole=True, by_width=True)
    if plains:
        t1s = plains
    else:  # the plain step again, after the settings: slow drift over the probe moves it as it moved them
        for srv in current.values():
            eng.discard(srv.cfg)
        base = server(Arm())
        timed_request(base, prompt(1 + steps), 1 + steps, cancel)  # warm-up
        after, stable_after = stable_rounds("the plain step", plain, min_rounds, max_rounds, target_rel, cancel)
        t1s += after
        stable = stable and stable_after
    path = Path(model)
    yield CostRecord(
        schema_version=SCHEMA_VERSION, record_type="cost", run_id=new_id(), engine="server",
        llama_build=eng.build, model_path=str(path.resolve()), model_size=path.stat().st_size, depth=depth,
        max_batch=max_k + 1, threads=eng.threads or 0,
        t_ms={1: Spread.of(t1s)}, ratio={1: Spread.of([1.0] * len(t1s))}, draft_ms=None, catchup_ms=None,
        prompt_tok_s=Spread.of(pp or [0.0]), rounds=max(s["accept"].n for s in step_ms.values()),
        stable=stable and stable_steps, timestamp_utc=utc_now(), host=host_info(),
        backend=placement.backend, devices=tuple(placement.devices), spec_type=mode,
        drafter=str(Path(drafter).resolve()) if drafter else None, step_ms=step_ms, mid_check=mid,
        plain_ms=Spread.of(t1s), edge_ms=edge_ms or None, **model_stamp(model))
