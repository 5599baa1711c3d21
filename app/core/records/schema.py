"""The run record: one frozen record per finished run, as it is written to a results file (one
JSON line), its fields' type checks, and the small helpers that fill one in (ids, times, hashes,
host). Unknown fields in old or newer files are kept out of the dataclass but do not break
reading (see app.core.records.reader)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import hashlib
import itertools
import json
import math
import operator
import os
import platform
import uuid
from typing import Any, Callable, Iterable, Sequence

from app.core.common.redact import redact, redact_args
from app.core.common.text import clean_strings, shown
from app.core.records.arm import Arm, arm_from_fields
from app.core.records.check import MAX_TEXT
from app.core.records.rpc import bad_rpc

MAX_RUN_THREADS = 512  # GGML_MAX_N_THREADS (ggml.h): no run has more threads
MAX_MIN_GAIN = 0.5  # a recorded δ (min_gain) past this is no sweep's: --min-gain takes 0-50 %
SCHEMA_VERSION = 8  # 2: where the run ran (backend, devices, offloaded_layers, layers_total; host["gpus"])
#                    3: the speculative mode (spec_type) and the drafter file (drafter); acceptance
#                       per draft position (accepted_per_pos, draft_steps); thinking; context depth;
#                       reasoning tokens (reasoning_n)
#                    4: what other programs took during the run (other_cpu, other_gpu, other_top) and
#                       the flag "disturbed"
#                    5: cost records say where they were measured (backend, devices, spec_type,
#                       drafter) and the llama-server probe's whole step costs (step_ms, mid_check);
#                       run records gain the draft sampling of a drafting arm (draft_sampling:
#                       "greedy" or "probabilistic")
#                    6: others' share of the CPU over the run's busiest second (other_cpu_peak)
#                    7: the user's own llama-server flags the run was measured with (server_args)
#                    8: the RPC workers the model was split over and their round trips at the
#                       sweep's start (rpc); an "rpc" line after the sweep with both ends' (records.rpc)


@dataclasses.dataclass(frozen=True, slots=True)  # slots: 36 fields are too many for a shared-key __dict__
class RunRecord:
    schema_version: int
    run_id: str
    sweep_id: str
    status: str  # "ok" | "failed"
    engine: str
    arm_kind: str  # "baseline" | "mtp" (draft-mtp) | "spec" (another mode, schema 3); "arm" in the file
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
    # schema 2: where the engine ran the model. backend: "CPU", "CUDA", "Metal", "Vulkan", ...;
    # devices: the devices it used; offloaded_layers of layers_total on a GPU (0 on a CPU-only
    # build; None: not known, and always None in schema 1 files)
    backend: str | None = None
    devices: tuple[str, ...] = ()
    offloaded_layers: int | None = None
    layers_total: int | None = None
    # schema 3: llama.cpp's --spec-type of the run ("none" for the baseline; None in older files,
    # where a run with a K was draft-mtp), and the separate drafter GGUF that drafted, if any:
    # {"path", "sha256", "arch", "size"}
    spec_type: str | None = None
    drafter: dict[str, Any] | None = None
    # accepted drafts at each draft position (index 0: the first drafted token of a step) and the
    # verification steps that drafted (llama.cpp's spec_decode_num_drafts); () / None: not counted
    accepted_per_pos: tuple[int, ...] = ()
    draft_steps: int | None = None
    # the chat template's thinking switch as sent (None: the template's own default), and the
    # tokens of neutral context put before the task prompt (0: none)
    thinking: bool | None = None
    depth: int = 0
    # generated tokens inside the template's reasoning markers (markers included; None: the
    # template marks no reasoning, or not counted); the answer is n_generated - reasoning_n
    reasoning_n: int | None = None
    # schema 4: what other programs (not this app, not its llama-server) took while the run
    # measured (app.core.measure.busy): their share of the CPU capacity and of the GPU in use, 0-1
    # (None: not measured; always None in older files), and the one that took the most CPU,
    # {"name": ..., "cpu": share}. A run over busy.BUSY_SHARE has the flag "disturbed".
    other_cpu: float | None = None
    other_gpu: float | None = None
    other_top: dict[str, Any] | None = None
    # schema 5: how the arm's drafts were sampled (llama-server's --spec-draft-sampling): "greedy"
    # or "probabilistic" for a mode that drafts with a model; None for the baseline and the n-gram
    # modes, and in older files (where a drafting arm was greedy)
    draft_sampling: str | None = None
    # schema 6: other programs' share of the CPU over the busiest second of the run (sampled
    # every busy.TICK_S; None: not measured, a run shorter than a second, older files). A run
    # over busy.BUSY_SHARE here is disturbed too, even when its whole-run share is not.
    other_cpu_peak: float | None = None
    # schema 7: the user's own llama-server flags the run's server started with, in their order
    # (their command less the model, the flags the measurement owns and the secrets:
    # engines.user_command), e.g. ["-fa", "on", "-ctk", "q8_0"]; None: the tuner's own flags only
    # (and in older files)
    server_args: tuple[str, ...] | None = None
    # schema 8: the llama.cpp RPC workers the model was split over and their round trips when the
    # sweep started, {"workers": ["host:port", ...], "rtt_start_ms": [0.31, null, ...]} (records.rpc:
    # the end's are in the "rpc" line after the sweep); None: this machine only (and older files)
    rpc: dict[str, Any] | None = None
    # (schema 8, optional) the δ of "no gain worth having" of the sequential sweep (adaptive, or
    # until decided) the run was measured in: it looked after every round, so its verdict is read on
    # anytime intervals (app.core.analysis.anytime) wherever the file is judged; None: a plain sweep
    min_gain: float | None = None
    # a greedy speculative run whose tokens left its baseline's (the latest baseline run of the same
    # prompt and setting in the sweep): where, both tokens there, and the baseline's two most likely
    # tokens at that place with their probabilities, read off the clock (measure.divergence):
    # {"at": 12, "baseline": 311, "arm": 907, "top": [311, 0.48], "second": [907, 0.47]} ("top" and
    # "second" absent where the engine cannot read them); None: none seen (and in older files, which
    # readers of schema 8 and older leave out, so it needs no new version)
    divergence: dict[str, Any] | None = None
    # (schema 8, optional) the CPU threads llama.cpp ran the run with (engines.engine_threads: the
    # user's -t, MTP_TUNER_THREADS, the sweep's free cores, else the physical cores, what users
    # run); None: not recorded (older files, which readers of schema 8 and older leave out)
    threads: int | None = None

    @property
    def whole_tok_s(self) -> float | None:
        """The whole answer's tok/s: every token over the time from the request to the last token
        (``token_times`` start at the request), so prompt processing (a drafter's own prefill of the
        prompt included) and the first token count; ``tok_s`` is decode alone. Old files carry
        ``token_times`` too: nothing new is recorded for it; a file read without a speculative
        run's times keeps their first and last (records.reader.ends), which is all this needs.
        None without two times, or where the times are not the ones ``tok_s`` was read from
        (decode over them more than 1 % from it: a file whose times were written apart from its
        speeds says nothing of the whole answer)."""
        t, n = self.token_times, self.n_generated
        if len(t) < 2 or n < 2 or not self.tok_s or not 0 < t[0] < t[-1] \
                or abs((n - 1) / (t[-1] - t[0]) / self.tok_s - 1) > 0.01:
            return None
        return n / t[-1]

    @property
    def measured_arm(self) -> "Arm":
        """The arm this run measured (old files: draft-mtp when it has a K, else the baseline);
        ``arm_kind`` is its kind (Arm.kind)."""
        return arm_from_fields(self.k, self.p_min, self.spec_type, (self.drafter or {}).get("path"),
                               self.draft_sampling)

    def to_json(self) -> str:
        """The record as a results file's line (each field under its key in the file, JSON_KEYS)."""
        d = {"record_type": "run", **{JSON_KEYS.get(k, k): v for k, v in dataclasses.asdict(self).items()}}
        d["output_tokens"] = list(self.output_tokens)
        d["prompt_tokens"] = list(self.prompt_tokens)
        d["token_times"] = [round(t, 6) for t in self.token_times]
        d["flags"] = list(self.flags)
        d["devices"] = list(self.devices)
        d["accepted_per_pos"] = list(self.accepted_per_pos)
        return json.dumps(d, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunRecord":
        """The record of a file line's JSON object. Raises ValueError naming the first missing or
        mistyped field by its key in the file."""
        names, fields = _fields()
        kw = {FIELD_NAMES.get(k, k): v for k, v in d.items() if k in names}
        for key in ("output_tokens", "prompt_tokens", "token_times", "flags", "devices", "accepted_per_pos"):
            if not isinstance(kw.get(key) or (), (list, tuple)):
                raise ValueError(f"{key} is not a list")
            kw[key] = tuple(kw.get(key) or ())
        if kw.get("server_args") is not None:
            if not isinstance(kw["server_args"], (list, tuple)):
                raise ValueError("server_args is not a list")
            kw["server_args"] = tuple(kw["server_args"])
        kw.setdefault("error", None)
        for f, fast in fields:
            if f.name not in kw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ValueError(f"no {JSON_KEYS.get(f.name, f.name)!r}")
                continue
            if type(kw[f.name]) in fast:
                continue
            if not _type_ok(kw[f.name], str(f.type)):
                raise ValueError(f"{JSON_KEYS.get(f.name, f.name)!r} is {shown(repr(kw[f.name]), 80)}, "
                                 f"expected {f.type}")
        for key in _TEXT_KEYS:  # outside text: one line each, so no field can print a line of its own
            v = kw.get(key)
            if v:
                kw[key] = clean_strings(v)
        return cls(**kw)


def redacted(rec: RunRecord, seen: dict[Any, Any] | None = None) -> RunRecord:
    """``rec`` with the secrets its outside text may quote masked (common.redact): the server's
    flags (``server_args``: a value after a secret flag, a URL's password, a JSON key's value) and
    the error (llama-server's own lines). ``rec`` itself when there is none; ``seen``: the flags
    already redacted, by their tuple (a file's records share a few)."""
    args, error = rec.server_args, rec.error
    if args:
        key = ("redacted server_args", args)
        clean = seen.get(key) if seen is not None else None
        if clean is None:
            clean = redact_args(args)
            clean = args if clean == args else clean
            if seen is not None:
                seen[key] = clean
        args = clean
    if error:
        error = redact(error)
        error = rec.error if error == rec.error else error
    if args is rec.server_args and error is rec.error:
        return rec
    return dataclasses.replace(rec, server_args=args, error=error)


# the fields that are text (_TEXT, each bounded by MAX_TEXT: _bad_text), and those holding text in
# dicts and lists: every one cleaned as a record is read
_TEXT = ("run_id", "sweep_id", "status", "engine", "arm_kind", "task", "prompt_id", "output_sha256", "llama_build",
         "model_path", "timestamp_utc", "error", "backend", "spec_type", "draft_sampling")
_TEXT_KEYS = _TEXT + ("sampling", "host", "flags", "devices", "drafter", "other_top", "server_args", "rpc",
                      "divergence")

# the fields whose key in a results file is another name (files keep the key they always had)
JSON_KEYS = {"arm_kind": "arm"}
FIELD_NAMES = {v: k for k, v in JSON_KEYS.items()}


@functools.lru_cache(maxsize=None)
def _fields() -> tuple[frozenset[str], tuple[tuple[dataclasses.Field[Any], frozenset[type]], ...]]:
    """The keys a file line has for RunRecord's fields, and each field with the types that fit it
    for sure (those _type_ok accepts whatever the value; the empty set for the tuples, whose items
    need a look)."""
    fields = dataclasses.fields(RunRecord)
    fast = []
    for f in fields:
        parts = [_FAST.get(a.strip()) for a in str(f.type).split("|")]
        known = [p for p in parts if p is not None]
        fast.append((f, frozenset().union(*known) if len(known) == len(parts) else frozenset()))
    return frozenset(JSON_KEYS.get(f.name, f.name) for f in fields), tuple(fast)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


_INT, _NUM, _STR = frozenset({int}), frozenset({int, float}), frozenset({str})
_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int, "float": _is_num, "str": lambda x: isinstance(x, str),
    "bool": lambda x: isinstance(x, bool), "None": lambda x: x is None,
    "dict[str, Any]": lambda x: isinstance(x, dict),
    # the set of element types first (in C): what JSON gives passes at once, and the
    # element-wise check decides the rest
    "tuple[int, ...]": lambda x: _INT.issuperset(map(type, x)) or all(_is_int(v) for v in x),
    "tuple[float, ...]": lambda x: _NUM.issuperset(map(type, x)) or all(_is_num(v) for v in x),
    "tuple[str, ...]": lambda x: isinstance(x, tuple) and (_STR.issuperset(map(type, x))
                                                           or all(isinstance(v, str) for v in x))}
_FAST: dict[str, frozenset[type]] = {"int": _INT, "float": _NUM, "str": _STR, "bool": frozenset({bool}),
                                     "None": frozenset({type(None)}), "dict[str, Any]": frozenset({dict})}


@functools.lru_cache(maxsize=None)
def _checks(annotation: str) -> tuple[Callable[[Any], bool] | None, ...]:
    return tuple(_CHECKS.get(a.strip()) for a in annotation.split("|"))


def _type_ok(value: Any, annotation: str) -> bool:
    """Does a value read from JSON fit a field annotated as ``annotation`` (e.g. "float | None")?"""
    for c in _checks(annotation):
        if c is None or c(value):
            return True
    return False


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length when one is the
    other's start), None when equal."""
    # the first i where a[i] != b[i], scanned in C (map, compress) rather than a Python loop
    i = next(itertools.compress(itertools.count(), map(operator.ne, a, b)), None)
    if i is not None:
        return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


def tokens_sha256(tokens: Iterable[int]) -> str:
    return hashlib.sha256(json.dumps(list(tokens), separators=(",", ":")).encode()).hexdigest()


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def host_info(gpus: Sequence[dict[str, Any]] | None = None, unified_memory: bool = False) -> dict[str, Any]:
    """The host as a run record keeps it. ``gpus``: the GPUs the hardware snapshot found when the
    sweep began (vendor, name, memory; schema 2), which the analysis holds the runs' placement
    against (a GPU here but the runs on the CPU)."""
    d: dict[str, Any] = {"os": platform.platform(), "machine": platform.machine(),
                         "cpu_count": os.cpu_count(), "python": platform.python_version()}
    if gpus is not None:
        d["gpus"] = [dict(g) for g in gpus]
        d["unified_memory"] = bool(unified_memory)
    return d


def bad_numbers(rec: RunRecord) -> str | None:
    """Why a record's numbers cannot be measurements (infinite, NaN, negative or zero speeds or
    ones beyond MAX_TOK_S, acceptance outside 0..1, more accepted than drafted), or its text cannot
    be the app's (_bad_text), or None when they can."""
    return _bad_count(rec) or _bad_text(rec) or _bad_scalars(rec) or bad_times(rec.token_times)


# no text field the app writes is longer than records.check.MAX_TEXT (a path, a build, a prompt id;
# an error is cut to it): a longer one is not the app's, and would be shown whole in lines and
# labels. The reader's fast path has msgspec refuse such a line (reader._decode_types), so only
# records read otherwise need the look; texts inside the dicts (host, sampling, ...) are bounded
# where they are shown
_GET_TEXT = operator.attrgetter(*_TEXT)


def _bad_text(rec: RunRecord) -> str | None:
    """Which text field is longer than any the app writes (MAX_TEXT characters)."""
    for name, v in [*zip(_TEXT, _GET_TEXT(rec)), *(("devices", d) for d in rec.devices),
                    *(("flags", f) for f in rec.flags), *(("server_args", a) for a in rec.server_args or ())]:
        if v is not None and len(v) > MAX_TEXT:
            return f"{name} is {len(v):,} characters long, more than the {MAX_TEXT:,} a record's text may have"
    return None


# no run measures more: a speed beyond it is no measurement, and its sums and squares would
# overflow the statistics (a mean or standard deviation of 1e308 tok/s is infinite); a count
# (K, tokens, drafts, bytes, depth) beyond MAX_COUNT cannot even be a float exactly
MAX_TOK_S, MAX_COUNT = 1e9, 2**53
_COUNTS = ("k", "rep", "n_predict", "n_generated", "draft_n", "draft_accepted", "prompt_n", "model_size",
           "offloaded_layers", "layers_total", "draft_steps", "depth", "reasoning_n")
_GET_COUNTS = operator.attrgetter(*_COUNTS)


def _bad_count(rec: RunRecord) -> str | None:
    """Which count is beyond MAX_COUNT either way (a JSON integer can have hundreds of digits).
    The reader's fast path has msgspec refuse such a line, so only records read otherwise need it."""
    vals = [v for v in _GET_COUNTS(rec) if v is not None] + list(rec.accepted_per_pos)
    if max(vals) <= MAX_COUNT and min(vals) >= -MAX_COUNT:  # every record has n_predict: never empty
        return None
    for name, v in [*zip(_COUNTS, _GET_COUNTS(rec)), *(("accepted_per_pos", x) for x in rec.accepted_per_pos)]:
        if v is not None and abs(v) > MAX_COUNT:
            return f"{name} is {_shown(v)}, more than any count"
    return None


def _shown(v: float) -> str:
    """A number as a message shows it: an integer of hundreds of digits by its size."""
    if type(v) is int and abs(v) > MAX_COUNT:
        return f"about {'-' if v < 0 else ''}10^{int(v.bit_length() * math.log10(2))}"
    return repr(v)


def _finite(v: float) -> bool:
    """math.isfinite, and False for an integer beyond a double's range (where it raises)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _bad_scalars(rec: RunRecord) -> str | None:
    """bad_numbers but for the token times, the counts' size (_bad_count) and the texts' length
    (_bad_text): what the reader's fast path has msgspec check."""
    for name in ("tok_s", "tok_s_engine", "prompt_tok_s"):
        v = getattr(rec, name)
        if v is not None and not (_finite(v) and 0 < v <= MAX_TOK_S):
            more = f", more than any run measures ({MAX_TOK_S:,.0f} tok/s)" if v > 0 else ""
            return f"{name} is {_shown(v)}{more}"
    if rec.p_min is not None and not _finite(rec.p_min):
        return f"p_min is {_shown(rec.p_min)}"
    if rec.acceptance is not None and not (_finite(rec.acceptance) and 0 <= rec.acceptance <= 1):
        return f"acceptance is {_shown(rec.acceptance)}"
    for name in ("other_cpu", "other_gpu", "other_cpu_peak"):
        v = getattr(rec, name)
        if v is not None and not (_finite(v) and 0 <= v <= 1):
            return f"{name} is {_shown(v)}, not a share from 0 to 1"
    for name in ("draft_n", "draft_accepted", "n_generated", "n_predict"):
        v = getattr(rec, name)
        if v is not None and v < 0:
            return f"{name} is {v!r}"
    if rec.draft_n is not None and rec.draft_accepted is not None and rec.draft_accepted > rec.draft_n:
        return f"draft_accepted ({rec.draft_accepted}) is more than draft_n ({rec.draft_n})"
    if rec.k is not None and rec.k < 1:
        return f"k is {rec.k!r}"
    if rec.rpc is not None and (why := bad_rpc(rec.rpc)):
        return why
    if rec.min_gain is not None and not (_finite(rec.min_gain) and 0 <= rec.min_gain <= MAX_MIN_GAIN):
        return f"min_gain is {_shown(rec.min_gain)}, not a share from 0 to {MAX_MIN_GAIN}"
    if rec.threads is not None and not 1 <= rec.threads <= MAX_RUN_THREADS:
        return f"threads is {rec.threads!r}, not a thread count from 1 to {MAX_RUN_THREADS}"
    return _bad_arm(rec) if rec.spec_type is not None or rec.drafter is not None or rec.draft_sampling else None


def _bad_arm(rec: RunRecord) -> str | None:
    """Why a schema-3 record's mode, K and drafter make no arm (e.g. draft-mtp without a K, a
    drafter without a path), or None."""
    if rec.drafter is not None and not isinstance(rec.drafter.get("path"), str):
        return f"drafter {shown(repr(rec.drafter), 80)} has no path"
    try:
        rec.measured_arm
    except (ValueError, TypeError) as e:
        return f"spec_type {shown(repr(rec.spec_type), 80)} with k {rec.k!r}" + (
            f" and draft_sampling {shown(repr(rec.draft_sampling), 80)}" if rec.draft_sampling else "") + f": {e}"
    return None


def bad_times(token_times: Sequence[float]) -> str | None:
    """bad_numbers' check of the token times."""
    try:
        if all(map(math.isfinite, token_times)):
            return None
    except OverflowError:  # an integer beyond a double's range
        pass
    return _BAD_TIMES


_BAD_TIMES = "token_times has a value that is not a finite number"
