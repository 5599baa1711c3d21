"""Calibrated models for llama.cpp's draft-simple and ngram-mod speculative modes, checked against
the real llama-server: the simulators in calibrated_modes predict draft_n / draft_n_accepted exactly."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from conftest import bare_server, post_json

from app.core.calibrated import design as C, gguf as G, modes as M
from app.core.machine.gguf_info import read_header

SEED = 0
P_WRONG = (0.3, 0.7)
DS_PROMPT = [104, 105]  # "hi": any tokens; the target's chain starts from the last one
DS_N = 150
NG_START, NG_LEN, NG_REPEAT = 104, 300, 40  # ngram-mod prompt: 300 chain tokens, then their first 40 again


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("pairs")
    for p in P_WRONG:
        G.make_pair(d, p, SEED)
    return d


def _pair(pair_dir, p):
    return G.make_pair(pair_dir, p, SEED)  # rewrites the same bytes: cheap, and gives the paths


# --------------------------------------------------------------------------------------------
# no llama.cpp needed


def test_drafter_differs_from_target_exactly_on_the_wrong_subset():
    target, _, _ = C.design_tables(0.0, "embedding", SEED)
    cyc = C.cycle_token_ids()
    nxt = target.next_token
    for p in (0.0, 0.3, 1.0):
        d, alias, bad = M.drafter_tables(target, p, SEED)
        assert abs(bad[cyc].mean() - p) < 1e-3 and d.p_reject == pytest.approx(bad[cyc].mean())
        assert np.array_equal(d.next_token[cyc], np.where(bad[cyc], nxt[nxt[cyc]], nxt[cyc]))
        assert np.array_equal(nxt, nxt[alias])  # an out-of-cycle token stands for its alias
        assert np.array_equal(d.next_token, d.next_token[alias])


def test_drafter_gguf_is_plain_deterministic_and_shares_the_vocabulary(tmp_path):
    target, drafter = G.make_pair(tmp_path, 0.3, SEED)
    again = G.make_drafter(tmp_path / "again.gguf", target, 0.3, SEED)
    assert drafter.read_bytes() == again.read_bytes()
    ht, hd = read_header(target), read_header(drafter)
    assert ht.has_mtp and not hd.has_mtp and hd.block_count == 4
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.pre"):
        assert hd.metadata[key] == ht.metadata[key], key
    dt = C.load_tables(drafter)
    ref, _, _ = M.drafter_tables(C.load_tables(target), 0.3, SEED)
    assert np.array_equal(dt.next_token, ref.next_token) and not dt.has_mtp
    assert hd.metadata["synthetic.role"] == "drafter"


def test_draft_simple_simulator_p0_accepts_everything_and_replay_only_follows_a_rejection():
    target, _, _ = C.design_tables(0.0, "embedding", SEED)
    perfect, _, _ = M.drafter_tables(target, 0.0, SEED)
    for k in (1, 2, 3):
        a = M.simulate_draft_simple(target, perfect, DS_PROMPT, k, DS_N)
        b = M.simulate_draft_simple(target, perfect, DS_PROMPT, k, DS_N, replay=False)
        assert a == b and a.draft_n == a.draft_accepted > 0
        assert a.tokens == tuple(target.chain(DS_PROMPT[-1], DS_N))
    wrong, _, _ = M.drafter_tables(target, 1.0, SEED)
    r = M.simulate_draft_simple(target, wrong, DS_PROMPT, 3, DS_N)
    assert r.draft_accepted == 0 and r.steps == (DS_N - 1) // 2  # each replay emits 2 tokens


def test_ngram_mod_simulator_drafts_from_the_repeated_prompt():
    target, _, _ = C.design_tables(0.0, "embedding", SEED)
    prompt = M.ngram_prompt(target, NG_START, NG_LEN, NG_REPEAT)
    assert prompt[-NG_REPEAT:] == prompt[:NG_REPEAT] and len(prompt) == NG_LEN + NG_REPEAT
    r, st = M.simulate_ngram_mod(target, prompt, 200)
    assert r.draft_n == r.draft_accepted > 0 and r.tokens == tuple(target.chain(prompt[-1], 200))
    r2, _ = M.simulate_ngram_mod(target, [104] * 10, 50)  # shorter than n_match: never drafts
    assert r2.draft_n == 0


# --------------------------------------------------------------------------------------------
# the real llama-server


@contextmanager
def _server(server_bin, args, log):
    with bare_server(server_bin, ["-np", "1", "-c", "1024", "-t", "1", *args], log) as url:
        def complete(prompt, n_predict):
            res = post_json(url, "/completion", {"prompt": list(prompt), "n_predict": n_predict, "temperature": 0,
                                                 "cache_prompt": False, "return_tokens": True})
            tm = res["timings"]
            return tuple(res["tokens"]), tm.get("draft_n", 0), tm.get("draft_n_accepted", 0)

        yield complete


_BASELINE: dict = {}


def _baseline(server_bin, target, tmp_path, prompt, n_predict):
    """The target's greedy tokens without speculation (one server for the whole module)."""
    if not _BASELINE:
        tables = C.load_tables(target)
        asks = [(tuple(DS_PROMPT), DS_N), (tuple(M.ngram_prompt(tables, NG_START, NG_LEN, NG_REPEAT)), 300)]
        with _server(server_bin, ["-m", target], tmp_path / "baseline.log") as complete:
            for p, n in asks:
                tokens, draft_n, _ = complete(p, n)
                assert draft_n == 0
                _BASELINE[p] = tokens
    return _BASELINE[tuple(prompt)][:n_predict]


@pytest.mark.parametrize("p", P_WRONG)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_draft_simple_counts_equal_the_simulator(server_bin, pair_dir, tmp_path, k, p):
    target, drafter = _pair(pair_dir, p)
    want = M.simulate_draft_simple(C.load_tables(target), C.load_tables(drafter), DS_PROMPT, k, DS_N)
    args = ["-m", target, "-md", drafter, "--spec-type", "draft-simple", "--spec-draft-n-max", k]
    with _server(server_bin, args, tmp_path / "server.log") as complete:
        tokens, draft_n, accepted = complete(DS_PROMPT, DS_N)
    assert (draft_n, accepted) == (want.draft_n, want.draft_accepted)
    assert 0 < accepted < draft_n
    assert tokens == want.tokens == _baseline(server_bin, target, tmp_path, DS_PROMPT, DS_N)


def test_draft_simple_n_min_drops_a_short_draft(server_bin, pair_dir, tmp_path):
    """--spec-draft-n-min 3 with K 3: the last draft, cut to fewer tokens by n_predict, is dropped."""
    target, drafter = _pair(pair_dir, P_WRONG[0])
    tt, dt = C.load_tables(target), C.load_tables(drafter)
    want = M.simulate_draft_simple(tt, dt, DS_PROMPT, 3, DS_N, n_min=3)
    assert want.draft_n < M.simulate_draft_simple(tt, dt, DS_PROMPT, 3, DS_N).draft_n
    args = ["-m", target, "-md", drafter, "--spec-type", "draft-simple", "--spec-draft-n-max", 3,
            "--spec-draft-n-min", 3]
    with _server(server_bin, args, tmp_path / "server.log") as complete:
        tokens, draft_n, accepted = complete(DS_PROMPT, DS_N)
    assert (draft_n, accepted) == (want.draft_n, want.draft_accepted) and tokens == want.tokens


@pytest.mark.parametrize("flags,state", [
    # --spec-draft-n-max does not bound ngram-mod (its own n_max, 64, does)
    (["--spec-draft-n-max", 1], {}),
    (["--spec-ngram-mod-n-max", 16, "--spec-ngram-mod-n-min", 8], {"n_max": 16, "n_min": 8}),
], ids=["defaults", "n_max16"])
def test_ngram_mod_counts_equal_the_simulator_request_after_request(server_bin, pair_dir, tmp_path, flags, state):
    target, _ = _pair(pair_dir, P_WRONG[0])
    tables = C.load_tables(target)
    prompt = M.ngram_prompt(tables, NG_START, NG_LEN, NG_REPEAT)
    st = M.NgramModState(**state)
    # 200 tokens stay inside the repeated stretch; 300 run past its end (into n-grams the table
    # learns during the request, and keeps for the next one)
    asks = [200, 200, 300, 300]
    got, want = [], []
    with _server(server_bin, ["-m", target, "--spec-type", "ngram-mod", *flags], tmp_path / "server.log") as complete:
        for n in asks:
            got.append(complete(prompt, n))
            sim, st = M.simulate_ngram_mod(tables, prompt, n, st)
            want.append((sim.tokens, sim.draft_n, sim.draft_accepted))
    assert [g[1:] for g in got] == [w[1:] for w in want]
    assert got[0][1] > 0 and got[0][1:] == got[1][1:]  # drafted, and the same counts twice
    for (tokens, _, _), n in zip(got, asks):
        assert tokens == _baseline(server_bin, target, tmp_path, prompt, n)
    assert [w[0] for w in want] == [g[0] for g in got]
