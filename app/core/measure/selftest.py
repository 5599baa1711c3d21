"""Self-test of a user's llama.cpp build: calibrated models through it, counts checked exactly.

llama.cpp builds have shipped MTP regressions (wrong hidden-state hand-off, broken rollback,
counts off by one). The calibrated models' drafted/accepted counts and tokens are known exactly,
so any difference is a bug in the build (or in this app), found in seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import Iterator

from app.core.engines import calibrated, calibrated_gguf
from app.core.engines.base import EngineSettings
from app.core.engines.factory import make_engine
from app.core.common.cancel import CancelToken
from app.core.measure.plan import Plan, make_arms
from app.core.records.prompt import Prompt
from app.core.measure.runner import RunFailed, RunFinished, SweepError, run_sweep

SELFTEST_PROMPTS = (
    Prompt("selftest-hello", "selftest", "hello world"),
    Prompt("selftest-fox", "selftest", "the quick brown fox jumps over the lazy dog"),
)


@dataclasses.dataclass(frozen=True)
class Check:
    variant: str
    p_reject: float
    k: int | None
    prompt_id: str
    expected: tuple[int, int]  # (draft_n, accepted)
    got: tuple[int | None, int | None]
    tokens_ok: bool
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.tokens_ok and (self.k is None or self.got == self.expected)


def run_selftest(settings: EngineSettings, *, ks=(1, 2, 3, 4), p_values=(0.0, 0.5, 1.0),
                 variants=calibrated.VARIANTS, n_predict: int = 64, workdir: str | None = None,
                 cancel: CancelToken | None = None) -> Iterator[Check]:
    """Yield one Check per run, on a fresh engine of ``settings`` per model."""
    cancel = cancel or CancelToken()
    with tempfile.TemporaryDirectory(prefix="mtp-selftest-", dir=workdir) as tmp:
        for variant in variants:
            for p in p_values:
                cancel.check()
                path = calibrated_gguf.make_model(Path(tmp) / f"cal-{variant}-{p:g}.gguf", p, variant)
                tables = calibrated.load_tables(path)
                plan = Plan(model=str(path), arms=make_arms(ks), prompts=SELFTEST_PROMPTS,
                            n_predict=n_predict, reps=1, warmup=0, raw=True)
                with contextlib.closing(make_engine(settings)) as engine:
                    for ev in run_sweep(plan, engine, None, cancel):
                        if isinstance(ev, RunFinished):
                            r = ev.record
                            sim = calibrated.simulate(tables, r.prompt_tokens, r.k or 0, n_predict)
                            yield Check(variant, p, r.k, r.prompt_id, (sim.draft_n, sim.draft_accepted),
                                        (r.draft_n or 0, r.draft_accepted or 0) if r.k else (0, 0),
                                        tuple(r.output_tokens) == sim.tokens)
                        elif isinstance(ev, RunFailed):
                            r = ev.record
                            yield Check(variant, p, r.k, r.prompt_id, (0, 0), (None, None), False,
                                        r.error or "run failed")
                        elif isinstance(ev, SweepError):
                            yield Check(variant, p, ev.arm.k if ev.arm else None, "-", (0, 0),
                                        (None, None), False, ev.message)


def format_check(c: Check) -> str:
    arm = "baseline" if c.k is None else f"K={c.k}"
    if c.error:
        return f"FAIL {c.variant:<9} p={c.p_reject:<4g} {arm:<8} {c.prompt_id:<16} {c.error}"
    counts = "" if c.k is None else (f"drafted/accepted {c.got[0]}/{c.got[1]} "
                                     f"(expected {c.expected[0]}/{c.expected[1]})")
    toks = "tokens as designed" if c.tokens_ok else "TOKENS DIFFER from the designed chain"
    return (f"{'ok  ' if c.ok else 'FAIL'} {c.variant:<9} p={c.p_reject:<4g} {arm:<8} "
            f"{c.prompt_id:<16} {counts}{'; ' if counts else ''}{toks}")
