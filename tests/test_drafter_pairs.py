"""Catalog pairs: a Gemma 4 target and its assistant drafter, described in the catalog and
downloaded together from a local test Hub (both files resumable and sha256-verified)."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from app.core.common.errors import UserError
from app.core.machine import hub
from hubserver import FakeHub
from tests.helpers import assistant, gemma4_target

REPO = "ggml-org/gemma-4-31B-it-GGUF"


def test_catalog_pairs_are_gemma_4_targets_with_their_assistant():
    cat = {e.repo: e for e in hub.load_catalog()}
    gemma = [e for e in cat.values() if e.arch == "gemma4"]
    assert {e.repo for e in gemma} == {f"ggml-org/gemma-4-{s}-it-GGUF" for s in ("31B", "26B-A4B", "E4B", "E2B")}
    for e in gemma:
        assert e.drafter == hub.DrafterRef(e.repo, "mtp-*.gguf", "draft-mtp", "gemma4-assistant",
                                           e.drafter.source, verified=False)
        assert e.drafter.source.startswith("google/gemma-4-") and e.drafter.source.endswith("-it-assistant")
    assert hub.catalog_entry(REPO.upper()) == cat[REPO]  # the Hub's ids ignore case
    assert hub.catalog_pair(f"/m/{REPO.replace('/', '__')}/gemma-4-31B-it-Q4_K_M.gguf") == cat[REPO]
    assert hub.catalog_pair("/m/unsloth__Qwen3.6-27B-MTP-GGUF/x.gguf") is None  # no drafter
    assert "NOT verified against the Hub" in json.loads(hub.resource("catalog.json").read_text())["note"]


@pytest.mark.parametrize("drafter, match", [
    ({"file": "x"}, "needs a 'repo'"),
    ({"repo": "a/b", "size": 3}, "drafter key 'size'"),
    ({"repo": "a/b", "verified": "yes"}, "drafter key 'verified'"),
    ({"repo": "not a repo"}, "not an owner/name repo id"),
])
def test_a_bad_drafter_in_the_catalog_is_one_clear_error(tmp_path, drafter, match):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"models": [{"repo": "a/b", "arch": "gemma4", "kind": "dense", "notes": "n",
                                         "drafter": drafter}]}))
    with pytest.raises(UserError, match=match):
        hub.load_catalog(p)
    p.write_text(json.dumps({"models": [{"repo": "a/b", "arch": "gemma4", "kind": "dense", "notes": "n",
                                         "drafter": "c/d"}]}))  # the old form: a repo id alone
    assert hub.load_catalog(p)[0].drafter == hub.DrafterRef("c/d")


def test_pick_drafter_prefers_the_targets_quant_then_the_nearest():
    files = [hub.RemoteFile(n, 10, None) for n in ("mtp-g-F16.gguf", "mtp-g-Q8_0.gguf", "mtp-g-Q4_K_M.gguf",
                                                   "g-Q4_K_M.gguf", "mmproj-g-F16.gguf")]
    quants = hub.group_quants(files)
    ref = hub.DrafterRef(REPO)
    assert hub.pick_drafter(ref, quants, "g-Q4_K_M.gguf").first.path == "mtp-g-Q4_K_M.gguf"
    assert hub.pick_drafter(ref, quants, "g-Q6_K.gguf").first.path == "mtp-g-Q8_0.gguf"
    assert hub.pick_drafter(hub.DrafterRef(REPO, "eagle3-*.gguf"), quants, "g-Q4_K_M.gguf") is None


@pytest.fixture
def gemma_hub(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    target = gemma4_target(src / "t.gguf", n_embd=256, n_vocab=300, layers=2).read_bytes()
    good = assistant(src / "a.gguf", width_out=256, n_embd=64, n_vocab=300, layers=2).read_bytes()
    wide = assistant(src / "w.gguf", width_out=128, n_embd=64, n_vocab=300, layers=2).read_bytes()
    h = FakeHub()
    h.add(REPO, {"gemma-4-31B-it-Q4_K_M.gguf": target, "mtp-gemma-4-31B-it-Q8_0.gguf": good,
                 "mtp-gemma-4-31B-it-F16.gguf": good, "README.md": b"hi"})
    h.add("ggml-org/gemma-4-E2B-it-GGUF", {"gemma-4-E2B-it-Q8_0.gguf": target})  # its drafter is missing
    h.add("ggml-org/gemma-4-E4B-it-GGUF", {"gemma-4-E4B-it-Q8_0.gguf": target, "mtp-gemma-4-E4B-it-Q8_0.gguf": wide})
    h.start()
    yield h
    h.stop()


def _download(hub_url, dest, repo, file, *extra):
    return main(["models", "download", repo, file, "--endpoint", hub_url, "--dest", str(dest), *extra])


def test_download_of_a_catalog_target_fetches_its_drafter_too(gemma_hub, tmp_path, capsys):
    dest = tmp_path / "models"
    assert _download(gemma_hub.url, dest, REPO, "gemma-4-31B-it-Q4_K_M.gguf") == 0
    out = capsys.readouterr().out
    folder = dest / REPO.replace("/", "__")
    t, a = folder / "gemma-4-31B-it-Q4_K_M.gguf", folder / "mtp-gemma-4-31B-it-Q8_0.gguf"
    assert sorted(p.name for p in folder.iterdir()) == [t.name, a.name]  # Q8_0: nearest to the target's Q4
    files = gemma_hub.repos[REPO].files
    assert t.read_bytes() == files[t.name] and a.read_bytes() == files[a.name]
    assert f"{a}: " in out and "sha256 verified" in out and f"the drafter (-md) of {REPO}" in out
    assert f"pair: -m {t} -md {a} --spec-type draft-mtp" in out
    served = gemma_hub.bytes_served
    assert _download(gemma_hub.url, dest, REPO, "gemma-4-31B-it-Q4_K_M.gguf", "--json") == 0  # both on disk
    d = json.loads(capsys.readouterr().out)
    assert d["drafter"]["path"] == str(a) and d["drafter"]["pair_problem"] is None
    assert gemma_hub.bytes_served == served  # verified on disk, nothing fetched again


def test_no_drafter_downloads_the_target_only(gemma_hub, tmp_path, capsys):
    dest = tmp_path / "models"
    assert _download(gemma_hub.url, dest, REPO, "gemma-4-31B-it-Q4_K_M.gguf", "--no-drafter") == 0
    assert [p.name for p in (dest / REPO.replace("/", "__")).iterdir()] == ["gemma-4-31B-it-Q4_K_M.gguf"]
    assert "the drafter (-md)" not in capsys.readouterr().out
    # the drafter asked for by name is fetched alone (it is not a target with a drafter)
    assert _download(gemma_hub.url, dest, REPO, "mtp-gemma-4-31B-it-F16.gguf") == 0
    assert len(list((dest / REPO.replace("/", "__")).iterdir())) == 2


def test_a_missing_or_mismatched_drafter_is_said_and_the_target_kept(gemma_hub, tmp_path, capsys):
    dest = tmp_path / "models"
    assert _download(gemma_hub.url, dest, "ggml-org/gemma-4-E2B-it-GGUF", "gemma-4-E2B-it-Q8_0.gguf") == 0
    err = capsys.readouterr().err
    assert "the catalog's drafter (ggml-org/gemma-4-E2B-it-GGUF, mtp-*.gguf) is not among the repo's files" in err
    assert "has not checked that name against the Hub" in err
    assert _download(gemma_hub.url, dest, "ggml-org/gemma-4-E4B-it-GGUF", "gemma-4-E4B-it-Q8_0.gguf") == 0
    cap = capsys.readouterr()
    assert "the downloaded pair does not check:" in cap.err and "wrong width" in cap.err and "pair: -m" not in cap.out
