"""The two engines must agree (issue 37): each engine times its baseline and its speculative arms
by one clock in one loop, and a verdict says so when the sweep's baseline ran slower or faster
than the plain decode step its own cost probe measured."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from app.core.analysis.fidelity import CODE, baseline_finding, baseline_gap
from app.core.records.cost import Spread
from app.core.records.reader import load_records
from app.core.verdict.report import verdict_text
from app.core.verdict.verdict import build_verdict
from tests.helpers import clear_sweep_file, fake_costs, generated

COSTS = {1: 25.0, 2: 27.0, 3: 29.0, 4: 31.0}


def _probe(plain_ms: float, spread: float = 0.02, **over):
    sp = Spread(plain_ms, plain_ms * (1 - spread), plain_ms * (1 + spread), 9)
    return dataclasses.replace(fake_costs(COSTS, 4.0), plain_ms=sp, **over)


def _sweep(tmp_path):
    """The recorded clear sweep (in process): its baseline runs at 40 tok/s, 25 ms a token."""
    recs = clear_sweep_file(tmp_path / "r.jsonl", model="/m/cal.gguf")
    llama_build = recs[0].llama_build
    return load_records(tmp_path / "r.jsonl"), llama_build


def test_a_baseline_slower_than_the_probes_plain_step_is_said_with_the_verdict(tmp_path):
    recs, build = _sweep(tmp_path)
    probe = _probe(20.0, model_path="/m/cal.gguf", llama_build=build, engine="inprocess")
    gap, base_ms, probe_ms = baseline_gap(recs, probe)
    assert base_ms == pytest.approx(25.0, rel=0.02) and probe_ms == 20.0 and gap == pytest.approx(0.25, abs=0.02)
    v = build_verdict(recs, cost_records=[probe])
    assert v.cost_probe is probe
    f = next(f for f in v.analysis.findings if f.code == CODE)
    assert "the baseline ran 25% slower than the decode step the probe measured" in f.message
    assert "the speedups may read high" in f.message
    assert "the baseline ran 25% slower" in verdict_text(v)


def test_a_fast_baseline_reads_low_and_a_baseline_within_the_noise_says_nothing(tmp_path):
    recs, build = _sweep(tmp_path)
    fast = baseline_finding(recs, _probe(30.0, model_path="/m/cal.gguf", llama_build=build, engine="inprocess"))
    assert fast is not None and "faster" in fast.message and "may read low" in fast.message
    assert baseline_finding(recs, _probe(24.0, model_path="/m/cal.gguf", llama_build=build,
                                         engine="inprocess")) is None  # 4 %: within MIN_GAP
    # a noisy probe widens what counts as noise: 25 % apart, but its plain step spread +-30 %
    assert baseline_finding(recs, _probe(20.0, 0.3, model_path="/m/cal.gguf", llama_build=build,
                                         engine="inprocess")) is None
    # no plain step (an old probe), or a probe through the other engine: no check
    assert baseline_finding(recs, dataclasses.replace(_probe(20.0), plain_ms=None)) is None
    assert baseline_finding(recs, _probe(20.0, engine="server")) is None


# ---- one clock, one loop: recorded clocks, no live timing ---------------------------------------

STEP = 0.5  # each reading of the recorded clock: 0.5 s later (exact in binary, so every difference is)


def _recorded_clock():
    ticks = itertools.count()
    return lambda: next(ticks) * STEP


def _times_from(g) -> bool:
    """Every token time is a whole number of the recorded clock's steps from the loop's start."""
    return bool(g.token_times) and all((t / STEP).is_integer() for t in g.token_times)


def _run(eng, model, k, n=24):
    return generated(eng, model, k, n=n)


def test_in_process_baseline_and_mtp_are_timed_by_one_clock_in_one_loop(make_model, monkeypatch):
    """The in-process engine's plain decoding is K = 0 of the decode loop its MTP arms run in:
    with the loop's clock replaced by a recorded one, both arms' token times come from it (a
    baseline timed by another clock or loop would not)."""
    from app.core.engines import decode_loop
    from app.core.engines.inprocess import InProcessEngine

    model = make_model(0.3)
    with InProcessEngine(ctx_size=512, threads=1) as eng:
        for k in (None, 2):
            monkeypatch.setattr(decode_loop, "clock", _recorded_clock())
            g = _run(eng, model, k)
            assert _times_from(g), (k, g.token_times[:5])
            assert g.decode_tok_s is not None  # tok/s comes from those times: none was left out


@pytest.mark.server
def test_server_baseline_and_mtp_are_timed_by_one_clock_in_one_loop(make_model, server_bin, monkeypatch):
    """llama-server's arms: the client's one clock reads every token's arrival, baseline and MTP."""
    from app.core.engines.server import process
    from app.core.engines.server.engine import ServerEngine

    model = make_model(0.3)
    eng = ServerEngine(server_bin, ctx_size=512, threads=1)
    try:
        for k in (None, 2):
            monkeypatch.setattr(process, "clock", _recorded_clock())
            g = _run(eng, model, k)
            assert _times_from(g), (k, g.token_times[:5])
    finally:
        eng.close()


def test_the_window_shows_the_slow_baseline_beside_the_verdict(window, tmp_path):
    """A recorded sweep whose baseline ran 25 % slower than its probe's plain step, the probe in
    the same results file: the Results tab's verdict carries the warning."""
    from PySide6.QtWidgets import QLabel

    from app.core.records.writer import append_line

    recs, build = _sweep(tmp_path)
    probe = _probe(20.0, model_path="/m/cal.gguf", llama_build=build, engine="inprocess")
    append_line(tmp_path / "r.jsonl", probe.to_json())
    window.results_tab.open_results(str(tmp_path / "r.jsonl"))
    shown = " ".join(w.text() for w in window.results_tab.findChildren(QLabel))
    assert "the baseline ran 25% slower than the decode step the probe measured" in shown
