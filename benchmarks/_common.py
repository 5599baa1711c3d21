"""Shared helpers for the benchmark scripts (not tests: they print figures for the notes)."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.calibrated import gguf as calibrated_gguf# noqa: E402
from app.core.common.cancel import CancelToken  # noqa: E402


def bench_model(p: float, variant: str = "embedding", size: str = "bench", seed: int = 0) -> Path:
    """The bench-size calibrated model (~0.9 GB; ``size="demo"``: ~130 MB), written once into the
    cache folder; ``seed`` other than 0 designs another one (its own file)."""
    from app.core.common.paths import cache_dir

    path = cache_dir() / "models" / (f"calibrated-{size}-{variant}-p{p:g}" + (f"-s{seed}" if seed else "") + ".gguf")
    if not path.exists():
        t0 = time.monotonic()
        print(f"writing {path} ...", file=sys.stderr, flush=True)
        calibrated_gguf.make_model(path, p, variant, size=size, seed=seed)
        print(f"  {path.stat().st_size / 2**20:.0f} MiB in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return path


def run_one(engine, model, k, text, n_predict, p_min=0.0, raw=True):
    from app.core.records.arm import Arm
    from app.core.records.sampler import greedy

    g = engine.generate(str(model), Arm(k, p_min) if k else Arm(), text, raw=raw, n_predict=n_predict,
                        sampler=greedy(1), cancel=CancelToken())
    while True:
        try:
            next(g)
        except StopIteration as s:
            return s.value


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def threads() -> int:
    return int(os.environ.get("BENCH_THREADS", os.cpu_count() or 2))
