"""Tokens that reach the app in a burst (issue: Confirm showed 64,701 tok/s for the plain command on
the tiny demo model, against 798.6 tok/s in process). llama-server decoded the demo model faster
than the stream was read, so its lines queued and were read together: the arrival times measured
the reading (64 tokens in 0.85 ms, 73,913 tok/s) while the server's own clock said 4,350 tok/s.
Such a run's speed is read from the server's own token stamps; where it sent none, the run fails
with the reason, and no speed is recorded. A recorded run whose tok/s is more than 2x from the
engine's own figure (an old file, a reader held up) has no speed in the analysis or Confirm."""

from __future__ import annotations

import pytest

from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError
from app.core.engines.server.engine import ServerEngine
from app.core.engines.server.process import token_clock
from app.core.records.arm import Arm
from app.core.records.sampler import greedy
from tests.helpers import drained

# recorded: the plain command on the tiny demo model, 64 tokens read within 0.852 ms, the server's
# predicted_ms 14.48 (63 steps after the first token), its stamps one per token
N, FIRST, READ_MS, SERVER_MS = 64, 0.0101, 0.852, 14.48
TIMES = [FIRST + READ_MS / 1000 * i / (N - 1) for i in range(N)]
STAMPS = [0.00021 + SERVER_MS / 1000 * i / (N - 1) for i in range(N)]
TIMINGS = {"predicted_n": N, "predicted_ms": SERVER_MS, "predicted_per_second": 4350.5}


def test_a_burst_is_timed_by_the_servers_stamps():
    times = token_clock(TIMES, STAMPS, TIMINGS)
    tok_s = (N - 1) / (times[-1] - times[0])
    assert times[0] == FIRST and tok_s == pytest.approx((N - 1) / SERVER_MS * 1000)  # 4,351 tok/s, not 73,944


def test_a_burst_without_stamps_is_refused_with_its_reason():
    with pytest.raises(EngineError, match=r"64 tokens reached this client in a burst "
                                          r"\(read within 0.85 ms, decoded in 14.48 ms\).*cannot be measured"):
        token_clock(TIMES, None, TIMINGS)


def test_tokens_read_as_they_came_keep_their_arrival_times():
    steady = [FIRST + SERVER_MS / 1000 * 1.1 * i / (N - 1) for i in range(N)]  # the HTTP read a little slower
    assert token_clock(steady, STAMPS, TIMINGS) is steady
    assert token_clock(TIMES, STAMPS, {}) is TIMES  # no server figure: nothing to tell a burst by


def test_a_reader_held_up_keeps_its_arrival_times_for_the_analysis_to_leave_out():
    late = [FIRST] + [FIRST + 3.0 + READ_MS / 1000 * i / (N - 2) for i in range(N - 1)]  # 3 s held after the first
    assert token_clock(late, STAMPS, TIMINGS) is late  # 21 tok/s: more than 2x from the engine's, clock_off


@pytest.mark.server
def test_a_tiny_model_read_as_fast_as_it_can_is_not_an_impossible_speed(server_bin, make_model):
    """The reproduction on a real llama-server: the tiny calibrated model outruns the reader, whose
    arrival times said 71,603 tok/s where the server's own timings said 4,038 (old code)."""
    eng = ServerEngine(server_bin, ctx_size=2048)
    try:
        model = str(make_model(0.0))
        for _ in range(8):
            g = drained(eng.generate(model, Arm(), "hello world", raw=True, n_predict=64, sampler=greedy(42),
                                     cancel=CancelToken()))[1]
            assert len(g.tokens) == 64 and g.engine_tok_s
            assert g.decode_tok_s <= 2.0 * g.engine_tok_s, (g.decode_tok_s, g.engine_tok_s)
    finally:
        eng.close()


def _burst_confirm():
    """The demo sweep's code runs of the plain command and K=2 as llama-server answered a confirm
    run, two of the three plain runs read in a burst as recorded (64,701 tok/s by the arrival
    times, 4,038 by llama-server's own timings)."""
    import dataclasses

    from app.core.records.reader import load_records
    from app.core.session import confirm as C
    from conftest import ROOT
    from app.core.measure.plan import Plan
    from app.core.records.prompt import Prompt

    k2 = Arm(k=2)
    runs = [dataclasses.replace(r, engine="server", llama_build="b9999", tok_s_engine=r.tok_s)
            for r in load_records(ROOT / "tests" / "data" / "demo_sweep.jsonl")
            if r.status == "ok" and r.task == "code" and r.measured_arm in (Arm(), k2)]
    plain = [i for i, r in enumerate(runs) if r.measured_arm == Arm()]
    for i in plain[:2]:
        runs[i] = dataclasses.replace(runs[i], tok_s=64701.0, tok_s_engine=4038.2)
    plan = Plan(model="m.gguf", arms=(Arm(), k2), prompts=(Prompt("demo-code", "code", "x"),), reps=3)
    return C, C.ConfirmPlan(plan, k2, "code", "demo-code", "inprocess", 50.0, 1.29), runs


def test_confirm_shows_no_speed_that_timed_a_burst():
    C, c, runs = _burst_confirm()
    text = C.confirm_text(c, runs) + C.confirm_headline(c, runs)
    assert "64701" not in text and "64,701" not in text, text
    assert "(the plain command " in text, text  # the one plain run read as it came


def test_a_sweeps_analysis_leaves_a_bursts_speed_out_and_says_why():
    from app.core.analysis.analysis import analyze

    _C, _c, runs = _burst_confirm()
    a = analyze(runs)
    plain = a.cell("code", Arm())
    assert plain.tok_s.n == 1 and plain.tok_s.median < 1000, plain.tok_s
    f = [f for f in a.findings if f.code == "clock_mismatch"]
    assert len(f) == 1 and f[0].message.startswith("in 2 run(s)"), f
    assert "left out (worst: 64,701.0 tok/s against the engine's 4,038.2)" in f[0].message, f[0].message


def test_a_confirm_whose_every_run_timed_a_burst_says_so():
    import dataclasses

    C, c, runs = _burst_confirm()
    runs = [dataclasses.replace(r, tok_s=64701.0, tok_s_engine=4038.2) for r in runs]
    head = C.confirm_headline(c, runs)
    assert head == ("llama-server could not time K=2 on the code prompt demo-code: in 6 of 6 runs the tokens arrived "
                    "in bursts, so their speed timed the reading, not the decoding; close other programs and "
                    "confirm again"), head
    assert "64701" not in C.confirm_text(c, runs) and "bursts" in C.confirm_text(c, runs)
