"""The results reader on large files: msgspec reads the lines, checking each run
record's types as it reads, and json reads what msgspec does not. Whatever a file holds, the
records, their values' types, the lines left out and the errors are those of the plain json reader
(RunRecord.from_dict on json.loads), which is what the reader does without msgspec."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import random

import pytest

from app.core.records import reader as results_reader
from app.core.common.errors import UserError
from app.core.records.reader import load_cost_records, load_records
from app.core.records.schema import SCHEMA_VERSION, RunRecord
from tests.helpers import make_record

msgspec = pytest.importorskip("msgspec")


def rec(**kw) -> RunRecord:
    """make_record with a seed in the sampling and a host, as files hold them."""
    return make_record(**{"sampling": {"temperature": 0.0, "seed": 1}, "host": {"os": "Linux", "cpu_count": 8}, **kw})


def line(r: RunRecord | None = None, **changes) -> str:
    """A record's line as to_json writes it, with fields changed (a value of `...` removes one)."""
    d = json.loads((r or rec()).to_json())
    for k, v in changes.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return json.dumps(d, ensure_ascii=False)


@contextlib.contextmanager
def plain(monkeypatch):
    """The reader without msgspec: json.loads and RunRecord.from_dict for every line."""
    with monkeypatch.context() as m:
        m.setattr(results_reader, "msgspec", None)
        results_reader._run_decoder.cache_clear()
        results_reader._any_decoder.cache_clear()
        try:
            yield
        finally:
            results_reader._run_decoder.cache_clear()
            results_reader._any_decoder.cache_clear()


def read(path, reader, mtp_times=True):
    """What a reader makes of a file: the records (with each field's type), the problems, or the
    error; for the cost-probe records too."""
    problems: list[str] = []
    try:
        recs = reader(path, problems, mtp_times=mtp_times)
        got = [(r, [type(v) for v in dataclasses.astuple(r)],
                [type(x) for x in r.token_times + r.output_tokens + r.prompt_tokens]) for r in recs]
    except (UserError, OverflowError) as e:  # OverflowError: a 400-digit token time, as before
        got = f"{type(e).__name__}: {e}"
    try:
        costs = load_cost_records(path)
    except UserError as e:
        costs = f"UserError: {e}"
    return got, problems, costs


def both(path, monkeypatch, mtp_times=True):
    assert results_reader._run_decoder() is not None
    fast = read(path, load_records, mtp_times)
    with plain(monkeypatch):
        slow = read(path, load_records, mtp_times)
    return fast, slow


LINES = {
    "as written": line(),
    "baseline": line(rec(arm_kind="baseline", k=None, p_min=None, draft_n=None, draft_accepted=None,
                         acceptance=None, mtp_engaged=None, run_id="b1")),
    "failed": line(rec(status="failed", tok_s=None, tok_s_engine=None, output_tokens=(), token_times=(),
                       output_sha256=None, error="llama-server exited (code -9)")),
    "ints for floats": line(tok_s=10, p_min=0, acceptance=1, token_times=[0, 1, 2.5, 3]),
    "keys in another order": json.dumps(dict(reversed(json.loads(line()).items()))),
    "no flags, no error, no record_type": line(flags=..., error=..., record_type=...),
    "unknown fields": line(extra={"a": [1, 2, {"b": None}]}, more=1e300),
    "big integers": line(model_size=2**70, sampling={"seed": -2**80, "x": 12345678901234567890123}),
    "big integer tokens": line(output_tokens=[2**64, 1], prompt_tokens=[-2**63 - 1]),
    "big float": line(tok_s=1.7976931348623157e308, token_times=[1e308, 1e308, 1e308]),
    "NaN speed": line().replace('"tok_s": 10.0', '"tok_s": NaN'),
    "Infinity time": line().replace("0.4]", "Infinity]"),
    "1e400": line().replace('"tok_s": 10.0', '"tok_s": 1e400'),
    "lone surrogate": line(error="x").replace('"error": "x"', '"error": "\\ud800"'),
    "escapes and unicode": line(model_path="C:\\models\\é \u2028 \"q\".gguf", task="tâche\t1"),
    "duplicate key": line()[:-1] + ', "k": 3}',
    "sampled": line(sampling={"temperature": 0.7, "top_p": [0.9, None], "nested": {"a": True}}),
    "null for a list": line(flags=None),  # () as before
    "negative zero": line(tok_s_engine=-0.0, p_min=-0.0, token_times=[-0.0, 0.0]),
    "cost record": json.dumps({"record_type": "cost", "schema_version": 1, "run_id": "c1"}),
    "other record type": line(record_type="note"),
    "not a record": json.dumps({"hello": 1}),
    "a list": "[1, 2]",
    "cut short": line()[:200],
    "blank": "   ",
}
ERRORS = {  # lines whose record is an error: the file is refused, with the same message
    "bool for an int": line(k=True),
    "float token": line(output_tokens=[1, 2.0]),
    "bool token time": line(token_times=[0.1, True]),
    "string time": line(token_times=[0.1, "x"]),
    "list for a string": line(task=["code"]),
    "no run_id": line(run_id=...),
    "no model_size": line(model_size=...),
    "float for an int": line(rep=1.0),
    "dict for a list": line(prompt_tokens={"a": 1}),
    "newer schema": line(schema_version=SCHEMA_VERSION + 1),
    "schema_version as a string": line(schema_version="1"),
    "huge token time": line(token_times=[float("nan")]).replace("NaN", "1" * 400),
}


@pytest.mark.parametrize("mtp_times", [True, False])
@pytest.mark.parametrize("name", sorted(LINES) + sorted(ERRORS))
def test_each_kind_of_line_reads_as_with_json(tmp_path, monkeypatch, name, mtp_times):
    text = LINES.get(name) or ERRORS[name]
    path = tmp_path / "r.jsonl"
    path.write_text(line(run_id="before") + "\n" + text + "\n" + line(rec(arm_kind="baseline", k=None, run_id="after")) + "\n",
                    encoding="utf-8")
    fast, slow = both(path, monkeypatch, mtp_times)
    assert fast == slow


def test_a_whole_file_of_every_kind_reads_as_with_json(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    rng = random.Random(4)
    texts = list(LINES.values()) * 5
    rng.shuffle(texts)
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(texts).encode("utf-8") + b"\n{\"cut")
    for mtp_times in (True, False):
        fast, slow = both(path, monkeypatch, mtp_times)
        assert fast == slow
        assert len(fast[0]) > 50 and len(fast[1]) > 30  # records, and lines left out, were there


def test_random_values_read_as_with_json(tmp_path, monkeypatch):
    """Each field, one at a time or a few together, given values of every JSON type: the same
    record, types and all, or the same refusal."""
    rng = random.Random(9)
    values = [0, 1, -1, 2**63, 2**64, -2**63 - 1, 10**30, 0.0, -0.0, 0.5, 1e300, 5e-324, True, False, None,
              "", "x", "é", [], [1, 2], [1, 2.5], [0.1, 2**70], ["a"], [None], [True], {}, {"a": 1},
              {"a": [1, {"b": 2**65}]}]
    keys = sorted(json.loads(line()))
    for i in range(300):
        d = json.loads(line(rec(k=rng.choice([None, 1, 3]), run_id=f"r{i}")))
        for key in rng.sample(keys, rng.choice([1, 1, 2, 3])):
            d[key] = rng.choice(values)
        path = tmp_path / f"r{i}.jsonl"
        path.write_text(line() + "\n" + json.dumps(d) + "\n", encoding="utf-8")
        fast, slow = both(path, monkeypatch, mtp_times=bool(i % 2))
        assert fast == slow, d


def test_parse_is_json_loads():
    docs = [b'{"a": 1}', b"[1.5e-7, 0.1, 3.000000000000001, -0, -0.0, 1E5]", b"123456789012345678901234567890",
            b"-9223372036854775809", b"18446744073709551616", b'"\\ud83d\\ude00"', b"[NaN, Infinity, -Infinity]",
            b"1e400", b'"\\ud800"', b"[" * 64 + b"]" * 64, b'{"a": 1, "a": 2}']
    rng = random.Random(1)
    for _ in range(3000):
        x = rng.choice([rng.random() * 10 ** rng.randrange(-30, 30), rng.randrange(-10**25, 10**25),
                        float(rng.getrandbits(53)) / 2 ** rng.randrange(80)])
        docs.append(repr(x).encode())
    for doc in docs:
        want = json.loads(doc.decode())
        got = results_reader._parse(doc)
        assert repr(got) == repr(want) and type(got) is type(want)
    for bad in (b'{"a": 1', b'{"a": 01}', b'\xff', b'{"a": "\xed\xa0\x80"}', b"[1,]", b"", b'"\x01"',
                b'{"a": 1}\x0c', b'\x0b{}', b'{} \xc2\xa0', b'{"a": +1}', b'{"a": .1}', b'{"a": 0x1}', b"{'a': 1}",
                b'{"a": 1}{"b": 2}', b'{"a": "\\x"}', b'{"a": tRue}', b'{"a": 1.5e+}'):
        with pytest.raises(ValueError):
            json.loads(bad.decode("utf-8"))  # what the reader did before
        with pytest.raises(ValueError):
            results_reader._parse(bad)
    # nested deeper than any record: refused before either parser recurses (both end in
    # RecursionError at [ x 100,000), as a ValueError like any line that is not a record
    for deep in (b"[" * 65 + b"]" * 65, b'{"a":' * 65 + b"1" + b"}" * 65, b"[" * 100_000):
        with pytest.raises(ValueError, match="nested deeper than 64"):
            results_reader._parse(deep)


def test_mtp_times_false_leaves_out_only_the_mtp_runs_times_but_their_ends(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    recs = [rec(run_id="m1"), rec(run_id="b1", arm_kind="baseline", k=None, p_min=None),
            rec(run_id="m2", k=3, token_times=(0.5,) * 20)]
    path.write_text("".join(r.to_json() + "\n" for r in recs)
                    + line(run_id="bad").replace("0.4]", "NaN]") + "\n", encoding="utf-8")
    problems: list[str] = []
    got = load_records(path, problems, mtp_times=False)
    # an MTP run keeps its first and last time only: the whole answer's span (issue 55)
    assert got == [dataclasses.replace(r, token_times=(r.token_times[0], r.token_times[-1]) if r.k else r.token_times)
                   for r in recs]
    assert problems == [f"{path} line 4: token_times has a value that is not a finite number; "
                        "the record is left out of the statistics"]  # still checked, then left out
    assert load_records(path) == recs


def test_sharing_and_types_as_the_plain_reader(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(line(rec(run_id=f"r{i}", host={"os": "Linux", "n": i})) + "\n" for i in range(5)))
    got = load_records(path)
    assert got[0].output_tokens is got[4].output_tokens and got[0].model_path is got[4].model_path
    assert got[0].host["os"] is got[4].host["os"] and got[0].host is not got[4].host  # different hosts
    got[0].host["n"] = 99  # a record's dict is its own unless another record has the same host
    assert [r.host["n"] for r in got] == [99, 1, 2, 3, 4]
    with plain(monkeypatch):
        assert load_records(path) == [dataclasses.replace(got[0], host={"os": "Linux", "n": 0})] + got[1:]


def test_schema_2_devices_and_hosts_are_shared(tmp_path, monkeypatch):
    """Schema 2 records repeat their devices and their host (with its GPUs, a list of dicts): one
    object each across a file's records, as flags are (200k runs: tens of MB otherwise), by either
    reader; equal records all the same, and a host written otherwise (1 for 1.0, another GPU) its own."""
    gpus = [{"vendor": "nvidia", "name": "RTX 4090", "memory_mb": 24564}]
    host = {"os": "Linux", "cpu_count": 8, "gpus": gpus}
    recs = [rec(run_id=f"r{i}", backend="CUDA", devices=("CUDA0",), offloaded_layers=33, layers_total=33,
                host=json.loads(json.dumps(host))) for i in range(4)]
    recs.append(rec(run_id="r4", backend="CUDA", devices=("CUDA0",),
                    host={**host, "gpus": [{**gpus[0], "memory_mb": 24564.0}]}))
    path = tmp_path / "r.jsonl"
    path.write_text("".join(line(r) + "\n" for r in recs), encoding="utf-8")
    for reader in (contextlib.nullcontext, lambda: plain(monkeypatch)):
        with reader():
            got = load_records(path)
        assert got == recs
        assert got[0].devices is got[3].devices is got[4].devices
        assert got[0].host is got[3].host and got[0].host["gpus"] is got[3].host["gpus"]
        assert got[4].host is not got[0].host and type(got[4].host["gpus"][0]["memory_mb"]) is float


def test_gc_paused_restores_what_was_there():
    was = gc.isenabled()
    try:
        gc.enable()
        with results_reader.gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled()
        with pytest.raises(KeyError), results_reader.gc_paused():
            raise KeyError
        assert gc.isenabled()
        gc.disable()
        with results_reader.gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


def test_the_decoder_knows_every_field():
    """A field added to RunRecord with a type the decoder's table lacks would silently send every
    line through json: the table must grow with it."""
    assert results_reader._run_decoder() is not None
    assert [s.__name__ for s in results_reader._slots()[-2]] == [f.name for f in dataclasses.fields(RunRecord)]

