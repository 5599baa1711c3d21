from __future__ import annotations

import dataclasses
import json

from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter
from tests.helpers import make_record


def test_records_round_trip_and_survive_a_cut_last_line(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        w.append(make_record())
        w.append(make_record(run_id="r2", status="failed", error="boom"))
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "run_id": "r3", "sta')  # a crash mid-write
    got = load_records(path)
    assert [r.run_id for r in got] == ["r1", "r2"]
    assert got[0] == make_record()
    assert got[1].error == "boom"


def test_required_fields_present_in_json():
    d = json.loads(make_record().to_json())
    for key in ("schema_version", "run_id", "engine", "arm", "k", "p_min", "task", "prompt_id", "rep",
                "n_predict", "n_generated", "tok_s", "tok_s_engine", "draft_n", "draft_accepted",
                "acceptance", "output_sha256", "llama_build", "model_path", "model_size", "sampling",
                "token_times", "timestamp_utc"):
        assert key in d
    assert dataclasses.is_dataclass(make_record())


def test_two_sweeps_in_the_same_second_get_their_own_results_files():
    from app.core.records.writer import ResultsWriter
    from app.core.measure.runner import default_results_path

    a = default_results_path("/models/M.gguf")  # each name is reserved as it is handed out
    b = default_results_path("/models/M.gguf")
    c = default_results_path("/models/M.gguf")
    assert len({a, b, c}) == 3 and a.name.startswith("M-") and a.suffix == b.suffix == ".jsonl"
    ResultsWriter(a).close()  # a sweep that wrote no run leaves no empty file behind
    assert not a.exists() and b.exists()


def test_files_that_are_not_results_give_one_clear_error(tmp_path):
    import os

    import pytest

    from app.core.common.errors import UserError

    good = json.loads(make_record().to_json())
    cases = {
        "model.gguf": b"GGUF\x03\x00\x00\x00" + os.urandom(4096),
        "random.jsonl": os.urandom(200_000),  # not text: no UnicodeDecodeError traceback
        "missing.jsonl": json.dumps({"schema_version": 1, "run_id": "x"}).encode() + b"\n",
        "mistyped.jsonl": json.dumps({**good, "tok_s": "fast"}).encode() + b"\n",
        "tokens.jsonl": json.dumps({**good, "output_tokens": "1,2"}).encode() + b"\n",
        "one-long-line.jsonl": b"x" * (17 * 2**20),
    }
    want = {"model.gguf": "a GGUF model, not a results file", "random.jsonl": None,
            "missing.jsonl": "line 1: not a valid run record (no 'sweep_id')",
            "mistyped.jsonl": "line 1: not a valid run record ('tok_s' is 'fast'",
            "tokens.jsonl": "output_tokens is not a list", "one-long-line.jsonl": "line 1: longer than 16 MiB"}
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        if want[name] is None:
            assert load_records(p) == []  # no record in it: the front ends say "no runs"
            continue
        with pytest.raises(UserError) as e:
            load_records(p)
        assert str(p) in str(e.value) and want[name] in str(e.value), str(e.value)
    # a float written as a whole number is still a float field's value
    p = tmp_path / "int-tok-s.jsonl"
    p.write_text(json.dumps({**good, "tok_s": 10}) + "\n")
    assert load_records(p)[0].tok_s == 10
