"""Results: one frozen record per finished run, appended as one JSON line at once.

A crash loses at most the run in flight: every record is written, flushed and fsynced before the
next run starts. Unknown fields in old or newer files are kept out of the dataclass but do not
break reading.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import os
import platform
import uuid
from pathlib import Path
from typing import Any, Iterator

from .errors import UserError

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)  # slots: 33 fields are too many for a shared-key __dict__
class RunRecord:
    schema_version: int
    run_id: str
    sweep_id: str
    status: str  # "ok" | "failed"
    engine: str
    arm: str  # "baseline" | "mtp"
    k: int | None
    p_min: float | None
    task: str
    prompt_id: str
    rep: int
    n_predict: int
    n_generated: int
    tok_s: float | None  # decode tok/s from our own token timestamps, first token excluded
    tok_s_engine: float | None  # the engine's own figure
    draft_n: int | None
    draft_accepted: int | None
    acceptance: float | None
    mtp_engaged: bool | None
    output_sha256: str | None  # sha256 of the generated token ids (JSON list)
    output_tokens: tuple[int, ...]
    prompt_n: int | None
    prompt_tokens: tuple[int, ...]
    prompt_tok_s: float | None
    llama_build: str
    model_path: str
    model_size: int
    sampling: dict[str, Any]
    token_times: tuple[float, ...]
    timestamp_utc: str
    host: dict[str, Any]
    flags: tuple[str, ...] = ()
    error: str | None = None

    def to_json(self) -> str:
        d = {"record_type": "run", **dataclasses.asdict(self)}
        d["output_tokens"] = list(self.output_tokens)
        d["prompt_tokens"] = list(self.prompt_tokens)
        d["token_times"] = [round(t, 6) for t in self.token_times]
        d["flags"] = list(self.flags)
        return json.dumps(d, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunRecord":
        """Raises ValueError naming the first missing or mistyped field."""
        names, fields = _fields(cls)
        kw = {k: v for k, v in d.items() if k in names}
        for key in ("output_tokens", "prompt_tokens", "token_times", "flags"):
            if not isinstance(kw.get(key) or (), (list, tuple)):
                raise ValueError(f"{key} is not a list")
            kw[key] = tuple(kw.get(key) or ())
        kw.setdefault("error", None)
        for f, fast in fields:
            if f.name not in kw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ValueError(f"no {f.name!r}")
                continue
            if type(kw[f.name]) in fast:
                continue
            if not _type_ok(kw[f.name], str(f.type)):
                raise ValueError(f"{f.name!r} is {kw[f.name]!r}, expected {f.type}")
        return cls(**kw)


@functools.lru_cache(maxsize=None)
def _fields(cls) -> tuple[frozenset[str], tuple[tuple[dataclasses.Field, frozenset], ...]]:
    """The field names, and each field with the types that fit it for sure (those _type_ok
    accepts whatever the value; the empty set for the tuples, whose items need a look)."""
    fields = dataclasses.fields(cls)
    fast = []
    for f in fields:
        parts = [_FAST.get(a.strip()) for a in str(f.type).split("|")]
        fast.append((f, frozenset().union(*parts) if all(p is not None for p in parts) else frozenset()))
    return frozenset(f.name for f in fields), tuple(fast)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


_CHECKS = {"int": _is_int, "float": _is_num, "str": lambda x: isinstance(x, str),
           "bool": lambda x: isinstance(x, bool), "None": lambda x: x is None,
           "dict[str, Any]": lambda x: isinstance(x, dict),
           # the set of element types first (in C): what JSON gives passes at once, and the
           # element-wise check decides the rest
           "tuple[int, ...]": lambda x: _INT.issuperset(map(type, x)) or all(_is_int(v) for v in x),
           "tuple[float, ...]": lambda x: _NUM.issuperset(map(type, x)) or all(_is_num(v) for v in x),
           "tuple[str, ...]": lambda x: _STR.issuperset(map(type, x)) or all(isinstance(v, str) for v in x)}
_INT, _NUM, _STR = frozenset({int}), frozenset({int, float}), frozenset({str})
_FAST = {"int": _INT, "float": _NUM, "str": _STR, "bool": frozenset({bool}), "None": frozenset({type(None)}),
         "dict[str, Any]": frozenset({dict})}


@functools.lru_cache(maxsize=None)
def _checks(annotation: str) -> tuple:
    return tuple(_CHECKS.get(a.strip()) for a in annotation.split("|"))


def _type_ok(value: Any, annotation: str) -> bool:
    """Does a value read from JSON fit a field annotated as ``annotation`` (e.g. "float | None")?"""
    for c in _checks(annotation):
        if c is None or c(value):
            return True
    return False


def tokens_sha256(tokens) -> str:
    return hashlib.sha256(json.dumps(list(tokens), separators=(",", ":")).encode()).hexdigest()


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def host_info() -> dict[str, Any]:
    return {"os": platform.platform(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version()}


class ResultsWriter:
    """Appends records to a JSONL file; each line is on disk before :meth:`append` returns."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise UserError(f"{self.path}: cannot write the results file ({e.strerror or e})") from None
        self.count = 0

    def append(self, rec: RunRecord) -> None:
        self._f.write(rec.to_json() + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        self.count += 1

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MAX_LINE = 16 * 2**20  # no record comes near this; a longer "line" means another kind of file


def _objects(path: str | os.PathLike, record_type: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The JSON objects of one record type in a results file; a line cut short by a crash (the
    last one) is skipped; a file from a newer schema or another kind of file is refused."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{p}: results file not found")
    try:
        f = open(p, "rb")
    except OSError as e:
        raise UserError(f"{p}: cannot read it ({e.strerror or e})") from None
    with f:
        if f.read(4) == b"GGUF":
            raise UserError(f"{p}: a GGUF model, not a results file (results files end in .jsonl)")
        f.seek(0)
        n = 0
        while True:
            raw = f.readline(MAX_LINE + 1)
            if not raw:
                break
            n += 1
            if len(raw) > MAX_LINE:
                raise UserError(f"{p} line {n}: longer than {MAX_LINE // 2**20} MiB: not an MTP Tuner results file")
            if not raw.strip():
                continue
            if record_type != "run" and raw.startswith(_RUN_LINE):
                continue  # a run record, as RunRecord.to_json begins it: not what is asked for
            try:
                d = json.loads(raw.decode("utf-8"))
            except ValueError:  # also UnicodeDecodeError: a line cut short, or not text at all
                continue
            if not isinstance(d, dict) or d.get("schema_version") is None or "run_id" not in d:
                continue
            if d.get("record_type", "run") != record_type:
                continue
            try:
                version = int(d["schema_version"])
            except (TypeError, ValueError):
                continue
            if version > SCHEMA_VERSION:
                raise UserError(f"{p} line {n}: written by a newer MTP Tuner (schema "
                                f"{d['schema_version']}); update the app to read it")
            yield f"{p} line {n}", d


_RUN_LINE = b'{"record_type":"run",'
_SHARED_STR = ("sweep_id", "status", "engine", "arm", "task", "prompt_id", "output_sha256", "llama_build",
               "model_path", "error")


def _share(d: dict[str, Any], shared: dict) -> None:
    """One object for equal values across a file's records: greedy runs of a prompt have the same
    output tokens, every run of a prompt the same prompt tokens, and the names, paths and the keys
    of ``sampling`` and ``host`` repeat. Only values of exactly the types JSON gives are shared
    (so ``1`` never stands in for ``1.0``), and the dicts themselves are not: same values, half
    the memory in a large file."""
    for key, types in (("output_tokens", _INT), ("prompt_tokens", _INT), ("flags", _STR)):
        v = d.get(key)
        if type(v) is list and types.issuperset(map(type, v)):
            t = tuple(v)
            d[key] = shared.setdefault((key, t), t)
    for key in _SHARED_STR:
        v = d.get(key)
        if type(v) is str:
            d[key] = shared.setdefault(v, v)
    for key in ("sampling", "host"):
        v = d.get(key)
        if type(v) is dict:
            d[key] = {(shared.setdefault(k, k) if type(k) is str else k):
                      (shared.setdefault(x, x) if type(x) is str else x) for k, x in v.items()}


def iter_records(path: str | os.PathLike) -> Iterator[RunRecord]:
    """The run records of a results file."""
    shared: dict = {}
    for where, d in _objects(path, "run"):
        _share(d, shared)
        try:
            yield RunRecord.from_dict(d)
        except ValueError as e:
            raise UserError(f"{where}: not a valid run record ({e})") from None


def load_records(path: str | os.PathLike) -> list[RunRecord]:
    return list(iter_records(path))


def load_cost_records(path: str | os.PathLike) -> list:
    """The cost-probe records of a results file (see app.core.probe.CostRecord)."""
    from .probe import CostRecord

    out = []
    for where, d in _objects(path, "cost"):
        try:
            out.append(CostRecord.from_dict(d))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise UserError(f"{where}: not a valid cost-probe record ({type(e).__name__}: {e})") from None
    return out


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one JSON line durably (flush + fsync)."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
