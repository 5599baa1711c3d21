"""The self-test's timing check (issue 37): does an engine's baseline run at the speed of the decode
step its own cost probe measures?

The count checks (measure.selftest) say a build drafts and accepts what it should; they say nothing
about time. Every speedup is a ratio against the baseline runs, and the break-even model prices a
step with the probe's plain step, so the two must time the same thing. This check measures both on
one calibrated model at one context depth, through the engine being tested, and applies the rule
the verdict applies to a sweep (analysis.fidelity): a gap larger than both their noises (and at
least fidelity.MIN_GAP) fails, with the sentence the verdict would show.

    result = timing_check(settings)          # a TimingCheck
    print(format_timing(result))
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path

from app.core.analysis.fidelity import MIN_GAP, baseline_finding, baseline_gap
from app.core.calibrated import gguf as calibrated_gguf
from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError, UserError
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.factory import make_engine
from app.core.measure.plan import Plan, make_arms
from app.core.measure.events import RunFinished, SweepError
from app.core.measure.runner import run_sweep
from app.core.records.cost import CostRecord
from app.core.records.prompt import Prompt
from app.core.records.schema import RunRecord
from app.core.session.cost_probe import probe_costs

DEPTH = 256  # the probe's depth and the baseline runs' neutral context before the prompt
REPS = 5  # baseline runs (the first of each engine start is a warm-up, not counted)
N_PREDICT = 64
SIZE = "demo"  # ~130 MB: a step long enough that a per-token overhead shows as a share of it
P_REJECT = 0.3
PROMPT = Prompt("selftest-timing", "selftest", "the quick brown fox jumps over the lazy dog")


@dataclasses.dataclass(frozen=True)
class TimingCheck:
    engine: str
    baseline_ms: float | None = None  # median ms a token of the baseline runs
    probe_ms: float | None = None  # the probe's plain step, ms a token
    problem: str | None = None  # the verdict's sentence when they differ by more than the noise
    error: str | None = None  # the check could not run (why)

    @property
    def ok(self) -> bool:
        return self.error is None and self.problem is None and self.baseline_ms is not None

    @property
    def gap(self) -> float | None:
        if self.baseline_ms is None or not self.probe_ms:
            return None
        return self.baseline_ms / self.probe_ms - 1.0


def timing_check(settings: EngineSettings, *, workdir: str | None = None, reps: int = REPS,
                 cancel: CancelToken | None = None) -> TimingCheck:
    """Probe the plain step and time ``reps`` baseline runs on a calibrated model, through
    ``settings``' engine; the TimingCheck says whether they agree (see the module doc)."""
    cancel = cancel or CancelToken()
    kind = EngineKind.parse(settings.kind)
    with tempfile.TemporaryDirectory(prefix="mtp-selftest-timing-", dir=workdir) as tmp:
        model = calibrated_gguf.make_model(Path(tmp) / "timing.gguf", P_REJECT, "embedding", size=SIZE)
        try:
            probe = _probe(settings, str(model), cancel)
            records = _baseline_runs(settings, str(model), reps, cancel)
        except (EngineError, UserError) as e:
            return TimingCheck(kind.value, error=str(e))
    return judge(kind.value, records, probe)


def judge(engine: str, records: list[RunRecord], probe: CostRecord | None) -> TimingCheck:
    """The check's result from the baseline runs and the probe (the verdict's rule)."""
    if probe is None or probe.plain_ms is None:
        return TimingCheck(engine, error="the probe measured no plain step")
    gap = baseline_gap(records, probe)
    if gap is None:
        return TimingCheck(engine, probe_ms=probe.plain_ms.median,
                           error="too few baseline runs finished undisturbed to compare")
    finding = baseline_finding(records, probe)
    return TimingCheck(engine, baseline_ms=gap[1], probe_ms=gap[2],
                       problem=finding.message if finding else None)


def _probe(settings: EngineSettings, model: str, cancel: CancelToken) -> CostRecord | None:
    """The plain step, from the engine's own probe at K = 1 (the narrowest whole-step probe)."""
    rec = None
    for ev in probe_costs(settings, model, depth=DEPTH, max_k=1, cancel=cancel):
        if isinstance(ev, CostRecord):
            rec = ev
    return rec


def _baseline_runs(settings: EngineSettings, model: str, reps: int, cancel: CancelToken) -> list[RunRecord]:
    """``reps`` baseline runs at the probe's depth, through a fresh engine of ``settings``."""
    plan = Plan(model=model, arms=make_arms(()), prompts=(PROMPT,), n_predict=N_PREDICT, reps=reps,
                warmup=1, raw=True, depths=(DEPTH,), engine=EngineKind.parse(settings.kind))
    records: list[RunRecord] = []
    with contextlib.closing(make_engine(settings)) as engine:
        for ev in run_sweep(plan, engine, None, cancel):
            if isinstance(ev, RunFinished):
                records.append(ev.record)
            elif isinstance(ev, SweepError):
                raise EngineError(ev.message)
    return records


def format_timing(c: TimingCheck) -> str:
    """One line: ok/FAIL, the two times and their gap, or why the check could not run."""
    if c.error:
        return f"FAIL timing ({c.engine}): {c.error}"
    head = "ok  " if c.ok else "FAIL"
    gap = c.gap or 0.0
    said = (c.problem if c.problem else
            f"within the noise (a gap below {MIN_GAP:.0%} or twice the spread is not reported)")
    return (f"{head} timing ({c.engine}): baseline {c.baseline_ms:.2f} ms a token, the probe's plain step "
            f"{c.probe_ms:.2f} ms ({gap:+.1%}): {said}")
