"""The in-process engine (llama-cpp-python, low-level MTP loop) on calibrated models."""

from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
import psutil
import pytest

from app.core.calibrated import design as calibrated
from app.core.common.cancel import CancelToken
from app.core.common.errors import ModelFileError
from app.core.engines import llama_backend
from app.core.engines.inprocess import InProcessEngine
from app.core.measure.plan import Plan, make_arms
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished, SweepError, SweepStarted, TokenProgress
from tests.helpers import generated

PROMPTS = (Prompt("hello", "code", "hello world"),
           Prompt("cats", "story", "Write a story about 101 cats."))


gen = generated  # one request to its end (tests/helpers.py)


@pytest.mark.parametrize("variant", ["embedding", "hidden"])
def test_counts_equal_the_simulator_with_one_load_per_model(make_model, variant):
    with InProcessEngine(ctx_size=2048) as eng:
        for p in (0.0, 0.5, 1.0):
            path = make_model(p, variant)
            tables = calibrated.load_tables(path)
            plan = Plan(model=str(path), arms=make_arms([1, 2, 3, 4], [0.0, 0.5]), prompts=PROMPTS,
                        engine="inprocess", n_predict=70, reps=1, warmup=1)
            loads_before = eng.loads
            events = list(run_sweep(plan, eng))
            recs = [e.record for e in events if isinstance(e, RunFinished)]
            assert len(recs) == plan.total_runs == 2 * 10  # 8 MTP arms: a second baseline after 4
            assert eng.loads == loads_before + 1  # nine configurations, one model load
            base = {r.prompt_id: r.output_tokens for r in recs if r.k is None}
            for r in recs:
                sim = calibrated.simulate(tables, r.prompt_tokens, r.k or 0, 70)
                assert r.output_tokens == sim.tokens == base[r.prompt_id]
                assert r.engine == "inprocess"
                if r.k:
                    assert (r.draft_n, r.draft_accepted) == (sim.draft_n, sim.draft_accepted), (p, r.k, r.prompt_id)
        eng.close()


def test_hidden_variant_catches_a_wrong_hand_off(make_model, monkeypatch):
    """Feeding the MTP head the hidden state of the wrong position changes the counts: the
    hidden variant sees it (the embedding variant could not)."""
    from app.core.engines import decode_loop

    path = make_model(0.0, "hidden")
    eng = InProcessEngine(ctx_size=2048)
    good = gen(eng, path, 2)
    assert good.draft_accepted == calibrated.simulate(calibrated.load_tables(path), good.prompt_tokens, 2, 60).draft_accepted
    orig = decode_loop.DecodeLoop._verify

    def off_by_one(self, id_last, n_past, draft):
        ids = orig(self, id_last, n_past, draft)
        self.pending_h = self._last_H[max(0, len(ids) - 2)].copy()
        return ids

    orig_th = decode_loop.DecodeLoop._target_h

    def keep_h(self, n):
        self._last_H = orig_th(self, n)
        return self._last_H

    monkeypatch.setattr(decode_loop.DecodeLoop, "_target_h", keep_h)
    monkeypatch.setattr(decode_loop.DecodeLoop, "_verify", off_by_one)
    bad = gen(eng, path, 2)
    eng.close()
    assert bad.draft_accepted < good.draft_accepted
    assert bad.tokens == good.tokens  # still lossless: only the drafts went wrong


def test_recurrent_state_after_rejections_equals_plain_decode(make_model):
    path = make_model(0.5, "embedding")
    eng = InProcessEngine(ctx_size=2048)
    for k in (1, 3, 4):
        mtp = gen(eng, path, k, n=90)
        assert mtp.draft_n > mtp.draft_accepted > 0  # there were rejections and rollbacks
        s_mtp = np.frombuffer(eng.target_state(), dtype=np.uint8)
        base = gen(eng, path, None, n=90)
        s_base = np.frombuffer(eng.target_state(), dtype=np.uint8)
        assert mtp.tokens == base.tokens
        assert s_mtp.size == s_base.size and s_mtp.size > 10_000
        n = s_mtp.size // 4 * 4
        a, b = s_mtp[:n].view(np.float32), s_base[:n].view(np.float32)
        finite = np.isfinite(a) & np.isfinite(b)
        assert np.array_equal(np.isfinite(a), np.isfinite(b))
        assert np.max(np.abs(a[finite] - b[finite])) < 1e-4, k
    eng.close()


def test_temperature_with_seed_is_reproducible_and_lossless_on_the_calibrated_model(make_model):
    path = make_model(0.3)
    eng = InProcessEngine(ctx_size=2048)
    a = gen(eng, path, 3, temperature=0.8, seed=5)
    b = gen(eng, path, 3, temperature=0.8, seed=5)
    base = gen(eng, path, None, temperature=0.8, seed=9)
    eng.close()
    assert a.tokens == b.tokens == base.tokens  # the designed margin makes sampling deterministic
    assert (a.draft_n, a.draft_accepted) == (b.draft_n, b.draft_accepted)


def test_p_min_stops_drafting_early(make_model):
    path = make_model(0.0)
    eng = InProcessEngine(ctx_size=2048)
    full = gen(eng, path, 3, p_min=0.5)
    none = gen(eng, path, 3, p_min=1.01)  # no draft is ever that sure: MTP drafts nothing
    eng.close()
    assert full.draft_n > 0 and none.draft_n == 0
    assert full.tokens == none.tokens


def test_model_without_mtp_runs_baseline_and_says_why(make_model):
    path = make_model(0.0, mtp=False)
    plan = Plan(model=str(path), arms=(Arm(), Arm(2)), prompts=PROMPTS[:1], engine="inprocess",
                n_predict=20, reps=1, warmup=0)
    with InProcessEngine(ctx_size=1024) as eng:
        events = list(run_sweep(plan, eng))
    errs = [e.message for e in events if isinstance(e, SweepError)]
    assert len(errs) == 1 and "nextn_predict_layers" in errs[0] and str(path) in errs[0]
    assert [e.record.arm_kind for e in events if isinstance(e, RunFinished)] == ["baseline"]


@pytest.mark.parametrize("case", ["empty", "random", "trunc_data"])
def test_bad_files_are_clear_errors(tmp_path, make_model, case):
    import os

    good = make_model(0.0).read_bytes()
    p = tmp_path / "bad.gguf"
    p.write_bytes({"empty": b"", "random": os.urandom(5000), "trunc_data": good[:2_000_000]}[case])
    eng = InProcessEngine()
    with pytest.raises(ModelFileError, match=str(p)):
        gen(eng, p, None)


def _release_free_heap() -> None:
    """Hand freed heap back to the OS before RSS is read (glibc's malloc_trim). Without it, a
    busy machine showed a one-off 30 MiB step in one cycle out of 20: memory freed but kept by
    malloc's arenas, not a leak (after a trim every cycle read the same). Leaked memory is still
    allocated, so the trim cannot hide it."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (e.g. musl): measure as is
            pass


def test_no_native_memory_growth_across_load_close_cycles(make_model):
    path = make_model(0.5)
    proc = psutil.Process()

    def cycle():
        eng = InProcessEngine(ctx_size=2048)
        gen(eng, path, 2, n=16)
        eng.close()
        gc.collect()
        _release_free_heap()

    for _ in range(5):
        cycle()
    rss5 = proc.memory_info().rss
    for _ in range(15):
        cycle()
    growth = proc.memory_info().rss - rss5
    assert growth < 24 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 15 load/close cycles"


def test_progress_events_and_cancel(make_model):
    path = make_model(0.0)
    cancel = CancelToken()
    plan = Plan(model=str(path), arms=(Arm(),), prompts=PROMPTS[:1], engine="inprocess", n_predict=4000,
                reps=5, warmup=0)
    eng = InProcessEngine(ctx_size=8192)
    seen = []
    for ev in run_sweep(plan, eng, None, cancel):
        seen.append(ev)
        if isinstance(ev, TokenProgress):
            cancel.cancel()
    assert isinstance(seen[0], SweepStarted)
    assert seen[-1].cancelled and not any(isinstance(e, RunFinished) for e in seen)
    assert eng._m is not None  # the runner leaves the engine to its owner
    eng.close()
    assert eng._m is None


def test_context_size_zero_is_the_models_own(make_model):
    """ctx_size 0 (the CLI's and the window's "model's own") gives the context the GGUF was
    trained for; it was refused before (every prompt "exceeded the context size 0")."""
    from app.core.machine.gguf_info import read_header

    path = make_model(0.0)
    with InProcessEngine(ctx_size=0) as eng:
        g = gen(eng, path, 2, n=20)
        assert len(g.tokens) == 20
        own = read_header(path).metadata["qwen35.context_length"]
        assert eng.n_ctx() == own == 8192
    with InProcessEngine(ctx_size=512) as eng, pytest.raises(Exception, match="exceed the context size 512"):
        gen(eng, path, 2, n=600)


def test_every_target_context_runs_on_the_engines_threadpool_freed_after_them(make_model, monkeypatch):
    """As llama-server's target context (issue 37): one persistent ggml pool of the engine's
    threads, attached to each target context (the baseline's and each K's), freed once on close
    after the contexts (a context without one makes a pool for every graph)."""
    from app.core.engines import inprocess

    calls = []
    monkeypatch.setattr(inprocess, "new_threadpool", lambda n: calls.append(("new", n)) or llama_backend.new_threadpool(n))
    monkeypatch.setattr(inprocess, "attach_threadpool", lambda ctx, tp: calls.append(("attach", tp)) or llama_backend.attach_threadpool(ctx, tp))
    monkeypatch.setattr(inprocess, "free_threadpool", lambda tp: calls.append(("free", tp)) or llama_backend.free_threadpool(tp))
    path = make_model(0.0)
    eng = InProcessEngine(ctx_size=2048, threads=2)
    a, b, c = gen(eng, path, 1, n=8), gen(eng, path, None, n=8), gen(eng, path, 3, n=8)
    assert a.tokens == b.tokens == c.tokens
    pool = eng._pool
    assert pool and calls[0] == ("new", 2)
    assert calls[1:] == [("attach", pool)] * 3  # the K=1, baseline and K=3 target contexts
    eng.close()
    assert calls[-1] == ("free", pool) and eng._pool is None
