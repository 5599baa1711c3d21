"""The self-test's timing check (issue 37): the baseline against the probe's plain step, by the
verdict's own rule, on recorded runs; and the check run for real through the in-process engine."""

from __future__ import annotations

import dataclasses

from app.core.engines.base import EngineKind, EngineSettings
from app.core.records.cost import Spread
from app.core.records.reader import load_records
from app.core.session import selftest_timing
from app.core.session.selftest_timing import format_timing, judge, timing_check
from tests.helpers import clear_sweep_file, fake_costs


def _recorded(tmp_path, plain_ms: float):
    """The recorded clear sweep (baseline 25 ms a token) and a probe whose plain step took ``plain_ms``."""
    clear_sweep_file(tmp_path / "r.jsonl", model="/m/cal.gguf")
    recs = load_records(tmp_path / "r.jsonl")
    sp = Spread(plain_ms, plain_ms * 0.98, plain_ms * 1.02, 9)
    probe = dataclasses.replace(fake_costs({1: 25.0}, 4.0), plain_ms=sp, model_path="/m/cal.gguf",
                                llama_build=recs[0].llama_build, engine="inprocess")
    return recs, probe


def test_a_slow_baseline_fails_the_self_test_with_the_verdicts_sentence(tmp_path):
    recs, probe = _recorded(tmp_path, 20.0)
    c = judge("inprocess", recs, probe)
    assert not c.ok and c.error is None
    line = format_timing(c)
    assert line.startswith("FAIL timing (inprocess): baseline 25.")
    assert "the probe's plain step 20.00 ms (+25" in line
    assert "the baseline ran 25% slower than the decode step the probe measured" in line


def test_a_baseline_at_the_probes_step_passes(tmp_path):
    recs, probe = _recorded(tmp_path, 25.5)
    c = judge("inprocess", recs, probe)
    assert c.ok, c
    assert format_timing(c).startswith("ok   timing (inprocess): baseline 25.")
    assert "within the noise" in format_timing(c)


def test_no_plain_step_or_no_runs_is_a_failure_that_says_why(tmp_path):
    recs, probe = _recorded(tmp_path, 25.0)
    assert "no plain step" in format_timing(judge("inprocess", recs, dataclasses.replace(probe, plain_ms=None)))
    c = judge("inprocess", [r for r in recs if r.arm_kind != "baseline"], probe)
    assert not c.ok and "too few baseline runs" in format_timing(c)


def test_the_check_runs_through_the_in_process_engine(monkeypatch, tmp_path):
    """For real, on the tiny calibrated model: both times measured, the gap computed and judged
    (whether it passes depends on this machine's load, so only that it judged is asserted)."""
    monkeypatch.setattr(selftest_timing, "SIZE", "tiny")
    c = timing_check(EngineSettings(kind=EngineKind.INPROCESS, threads=2), workdir=str(tmp_path), reps=3)
    assert c.error is None, c.error
    assert c.engine == "inprocess" and c.baseline_ms and c.probe_ms and c.baseline_ms > 0 and c.probe_ms > 0
    assert (c.problem is None) == c.ok
