"""Results: one frozen record per finished run, appended as one JSON line at once.

A crash loses at most the run in flight: every record is written, flushed and fsynced before the
next run starts. Unknown fields in old or newer files are kept out of the dataclass but do not
break reading.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import gc
import hashlib
import itertools
import json
import logging
import math
import operator
import os
import platform
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence, Union

from app.core.common.errors import UserError, write_reason
from app.core.records.cost import CostRecord

try:  # a dependency (pyproject.toml); without it json reads every file alike, only slower
    import msgspec
except ImportError:  # pragma: no cover - an environment installed before msgspec was a dependency
    msgspec = None

SCHEMA_VERSION = 1
log = logging.getLogger(__name__)


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


def check_writable(path: str | os.PathLike, what: str = "results file") -> Path:
    """Before the work starts: can ``path`` be written (created or appended to)? Creates nothing.
    Raises UserError naming the file and the cause."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError(f"{p}: is a folder; give a file name for the {what}")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise UserError(f"{p}: cannot write the {what} (permission denied)")
        return p
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{p}: cannot write the {what} ({parent} is a file, not a folder)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{p}: cannot write the {what} (no permission to write in {parent})")
    return p


def write_error(path: Path, e: OSError, what: str = "results file") -> UserError:
    """One sentence for a failed write: the file and the cause in plain words."""
    return UserError(f"{path}: cannot write the {what} ({write_reason(e)})")


class ResultsWriter:
    """Appends records to a JSONL file; each line is on disk before :meth:`append` returns.

    The destination is checked when the writer is made, but the file is created only with the
    first record, so an error before any run leaves no empty file behind. A file whose last line
    was cut short (a crash or a full disk in an earlier sweep) gets that line ended first, so the
    next record is not glued onto it; ``notes`` says so. A failed write stops with a UserError
    naming the file and the cause; the records written before it stay whole."""

    def __init__(self, path: str | os.PathLike, what: str = "results file"):
        self.what = what
        self.path = check_writable(path, what)
        self._fd: int | None = None
        self.count = 0
        self.notes: list[str] = []

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
        except OSError as e:
            raise write_error(self.path, e, self.what) from None
        try:
            end_cut_line(self.path, fd, self.notes)
        except OSError as e:
            os.close(fd)
            raise write_error(self.path, e, self.what) from None
        return fd

    def append(self, rec: RunRecord) -> None:
        try:
            self.append_line(rec.to_json())
        except UserError as e:
            raise UserError(f"{e}; the sweep stopped there") from None

    def append_line(self, line: str) -> None:
        """Write one line and fsync it; on failure cut the file back to where the line began, so
        no partial line is left for the next reader or writer."""
        if self._fd is None:
            self._fd = self._open()
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            _write_all(self._fd, (line + "\n").encode("utf-8"))
            os.fsync(self._fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            kept = f"; the {self.count} record(s) written before are kept" if self.count else ""
            raise UserError(f"{write_error(self.path, e, self.what)}{kept}") from None
        self.count += 1

    def take_notes(self) -> list[str]:
        out, self.notes = self.notes, []
        return out

    def close(self) -> None:
        """Close the file; one that no record reached and that is empty (a name reserved for a
        sweep that then did not run) is removed, so no empty results file is left behind."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)  # every record was fsynced when written
        if self.count == 0:
            with contextlib.suppress(OSError):
                if self.path.is_file() and self.path.stat().st_size == 0:
                    self.path.unlink()

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def end_cut_line(path: Path, fd: int, notes: list[str]) -> None:
    """If the file does not end with a newline, its last line was cut short (a crash or a full
    disk): end it, so what comes next starts on a line of its own, and say so in ``notes``."""
    size = os.lseek(fd, 0, os.SEEK_END)
    if not size:
        return
    with open(path, "rb") as r:
        r.seek(size - 1)
        if r.read(1) == b"\n":
            return
        r.seek(0)
        n_lines = sum(chunk.count(b"\n") for chunk in iter(lambda: r.read(1 << 20), b"")) + 1
    _write_all(fd, b"\n")
    os.fsync(fd)
    notes.append(f"{path} line {n_lines}: the last line was cut short (a crash or a full disk while "
                 "writing); it was ended so that new records stay readable, and it is left out")


MAX_LINE = 16 * 2**20  # no record comes near this; a longer "line" means another kind of file
_READ_BUFFER = 2**20  # a 600 MB file in 1 MiB reads, not 8 KiB ones (a tenth of the time reading it line by line)


def _objects(path: str | os.PathLike, record_type: str,
             problems: list[str] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """The JSON objects of one record type in a results file. A line cut short (a crash or a
    full disk while writing) or that is not a record is left out and reported in ``problems``
    with its line number; a file from a newer schema or another kind of file is refused."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{p}: results file not found")
    try:
        f = open(p, "rb", buffering=_READ_BUFFER)
    except OSError as e:
        raise UserError(f"{p}: cannot read it ({e.strerror or e})") from None
    say = problems.append if problems is not None else log.warning
    typed = _run_decoder() if record_type == "run" else None
    name = str(p)
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
            if raw.isspace():
                continue
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark left by an editor
            if record_type != "run" and raw.startswith(_RUN_LINE):
                continue  # a run record, as RunRecord.to_json begins it: not what is asked for
            if typed is not None:
                try:
                    run = typed(raw)
                except (ValueError, RecursionError):  # not a run record with every field of a type that fits
                    pass
                else:
                    if run.record_type == "run" and run.schema_version <= SCHEMA_VERSION:
                        yield f"{name} line {n}", run
                        continue
            try:
                d = _parse(raw)
            except ValueError:  # also UnicodeDecodeError: a line cut short, or not text at all
                say(f"{p} line {n}: cut short or not a record (a crash or a full disk while writing?); "
                    "left out")
                continue
            if not isinstance(d, dict) or d.get("schema_version") is None or "run_id" not in d:
                say(f"{p} line {n}: not an MTP Tuner record; left out")
                continue
            if d.get("record_type", "run") != record_type:
                continue
            try:
                version = int(d["schema_version"])
            except (TypeError, ValueError):
                say(f"{p} line {n}: schema_version {d['schema_version']!r} is not a number; left out")
                continue
            if version > SCHEMA_VERSION:
                raise UserError(f"{p} line {n}: written by a newer MTP Tuner (schema "
                                f"{d['schema_version']}); update the app to read it")
            yield f"{name} line {n}", d


def _parse(raw: bytes) -> Any:
    """One line's JSON value, as json.loads gives it (msgspec reads a line several times faster
    and gives the same values, big integers included, where it reads it at all); json reads what
    msgspec does not (NaN and Infinity, which old files may hold and bad_numbers then reports,
    numbers beyond a double's range, lone surrogates) or says why the line is not JSON. Raises
    ValueError (UnicodeDecodeError included), as json.loads does."""
    if msgspec is not None:
        try:
            return _any_decoder()(raw)
        except (ValueError, RecursionError):
            pass
    return json.loads(raw.decode("utf-8"))


@functools.lru_cache(maxsize=None)
def _any_decoder():
    return msgspec.json.Decoder().decode


# the types msgspec checks while it reads a run record: exactly those that RunRecord.from_dict
# takes without a closer look (JSON's int and float for a float, not bool; int for an int, ...)
_DECODE_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,), "None": (type(None),),
                 "dict[str, Any]": (dict[str, Any],), "tuple[int, ...]": (tuple[int, ...],),
                 "tuple[float, ...]": (tuple[Union[float, int], ...],), "tuple[str, ...]": (tuple[str, ...],)}


@functools.lru_cache(maxsize=None)
def _run_decoder():
    """msgspec's reader of a run record line (RunRecord.to_json's, in any order, other fields
    left out) whose every field has a type that from_dict takes as it is, else None. It checks
    the types in C while it reads: a line whose values it refuses is read as JSON and checked
    by from_dict, which says what is wrong."""
    if msgspec is None:
        return None
    fields = []
    for f in dataclasses.fields(RunRecord):
        parts = [_DECODE_TYPES.get(a.strip()) for a in str(f.type).split("|")]
        if None in parts:
            return None  # a type this table does not know: from_dict checks every record
        t = Union[tuple(itertools.chain.from_iterable(parts))]
        if f.default is not dataclasses.MISSING:
            fields.append((f.name, t, f.default))
        elif f.default_factory is not dataclasses.MISSING:
            return None
        else:
            fields.append((f.name, t))
    fields.append(("record_type", str, "run"))
    return msgspec.json.Decoder(msgspec.defstruct("RunLine", fields)).decode


def bad_numbers(rec: RunRecord) -> str | None:
    """Why a record's numbers cannot be measurements (infinite, NaN, negative or zero speeds,
    acceptance outside 0..1, more accepted than drafted), or None when they can."""
    return _bad_scalars(rec) or bad_times(rec.token_times)


def _bad_scalars(rec: RunRecord) -> str | None:
    """bad_numbers but for the token times."""
    for name in ("tok_s", "tok_s_engine", "prompt_tok_s"):
        v = getattr(rec, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            return f"{name} is {v!r}"
    if rec.p_min is not None and not math.isfinite(rec.p_min):
        return f"p_min is {rec.p_min!r}"
    if rec.acceptance is not None and not (math.isfinite(rec.acceptance) and 0 <= rec.acceptance <= 1):
        return f"acceptance is {rec.acceptance!r}"
    for name in ("draft_n", "draft_accepted", "n_generated", "n_predict"):
        v = getattr(rec, name)
        if v is not None and v < 0:
            return f"{name} is {v!r}"
    if rec.draft_n is not None and rec.draft_accepted is not None and rec.draft_accepted > rec.draft_n:
        return f"draft_accepted ({rec.draft_accepted}) is more than draft_n ({rec.draft_n})"
    if rec.k is not None and rec.k < 1:
        return f"k is {rec.k!r}"
    return None


def bad_times(token_times: Sequence[float]) -> str | None:
    """bad_numbers' check of the token times."""
    if not all(map(math.isfinite, token_times)):
        return _BAD_TIMES
    return None


_BAD_TIMES = "token_times has a value that is not a finite number"


def _bad_times_fast(xs: tuple) -> str | None:
    """bad_times for a tuple of ints and floats (exactly those types, as msgspec reads them): a
    NaN or an infinity among them makes their sum one, and a sum too large for a float says
    nothing (then each is looked at)."""
    try:
        if math.isfinite(sum(xs)):
            return None
    except OverflowError:
        pass
    return bad_times(xs)


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
            d[key] = _share_dict(v, shared.setdefault)


def _share_dict(v: dict, setdefault) -> dict:
    """A copy of a dict with its string keys and values shared (see _share)."""
    return {(setdefault(k, k) if type(k) is str else k): (setdefault(x, x) if type(x) is str else x)
            for k, x in v.items()}


@functools.lru_cache(maxsize=None)
def _slots() -> tuple:
    """For _decoded_record: where the values that _share shares are among a decoded line's
    fields (the fields in order, then record_type), how to put each field's value in order from
    those fields followed by the shared strings, the shared lists and an empty tuple (with and
    without the token times), the dicts' positions and k's, and each field's slot. A record is
    built as pickle rebuilds one, slot by slot: RunRecord's __init__ only sets the fields (it has
    no __post_init__)."""
    order = tuple(f.name for f in dataclasses.fields(RunRecord))
    assert not hasattr(RunRecord, "__post_init__")
    n = len(order) + 1  # and record_type
    strs = [order.index(k) for k in _SHARED_STR]
    lists = [order.index(k) for k in ("output_tokens", "prompt_tokens", "flags")]
    at = list(range(len(order)))
    for j, i in enumerate(strs):
        at[i] = n + j
    for j, i in enumerate(lists):
        at[i] = n + len(strs) + j
    without_times = list(at)
    without_times[order.index("token_times")] = n + len(strs) + len(lists)  # the empty tuple
    slots = tuple(vars(RunRecord)[name] for name in order)
    return (operator.itemgetter(*strs), operator.itemgetter(*lists), tuple(order[i] for i in lists),
            operator.itemgetter(*at), operator.itemgetter(*without_times),
            tuple(order.index(k) for k in ("sampling", "host")), order.index("k"), slots, type(slots[0]).__set__)


def _decoded_record(run, shared: dict, mtp_times: bool) -> RunRecord:
    """The record of a line that _run_decoder read (each value of a type that from_dict takes as
    it is), with the values _share shares shared, and without the token times of an MTP run when
    ``mtp_times`` is false."""
    strs, lists, list_names, pick, pick_without_times, dicts, k_at, slots, set_slot = _slots()
    vals = msgspec.structs.astuple(run)
    setdefault = shared.setdefault
    for i in dicts:  # msgspec reuses short dict keys across lines already: the string values, in place
        v = vals[i]
        for k, x in v.items():
            if type(x) is str:
                v[k] = setdefault(x, x)
    s, t = strs(vals), lists(vals)
    vals += (*map(setdefault, s, s), *map(setdefault, zip(list_names, t), t), ())  # None shares as None
    rec = object.__new__(RunRecord)
    any(map(set_slot, slots, itertools.repeat(rec),  # each returns None: every slot is set
            (pick if mtp_times or vals[k_at] is None else pick_without_times)(vals)))
    return rec


def iter_records(path: str | os.PathLike, problems: list[str] | None = None, *,
                 mtp_times: bool = True) -> Iterator[RunRecord]:
    """The run records of a results file. Lines that are cut short, not records, or whose numbers
    cannot be measurements are left out and reported in ``problems`` (or the log), each with the
    file and line; a record with a missing or mistyped field is an error.

    ``mtp_times=False``: the token times of MTP runs (k set) are checked as always, then left out
    of their records (an empty tuple). analyze uses only the baseline runs' (for its gap
    statistics), and in a large file the MTP runs' times are most of the memory (200k runs: some
    650 MB); recommend and compare read files so. The Results tab keeps them."""
    say = problems.append if problems is not None else log.warning
    shared: dict = {}
    for where, d in _objects(path, "run", problems):
        if type(d) is not dict:  # read by _run_decoder: every field of a type that fits
            rec = _decoded_record(d, shared, mtp_times)
            why = _bad_scalars(rec) or _bad_times_fast(d.token_times)
        else:
            _share(d, shared)
            try:
                rec = RunRecord.from_dict(d)
            except ValueError as e:
                raise UserError(f"{where}: not a valid run record ({e})") from None
            why = bad_numbers(rec)
            if not mtp_times and rec.k is not None and not why:
                rec = dataclasses.replace(rec, token_times=())
        if why:
            say(f"{where}: {why}; the record is left out of the statistics")
            continue
        yield rec


def load_records(path: str | os.PathLike, problems: list[str] | None = None, *,
                 mtp_times: bool = True) -> list[RunRecord]:
    """iter_records as a list (see there for ``mtp_times``)."""
    with gc_paused():
        return list(iter_records(path, problems, mtp_times=mtp_times))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a large file's records are built or analysed: they
    hold no cycles, and each collection would go through all of them again (200k runs: a tenth
    of the time). Reference counting frees memory as always; collections resume after, unless
    they were off before."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_cost_records(path: str | os.PathLike) -> list:
    """The cost-probe records of a results file."""
    out = []
    for where, d in _objects(path, "cost", []):  # cut or foreign lines: load_records reports them
        try:
            out.append(CostRecord.from_dict(d))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise UserError(f"{where}: not a valid cost-probe record ({type(e).__name__}: {e})") from None
    return out


def append_line(path: str | os.PathLike, line: str, what: str = "results file") -> None:
    """Append one JSON line durably (flush + fsync), ending a cut last line first. Raises
    UserError naming the file and the cause when it cannot be written."""
    with ResultsWriter(path, what) as w:
        w.append_line(line)
    for note in w.notes:
        log.warning(note)


@dataclasses.dataclass(frozen=True)
class SweepInfo:
    """One sweep found in a results file: its id, model, when it ran and how many runs."""

    sweep_id: str
    model_path: str
    engine: str
    llama_build: str
    first_utc: str
    last_utc: str
    n_runs: int

    @property
    def label(self) -> str:
        return (f"{self.sweep_id} ({Path(self.model_path).name}, {self.engine}, {self.n_runs} runs, "
                f"{self.last_utc[:16].replace('T', ' ')} UTC)")


def sweeps_of(records: Sequence[RunRecord]) -> list[SweepInfo]:
    """The sweeps in these records, oldest first (by their last run)."""
    groups: dict[str, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(r.sweep_id, []).append(r)
    out = [SweepInfo(sid, rs[-1].model_path, rs[-1].engine, rs[-1].llama_build,
                     min(r.timestamp_utc for r in rs), max(r.timestamp_utc for r in rs), len(rs))
           for sid, rs in groups.items()]
    return sorted(out, key=lambda s: s.last_utc)


def select_sweep(records: Sequence[RunRecord], sweep: str | None = None, model: str | None = None,
                 where: str = "") -> tuple[list[RunRecord], SweepInfo | None, str | None]:
    """The runs of one sweep, so that one verdict never pools two models or two set-ups.

    ``sweep`` picks by id (a unique prefix is enough), ``model`` by model path (or file name);
    among what is left the latest sweep is taken. Returns (its runs, which sweep, a sentence
    saying which was chosen when the file held more than one, else None)."""
    all_sweeps = sweeps_of(records)
    if not all_sweeps:
        return [], None, None
    cands = all_sweeps
    if sweep:
        cands = [s for s in cands if s.sweep_id.startswith(sweep)]
        if not cands:
            raise UserError(f"{where}: no sweep {sweep!r}; it holds "
                            + ", ".join(s.label for s in all_sweeps))
        if len(cands) > 1:
            raise UserError(f"{where}: {sweep!r} names {len(cands)} sweeps ("
                            + ", ".join(s.sweep_id for s in cands) + "); give more of the id")
    if model:
        want = os.path.normcase(os.path.abspath(os.path.expanduser(model)))
        same = [s for s in cands if os.path.normcase(os.path.abspath(s.model_path)) == want]
        by_name = [s for s in cands if Path(s.model_path).name == Path(model).name]
        cands = same or by_name
        if not cands:
            raise UserError(f"{where}: no sweep of model {model!r}; it holds "
                            + ", ".join(s.label for s in all_sweeps))
    chosen = cands[-1]
    runs = [r for r in records if r.sweep_id == chosen.sweep_id]
    note = None
    if len(all_sweeps) > 1:
        models = {s.model_path for s in all_sweeps}
        what = f"{len(all_sweeps)} sweeps" + (f" of {len(models)} models" if len(models) > 1 else "")
        how = "the latest" if not (sweep or model) else "the one asked for"
        others = [s.sweep_id for s in all_sweeps if s is not chosen]
        note = f"{where} holds {what}; showing {how}: {chosen.label}; the others: {', '.join(others)}"
    return runs, chosen, note
