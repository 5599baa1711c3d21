"""Drafter pairs (-md FILE): what a drafter is, the pair check before anything starts, the memory
fit with a drafter, `inspect --drafter`, and the Model tab's Drafter row. The GGUFs are real
headers (keys, token lists, tensor tables) over sparse data, as llama.cpp would read them."""

from __future__ import annotations

import hashlib
import os
import subprocess

import psutil
import pytest

from app.cli import main
from app.core.common.errors import UserError
from app.core.machine import drafter as D
from app.core.machine.fit import fit, overhead_line
from app.core.machine.modelinfo import format_info, inspect
from tests.helpers import assistant, gemma4_target, sparse_gguf, vocab

GIB = 2**30


def plain(path, arch="gemma4", n_embd=512, n_vocab=1024, layers=2, **vk):
    """An ordinary small causal LM (a draft-simple drafter when the vocabulary matches)."""
    kv = {f"{arch}.block_count": layers, f"{arch}.embedding_length": n_embd, f"{arch}.context_length": 8192,
          f"{arch}.attention.head_count": 8, f"{arch}.attention.head_count_kv": 2,
          f"{arch}.attention.key_length": 64, f"{arch}.attention.value_length": 64, **vocab(n_vocab, **vk)}
    t = [("token_embd.weight", (n_embd, n_vocab), "Q8_0")]
    for i in range(layers):
        t += [(f"blk.{i}.attn_norm.weight", (n_embd,), "F32"), (f"blk.{i}.attn_q.weight", (n_embd, n_embd), "Q8_0")]
    return sparse_gguf(path, arch, kv, t)


def mtp_head(path, arch="qwen35", n_embd=5120, n_vocab=1024, blocks=65):
    """An mtp-only GGUF (convert --mtp): block_count of the whole model, only the last (NextN) block."""
    n = blocks - 1
    kv = {f"{arch}.block_count": blocks, f"{arch}.nextn_predict_layers": 1, f"{arch}.embedding_length": n_embd,
          f"{arch}.attention.head_count": 24, f"{arch}.attention.head_count_kv": 4,
          f"{arch}.attention.key_length": 256, f"{arch}.attention.value_length": 256, **vocab(n_vocab, kind="gpt2")}
    t = [("token_embd.weight", (n_embd, n_vocab), "Q8_0"),
         (f"blk.{n}.nextn.eh_proj.weight", (2 * n_embd, n_embd), "Q8_0"),
         (f"blk.{n}.attn_norm.weight", (n_embd,), "F32"), (f"blk.{n}.ffn_up.weight", (n_embd, 17408), "Q8_0")]
    return sparse_gguf(path, arch, kv, t)


@pytest.fixture
def pair(tmp_path):
    return gemma4_target(tmp_path / "gemma-4-31B-it-Q4_K_M.gguf"), assistant(tmp_path / "mtp-gemma-4-31B-it-Q8_0.gguf")


def test_a_matching_assistant_passes_and_says_what_it_is(pair):
    target, a = pair
    d = D.check_pair(target, a, "draft-mtp")
    assert (d.kind, d.arch, d.input_width, d.n_vocab, d.shares_target_kv) == (
        "gemma4-assistant", "gemma4-assistant", 5376, 1024, True)
    assert d.modes == ("draft-mtp",) and d.tokens_sha256 == D.tokenizer_fingerprint(target).tokens_sha256
    assert "gemma4-assistant drafter for a target of width 5376, vocabulary 1024 tokens" in format_info(inspect(a))
    assert "drafter:" not in format_info(inspect(target))
    assert D.check_pair(target, None, "draft-mtp") is None  # the model's own heads: not this check's business


@pytest.mark.parametrize("case, cause", [
    ("other vocabulary", "a drafter with another vocabulary than {t}: token 77 is '<other>' in the drafter, "
                         "'<t77>' in the target"),
    ("other vocabulary size", "a drafter with another vocabulary than {t}: 1100 tokens in the drafter, 1024 in "
                              "the target"),
    ("wrong width", "a drafter of the wrong width: it reads a target hidden state of 2560 "
                    "(gemma4-assistant.embedding_length_out), {t} has width 5376 (gemma4.embedding_length)"),
    ("not a drafter", "is an ordinary gemma4 model, not a drafter: draft-mtp takes a gemma4-assistant"),
    ("missing file", "no such drafter file"),
])
def test_each_pair_error_is_one_clear_line_before_any_process_starts(tmp_path, pair, monkeypatch, case, cause):
    target, _ = pair
    d = tmp_path / f"{case.replace(' ', '-')}.gguf"
    if case == "other vocabulary":
        assistant(d, tweak=77)
    elif case == "other vocabulary size":
        assistant(d, n_vocab=1100)
    elif case == "wrong width":
        assistant(d, width_out=2560)  # an E4B-sized assistant on the 31B target
    elif case == "not a drafter":
        gemma4_target(d, n_embd=2560)
    started = []
    monkeypatch.setattr(subprocess.Popen, "__init__", lambda *a, **kw: started.append(a) or 1 / 0)
    kids = set(psutil.Process().children(recursive=True))
    with pytest.raises(UserError) as ei:
        D.check_pair(target, d, "draft-mtp")
    msg = str(ei.value)
    assert "\n" not in msg and str(d) in msg and cause.format(t=target) in msg, msg
    assert not started and set(psutil.Process().children(recursive=True)) <= kids


@pytest.mark.parametrize("mode, drafter, cause", [
    ("draft-simple", None, "--spec-type draft-simple needs a drafter GGUF (-md FILE)"),
    ("draft-eagle3", None, "needs a drafter GGUF (-md FILE): an eagle3 drafter"),
    ("draft-dflash", None, "needs a drafter GGUF"),
    ("ngram-mod", "a", "--spec-type ngram-mod takes no drafter (it drafts from the text itself)"),
    ("none", "a", "takes no drafter (no speculation)"),
    ("draft-simple", "a", "is a gemma4-assistant drafter (it reads the target's KV cache and hidden state): it "
                          "drafts with --spec-type draft-mtp, not draft-simple"),
    ("draft-eagle3", "t", "is an ordinary gemma4 model, not a drafter: draft-eagle3 takes an eagle3 drafter"),
    ("mtp", "a", "unknown speculative type 'mtp'"),
])
def test_modes_that_need_a_drafter_or_take_none(pair, mode, drafter, cause):
    target, a = pair
    with pytest.raises(UserError, match=None) as ei:
        D.check_pair(target, {"a": a, "t": target, None: None}[drafter], mode)
    assert cause in str(ei.value) and "\n" not in str(ei.value)


def test_draft_simple_follows_llama_cpps_vocabulary_rule(tmp_path):
    target = gemma4_target(tmp_path / "t.gguf")
    ok = plain(tmp_path / "ok.gguf")
    assert D.check_pair(target, ok, "draft-simple").kind == "model"
    # llama.cpp compares token texts from id 5 on and allows up to 128 tokens more or fewer
    assert D.check_pair(target, plain(tmp_path / "low.gguf", tweak=3), "draft-simple")
    assert D.check_pair(target, plain(tmp_path / "size.gguf", n_vocab=1024 + 128), "draft-simple")
    for name, kw, cause in (
            ("tok.gguf", {"tweak": 7}, "token 7 is '<other>' in the drafter, '<t7>' in the target"),
            ("big.gguf", {"n_vocab": 1024 + 129}, "1153 tokens in the drafter, 1024 in the target (llama.cpp allows"),
            ("bos.gguf", {"bos": 5}, "the BOS token differs"),
            ("type.gguf", {"kind": "llama"}, "tokenizer type llama in the drafter, gemma4 in the target")):
        with pytest.raises(UserError, match="another vocabulary") as ei:
            D.check_pair(target, plain(tmp_path / name, **kw), "draft-simple")
        assert cause in str(ei.value)


def test_an_mtp_head_drafts_for_its_own_kind_of_model(tmp_path):
    head = mtp_head(tmp_path / "mtp-Qwen3.6-27B-Q8_0.gguf")
    qwen = plain(tmp_path / "qwen.gguf", arch="qwen35", n_embd=5120, kind="gpt2")
    assert inspect(head).drafter_kind == "mtp-head" and D.check_pair(qwen, head, "draft-mtp").input_width == 5120
    with pytest.raises(UserError, match="wrong width"):
        D.check_pair(plain(tmp_path / "narrow.gguf", arch="qwen35", n_embd=2048, kind="gpt2"), head, "draft-mtp")
    with pytest.raises(UserError, match="is the MTP head of a qwen35 model; .* is gemma4"):
        D.check_pair(gemma4_target(tmp_path / "g.gguf"), head, "draft-mtp")


def test_fingerprint_is_cached_by_path_size_and_time(tmp_path, monkeypatch):
    p = plain(tmp_path / "m.gguf")
    fp = D.tokenizer_fingerprint(p)
    assert (fp.n_vocab, fp.model_kind) == (1024, "gemma4")
    reads = []
    monkeypatch.setattr(D, "check_gguf_file", lambda path: reads.append(path))
    assert D.tokenizer_fingerprint(p) == fp and not reads
    monkeypatch.undo()
    plain(p, tweak=9)
    os.utime(p, ns=(1, 1))  # another file at the same path
    assert D.tokenizer_fingerprint(p).tokens_sha256 != fp.tokens_sha256


def test_matching_drafters_are_those_that_pass(tmp_path, pair):
    target, a = pair
    others = [assistant(tmp_path / "wide.gguf", width_out=2560), assistant(tmp_path / "voc.gguf", n_vocab=4000),
              gemma4_target(tmp_path / "other-quant.gguf"), plain(tmp_path / "small.gguf"),
              tmp_path / "gone.gguf", plain(tmp_path / "llama.gguf", kind="llama")]
    (tmp_path / "broken.gguf").write_bytes(b"GGUF nonsense")
    found = D.matching_drafters(target, [target, a, *others, tmp_path / "broken.gguf"])
    assert found == [a, tmp_path / "small.gguf"]


def test_file_sha256(tmp_path):
    p = plain(tmp_path / "m.gguf")
    assert D.file_sha256(p) == hashlib.sha256(p.read_bytes()).hexdigest()
    d = D.inspect_drafter(p, with_sha256=True)
    assert d.record() == {"path": str(p), "sha256": D.file_sha256(p), "arch": "gemma4", "size": p.stat().st_size}


def test_fit_with_an_assistant_adds_weights_and_compute_but_no_kv(pair, tmp_path):
    target, a = pair
    t = inspect(target)
    base = fit(t, 80 * GIB, ctx=8192)
    assert "drafter_weights" not in base.breakdown and base.mode == "baseline"  # unchanged without a drafter
    d = D.check_pair(target, a, "draft-mtp")
    with_d = fit(t, 80 * GIB, ctx=8192, drafter=d)
    b = with_d.breakdown
    assert with_d.mode == "drafter" and b["drafter_kv_cache"] == 0
    assert b["drafter_weights"] == inspect(a).weight_bytes and b["drafter_compute_buffers"] > 0
    assert with_d.need_bytes == base.need_bytes + b["drafter_weights"] + b["drafter_compute_buffers"]
    assert with_d.max_context < base.max_context or base.max_context == t.context_length
    assert "no KV cache of its own" in overhead_line(base, with_d)
    # a draft-simple model keeps its own KV at the same context, typed by -ctkd/-ctvd
    small = plain(tmp_path / "small.gguf")
    ds = D.check_pair(target, small, "draft-simple")
    s = fit(t, 80 * GIB, ctx=8192, drafter=ds, draft_cache_type="q8_0").breakdown
    assert s["drafter_kv_cache"] == int(inspect(small).kv_bytes_per_token("q8_0") * 8192) > 0
    assert fit(t, 80 * GIB, ctx=8192, drafter=inspect(small)).breakdown["drafter_kv_cache"] == int(
        inspect(small).kv_bytes_per_token("f16") * 8192)  # a ModelInfo does as a drafter too


def test_inspect_shows_the_drafter_and_checks_the_pair(pair, tmp_path, capsys):
    target, a = pair
    assert main(["inspect", str(a)]) == 0
    out = capsys.readouterr().out
    assert "drafter: gemma4-assistant drafter for a target of width 5376, vocabulary 1024 tokens" in out
    assert "memory fit" not in out and "inspect the target with --drafter FILE" in out
    assert main(["inspect", str(target), "--drafter", str(a)]) == 0
    out = capsys.readouterr().out
    assert f"pair: checked (vocabulary, width, kind): -m {target} -md {a} --spec-type draft-mtp" in out
    assert "  drafter " in out and "the drafter adds" in out
    wrong = assistant(tmp_path / "wrong.gguf", width_out=2560)
    assert main(["inspect", str(target), "--drafter", str(wrong)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "wrong width" in err and str(wrong) in err


def test_model_tab_suggests_the_pair_on_disk_and_shows_a_mismatch_inline(qtbot, tmp_path):
    pytest.importorskip("PySide6")
    from PySide6.QtCore import QSettings

    from app.core.common.paths import models_dir
    from app.gui.services import make_services
    from app.gui.state import AppState
    from app.gui.tabs.model import ModelTab

    folder = models_dir() / "ggml-org__gemma-4-31B-it-GGUF"  # where a catalog download lands
    folder.mkdir(parents=True)
    target = gemma4_target(folder / "gemma-4-31B-it-Q4_K_M.gguf")
    a = assistant(folder / "mtp-gemma-4-31B-it-Q8_0.gguf")
    wide = assistant(models_dir() / "mtp-gemma-4-E4B-it-Q8_0.gguf", width_out=2560)
    state = AppState(QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    errors = []
    state.error.connect(errors.append)
    jobs = make_services(state).jobs
    tab = ModelTab(state, jobs)
    qtbot.addWidget(tab)
    row = tab.drafter_row
    state.set_model(str(target))  # no MTP heads of its own: the row looks for drafters by itself
    qtbot.waitUntil(lambda: row.suggestions.count() > 1 and row.find_job is None, timeout=20000)
    items = [(row.suggestions.itemText(i), row.suggestions.itemData(i)) for i in range(row.suggestions.count())]
    assert items[1] == (f"catalog pair: {a.name}", str(a)) and str(wide) not in [d for _, d in items]
    with qtbot.waitSignal(row.checked, timeout=20000):
        row.choose(str(wide))
    assert row.info is None and state.drafter == "" and not errors
    msg = row.message.text()
    assert "\n" not in msg and str(wide) in msg and "wrong width" in msg and "2560" in msg and "5376" in msg
    with qtbot.waitSignal(state.drafter_changed, timeout=20000):
        row.suggestions.activated.emit(1)
    assert state.drafter == str(a) and "gemma4-assistant drafter" in row.message.text()
    rows = [tab.fit_table.item(r, 0).text() for r in range(tab.fit_table.rowCount())]
    assert rows == ["baseline", "drafter"] and "the drafter adds" in tab.fit_label.text()
    row.clear()
    assert state.drafter == "" and tab.fit_table.rowCount() == 1
    jobs.cancel_all(10000)
