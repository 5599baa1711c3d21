"""The llama-server engine against the real binary, on calibrated models with known answers."""

from __future__ import annotations

import threading

import psutil
import pytest

from app.core.calibrated import design as calibrated
from app.core.common.cancel import CancelToken
from app.core.measure.plan import Plan, make_arms
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFailed, RunFinished, SweepError, SweepFinished, TokenProgress
from app.core.engines.server.engine import ServerEngine
from app.core.analysis.analysis import analyze
from app.core.analysis.fields import format_analysis

pytestmark = pytest.mark.server

PROMPTS = (Prompt("hello", "code", "hello world"),
           Prompt("cats", "story", "Write a story about 101 cats."))


_MADE: list[ServerEngine] = []


def engine(server_bin, **kw):
    kw.setdefault("ctx_size", 2048)
    eng = ServerEngine(server_bin, **kw)
    _MADE.append(eng)
    return eng


@pytest.fixture(autouse=True)
def _close_engines():
    """The caller owns an engine: each test's engines are closed when it ends."""
    yield
    while _MADE:
        _MADE.pop().close()


@pytest.mark.parametrize("variant", ["embedding", "hidden"])
@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_counts_and_tokens_equal_the_simulator(server_bin, make_model, tmp_path, variant, p):
    path = make_model(p, variant)
    tables = calibrated.load_tables(path)
    plan = Plan(model=str(path), arms=make_arms([1, 2, 3, 4]), prompts=PROMPTS, n_predict=80, reps=1,
                warmup=0)
    events = list(run_sweep(plan, engine(server_bin), ResultsWriter(tmp_path / "r.jsonl")))
    recs = [e.record for e in events if isinstance(e, RunFinished)]
    assert len(recs) == 10, [e for e in events if not isinstance(e, (RunFinished, TokenProgress))]
    base = {r.prompt_id: r for r in recs if r.k is None}
    for r in recs:
        sim = calibrated.simulate(tables, r.prompt_tokens, r.k or 0, 80)
        assert r.output_tokens == sim.tokens, (r.k, r.prompt_id)
        assert r.output_tokens == base[r.prompt_id].output_tokens  # lossless at greedy
        if r.k is None:
            assert r.draft_n in (None, 0) and r.arm_kind == "baseline"
        else:
            assert (r.draft_n, r.draft_accepted) == (sim.draft_n, sim.draft_accepted), (r.k, r.prompt_id)
            assert r.mtp_engaged is True and "mtp_not_engaged" not in r.flags
        assert r.n_generated == 80 and r.tok_s and r.tok_s_engine
    # the chat template was applied: the story prompt starts with <|im_start|>
    assert base["cats"].prompt_tokens[0] == calibrated.N_VOCAB - 2
    assert len(load_records(tmp_path / "r.jsonl")) == 10


def test_mtp_that_did_not_engage_is_flagged(server_bin, make_model, tmp_path):
    # a minimum draft length above K makes llama-server drop every draft: MTP "on", nothing drafted
    plan = Plan(model=str(make_model(0.0)), arms=(Arm(), Arm(2)), prompts=PROMPTS[:1], n_predict=40,
                reps=1, warmup=0)
    eng = engine(server_bin, extra_args=("--spec-draft-n-min", "16"))
    events = list(run_sweep(plan, eng))
    mtp = [e.record for e in events if isinstance(e, RunFinished) and e.record.k == 2]
    assert mtp and mtp[0].mtp_engaged is False and "mtp_not_engaged" in mtp[0].flags
    assert any("did not engage" in getattr(e, "message", "") for e in events)
    a = analyze([e.record for e in events if isinstance(e, RunFinished)])
    assert [c.not_engaged for c in a.cells if c.arm.k == 2] == [1]
    text = format_analysis(a)
    assert "MTP did not engage in 1 MTP run(s)" in text, text


def _server_pids() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True) if "llama-server" in p.name()]


def test_cancel_cuts_the_run_in_flight_and_leaves_no_server(server_bin, make_model):
    """Cancel aborts the stream at once (the run in flight is cut, not let finish its 7000 tokens)
    and stops the server. Counted in events and tokens, not timed: the time from cancel to a
    stopped sweep is measured by benchmarks/cancel_latency.py."""
    n_predict = 7000
    plan = Plan(model=str(make_model(0.0)), arms=(Arm(), Arm(3)), prompts=PROMPTS[:1], n_predict=n_predict,
                reps=3, warmup=0)
    cancel = CancelToken()
    events: list = []
    started = threading.Event()

    def consume():
        with engine(server_bin, ctx_size=8192) as eng:
            for ev in run_sweep(plan, eng, None, cancel):
                events.append(ev)
                if isinstance(ev, TokenProgress) and ev.n_tokens > 50:
                    started.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    assert started.wait(120), "no tokens arrived"
    assert _server_pids()
    cancel.cancel()
    at_cancel = [e for e in list(events) if isinstance(e, TokenProgress)][-1]
    # a guard against a hang, not a speed target: the stop path allows llama-server
    # STOP_GRACE_S after SIGINT and 5 s after the kill
    t.join(30)
    assert not t.is_alive(), "the sweep did not end after cancel"
    assert isinstance(events[-1], SweepFinished) and events[-1].cancelled
    assert not any(isinstance(e, (RunFinished, RunFailed)) for e in events), events  # cut, not recorded
    # what the run received after the cancel is only what the server had already sent (still in
    # the socket): far from the rest of the 7000 tokens it would have streamed without the abort
    last = [e for e in events if isinstance(e, TokenProgress) and e.index == at_cancel.index][-1]
    assert last.n_tokens < n_predict // 2, (at_cancel.n_tokens, last.n_tokens)
    assert _server_pids() == []


def test_killed_server_is_recorded_as_failed_restarted_and_the_sweep_goes_on(server_bin, make_model, tmp_path):
    plan = Plan(model=str(make_model(0.0)), arms=(Arm(),), prompts=PROMPTS[:1], n_predict=2500, reps=4,
                warmup=0)
    out = tmp_path / "r.jsonl"
    eng = engine(server_bin, ctx_size=4096)
    killed = False
    events = []
    for ev in run_sweep(plan, eng, ResultsWriter(out)):
        events.append(ev)
        if isinstance(ev, TokenProgress) and ev.index == 1 and not killed and ev.n_tokens > 10:
            for pid in _server_pids():
                psutil.Process(pid).kill()
            killed = True
    assert killed
    kinds = [(type(e).__name__, e.record.rep) for e in events if isinstance(e, (RunFinished, RunFailed))]
    assert kinds == [("RunFinished", 0), ("RunFailed", 1), ("RunFinished", 2), ("RunFinished", 3)]
    failed = [e.record for e in events if isinstance(e, RunFailed)][0]
    assert failed.status == "failed" and "llama-server" in failed.error
    assert eng.starts == 2
    recs = load_records(out)
    assert [r.status for r in recs] == ["ok", "failed", "ok", "ok"]
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.n_ok == 3 and fin.n_failed == 1


def test_model_without_mtp_heads_runs_baseline_and_says_why(server_bin, make_model):
    path = make_model(0.0, mtp=False)
    plan = Plan(model=str(path), arms=make_arms([2]), prompts=PROMPTS[:1], n_predict=16, reps=1, warmup=0)
    events = list(run_sweep(plan, engine(server_bin)))
    errs = [e.message for e in events if isinstance(e, SweepError)]
    assert len(errs) == 1 and str(path) in errs[0] and "nextn_predict_layers" in errs[0]
    assert [e.record.arm_kind for e in events if isinstance(e, RunFinished)] == ["baseline"]


def test_server_start_failure_reports_the_servers_reason(server_bin, make_model, tmp_path):
    """Bypass our own header check: llama-server's own reason must reach the user."""
    from app.core.common.errors import EngineError
    from app.core.engines.server.process import ServerProcess

    eng = engine(server_bin)
    cfg = eng.config_for(str(make_model(0.0, mtp=False)), Arm(2))
    srv = ServerProcess(eng.binary, eng.caps, cfg)
    with pytest.raises(EngineError, match="MTP") as ei:
        srv.start(timeout=60)
    assert "failed to create MTP context" in str(ei.value) or "doesn't contain MTP" in str(ei.value)
    assert not srv.alive()


def test_a_server_a_request_could_not_reach_is_replaced_not_reused(server_bin, make_model):
    """After a SIGKILL the socket closes before the process can be reaped, so "is it running?"
    still says yes for a moment; the runs after it went to the dying server and all failed
    (connection refused). A request that breaks off now marks the server broken: the next run
    gets a fresh one. Made deterministic here by pointing the server's port at a closed one."""
    from app.core.common.errors import EngineError
    from app.core.engines.server.process import free_port

    eng = engine(server_bin)
    try:
        cfg = eng.config_for(str(make_model(0.0)), Arm())
        first = eng.server(cfg, CancelToken())
        assert eng.server(cfg, CancelToken()) is first and eng.starts == 1
        old_pid = first.pid
        first.port = free_port()  # nothing listens there: every request is refused
        with pytest.raises(EngineError, match="request /slots failed"):
            first.request_json("GET", "/slots")
        assert first.broken and not first.alive()
        second = eng.server(cfg, CancelToken())
        assert second is not first and eng.starts == 2
        assert second.request_json("GET", "/health")["status"] == "ok"
        assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        eng.close()
