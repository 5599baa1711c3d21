"""Self-test of a user's llama.cpp build: calibrated models through it, counts checked exactly
(MTP heads; on llama-server also a Gemma 4 assistant drafter, draft-simple and ngram-mod).

llama.cpp builds have shipped MTP regressions (wrong hidden-state hand-off, broken rollback,
counts off by one). The calibrated models' drafted/accepted counts and tokens are known exactly,
so any difference is a bug in the build (or in this app), found in seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Sequence

from app.core.common.spec_modes import MTP
from app.core.calibrated import design as calibrated, gguf as calibrated_gguf
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.factory import make_engine
from app.core.common.cancel import CancelToken
from app.core.measure.plan import Plan, make_arms
from app.core.records.prompt import Prompt
from app.core.measure.events import RunFailed, RunFinished, SweepError
from app.core.measure.runner import run_sweep
from app.core.records.schema import RunRecord

SELFTEST_PROMPTS = (
    Prompt("selftest-hello", "selftest", "hello world"),
    Prompt("selftest-fox", "selftest", "the quick brown fox jumps over the lazy dog"),
)


NGRAM_TOKENS = 880  # past the calibrated model's 771-token cycle: its text repeats, ngram-mod drafts
PAIR_P = 0.3  # the share of wrong drafts of the drafter pairs


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
    mode: str = MTP  # the arm's --spec-type ("none": the baseline)

    @property
    def ok(self) -> bool:
        return self.error is None and self.tokens_ok and (self.mode == "none" or self.got == self.expected)


def run_selftest(settings: EngineSettings, *, ks: Sequence[int] = (1, 2, 3, 4),
                 p_values: Sequence[float] = (0.0, 0.5, 1.0), variants: Sequence[str] = calibrated.VARIANTS,
                 n_predict: int = 64, workdir: str | None = None,
                 cancel: CancelToken | None = None, modes: bool | None = None) -> Iterator[Check]:
    """Yield one Check per run, on a fresh engine of ``settings`` per model: the calibrated MTP
    models, then (``modes``; default: on llama-server, which runs them) the other modes with
    models whose counts are known as exactly: a Gemma 4 target with its assistant drafter
    (draft-mtp, -md), a draft-simple pair, and ngram-mod on the model's own repeating text."""
    cancel = cancel or CancelToken()
    if modes is None:
        modes = EngineKind.parse(settings.kind) is EngineKind.SERVER
    with tempfile.TemporaryDirectory(prefix="mtp-selftest-", dir=workdir) as tmp:
        for variant in variants:
            for p in p_values:
                cancel.check()
                path = calibrated_gguf.make_model(Path(tmp) / f"cal-{variant}-{p:g}.gguf", p, variant)
                tables = calibrated.load_tables(path)
                plan = Plan(model=str(path), arms=make_arms(ks), prompts=SELFTEST_PROMPTS,
                            n_predict=n_predict, reps=1, warmup=0, raw=True)
                yield from _checks(plan, settings, variant, p, cancel,
                                   lambda r: calibrated.simulate(tables, r.prompt_tokens, r.k or 0, n_predict))
        if modes:
            yield from _mode_checks(settings, Path(tmp), ks, n_predict, cancel)


def _mode_checks(settings: EngineSettings, tmp: Path, ks: Sequence[int], n_predict: int,
                 cancel: CancelToken) -> Iterator[Check]:
    # deferred: the Gemma 4 writer and the mode simulators only when the modes are checked
    from app.core.calibrated import gemma4 as calibrated_gemma4, modes as calibrated_modes

    for variant in ("embedding", "chain"):
        cancel.check()
        target, assistant = calibrated_gemma4.make_gemma4_pair(tmp / f"gemma4-{variant}", PAIR_P, variant)
        g_tables = calibrated_gemma4.pair_tables(PAIR_P, variant)
        plan = Plan(model=str(target), arms=make_arms(ks, drafters={MTP: str(assistant)}),
                    prompts=SELFTEST_PROMPTS, n_predict=n_predict, reps=1, warmup=0, raw=True)

        def pair(r: RunRecord, t: calibrated.Tables = g_tables) -> calibrated.SimResult:
            return calibrated_gemma4.simulate_pair(t, r.prompt_tokens, r.k or 0, n_predict)

        yield from _checks(plan, settings, f"gemma4-{variant}", PAIR_P, cancel, pair)
    cancel.check()
    target, drafter = calibrated_gguf.make_pair(tmp / "draft-simple", PAIR_P)
    t_tab, d_tab = calibrated.load_tables(target), calibrated.load_tables(drafter)
    plan = Plan(model=str(target), arms=make_arms(ks, modes=("draft-simple",), drafters={"draft-simple": str(drafter)}),
                prompts=SELFTEST_PROMPTS, n_predict=n_predict, reps=1, warmup=0, raw=True)
    yield from _checks(plan, settings, "draft-simple", PAIR_P, cancel,
                       lambda r: calibrated_modes.simulate_draft_simple(t_tab, d_tab, r.prompt_tokens, r.k or 0, n_predict))
    cancel.check()
    # ngram-mod: each run on a fresh server (the engine's rule), so from an empty table
    plan = Plan(model=str(target), arms=make_arms((), modes=("ngram-mod",)), prompts=SELFTEST_PROMPTS[:1],
                n_predict=NGRAM_TOKENS, reps=2, warmup=0, raw=True)

    def ngram(r: RunRecord) -> calibrated.SimResult:
        if r.arm_kind == "baseline":
            return calibrated.simulate(t_tab, r.prompt_tokens, 0, NGRAM_TOKENS)
        return calibrated_modes.simulate_ngram_mod(t_tab, r.prompt_tokens, NGRAM_TOKENS)[0]
    yield from _checks(plan, settings, "ngram-mod", 0.0, cancel, ngram)


def _checks(plan: Plan, settings: EngineSettings, variant: str, p: float, cancel: CancelToken,
            predict: Callable[[RunRecord], calibrated.SimResult]) -> Iterator[Check]:
    """One Check per run of ``plan`` on a fresh engine, against ``predict(record)``."""
    with contextlib.closing(make_engine(settings)) as engine:
        for ev in run_sweep(plan, engine, None, cancel):
            if isinstance(ev, RunFinished):
                r = ev.record
                sim = predict(r)
                yield Check(variant, p, r.k, r.prompt_id, (sim.draft_n, sim.draft_accepted),
                            (r.draft_n or 0, r.draft_accepted or 0) if r.arm_kind != "baseline" else (0, 0),
                            tuple(r.output_tokens) == sim.tokens, mode=r.spec_type or "none")
            elif isinstance(ev, RunFailed):
                r = ev.record
                yield Check(variant, p, r.k, r.prompt_id, (0, 0), (None, None), False, r.error or "run failed",
                            mode=r.spec_type or "none")
            elif isinstance(ev, SweepError):
                yield Check(variant, p, ev.arm.k if ev.arm else None, "-", (0, 0), (None, None), False, ev.message,
                            mode=ev.arm.mode if ev.arm else "none")


def format_check(c: Check) -> str:
    arm = "baseline" if c.mode == "none" else (f"K={c.k}" if c.k is not None else c.mode)
    if c.error:
        return f"FAIL {c.variant:<16} p={c.p_reject:<4g} {arm:<9} {c.prompt_id:<16} {c.error}"
    counts = "" if c.mode == "none" else (f"drafted/accepted {c.got[0]}/{c.got[1]} "
                                          f"(expected {c.expected[0]}/{c.expected[1]})")
    toks = "tokens as designed" if c.tokens_ok else "TOKENS DIFFER from the designed chain"
    return (f"{'ok  ' if c.ok else 'FAIL'} {c.variant:<16} p={c.p_reject:<4g} {arm:<9} "
            f"{c.prompt_id:<16} {counts}{'; ' if counts else ''}{toks}")
