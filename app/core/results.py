"""Results: one frozen record per finished run, appended as one JSON line at once.

A crash loses at most the run in flight: every record is written, flushed and fsynced before the
next run starts. Unknown fields in old or newer files are kept out of the dataclass but do not
break reading.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import platform
import uuid
from pathlib import Path
from typing import Any, Iterator

from .errors import UserError

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
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
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for key in ("output_tokens", "prompt_tokens", "token_times", "flags"):
            kw[key] = tuple(kw.get(key) or ())
        kw.setdefault("error", None)
        return cls(**kw)


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


def _objects(path: str | os.PathLike, record_type: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of one record type in a results file; a line cut short by a crash (the
    last one) is skipped; a file from a newer schema is refused."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{p}: results file not found")
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if not isinstance(d, dict) or d.get("schema_version") is None or "run_id" not in d:
                continue
            if d.get("record_type", "run") != record_type:
                continue
            if int(d["schema_version"]) > SCHEMA_VERSION:
                raise UserError(f"{p} line {n}: written by a newer MTP Tuner (schema "
                                f"{d['schema_version']}); update the app to read it")
            yield d


def iter_records(path: str | os.PathLike) -> Iterator[RunRecord]:
    """The run records of a results file."""
    for d in _objects(path, "run"):
        yield RunRecord.from_dict(d)


def load_records(path: str | os.PathLike) -> list[RunRecord]:
    return list(iter_records(path))


def load_cost_records(path: str | os.PathLike) -> list:
    """The cost-probe records of a results file (see app.core.probe.CostRecord)."""
    from .probe import CostRecord

    return [CostRecord.from_dict(d) for d in _objects(path, "cost")]


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one JSON line durably (flush + fsync)."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
