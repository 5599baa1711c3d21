"""Cost probe: what a verify pass of n tokens costs against one token, what one draft step costs,
and prompt speed, at a given context depth. The "can MTP pay on this machine?" pre-check.

Runs on any GGUF (the draft step only where the model has MTP heads). Sizes are visited in a new
random order every round, so slow drift hits all of them alike; rounds repeat until the medians
are stable. Ratios T(n)/T(1) are taken within a round (paired), then summarised.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence

import numpy as np

from app.core.common.spec_modes import MTP
from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError
from app.core.common.text import shown
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.factory import make_inprocess
from app.core.engines.inprocess import RawContexts
from app.core.engines.llama_backend import decode_or_raise, fill_batch
from app.core.records.cost import DEFAULT_DEPTH, CostRecord, Spread, model_stamp
from app.core.records.schema import SCHEMA_VERSION, host_info, new_id, utc_now
from app.core.records.writer import append_line


# the llama-server probe's middle rate: a measured step within 5 % of the line between full
# acceptance and full rejection means the interpolation holds (app.core.measure.server_probe)
MID_TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class ProbeProgress:
    round: int
    max_rounds: int
    message: str


def run_probe(model: str, *, depth: int = DEFAULT_DEPTH, max_batch: int = 9, threads: int | None = None,
              min_rounds: int = 5, max_rounds: int = 25, target_rel: float = 0.05,
              n_gpu_layers: str | None = None, cancel: CancelToken | None = None,
              seed: int = 0, whole: bool = True, steps: int = 16) -> Iterator[ProbeProgress | CostRecord]:
    """Yield progress, then the CostRecord. Stops early once every median is stable (the
    relative standard error of each T(n) median below ``target_rel`` / 2) after ``min_rounds``.
    With ``whole`` (and MTP heads), also the whole speculative step at K = 1..max_batch - 1, timed
    in the engine's own decode loop with synthetic acceptance (whole_steps), as the llama-server
    probe times it: what the break-even model prices runs with."""
    cancel = cancel or CancelToken()
    if max_batch < 1 or max_batch > 64:
        raise EngineError(f"--max-batch must be between 1 and 64, got {max_batch}")
    if depth < 1:
        raise EngineError(f"--depth must be at least 1, got {depth}")
    eng = make_inprocess(EngineSettings(kind=EngineKind.INPROCESS, ctx_size=max(depth + max_batch + 64, 512),
                                        threads=threads, n_gpu_layers=n_gpu_layers, max_k=max_batch))
    try:
        raw = eng.raw_contexts(model, max_batch)
        L, X, m = raw.L, raw.X, raw.model
        tgt, dft = raw.target, raw.draft
        mem_t = L.llama_get_memory(tgt)
        rng = np.random.default_rng(seed)
        hi = max(2, min(m.n_vocab, 30000))
        tb, db = raw.target_batch, raw.draft_batch
        loop_helpers = _Helpers(raw)

        # prompt speed: decode `depth` (>= 128) random tokens from empty, three times
        pp_n = max(depth, 128)
        pp = []
        for _ in range(3):
            cancel.check()
            L.llama_memory_clear(mem_t, True)
            toks = rng.integers(1, hi, pp_n).tolist()
            loop_helpers.fill(tb, toks, 0, [0] * (pp_n - 1) + [1])
            t0 = time.perf_counter()
            loop_helpers.decode(tgt, tb)
            L.llama_synchronize(tgt)
            pp.append(pp_n / (time.perf_counter() - t0))
        yield ProbeProgress(0, max_rounds, f"prompt processing {statistics.median(pp):.0f} tok/s")

        # context at the requested depth (target, and the MTP context through a catch-up)
        L.llama_memory_clear(mem_t, True)
        ctx_toks = rng.integers(1, hi, depth).tolist()
        X.llama_set_embeddings_nextn(tgt, bool(m.has_mtp), False)
        loop_helpers.fill(tb, ctx_toks, 0, [0] * (depth - 1) + [1])
        loop_helpers.decode(tgt, tb)
        h_last = None
        if m.has_mtp:
            mem_d = L.llama_get_memory(dft)
            L.llama_memory_clear(mem_d, True)
            H = np.ctypeslib.as_array(X.llama_get_embeddings_nextn(tgt), shape=(depth, m.n_embd)).copy()
            rows = [np.zeros(m.n_embd, np.float32)] + [H[i - 1] for i in range(1, depth)]
            loop_helpers.fill(db, ctx_toks, 0, [0] * depth, rows)
            loop_helpers.decode(dft, db)
            h_last = H[-1].copy()
        full_state = eng.target_state(partial=False)

        sizes = list(range(1, max_batch + 1))
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        ratios: dict[int, list[float]] = {n: [] for n in sizes}
        drafts: list[float] = []
        catchups: dict[int, list[float]] = {n: [] for n in sizes}
        stable = False
        rounds = 0
        for rnd in range(1, max_rounds + 1):
            cancel.check()
            this: dict[int, float] = {}
            order = sizes[:]
            rng.shuffle(order)
            for n in order:
                toks = rng.integers(1, hi, n).tolist()
                loop_helpers.fill(tb, toks, depth, [1] * n)
                t0 = time.perf_counter()
                loop_helpers.decode(tgt, tb)
                L.llama_synchronize(tgt)
                this[n] = (time.perf_counter() - t0) * 1000
                if not L.llama_memory_seq_rm(mem_t, 0, depth, -1):
                    L.llama_memory_seq_rm(mem_t, 0, -1, -1)
                    if not eng.restore_target_state(full_state, partial=False):
                        raise EngineError("could not restore the context between probe trials")
            for n in sizes:
                samples[n].append(this[n])
                ratios[n].append(this[n] / this[1])
            if m.has_mtp:
                for _ in range(3):
                    t0 = time.perf_counter()
                    loop_helpers.fill(db, [int(rng.integers(1, hi))], depth, [1], [h_last])
                    loop_helpers.decode(dft, db)
                    lg = np.ctypeslib.as_array(L.llama_get_logits_ith(dft, 0), shape=(m.n_vocab,))
                    int(np.argmax(lg))
                    np.ctypeslib.as_array(X.llama_get_embeddings_nextn_ith(dft, 0), shape=(m.n_embd,)).copy()
                    drafts.append((time.perf_counter() - t0) * 1000)
                    L.llama_memory_seq_rm(mem_d, 0, depth, -1)
                for n in order:
                    toks = rng.integers(1, hi, n).tolist()
                    loop_helpers.fill(db, toks, depth, [0] * n, [h_last] * n)
                    t0 = time.perf_counter()
                    loop_helpers.decode(dft, db)
                    L.llama_synchronize(dft)
                    catchups[n].append((time.perf_counter() - t0) * 1000)
                    L.llama_memory_seq_rm(mem_d, 0, depth, -1)
            rounds = rnd
            if rnd >= min_rounds:
                stable = all(_rse_median(samples[n]) < target_rel / 2 for n in sizes)
            yield ProbeProgress(rnd, max_rounds, f"round {rnd}: T(1) {statistics.median(samples[1]):.2f} ms"
                                + (" (stable)" if stable else ""))
            if stable:
                break
        step_ms: dict[int, dict[str, Spread]] | None = None
        mid: dict[str, Any] | None = None
        plain: Spread | None = None
        if m.has_mtp and whole and max_batch > 1:
            step_ms, mid, plain, stable_steps = yield from _inprocess_steps(
                eng, model, depth, max_batch - 1, steps, min_rounds, max_rounds, target_rel, cancel)
            stable = stable and stable_steps
        yield CostRecord(
            schema_version=SCHEMA_VERSION, record_type="cost", run_id=new_id(), engine="inprocess",
            llama_build=eng.build, model_path=str(Path(model).resolve()),
            model_size=Path(model).stat().st_size, depth=depth, max_batch=max_batch, threads=eng.threads,
            t_ms={n: Spread.of(samples[n]) for n in sizes},
            ratio={n: Spread.of(ratios[n]) for n in sizes},
            draft_ms=Spread.of(drafts) if drafts else None,
            catchup_ms={n: Spread.of(v) for n, v in catchups.items()} if drafts else None,
            prompt_tok_s=Spread.of(pp), rounds=rounds,
            stable=stable, timestamp_utc=utc_now(), host=host_info(),
            backend=eng.placement.backend if eng.placement else None,
            devices=tuple(eng.placement.devices) if eng.placement else (),
            spec_type=MTP if m.has_mtp else None, step_ms=step_ms, mid_check=mid, plain_ms=plain,
            **model_stamp(model))
    finally:
        eng.close()


FILLER = ("The quick brown fox jumps over the lazy dog while the river runs past old stone walls and "
          "green fields. ")  # the whole-step probes' prompt text, repeated to the depth
MID_ALPHA = 0.6  # the middle rate's per-token acceptance (position i accepted with alpha^(i+1))


def centred_prompt_len(depth: int, n: int) -> int:
    """The prompt length that centres a request of ``n`` tokens on ``depth`` (half of its steps
    before the depth, half after; at least one token): the whole-step probes' requests are of
    different lengths (full acceptance K + 1 tokens a step, full rejection one), and each is then
    measured around the same depth, as the probe says, not the longest ones deeper than the rest."""
    return max(1, depth - (n - 1) // 2)


def rates_text(rates: Sequence[float]) -> str:
    return ",".join(f"{r:.4g}" for r in rates)


def step_cost(timings: Mapping[str, Any], steps: int, k: int, t1: float) -> float | None:
    """ms of one full speculative step at width k from a request's timings (predicted_n,
    predicted_ms: the span of the N - 1 steps after the first token; draft_n, draft_n_accepted)
    and its verification steps that drafted (``steps``), given the plain step ``t1``. Plain steps
    (no draft) are priced t1, and each draft slot a capped last step leaves out saves
    (full - t1) / k. None when the request has no full step."""
    n = int(timings.get("predicted_n") or 0)
    total = float(timings.get("predicted_ms") or 0.0)
    drafted = int(timings.get("draft_n") or 0)
    accepted = int(timings.get("draft_n_accepted") or 0)
    plain = max(0, (n - 1) - (steps + accepted))
    missing = max(0, steps * k - drafted)
    denom = steps - missing / k
    if steps <= 0 or denom <= 0 or total <= 0:
        return None
    return (total - t1 * (plain + missing / k)) / denom


# one request at width k with synthetic acceptance ``rates``, of n tokens: (timings, steps that drafted)
Request = Callable[[int, Sequence[float], int], tuple[Mapping[str, Any], int]]


def stable_rounds(label: str, measure: Callable[[], float | None], min_rounds: int, max_rounds: int,
                  target_rel: float, cancel: CancelToken) -> tuple[list[float], bool]:
    """Repeat ``measure`` until its median is stable (relative standard error below
    ``target_rel`` / 2 after ``min_rounds``) or ``max_rounds``: (the values, stable)."""
    xs: list[float] = []
    for _ in range(max_rounds):
        cancel.check()
        x = measure()
        if x is not None and x > 0:
            xs.append(x)
        if len(xs) >= min_rounds and _rse_median(xs) < target_rel / 2:
            return xs, True
    if not xs:
        raise EngineError(f"the probe measured no step for {label}")
    return xs, False


def whole_steps(request: Request, t1: float, max_k: int, steps: int, min_rounds: int, max_rounds: int,
                target_rel: float, cancel: CancelToken, interleave: bool = False, warmup_whole: bool = False,
                by_width: bool = False
                ) -> Generator[ProbeProgress, None,
                               tuple[dict[int, dict[str, Spread]], dict[str, Any], bool, list[float] | None]]:
    """The whole speculative step at K = 1..max_k at full acceptance and full rejection, and the
    middle-rate check at one K; ``request(k, rates, n)`` runs one request (k = 0: a plain one; the
    first of a setting is its warm-up: a few tokens, or with ``warmup_whole`` a whole request, as a
    fresh llama-server's first request is slower). One setting after the other until each is
    stable, or with ``interleave`` every setting once per round in a new random order, the plain
    step included, until all are stable: slow drift and busy spells then hit all settings alike, as
    they hit a sweep's interleaved arms (measured one after the other, each setting in its own
    window, a busy spell in one window moved that setting alone by 10-25 %); each step is then
    paired with its round's plain step and priced at the plain step's median. With ``by_width``
    the rounds go one K at a time (that K's settings and the plain step; the middle rate with its
    K), so only a few llama-servers need be up at once; the pairing carries across the widths.
    Returns (step_ms, mid_check, stable, the plain step's values when measured here)."""
    k_mid = max(1, (max_k + 1) // 2)
    mid_rates = [MID_ALPHA ** (i + 1) for i in range(k_mid)]
    settings: list[tuple[tuple[str, int], int, list[float], int]] = []
    for k in range(1, max_k + 1):
        settings.append((("accept", k), k, [1.0] * k, 1 + steps * (k + 1)))  # whole steps only: no capped draft
        settings.append((("reject", k), k, [0.0] * k, 1 + steps + k))
    settings.append((("mid", k_mid), k_mid, mid_rates, 1 + steps * 2))
    if interleave:
        settings.append((("plain", 0), 0, [], 1 + steps))
    xs: dict[tuple[str, int], list[float]] = {key: [] for key, *_ in settings}
    raws: dict[tuple[str, int], list[tuple[Mapping[str, Any], int]]] = {key: [] for key, *_ in settings}

    def one(key: tuple[str, int], k: int, rates: list[float], n: int) -> float | None:
        tm, st = request(k, rates, n)
        raws[key].append((tm, st))
        if k == 0:
            pn = int(tm.get("predicted_n") or 0)
            return float(tm.get("predicted_ms") or 0.0) / (pn - 1) if pn > 1 else None
        return step_cost(tm, st, k, t1)

    def done(key: tuple[str, int]) -> bool:
        return len(xs[key]) >= min_rounds and _rse_median(xs[key]) < target_rel / 2

    stable = True
    if interleave:
        rng = random.Random(0)
        # each step is taken against the plain step of its own round (paired, as a sweep pairs its
        # arms' runs), then priced at the plain step's median: a busy spell over a round moves
        # the step and the plain step together and cancels
        ratios: dict[tuple[str, int], list[float]] = {key: [] for key, *_ in settings}
        plain_s = [st for st in settings if st[0][0] == "plain"]
        groups = ([plain_s + [st for st in settings if st[1] == k] for k in range(1, max_k + 1)] if by_width
                  else [settings])
        warmed: set[tuple[str, int]] = set()
        for group in groups:
            ok = False
            for key, k, rates, n in group:
                if key not in warmed:
                    request(k, rates, n if warmup_whole else min(n, 2 + k))  # warm-up
                    warmed.add(key)
            for rnd in range(1, max_rounds + 1):
                order = group[:]
                rng.shuffle(order)
                this: dict[tuple[str, int], float] = {}
                for key, k, rates, n in order:
                    cancel.check()
                    x = one(key, k, rates, n)
                    if x is not None and x > 0:
                        this[key] = x
                p = this.get(("plain", 0))
                for key, x in this.items():
                    xs[key].append(x)
                    if p:
                        ratios[key].append(x / p)
                ok = all(len(ratios[key]) >= min_rounds and _rse_median(ratios[key]) < target_rel / 2
                         for key, *_ in group if key[0] != "plain") and done(("plain", 0))
                where = f"K={group[-1][1]}, " if by_width else ""
                yield ProbeProgress(rnd, max_rounds, f"whole steps, {where}round {rnd}" + (" (stable)" if ok else ""))
                if ok:
                    break
            stable = stable and ok
        if any(not ratios[key] for key, *_ in settings):
            raise EngineError("the probe measured no whole step for a setting")
        scale = statistics.median(xs[("plain", 0)])
        for key, *_ in settings:
            if key[0] != "plain":
                xs[key] = [r * scale for r in ratios[key]]
    else:
        for key, k, rates, n in settings:
            request(k, rates, n if warmup_whole else min(n, 2 + k))  # warm-up
            xs[key], ok = stable_rounds(f"K={k} at rates {rates_text(rates)}",
                                        lambda: one(key, k, rates, n), min_rounds, max_rounds, target_rel, cancel)
            stable = stable and ok
            if key[0] == "reject":
                yield ProbeProgress(k, max_k, f"K={k}: step {statistics.median(xs[('accept', k)]):.2f} ms at full "
                                    f"acceptance, {statistics.median(xs[key]):.2f} ms at full rejection")
    step_ms = {k: {"accept": Spread.of(xs[("accept", k)]), "reject": Spread.of(xs[("reject", k)])}
               for k in range(1, max_k + 1)}
    raw = raws[("mid", k_mid)]
    per_step = [int(tm.get("draft_n_accepted") or 0) / st for tm, st in raw if st]
    a = statistics.median(per_step) if per_step else 0.0
    full, none = step_ms[k_mid]["accept"].median, step_ms[k_mid]["reject"].median
    predicted = none + (full - none) * min(a, k_mid) / k_mid
    measured = statistics.median(xs[("mid", k_mid)])
    mid = {"k": k_mid, "rates": [round(r, 6) for r in mid_rates], "accepted_per_step": a,
           "predicted_ms": predicted, "measured_ms": measured,
           "error": predicted / measured - 1.0 if measured else None}
    yield ProbeProgress(max_k, max_k, f"middle rate at K={k_mid}: {a:.2f} accepted per step, step "
                        f"{measured:.2f} ms, the line predicts {predicted:.2f} ms")
    return step_ms, mid, stable, xs.get(("plain", 0))


def _inprocess_steps(eng: Any, model: str, depth: int, max_k: int, steps: int, min_rounds: int, max_rounds: int,
                     target_rel: float, cancel: CancelToken
                     ) -> Generator[ProbeProgress, None,
                                    tuple[dict[int, dict[str, Spread]], dict[str, Any], Spread, bool]]:
    """The whole step in process: the engine's own decode loop (DecodeLoop: draft, verify,
    rollback, catch-up) with synthetic acceptance (InProcessEngine.synth_rates); each request
    centred on ``depth`` (centred_prompt_len)."""
    from app.core.records.arm import Arm
    from app.core.records.sampler import greedy

    eng.load(model)
    words = (FILLER * max(2, depth // 4 + 2)).split(" ")
    texts: dict[int, str] = {}

    def text_of(n_tokens: int) -> str:
        """The shortest run of the filler's words that is at least ``n_tokens`` tokens."""
        if n_tokens not in texts:
            lo, hi = 1, len(words)
            while lo < hi:
                mid = (lo + hi) // 2
                if len(eng.prompt_tokens(" ".join(words[:mid]), True, None)) >= n_tokens:
                    hi = mid
                else:
                    lo = mid + 1
            texts[n_tokens] = " ".join(words[:lo])
        return texts[n_tokens]

    def one(arm: Arm, rates: Sequence[float] | None, n: int) -> tuple[dict[str, Any], int]:
        eng.synth_rates = tuple(rates) if rates is not None else None
        try:
            g = eng.generate(model, arm, text_of(centred_prompt_len(depth, n)), raw=True, n_predict=n,
                             sampler=greedy(), cancel=cancel, ignore_eos=True)
            while True:
                try:
                    next(g)
                except StopIteration as s:
                    gen = s.value
                    break
        finally:
            eng.synth_rates = None
        times = gen.token_times
        span = (times[-1] - times[0]) * 1000.0 if len(times) > 1 else 0.0
        return ({"predicted_n": len(gen.tokens), "predicted_ms": span, "draft_n": gen.draft_n or 0,
                 "draft_n_accepted": gen.draft_accepted or 0}, int(gen.draft_steps or 0))

    one(Arm(), None, 4)  # warm-up

    def plain() -> float | None:
        tm, _ = one(Arm(), None, 1 + steps)
        return tm["predicted_ms"] / (tm["predicted_n"] - 1) if tm["predicted_n"] > 1 else None

    # a first plain step (what capped last steps are priced against); the rounds measure it again
    t1s, _ = stable_rounds("the plain step", plain, min(min_rounds, 3), min(min_rounds, 3), target_rel, cancel)
    t1 = statistics.median(t1s)
    yield ProbeProgress(0, max_rounds, f"plain decode step {t1:.2f} ms (the whole-step probe)")
    step_ms, mid, stable, plains = yield from whole_steps(
        lambda k, r, n: one(Arm(k, 0.0) if k else Arm(), r if k else None, n), t1, max_k, steps, min_rounds,
        max_rounds, target_rel, cancel, interleave=True)
    return step_ms, mid, Spread.of(plains or t1s), stable


def _rse_median(xs: list[float]) -> float:
    """Relative standard error of the median (1.2533 * sd / sqrt(n) / median)."""
    if len(xs) < 3:
        return float("inf")
    med = statistics.median(xs)
    return 1.2533 * statistics.stdev(xs) / (len(xs) ** 0.5) / med if med else float("inf")


class _Helpers:
    def __init__(self, raw: RawContexts):
        self.raw, self.L = raw, raw.L

    def fill(self, b, toks, pos0, logits, embs=None):
        fill_batch(b, toks, pos0, logits, embs, self.raw.hidden_rows, self.raw.model.n_embd)

    def decode(self, ctx, b):
        decode_or_raise(self.L, ctx, b, "the probe")


def save_cost_record(path: str | Path, rec: CostRecord) -> None:
    """Append the cost record to a results file (a UserError naming the file when it cannot)."""
    append_line(path, rec.to_json())


def format_probe(rec: CostRecord) -> str:
    lines = [f"cost probe: {shown(rec.model_path, 400)}" + (f" with drafter {shown(rec.drafter, 400)}" if rec.drafter else ""),
             f"measured {rec.where()}, llama.cpp {rec.llama_build}",
             f"depth {rec.depth}, {rec.threads or 'default'} threads, {rec.rounds} rounds"
             f"{'' if rec.stable else ' (not fully stable: more rounds or a quieter machine would help)'}",
             f"prompt processing: {rec.prompt_tok_s.median:.0f} tok/s"]
    if rec.engine == EngineKind.SERVER and rec.step_ms:
        return "\n".join(lines + _format_steps(rec))
    lines += [f"{'n':>3} {'T(n) ms':>9} {'p10-p90':>15} {'T(n)/T(1)':>10} {'p10-p90':>13}"]
    for n in sorted(rec.t_ms):
        t, r = rec.t_ms[n], rec.ratio[n]
        lines.append(f"{n:>3} {t.median:>9.2f} {t.p10:>7.2f}-{t.p90:<7.2f} {r.median:>10.2f} "
                     f"{r.p10:>6.2f}-{r.p90:<6.2f}")
    if rec.draft_ms:
        d = rec.draft_ms
        lines.append(f"draft step: {d.median:.2f} ms (p10-p90 {d.p10:.2f}-{d.p90:.2f}), "
                     f"{d.median / rec.t_ms[1].median:.0%} of T(1)")
    else:
        lines.append("draft step: - (the model has no MTP heads)")
    if rec.step_ms:
        lines += _format_steps(rec)
    return "\n".join(lines)


def _format_steps(rec: CostRecord) -> list[str]:
    """The llama-server probe's whole steps: per K at full acceptance and full rejection, against
    the plain step, and the middle-rate check."""
    assert rec.step_ms is not None
    t1 = rec.plain_ms or rec.t_ms[1]
    out = [f"plain decode step: {t1.median:.2f} ms (p10-p90 {t1.p10:.2f}-{t1.p90:.2f})",
           "whole speculative step (draft, verify, rollback, catch-up), ms:",
           f"{'K':>3} {'accept all':>11} {'p10-p90':>15} {'reject all':>11} {'p10-p90':>15} {'/plain':>7}"]
    for k in sorted(rec.step_ms):
        a, r = rec.step_ms[k]["accept"], rec.step_ms[k]["reject"]
        out.append(f"{k:>3} {a.median:>11.2f} {a.p10:>7.2f}-{a.p90:<7.2f} {r.median:>11.2f} "
                   f"{r.p10:>7.2f}-{r.p90:<7.2f} {a.median / t1.median:>7.2f}")
    mc = rec.mid_check
    if mc and mc.get("error") is not None:
        ok = abs(mc["error"]) <= MID_TOLERANCE
        out.append(f"middle rate at K={mc['k']} ({mc['accepted_per_step']:.2f} accepted per step): measured "
                   f"{mc['measured_ms']:.2f} ms, the line between the two predicts {mc['predicted_ms']:.2f} ms "
                   f"({100 * mc['error']:+.1f} %: " + ("interpolation holds)" if ok else
                                                       f"beyond {100 * MID_TOLERANCE:.0f} %, a noisy machine?)"))
    return out
