"""Cost probe in process: what a verify pass of n tokens costs against one token, what one draft
step costs, and prompt speed, at a given context depth. The "can MTP pay on this machine?"
pre-check; called through app.core.session.cost_probe, which chooses it or server_probe.

Runs on any GGUF (the draft step only where the model has MTP heads). Sizes are visited in a new
random order every round, so slow drift hits all of them alike; rounds repeat until the medians
are stable. Ratios T(n)/T(1) are taken within a round (paired), then summarised. The decodes
themselves are app.core.engines.probe_decode's; with MTP heads the whole speculative step is then
timed in the engine's own decode loop (whole_step.whole_steps).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any, Generator, Iterator, Sequence

import numpy as np

from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError
from app.core.common.spec_modes import MTP
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.factory import make_inprocess
from app.core.engines.inprocess import InProcessEngine
from app.core.engines.probe_decode import ProbeDecoder
from app.core.measure.whole_step import (FILLER, ProbeProgress, Rounds, StepMs, Timings, centred_prompt_len,
                                         run_to_end, stable_rounds, steady_steps, whole_steps)
from app.core.records.arm import Arm
from app.core.records.cost import DEFAULT_DEPTH, CostRecord, Spread, model_stamp
from app.core.records.sampler import greedy
from app.core.records.schema import SCHEMA_VERSION, host_info, new_id, utc_now


@dataclasses.dataclass
class _Parts:
    """What the rounds of verify passes (and draft steps, catch-ups) measured, per size n."""

    samples: dict[int, list[float]]  # T(n), ms
    ratios: dict[int, list[float]]  # T(n)/T(1), within a round
    drafts: list[float]  # one MTP draft step, ms
    catchups: dict[int, list[float]]  # the MTP catch-up over n tokens, ms
    rounds: int = 0
    stable: bool = False


def run_probe(model: str, *, depth: int = DEFAULT_DEPTH, max_batch: int = 9, threads: int | None = None,
              min_rounds: int = 5, max_rounds: int = 25, target_rel: float = 0.05,
              n_gpu_layers: str | None = None, cancel: CancelToken | None = None,
              seed: int = 0, whole: bool = True, steps: int = 16) -> Iterator[ProbeProgress | CostRecord]:
    """Yield progress, then the CostRecord. Stops early once every median is stable (the
    relative standard error of each T(n) median below ``target_rel`` / 2) after ``min_rounds``.
    With ``whole`` (and MTP heads), also the whole speculative step at K = 1..max_batch - 1, timed
    in the engine's own decode loop with synthetic acceptance (_inprocess_steps), as the llama-server
    probe times it: what the break-even model prices runs with."""
    cancel = cancel or CancelToken()
    if max_batch < 1 or max_batch > 64:
        raise EngineError(f"--max-batch must be between 1 and 64, got {max_batch}")
    if depth < 1:
        raise EngineError(f"--depth must be at least 1, got {depth}")
    eng = make_inprocess(EngineSettings(kind=EngineKind.INPROCESS, ctx_size=max(depth + max_batch + 64, 512),
                                        threads=threads, n_gpu_layers=n_gpu_layers, max_k=max_batch))
    rounds = Rounds(min_rounds, max_rounds, target_rel)
    try:
        dec = ProbeDecoder(eng, model, max_batch)
        rng = np.random.default_rng(seed)
        hi = max(2, min(dec.n_vocab, 30000))
        # prompt speed: decode `depth` (>= 128) random tokens from empty, three times
        pp_n = max(depth, 128)
        pp = []
        for _ in range(3):
            cancel.check()
            pp.append(pp_n / dec.prompt_pass(rng.integers(1, hi, pp_n).tolist()))
        yield ProbeProgress(0, max_rounds, f"prompt processing {statistics.median(pp):.0f} tok/s")
        dec.fill_context(rng.integers(1, hi, depth).tolist())  # the context at the requested depth
        parts = yield from _part_rounds(dec, rng, hi, max_batch, rounds, cancel)
        step_ms: StepMs | None = None
        mid: dict[str, Any] | None = None
        plain: Spread | None = None
        edge_ms: StepMs | None = None
        stable = parts.stable
        if dec.has_mtp and whole and max_batch > 1:
            step_ms, mid, plain, stable_steps, edge_ms = yield from _inprocess_steps(eng, model, depth, max_batch - 1,
                                                                                     steps, rounds, cancel)
            stable = stable and stable_steps
        sizes = sorted(parts.samples)
        yield CostRecord(
            schema_version=SCHEMA_VERSION, record_type="cost", run_id=new_id(), engine="inprocess",
            llama_build=eng.build, model_path=str(Path(model).resolve()),
            model_size=Path(model).stat().st_size, depth=depth, max_batch=max_batch, threads=eng.threads,
            t_ms={n: Spread.of(parts.samples[n]) for n in sizes},
            ratio={n: Spread.of(parts.ratios[n]) for n in sizes},
            draft_ms=Spread.of(parts.drafts) if parts.drafts else None,
            catchup_ms={n: Spread.of(v) for n, v in parts.catchups.items()} if parts.drafts else None,
            prompt_tok_s=Spread.of(pp), rounds=parts.rounds,
            stable=stable, timestamp_utc=utc_now(), host=host_info(),
            backend=eng.placement.backend if eng.placement else None,
            devices=tuple(eng.placement.devices) if eng.placement else (),
            spec_type=MTP if dec.has_mtp else None, step_ms=step_ms, mid_check=mid, plain_ms=plain,
            edge_ms=edge_ms or None, **model_stamp(model))
    finally:
        eng.close()


def _part_rounds(dec: ProbeDecoder, rng: np.random.Generator, hi: int, max_batch: int, rounds: Rounds,
                 cancel: CancelToken) -> Generator[ProbeProgress, None, _Parts]:
    """The rounds of the parts: a verify pass of every size n = 1..max_batch in a new random order
    (and, with MTP heads, three draft steps and a catch-up of every size), until every T(n)
    median is stable or ``rounds.max_rounds``."""
    sizes = list(range(1, max_batch + 1))
    parts = _Parts({n: [] for n in sizes}, {n: [] for n in sizes}, [], {n: [] for n in sizes})
    for rnd in range(1, rounds.max_rounds + 1):
        cancel.check()
        order = sizes[:]
        rng.shuffle(order)
        this = {n: dec.verify(rng.integers(1, hi, n).tolist()) for n in order}
        for n in sizes:
            parts.samples[n].append(this[n])
            parts.ratios[n].append(this[n] / this[1])
        if dec.has_mtp:
            for _ in range(3):
                parts.drafts.append(dec.draft_step(int(rng.integers(1, hi))))
            for n in order:
                parts.catchups[n].append(dec.catchup(rng.integers(1, hi, n).tolist()))
        parts.rounds = rnd
        if rnd >= rounds.min_rounds:
            parts.stable = all(rounds.stable(parts.samples[n]) for n in sizes)
        yield ProbeProgress(rnd, rounds.max_rounds, f"round {rnd}: T(1) {statistics.median(parts.samples[1]):.2f} "
                            "ms" + (" (stable)" if parts.stable else ""))
        if parts.stable:
            break
    return parts


class _FillerPrompts:
    """Prompts of the filler text by their length in tokens, for the in-process whole step."""

    def __init__(self, eng: InProcessEngine, depth: int):
        self._eng = eng
        self._words = (FILLER * max(2, depth // 4 + 2)).split(" ")
        self._texts: dict[int, str] = {}

    def text_of(self, n_tokens: int) -> str:
        """The shortest run of the filler's words that is at least ``n_tokens`` tokens."""
        if n_tokens not in self._texts:
            lo, hi = 1, len(self._words)
            while lo < hi:
                mid = (lo + hi) // 2
                if len(self._eng.prompt_tokens(" ".join(self._words[:mid]), True, None)) >= n_tokens:
                    hi = mid
                else:
                    lo = mid + 1
            self._texts[n_tokens] = " ".join(self._words[:lo])
        return self._texts[n_tokens]


def _inprocess_steps(eng: InProcessEngine, model: str, depth: int, max_k: int, steps: int, rounds: Rounds,
                     cancel: CancelToken
                     ) -> Generator[ProbeProgress, None, tuple[StepMs, dict[str, Any], Spread, bool, StepMs]]:
    """The whole step in process: the engine's own decode loop (DecodeLoop: draft, verify,
    rollback, catch-up) with synthetic acceptance (InProcessEngine.synth_rates); each request
    centred on ``depth`` (centred_prompt_len)."""
    eng.load(model)
    prompts = _FillerPrompts(eng, depth)

    def one(arm: Arm, rates: Sequence[float] | None, n: int) -> Timings:
        eng.synth_rates = tuple(rates) if rates is not None else None
        try:
            g = eng.generate(model, arm, prompts.text_of(centred_prompt_len(depth, n)), raw=True, n_predict=n,
                             sampler=greedy(), cancel=cancel, ignore_eos=True)
            gen = run_to_end(g)
        finally:
            eng.synth_rates = None
        return steady_steps(gen.token_times, arm.k or 0, n)  # the first and the capped steps left out

    one(Arm(), None, 4)  # warm-up

    def plain() -> float | None:
        tm, _ = one(Arm(), None, 1 + steps)
        return float(tm["predicted_ms"]) / (tm["predicted_n"] - 1) if tm["predicted_n"] > 1 else None

    # a first plain step (what capped last steps are priced against); the rounds measure it again
    first = min(rounds.min_rounds, 3)
    t1s, _ = stable_rounds("the plain step", plain, first, first, rounds.target_rel, cancel)
    t1 = statistics.median(t1s)
    yield ProbeProgress(0, rounds.max_rounds, f"plain decode step {t1:.2f} ms (the whole-step probe)")
    step_ms, mid, stable, plains, edge_ms = yield from whole_steps(
        lambda k, r, n: one(Arm(k, 0.0) if k else Arm(), r if k else None, n), t1, max_k, steps, rounds.min_rounds,
        rounds.max_rounds, rounds.target_rel, cancel, interleave=True)
    return step_ms, mid, Spread.of(plains or t1s), stable, edge_ms

