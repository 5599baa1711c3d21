"""The calibrated model generator and its simulator (no llama.cpp needed here)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from app.core.calibrated import design as C, gguf as calibrated_gguf
from app.core.common.errors import UserError
from app.core.machine.gguf_info import read_header


def sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_same_arguments_give_byte_identical_files(tmp_path):
    a = calibrated_gguf.make_model(tmp_path / "a.gguf", 0.3, "hidden", seed=7)
    b = calibrated_gguf.make_model(tmp_path / "b.gguf", 0.3, "hidden", seed=7)
    c = calibrated_gguf.make_model(tmp_path / "c.gguf", 0.3, "hidden", seed=8)
    assert sha(a) == sha(b)
    assert sha(a) != sha(c)


def test_tiny_model_is_small_and_has_mtp_block(make_model):
    path = make_model(0.5)
    hdr = read_header(path)
    assert hdr.arch == "qwen35"
    assert hdr.has_mtp and hdr.nextn_layers == 1 and hdr.block_count == 5
    assert "blk.4.nextn.eh_proj.weight" in {t.name for t in hdr.tensors}
    assert "blk.4.nextn.shared_head_head.weight" in {t.name for t in hdr.tensors}
    assert path.stat().st_size < 8_000_000
    assert hdr.mtp_problem() is None


def test_no_mtp_variant_has_no_heads(make_model):
    hdr = read_header(make_model(0.0, mtp=False))
    assert not hdr.has_mtp
    assert "nextn_predict_layers" in hdr.mtp_problem()


def test_tables_roundtrip_through_gguf(make_model):
    tables = C.load_tables(make_model(0.5, "hidden"))
    ref, _, bad = C.design_tables(0.5, "hidden", 0)
    assert np.array_equal(tables.next_token, ref.next_token)
    assert np.array_equal(tables.mtp_next_token, ref.mtp_next_token)
    assert tables.variant == "hidden" and tables.p_reject == pytest.approx(0.5)
    assert abs(bad[C.cycle_token_ids()].mean() - 0.5) < 0.01


def test_cycle_is_one_permutation_cycle_over_printable_tokens():
    t, _, _ = C.design_tables(0.0, "embedding", 3)
    cyc = C.cycle_token_ids()
    start = int(cyc[0])
    seen, x = set(), start
    for _ in range(len(cyc)):
        seen.add(x)
        x = int(t.next_token[x])
    assert x == start and seen == set(cyc.tolist())


def test_simulator_p0_embedding_accepts_everything():
    t, _, _ = C.design_tables(0.0, "embedding", 0)
    for k in (1, 2, 3, 4):
        r = C.simulate(t, [104, 105], k, 200)
        assert r.draft_n == r.draft_accepted > 0
        assert r.tokens == tuple(t.chain(105, 200))


def test_simulator_p1_accepts_nothing_and_hidden_accepts_one_per_step():
    t1, _, _ = C.design_tables(1.0, "embedding", 0)
    assert C.simulate(t1, [104], 3, 100).draft_accepted == 0
    th, _, _ = C.design_tables(0.0, "hidden", 0)
    for k in (1, 2, 3, 4):
        r = C.simulate(th, [104], k, 150)
        assert r.draft_accepted == r.steps  # exactly one accepted draft per verification step
        assert r.tokens == tuple(th.chain(104, 150))


def test_simulator_budget_never_drafts_past_n_predict():
    t, _, _ = C.design_tables(0.0, "embedding", 0)
    r = C.simulate(t, [104], 4, 7)
    assert len(r.tokens) == 7
    # first token from the prompt, then steps of 4+1 drafted/accepted... budget min(4, 7-1-1)=4 -> 6, then 0 -> plain
    assert r.draft_n == 4 and r.draft_accepted == 4


@pytest.mark.parametrize("variant", ["embedding", "hidden"])
@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_simulated_rate_approaches_closed_form(variant, p):
    t, _, _ = C.design_tables(p, variant, 11)
    for k in (1, 3):
        r = C.simulate(t, [104], k, 20000)
        assert r.acceptance == pytest.approx(C.closed_form_acceptance(p, k, variant), abs=0.03)


def test_bad_arguments_are_clear(tmp_path):
    with pytest.raises(UserError, match="p-reject"):
        calibrated_gguf.make_model(tmp_path / "x.gguf", 1.5)
    with pytest.raises(UserError, match="variant"):
        calibrated_gguf.make_model(tmp_path / "x.gguf", 0.1, "nope")
    assert not list(tmp_path.iterdir())
