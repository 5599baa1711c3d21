"""The calibrated Gemma 4 pair (app.core.calibrated.gemma4) on the real llama-server:
``-m target -md assistant --spec-type draft-mtp`` drafts, stays lossless, and its draft counts are
the simulator's exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import bare_server, post_json

from app.core.calibrated import gemma4 as g4
from app.core.machine.gguf_info import read_header

PROMPT = [104, 101, 108, 108, 111]  # "hello" as token ids (id == byte)
N_PREDICT = 64


def _server(binary: str, target: Path, assistant: Path | None = None, k: int = 0):
    args = ["-m", target, "-np", "1", "-c", "512", "-t", "1"]
    if assistant is not None:
        args += ["-md", assistant, "--spec-type", "draft-mtp", "--spec-draft-n-max", k]
    return bare_server(binary, args, target.parent / f"server-{'mtp' if assistant else 'base'}-{k}.log", 30)


def _complete(url: str, prompt) -> tuple[list[int], int | None, int | None]:
    r = post_json(url, "/completion", {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "top_k": 1,
                                       "cache_prompt": False, "return_tokens": True})
    t = r["timings"]
    return list(r["tokens"]), t.get("draft_n"), t.get("draft_n_accepted")


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gemma4")
    g4.make_gemma4_target(d / g4.TARGET_FILE)
    return d


def _assistant(pair_dir: Path, variant: str, p: float) -> Path:
    path = pair_dir / f"mtp-gemma4-{variant}-p{p:g}.gguf"
    if not path.exists():
        g4.make_gemma4_assistant(path, p, variant)
    return path


def test_pair_files_are_small_deterministic_and_matched(tmp_path):
    target, assistant = g4.make_gemma4_pair(tmp_path / "a", 0.3, "chain")
    again = g4.make_gemma4_pair(tmp_path / "b", 0.3, "chain")
    assert [p.read_bytes() for p in (target, assistant)] == [p.read_bytes() for p in again]
    assert target.name == g4.TARGET_FILE and assistant.name == g4.ASSISTANT_FILE
    assert target.stat().st_size < 4e6 and assistant.stat().st_size < 2e6
    # the target does not depend on the assistant's variant or knob
    assert g4.make_gemma4_pair(tmp_path / "c")[0].read_bytes() == target.read_bytes()

    ht, ha = read_header(target), read_header(assistant)
    assert (ht.arch, ha.arch) == ("gemma4", "gemma4-assistant")
    n_embd = ht.arch_key("embedding_length")
    assert ha.arch_key("embedding_length_out") == n_embd != ha.arch_key("embedding_length")
    assert ha.arch_key("nextn_predict_layers") == ha.block_count
    assert ha.has_mtp and not ht.has_mtp
    names = {t.name for t in ha.tensors}
    assert {"nextn.pre_projection.weight", "nextn.post_projection.weight", "token_embd.weight"} <= names
    assert not any(".attn_k." in n or ".attn_v." in n for n in names)  # KV comes from the target
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.model",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        assert ht.metadata[key] == ha.metadata[key], key

    # deliberately mismatched drafters for pair checks
    wide = read_header(g4.make_gemma4_assistant(tmp_path / "w.gguf", target_n_embd=96))
    assert wide.arch_key("embedding_length_out") == 96
    other = read_header(g4.make_gemma4_assistant(tmp_path / "v.gguf", vocab_offset=7))
    assert other.metadata["tokenizer.ggml.tokens"] != ht.metadata["tokenizer.ggml.tokens"]
    assert len(other.metadata["tokenizer.ggml.tokens"]) == len(ht.metadata["tokenizer.ggml.tokens"])


def test_chain_variant_simulation_needs_the_assistants_own_h():
    """At p = 0: chain and embedding drafts are all right, hidden ones only the first."""
    runs = {v: g4.simulate_pair(g4.pair_tables(0.0, v), PROMPT, 3, N_PREDICT) for v in g4.VARIANTS}
    assert runs["embedding"].acceptance == runs["chain"].acceptance == 1.0
    hidden = runs["hidden"]
    assert hidden.draft_accepted == hidden.steps < hidden.draft_n  # one right draft a step
    assert len({r.tokens for r in runs.values()}) == 1


@pytest.fixture(scope="module")
def baseline(server_bin, pair_dir) -> list[int]:
    """The target alone: the designed chain, from token ids and from text."""
    tables = g4.pair_tables()
    with _server(server_bin, pair_dir / g4.TARGET_FILE) as url:
        tokens, draft_n, _ = _complete(url, PROMPT)
        text_ids = post_json(url, "/tokenize", {"content": "hello world"})["tokens"]
        from_text, _, _ = _complete(url, "hello world")
    assert draft_n in (None, 0)
    assert tokens == tables.chain(PROMPT[-1], N_PREDICT)
    assert len(set(tokens)) == N_PREDICT  # not degenerate: a cycle of 771 tokens
    assert from_text == tables.chain(text_ids[-1], N_PREDICT)
    return tokens


# (variant, p_reject, K values). Measured (draft_n, accepted) for K = 1, 2, 3: embedding p=0 (31, 31),
# (42, 42), (47, 47); p=0.3 (39, 23), (60, 32), (80, 35); hidden p=0.3 K=2 (77, 24); chain p=0.3 K=3 (78, 36).
CASES = [("embedding", 0.0, (1, 2, 3)), ("embedding", 0.3, (1, 2, 3)),
         ("hidden", 0.3, (2,)), ("chain", 0.0, (3,)), ("chain", 0.3, (3,))]


@pytest.mark.parametrize("variant,p,ks", CASES, ids=[f"{v}-p{p:g}" for v, p, _ in CASES])
def test_assistant_drafts_losslessly_with_the_simulated_counts(server_bin, pair_dir, baseline, variant, p, ks):
    assistant = _assistant(pair_dir, variant, p)
    tables = g4.pair_tables(p, variant)
    for k in ks:
        with _server(server_bin, pair_dir / g4.TARGET_FILE, assistant, k) as url:
            first, second = _complete(url, PROMPT), _complete(url, PROMPT)
        sim = g4.simulate_pair(tables, PROMPT, k, N_PREDICT)
        tokens, draft_n, accepted = first
        assert draft_n and draft_n > 0, f"K={k}: no drafts"
        assert tokens == baseline == list(sim.tokens), f"K={k}: not lossless"
        assert second == first, f"K={k}: two identical requests differ"
        assert (draft_n, accepted) == (sim.draft_n, sim.draft_accepted), f"K={k}"
