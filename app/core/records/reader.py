"""The results reader: the run, cost-probe and watch records of a results file.

A line cut short (a crash or a full disk while writing), nested deeper than any record
(common.jsonsafe: past it json and msgspec end in RecursionError), that is not a record, or whose
fields are not what they declare (a cost or watch record: records.check) is left out and reported
with its file and line; a file from a newer schema or another kind of file is refused. msgspec
reads the lines where it can (several times faster), json the rest."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
import json
import logging
import math
import operator
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Hashable, Iterator, Sequence, TypeVar, Union

from app.core.common.errors import NotRegularFile, UserError, os_reason
from app.core.common import jsonsafe, units
from app.core.common.reading import open_regular
from app.core.common.text import shown
from app.core.records.check import MAX_TEXT, BadField
from app.core.records.cost import CostRecord
from app.core.records.rpc import RECORD_TYPE as RPC, RpcRecord
from app.core.records.watch import RECORD_TYPE as WATCH, WatchRecord
from app.core.records.schema import (_INT, _STR, FIELD_NAMES, JSON_KEYS, MAX_COUNT, SCHEMA_VERSION, RunRecord,
                                     _bad_scalars, bad_numbers, bad_times, redacted)

if TYPE_CHECKING:  # its types; the module may be None (below)
    import msgspec
else:
    try:  # a dependency (pyproject.toml); without it json reads every file alike, only slower
        import msgspec
    except ImportError:  # pragma: no cover - an environment installed before msgspec was a dependency
        msgspec = None

log = logging.getLogger(__name__)

MAX_LINE = 16 * 2**20  # no record comes near this; a longer "line" means another kind of file
_READ_BUFFER = 2**20  # a 600 MB file in 1 MiB reads, not 8 KiB ones (a tenth of the time reading it line by line)


# a line whose text may hold a control, bidi or invisible character (as a JSON escape or raw UTF-8):
# read by from_dict, which cleans it (RunRecord._TEXT_KEYS), not by the fast path, which does not
# look at the strings; a false alarm (an escaped backslash before an "n", an escaped accent) only
# costs speed
_UNSAFE_TEXT = re.compile(rb"\\[nrtbf]|\\u(?:00[0-9a-fA-F]{2}|20[0-6][0-9a-fA-F]|061[cC]|[fF][eE][fF][fF]|"
                          rb"[fF]{3}[9abAB])|\xc2[\x80-\x9f]|\xe2\x80[\x8b-\x8f\xa8-\xae]|\xe2\x81[\xa0-\xaf]|"
                          rb"\xd8\x9c|\xef\xbb\xbf|\xef\xbf[\xb9-\xbb]")


def _objects(path: str | os.PathLike[str], record_type: str,
             problems: list[str] | None = None) -> Iterator[tuple[str, Any]]:
    """The JSON objects (dicts) of one record type in a results file, each with its file and line;
    for run records, a line _run_decoder reads is its struct instead. A line cut short (a crash or
    a full disk while writing) or that is not a record is left out and reported in ``problems``
    with its line number; a file from a newer schema or another kind of file is refused."""
    p = Path(path).expanduser()
    try:  # only a regular file, looked at once opened: a FIFO or a device is refused at once
        f = open_regular(p, "results file", buffering=_READ_BUFFER)
    except FileNotFoundError:
        raise UserError(f"{p}: results file not found") from None
    except NotRegularFile:
        raise
    except OSError as e:
        raise UserError(f"{p}: cannot read it ({os_reason(e)})") from None
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
                raise UserError(f"{p} line {n}: longer than {units.size(MAX_LINE)}: not an MTP Tuner results file")
            if raw.isspace():
                continue
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark left by an editor
            if record_type != "run" and raw.startswith(_RUN_LINE):
                continue  # a run record, as RunRecord.to_json begins it: not what is asked for
            try:  # before any parser recurses into it (the typed one too: a deep "host" in a run line)
                jsonsafe.check_depth(raw)
            except jsonsafe.TooDeep:
                say(f"{p} line {n}: nested deeper than {jsonsafe.MAX_DEPTH} levels, not a record; left out")
                continue
            if typed is not None and not _UNSAFE_TEXT.search(raw):
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
    ValueError (UnicodeDecodeError included), as json.loads does; jsonsafe.TooDeep for a line
    nested deeper than jsonsafe.MAX_DEPTH (where both parsers would end in RecursionError)."""
    jsonsafe.check_depth(raw)
    if msgspec is not None:
        try:
            return _any_decoder()(raw)
        except (ValueError, RecursionError):
            pass
    return json.loads(raw.decode("utf-8"))


@functools.lru_cache(maxsize=None)
def _any_decoder() -> Callable[[bytes], Any]:
    return msgspec.json.Decoder().decode


@functools.lru_cache(maxsize=None)
def _decode_types() -> dict[str, tuple[Any, ...]]:
    """The types msgspec checks while it reads a run record: exactly those that RunRecord.from_dict
    takes without a closer look (JSON's int and float for a float, not bool; int for an int, ...),
    every integer within MAX_COUNT either way (a line with a larger one is read by json, and
    bad_numbers names the field)."""
    count = Annotated[int, msgspec.Meta(ge=-MAX_COUNT, le=MAX_COUNT)]
    text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]  # longer: read by json, named by bad_numbers
    return {"int": (count,), "float": (float, count), "str": (text,), "bool": (bool,), "None": (type(None),),
            "dict[str, Any]": (dict[str, Any],), "tuple[int, ...]": (tuple[count, ...],),
            "tuple[float, ...]": (tuple[Union[float, count], ...],), "tuple[str, ...]": (tuple[text, ...],)}


@functools.lru_cache(maxsize=None)
def _run_decoder() -> Callable[[bytes], Any] | None:
    """msgspec's reader of a run record line (RunRecord.to_json's, in any order, other fields
    left out) whose every field has a type that from_dict takes as it is, else None. It checks
    the types in C while it reads: a line whose values it refuses is read as JSON and checked
    by from_dict, which says what is wrong."""
    if msgspec is None:
        return None
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for f in dataclasses.fields(RunRecord):
        parts = [_decode_types().get(a.strip()) for a in str(f.type).split("|")]
        known = [p for p in parts if p is not None]
        if len(known) < len(parts):
            return None  # a type this table does not know: from_dict checks every record
        t: object = Union[tuple(itertools.chain.from_iterable(known))]  # the field's type, built here
        if f.default is not dataclasses.MISSING:
            fields.append((f.name, t, f.default))
        elif f.default_factory is not dataclasses.MISSING:
            return None
        else:
            fields.append((f.name, t))
    fields.append(("record_type", str, "run"))
    return msgspec.json.Decoder(msgspec.defstruct("RunLine", fields, rename=dict(JSON_KEYS))).decode


def _bad_times_fast(xs: tuple[float, ...]) -> str | None:
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
# by their keys in the file (_slots finds their fields)
_SHARED_STR = ("sweep_id", "status", "engine", "arm", "task", "prompt_id", "output_sha256", "llama_build", "backend",
               "model_path", "error", "spec_type", "draft_sampling")


_SHARED_LISTS = (("output_tokens", _INT), ("prompt_tokens", _INT), ("flags", _STR), ("devices", _STR))


# what _share shares: by a value or a key of its own, the one object that stands for equal ones
_Shared = dict[Hashable, Any]


def _share(d: dict[str, Any], shared: _Shared) -> None:
    """One object for equal values across a file's records: greedy runs of a prompt have the same
    output tokens, every run of a prompt the same prompt tokens, and the names, paths and the keys
    of ``sampling`` and ``host`` repeat, and so do ``devices`` and the whole ``host`` (its GPUs a
    list of dicts since schema 2: one object per distinct host, keyed on its JSON text, so only a
    host written exactly alike, value types and key order included, stands in for another). Only
    values of exactly the types JSON gives are shared (so ``1`` never stands in for ``1.0``); the
    ``sampling`` dicts themselves are not: same values, half the memory in a large file."""
    for key, types in _SHARED_LISTS:
        v = d.get(key)
        if type(v) is list and types.issuperset(map(type, v)):
            t = tuple(v)
            d[key] = shared.setdefault((key, t), t)
    for key in _SHARED_STR:
        v = d.get(key)
        if type(v) is str:
            d[key] = shared.setdefault(v, v)
    v = d.get("sampling")
    if type(v) is dict:
        d["sampling"] = _share_dict(v, shared.setdefault)
    v = d.get("host")
    if type(v) is dict:
        try:
            host_key = ("host", json.dumps(v, ensure_ascii=False, separators=(",", ":")))
        except (TypeError, ValueError):  # not JSON's own values: its own object
            d["host"] = _share_dict(v, shared.setdefault)
        else:
            if host_key not in shared:
                shared[host_key] = _share_dict(v, shared.setdefault)
            d["host"] = shared[host_key]


def _share_dict(v: dict[Any, Any], setdefault: Callable[[Hashable, Any], Any]) -> dict[Any, Any]:
    """A copy of a dict with its string keys and values shared (see _share)."""
    return {(setdefault(k, k) if type(k) is str else k): (setdefault(x, x) if type(x) is str else x)
            for k, x in v.items()}


# _slots' answer: what each part is, in its docstring
_Slots = tuple["operator.itemgetter[Any]", "operator.itemgetter[Any]", tuple[str, ...], "operator.itemgetter[Any]",
               "operator.itemgetter[Any]", int, int, int, tuple[Any, ...], Callable[[Any, Any, Any], None]]


@functools.lru_cache(maxsize=None)
def _slots() -> _Slots:
    """For _decoded_record: where the values that _share shares are among a decoded line's
    fields (the fields in order, then record_type), how to put each field's value in order from
    those fields followed by the shared strings, the shared lists, the shared host and an empty
    tuple (with and without the token times), the sampling dict's, host's and arm's positions,
    and each field's slot. A record is built as pickle rebuilds one, slot by slot: RunRecord's
    __init__ only sets the fields (it has no __post_init__)."""
    order = tuple(f.name for f in dataclasses.fields(RunRecord))
    assert not hasattr(RunRecord, "__post_init__")
    n = len(order) + 1  # and record_type
    strs = [order.index(FIELD_NAMES.get(k, k)) for k in _SHARED_STR]
    lists = [order.index(k) for k, _ in _SHARED_LISTS]
    at = list(range(len(order)))
    for j, i in enumerate(strs):
        at[i] = n + j
    for j, i in enumerate(lists):
        at[i] = n + len(strs) + j
    at[order.index("host")] = n + len(strs) + len(lists)
    without_times = list(at)
    without_times[order.index("token_times")] = n + len(strs) + len(lists) + 1  # the empty tuple
    slots = tuple(vars(RunRecord)[name] for name in order)
    return (operator.itemgetter(*strs), operator.itemgetter(*lists), tuple(k for k, _ in _SHARED_LISTS),
            operator.itemgetter(*at), operator.itemgetter(*without_times),
            order.index("sampling"), order.index("host"), order.index("arm_kind"), slots, type(slots[0]).__set__)


def _share_strs_in_place(v: dict[str, Any], setdefault: Callable[[Hashable, Any], Any]) -> None:
    for k, x in v.items():
        if type(x) is str:
            v[k] = setdefault(x, x)


def _decoded_record(run: msgspec.Struct, shared: _Shared, mtp_times: bool) -> RunRecord:
    """The record of a line that _run_decoder read (each value of a type that from_dict takes as
    it is), with the values _share shares shared, and without the token times of an MTP run when
    ``mtp_times`` is false."""
    strs, lists, list_names, pick, pick_without_times, sampling_at, host_at, arm_at, slots, set_slot = _slots()
    times_at = _times_at()
    vals = msgspec.structs.astuple(run)
    setdefault = shared.setdefault
    # msgspec reuses short dict keys across lines already: the sampling's string values, in place
    _share_strs_in_place(vals[sampling_at], setdefault)
    host = vals[host_at]  # one object per distinct host (msgspec read it: JSON's own values, no NaN)
    key = ("host", _encode()(host))
    if key not in shared:
        _share_strs_in_place(host, setdefault)
        shared[key] = host
    s, t = strs(vals), lists(vals)
    vals += (*map(setdefault, s, s), *map(setdefault, zip(list_names, t), t), shared[key],
             () if mtp_times else ends(vals[times_at]))  # None shares as None
    rec = object.__new__(RunRecord)
    any(map(set_slot, slots, itertools.repeat(rec),  # each returns None: every slot is set
            (pick if mtp_times or vals[arm_at] == "baseline" else pick_without_times)(vals)))
    return rec


@functools.lru_cache(maxsize=None)
def _times_at() -> int:
    return tuple(f.name for f in dataclasses.fields(RunRecord)).index("token_times")


def ends(times: Sequence[float]) -> tuple[float, ...]:
    """What a speculative run keeps of its token times when they are left out (``mtp_times``
    false): the first and the last, the whole answer's span (RunRecord.whole_tok_s); () for fewer."""
    return (times[0], times[-1]) if len(times) >= 2 else ()


@functools.lru_cache(maxsize=None)
def _encode() -> Callable[[Any], bytes]:
    return msgspec.json.Encoder().encode


def iter_records(path: str | os.PathLike[str], problems: list[str] | None = None, *,
                 mtp_times: bool = True, refuse: Callable[[RunRecord], str | None] | None = None) -> Iterator[RunRecord]:
    """The run records of a results file. Lines that are cut short, not records, or whose numbers
    cannot be measurements are left out and reported in ``problems`` (or the log), each with the
    file and line; a record with a missing or mistyped field is an error.

    ``mtp_times=False``: the token times of speculative runs (every arm but the baseline) are checked as always, then left out
    of their records but for the first and the last (``ends``: the whole answer's span, RunRecord.whole_tok_s). analyze uses only the baseline runs' (for its gap
    statistics), and in a large file the MTP runs' times are most of the memory (200k runs: some
    650 MB); recommend and compare read files so. The Results tab keeps them.

    ``refuse``: a check of each record (e.g. measure.plan.planned_counts, the counts a sweep
    planned again from the file may have); a reason from it refuses the whole file, in one
    UserError naming the file, the line and the reason."""
    say = problems.append if problems is not None else log.warning
    shared: _Shared = {}
    for where, d in _objects(path, "run", problems):
        if type(d) is not dict:  # read by _run_decoder: every field of a type that fits
            rec = _decoded_record(d, shared, mtp_times)
            why = _bad_scalars(rec) or _bad_times_fast(d.token_times)  # its counts: bounded by msgspec
        else:
            _share(d, shared)
            try:
                rec = RunRecord.from_dict(d)
            except ValueError as e:
                raise UserError(f"{where}: not a valid run record ({e})") from None
            why = bad_numbers(rec)
            if not mtp_times and rec.arm_kind != "baseline" and not why:
                rec = dataclasses.replace(rec, token_times=ends(rec.token_times))
        if why:
            say(f"{where}: {why}; the record is left out of the statistics")
            continue
        if refuse is not None and (refused := refuse(rec)):
            raise UserError(f"{where}: {refused}; the file is refused")
        yield redacted(rec, shared) if rec.server_args or rec.error else rec  # outside text: no secret shown


def load_records(path: str | os.PathLike[str], problems: list[str] | None = None, *,
                 mtp_times: bool = True, refuse: Callable[[RunRecord], str | None] | None = None) -> list[RunRecord]:
    """iter_records as a list (see there for ``mtp_times`` and ``refuse``)."""
    with gc_paused():
        return list(iter_records(path, problems, mtp_times=mtp_times, refuse=refuse))


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


def load_cost_records(path: str | os.PathLike[str], problems: list[str] | None = None) -> list[CostRecord]:
    """The cost-probe records of a results file. One that is not (a field missing, of another
    type, or beyond what a probe measures: CostRecord.from_dict) is left out and reported in
    ``problems`` (else the log), with its file and line: never priced with."""
    return _checked(path, "cost", CostRecord.from_dict, "cost-probe", problems)


def load_watch_records(path: str | os.PathLike[str], problems: list[str] | None = None) -> list[WatchRecord]:
    """The watch records of a results file (``mtp-tuner watch``), oldest first. One that is not
    (WatchRecord.from_dict) is left out and reported in ``problems`` (else the log), with its file
    and line."""
    return _checked(path, WATCH, WatchRecord.from_dict, "watch", problems)


def load_rpc_records(path: str | os.PathLike[str], problems: list[str] | None = None) -> list[RpcRecord]:
    """The lines after each sweep over RPC workers: their round trips at its start and its end
    (records.rpc). One that is not (RpcRecord.from_dict) is left out and reported in ``problems``
    (else the log), with its file and line."""
    return _checked(path, RPC, RpcRecord.from_dict, "rpc", problems)


_R = TypeVar("_R")


def _checked(path: str | os.PathLike[str], record_type: str, build: Callable[[dict[str, Any]], _R], what: str,
             problems: list[str] | None) -> list[_R]:
    say = problems.append if problems is not None else log.warning
    out = []
    for where, d in _objects(path, record_type, []):  # cut or foreign lines: load_records reports them
        try:
            out.append(build(d))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            why = str(e) if isinstance(e, BadField) else f"{type(e).__name__}: {e}"
            say(f"{where}: not a valid {what} record ({shown(why)}); left out")
    return out
