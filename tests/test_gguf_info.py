"""Header reading: good files, and one clear error per kind of broken file, from the header alone."""

from __future__ import annotations

import os
import struct
import time

import pytest

from app.core.machine import gguf_info
from app.core.common.errors import ModelFileError
from app.core.machine.gguf_info import check_gguf_file, read_header, split_parts


def test_reads_calibrated_header(make_model):
    hdr = read_header(make_model(0.0))
    assert hdr.metadata["general.architecture"] == "qwen35"
    assert hdr.n_params > 1_000_000
    assert hdr.metadata["tokenizer.ggml.tokens"][32] == "Ġ"


@pytest.mark.parametrize("case, match", [
    ("missing", "no such file"),
    ("empty", "empty"),
    ("random", "not a GGUF file"),
    ("trunc_header", "truncated"),
    ("trunc_data", "truncated or corrupt"),
    ("absurd", "corrupt GGUF header"),
    ("folder", "folder"),
])
def test_broken_files_give_one_clear_error(tmp_path, make_model, monkeypatch, case, match):
    good = make_model(0.0).read_bytes()
    header_end = read_header(make_model(0.0)).data_offset
    p = tmp_path / f"{case}.gguf"
    if case == "empty":
        p.write_bytes(b"")
    elif case == "random":
        p.write_bytes(os.urandom(4096))
    elif case == "trunc_header":
        p.write_bytes(good[:100])
    elif case == "trunc_data":
        p.write_bytes(good[:2_000_000])
    elif case == "absurd":
        p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**60, 2**60))
    elif case == "folder":
        p.mkdir()
    # "fast" as a count, not a clock: the error comes from the header, so check_gguf_file reads at
    # most the good file's header (never the tensor data, never a whole file to hash it)
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            b = self.f.read(n)
            read.append(len(b))
            return b

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(gguf_info, "open", lambda *a, **kw: Counting(open(*a, **kw)), raising=False)
    with pytest.raises(ModelFileError, match=match) as ei:
        check_gguf_file(p)
    assert str(p) in str(ei.value)
    if case in ("missing", "empty", "folder"):
        assert read == []  # refused before opening
    else:
        assert read, "check_gguf_file read the file some other way than gguf_info's open()"
        assert sum(read) <= min(header_end, p.stat().st_size), (case, sum(read), header_end)
    if case == "absurd":
        assert sum(read) == 24  # magic, version and the two counts: refused on the counts


def test_split_names_are_grouped(tmp_path):
    parts = split_parts(tmp_path / "Model-Q4-00001-of-00003.gguf")
    assert [x.name for x in parts] == [f"Model-Q4-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert split_parts(tmp_path / "plain.gguf") == [tmp_path / "plain.gguf"]


def test_missing_split_part_is_named(tmp_path, make_model):
    first = tmp_path / "m-00001-of-00002.gguf"
    first.write_bytes(make_model(0.0).read_bytes())
    with pytest.raises(ModelFileError, match="m-00002-of-00002.gguf: no such file"):
        check_gguf_file(first)


def test_a_header_read_again_comes_from_memory_until_the_file_changes(tmp_path, make_model):
    # a sweep reads its model's header a dozen times: the parse is kept by the file's identity
    src = make_model(0.0)
    p = tmp_path / "m.gguf"
    p.write_bytes(src.read_bytes())
    old = time.time() - 60
    os.utime(p, (old, old))  # settled: written a minute ago
    first = read_header(p)
    assert read_header(p) is first  # the same parse
    assert read_header(p, keep_arrays=False) is not first  # a different read is its own entry
    # the file replaced by another model (new times): read anew
    other = make_model(0.3)
    p.write_bytes(other.read_bytes())
    os.utime(p, (old + 1, old + 1))
    again = read_header(p)
    assert again is not first and again.metadata == read_header(other).metadata
    # a file modified this instant is never kept: its next change may fall in the same clock tick
    q = tmp_path / "fresh.gguf"
    q.write_bytes(src.read_bytes())
    assert read_header(q) is not read_header(q)
    # a broken file is never kept either: it fails every time, with its cause
    os.utime(q, (old, old))
    with open(q, "r+b") as f:
        f.truncate(100)
    os.utime(q, (old, old))
    for _ in range(2):
        with pytest.raises(ModelFileError, match="truncated"):
            read_header(q)
