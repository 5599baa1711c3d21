"""Cost probe: what a verify pass of n tokens costs against one token, what one draft step costs,
and prompt speed, at a given context depth. The "can MTP pay on this machine?" pre-check.

Runs on any GGUF (the draft step only where the model has MTP heads). Sizes are visited in a new
random order every round, so slow drift hits all of them alike; rounds repeat until the medians
are stable. Ratios T(n)/T(1) are taken within a round (paired), then summarised.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.factory import make_inprocess
from app.core.engines.inprocess import RawContexts
from app.core.engines.llama_backend import decode_or_raise, fill_batch
from app.core.records.cost import DEFAULT_DEPTH, CostRecord, Spread
from app.core.records.schema import SCHEMA_VERSION, host_info, new_id, utc_now
from app.core.records.writer import append_line


@dataclasses.dataclass(frozen=True)
class ProbeProgress:
    round: int
    max_rounds: int
    message: str


def run_probe(model: str, *, depth: int = DEFAULT_DEPTH, max_batch: int = 9, threads: int | None = None,
              min_rounds: int = 5, max_rounds: int = 25, target_rel: float = 0.05,
              n_gpu_layers: str | None = None, cancel: CancelToken | None = None,
              seed: int = 0) -> Iterator[ProbeProgress | CostRecord]:
    """Yield progress, then the CostRecord. Stops early once every median is stable (the
    relative standard error of each T(n) median below ``target_rel`` / 2) after ``min_rounds``."""
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
        yield CostRecord(
            schema_version=SCHEMA_VERSION, record_type="cost", run_id=new_id(), engine="inprocess",
            llama_build=eng.build, model_path=str(Path(model).resolve()),
            model_size=Path(model).stat().st_size, depth=depth, max_batch=max_batch, threads=eng.threads,
            t_ms={n: Spread.of(samples[n]) for n in sizes},
            ratio={n: Spread.of(ratios[n]) for n in sizes},
            draft_ms=Spread.of(drafts) if drafts else None,
            catchup_ms={n: Spread.of(v) for n, v in catchups.items()} if drafts else None,
            prompt_tok_s=Spread.of(pp), rounds=rounds,
            stable=stable, timestamp_utc=utc_now(), host=host_info())
    finally:
        eng.close()


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
    lines = [f"cost probe: {rec.model_path}", f"depth {rec.depth}, {rec.threads} threads, {rec.rounds} rounds"
             f"{'' if rec.stable else ' (not fully stable: more rounds or a quieter machine would help)'}",
             f"prompt processing: {rec.prompt_tok_s.median:.0f} tok/s",
             f"{'n':>3} {'T(n) ms':>9} {'p10-p90':>15} {'T(n)/T(1)':>10} {'p10-p90':>13}"]
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
    return "\n".join(lines)
