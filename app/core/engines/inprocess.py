"""In-process engine on llama-cpp-python's low-level API: one model load per sweep, a target
context (and an MTP context when needed) reused by every arm. The decode loop itself (baseline
greedy and the MTP speculative loop that mirrors llama-server) is in decode_loop; the library,
its log and the batch helpers in llama_backend.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from typing import Any, Generator, Sequence

import numpy as np

from app.core.common.cancel import CancelToken
from app.core.common.errors import EngineError, ModeUnavailable, ModelFileError, MtpUnavailable, UserError
from app.core.common.spec_modes import mode_or_guess
from app.core.engines.base import EngineKind, EngineSettings, Generation, Progress, TopTwo, engine_threads
from app.core.engines.chat_template import ModelTemplate, jinja_render
from app.core.engines.decode_loop import DecodeLoop
from app.core.engines.loaded import LoadedModel
from app.core.engines.backend_truth import Placement, layers_total, parse_load_log
from app.core.engines.llama_backend import (attach_threadpool, capture_log, failure_reasons, free_threadpool,
                                            inprocess_backends, llama, llama_cpp_version, new_threadpool)
from app.core.machine.gguf_info import GGUFHeader, check_gguf_file
from app.core.engines.sampler_chain import eog_tokens
from app.core.records.arm import Arm
from app.core.records.sampler import Sampler
from app.core.records.shape import SweepShape


@dataclasses.dataclass(frozen=True)
class RawContexts:
    """A loaded model's llama.cpp handles, for the cost probe's timed decodes: the low-level API
    (L, and X for the MTP extension), the model, the target and MTP contexts and their batches,
    and the hidden-row buffer that fill_batch copies from."""

    L: Any
    X: Any
    model: LoadedModel
    target: object
    draft: object | None
    target_batch: object
    draft_batch: object | None
    hidden_rows: np.ndarray | None


class InProcessEngine:
    """One model load per sweep; a target context (and an MTP context when needed) reused by
    every arm. ``loads`` counts model loads (a K x p_min sweep must load once)."""

    kind = EngineKind.INPROCESS
    MAX_PARKED = 1  # sets of contexts kept aside besides the current one (each holds a KV cache)

    def __init__(self, *, ctx_size: int = 4096, threads: int | None = None, n_gpu_layers: int = -1,
                 n_batch: int = 2048, n_ubatch: int = 512, max_k: int = 8, flash_attn: str = "auto"):
        if flash_attn not in ("auto", "on", "off"):
            raise EngineError(f"flash attention must be auto, on or off, got {flash_attn!r}")
        self.flash_attn = flash_attn
        self.ctx_size, self.n_batch, self.n_ubatch = ctx_size, n_batch, n_ubatch
        self.threads = engine_threads(threads)
        self.n_gpu_layers = n_gpu_layers
        self.max_k = max_k
        self.loads = 0
        self._m: LoadedModel | None = None
        self._tgt: Any = None  # llama.cpp handles (ctypes)
        self._dft: Any = None
        self._tgt_rs = -1
        self._parked: dict[int, tuple] = {}  # n_rs_seq -> a set of contexts set aside (_park)
        self._pool: int | None = None  # the target contexts' CPU threadpool (new_threadpool)
        self._tb: Any = None
        self._db: Any = None
        self._db_tokens: Any = None
        self._demb: np.ndarray | None = None
        self._prompt_cache: dict[tuple[str, bool, bool | None], list[int]] = {}
        self._lock = threading.Lock()
        self.placement: Placement | None = None  # set by load()
        # benchmarking only (the cost probe): llama.cpp's --spec-synth-rates for the draft-mtp steps
        # of generate (see DecodeLoop); None: the target's own samples decide, as always
        self.synth_rates: tuple[float, ...] | None = None

    # -- properties the runner reads --------------------------------------------------------
    @property
    def name(self) -> str:
        return self.kind.value

    @property
    def settings(self) -> EngineSettings:
        return EngineSettings(kind=self.kind, ctx_size=self.ctx_size, threads=self.threads,
                              n_gpu_layers=str(self.n_gpu_layers), max_k=self.max_k)

    @property
    def build(self) -> str:
        return llama_cpp_version()

    def check_mtp(self) -> None:
        llama()  # raise a clear error early if the library is unusable

    def mode_problem(self, arm: Arm) -> str | None:
        """Why this engine cannot run ``arm`` exactly as llama.cpp does, or None. It runs the
        baseline and draft-mtp on the model's own MTP heads; a drafter file or another mode needs
        llama-server (llama-cpp-python has no speculative driver of llama.cpp's to call)."""
        if not arm.needs_server:
            return None
        what = (f"{arm.mode} with a drafter file ({arm.drafter})" if arm.drafter and mode_or_guess(arm.mode).in_process
                else arm.mode if not mode_or_guess(arm.mode).in_process
                else f"{arm.mode} with probabilistic draft sampling")
        return (f"the in-process engine cannot run {what}: it runs only the model's own MTP heads "
                "(llama-cpp-python does not expose llama.cpp's other speculative modes); use llama-server")

    def prepare(self, shape: SweepShape) -> None:
        """Size the recurrent-state snapshots for the widest K of the arms the runner will run
        (the runner calls this with them: the ones this engine can run)."""
        if shape.max_k:
            self.max_k = shape.max_k

    def raw_contexts(self, path: str, max_batch: int) -> RawContexts:
        """Load ``path`` and size the contexts for decodes of up to ``max_batch`` tokens; the handles
        stay owned by this engine (valid until close())."""
        m = self.load(path)
        self._ensure_contexts(m.has_mtp, max_batch)
        L, X = llama()
        return RawContexts(L, X, m, self._tgt, self._dft, self._tb, self._db, self._demb)

    def n_ctx(self) -> int:
        """The target context's size as llama.cpp made it: ``ctx_size``, or with 0 the model's own
        training context. Valid once a model is loaded and its contexts exist."""
        if self._tgt is None:
            return self.ctx_size
        L, _ = llama()
        return int(L.llama_n_ctx(self._tgt))

    def ready_limit(self, model: str, n_configs: int) -> int | None:
        """Every configuration is ready at once: one model load serves all of them."""
        return None

    # -- model and contexts ---------------------------------------------------------------
    def load(self, path: str) -> LoadedModel:
        if self._m is not None and self._m.path == str(path):
            return self._m
        self._unload()
        L, X = llama()
        hdr = check_gguf_file(path)
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = self.n_gpu_layers
        has_mtp = hdr.mtp_problem() is None and hdr.arch != "gemma4-assistant"
        mp.load_mtp = bool(has_mtp)
        with capture_log() as load_log:
            model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            raise ModelFileError(f"{path}: llama.cpp could not load the model"
                                 + (f" ({failure_reasons()})" if failure_reasons() else ""))
        self.loads += 1
        if has_mtp and L.llama_model_n_layer_nextn(model) < 1:
            has_mtp = False
        vocab = L.llama_model_get_vocab(model)
        tmpl = L.llama_model_chat_template(model, None)
        meta = hdr.metadata
        toks = meta.get("tokenizer.ggml.tokens") or []

        def tok_text(key: str) -> str:
            i = meta.get(key)
            return toks[i] if isinstance(i, int) and 0 <= i < len(toks) else ""

        self._m = LoadedModel(str(path), hdr, model, vocab, L.llama_vocab_n_tokens(vocab),
                          L.llama_model_n_embd_out(model), has_mtp,
                          tmpl.decode("utf-8", errors="replace") if tmpl else None,
                          tok_text("tokenizer.ggml.bos_token_id"), tok_text("tokenizer.ggml.eos_token_id"))
        self._prompt_cache.clear()
        self.placement = self._placement(load_log, hdr)
        return self._m

    def _placement(self, load_log: list[str], hdr: GGUFHeader) -> Placement:
        """Where the model went: the load log's devices and "offloaded N/M layers" (a build that
        cannot offload logs neither: then the CPU, 0 layers on a GPU)."""
        info = inprocess_backends()
        available = info.gpus if info.gpu_offload and self.n_gpu_layers != 0 else ()
        return parse_load_log(load_log, available, layers_total(hdr))

    def _ctx_params(self, L, n_rs: int, mtp: bool):
        cp = L.llama_context_default_params()
        cp.n_ctx = self.ctx_size
        cp.n_batch = max(self.n_batch, self.max_k + 1)
        cp.n_ubatch = max(self.n_ubatch, n_rs + 2)
        cp.n_seq_max = 1
        cp.n_threads = self.threads
        cp.n_threads_batch = self.threads
        cp.n_rs_seq = n_rs
        cp.flash_attn_type = {"auto": -1, "off": 0, "on": 1}[self.flash_attn]
        if mtp:
            cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
            cp.ctx_other = self._tgt
        return cp

    def _ensure_contexts(self, need_mtp: bool, k: int) -> None:
        """The target context (and the MTP context) for a request at draft width ``k``, its
        recurrent snapshot slots (n_rs_seq) set as llama-server sets them
        (common_params_speculative::need_n_rs_seq): the draft width for draft-mtp, 0 without. The
        slots change the plain step's cost on a hybrid model (with any, llama.cpp's gated delta net
        works on a copy of the state and writes it back as a snapshot), so a baseline run on a
        context sized for the widest K paid for them where llama-server's baseline does not
        (issue 37). One other set of contexts is kept aside (the baseline's, between a K's runs)."""
        L, X = llama()
        m = self._m
        assert m is not None
        want_rs = k if (m.has_mtp and need_mtp and k > 0) else 0
        if self._tgt is not None and self._tgt_rs != want_rs:
            self._park()
        if self._tgt is None and want_rs in self._parked:
            self._unpark(want_rs)
        if self._tgt is None:
            tgt = L.llama_init_from_model(m.model, self._ctx_params(L, want_rs, False))
            if not tgt:
                raise EngineError(f"{m.path}: llama.cpp could not create a context"
                                  + (f" ({failure_reasons()})" if failure_reasons() else ""))
            if self._pool is None:
                self._pool = new_threadpool(self.threads)
            if self._pool is not None:  # llama-server's persistent pool (llama_backend.SERVER_POLL)
                attach_threadpool(tgt, self._pool)
            self._tgt, self._tgt_rs = tgt, want_rs
            self._tb = L.llama_batch_init(max(self.n_batch, self.max_k + 1, k + 1), 0, 1)
        if need_mtp and self._dft is None:
            if not m.has_mtp:
                raise MtpUnavailable(m.header.mtp_problem() or f"{m.path}: no MTP layers")
            dft = L.llama_init_from_model(m.model, self._ctx_params(L, 0, True))
            if not dft:
                raise MtpUnavailable(f"{m.path}: llama.cpp could not create the MTP context"
                                     + (f" ({failure_reasons()})" if failure_reasons() else ""))
            self._dft = dft
            X.llama_set_embeddings_nextn(dft, True, True)
            n = max(self.n_batch, self.max_k + 1, k + 1)
            self._db = L.llama_batch_init(n, m.n_embd, 1)
            self._db_tokens = (L.llama_token * n)()
            self._db.token = ctypes.cast(self._db_tokens, ctypes.POINTER(L.llama_token))
            self._demb = np.ctypeslib.as_array(self._db.embd, shape=(n * m.n_embd,))

    _SET = ("_tgt", "_dft", "_tb", "_db", "_db_tokens", "_demb")

    def _park(self) -> None:
        """Set the current contexts aside (keyed by their n_rs_seq); the oldest set aside is freed
        first, so at most MAX_PARKED sets wait beside the current one."""
        rs = self._tgt_rs
        self._parked.pop(rs, None)
        while len(self._parked) >= self.MAX_PARKED:
            old = next(iter(self._parked))
            self._free_set(self._parked.pop(old))
        self._parked[rs] = tuple(getattr(self, a) for a in self._SET)
        for a in self._SET:
            setattr(self, a, None)
        self._tgt_rs = -1

    def _unpark(self, rs: int) -> None:
        for a, v in zip(self._SET, self._parked.pop(rs)):
            setattr(self, a, v)
        self._tgt_rs = rs

    def _free_set(self, handles: tuple) -> None:
        L, _ = llama()
        tgt, dft, tb, db, _tokens, _demb = handles
        if db is not None:
            db.token = ctypes.POINTER(L.llama_token)()  # ours: must not be freed by llama
            L.llama_batch_free(db)
        if tb is not None:
            L.llama_batch_free(tb)
        if dft is not None:
            L.llama_free(dft)
        if tgt is not None:
            L.llama_free(tgt)

    def _free_contexts(self) -> None:
        while self._parked:
            self._free_set(self._parked.pop(next(iter(self._parked))))
        if self._tgt is not None or self._dft is not None:
            self._free_set(tuple(getattr(self, a) for a in self._SET))
            for a in self._SET:
                setattr(self, a, None)
            self._tgt_rs = -1
        if self._pool is not None:  # after every context it ran
            free_threadpool(self._pool)
            self._pool = None

    def _unload(self) -> None:
        self._free_contexts()
        if self._m is not None:
            L, _ = llama()
            L.llama_model_free(self._m.model)
            self._m = None

    def close(self) -> None:
        with self._lock:
            self._unload()

    def __enter__(self) -> "InProcessEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def target_state(self, partial: bool = True) -> bytes:
        """The target's sequence-0 state: with ``partial`` only the part a rollback needs (the
        recurrent state of hybrid models), else all of it (KV cache included)."""
        L, _ = llama()
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        n = L.llama_state_seq_get_size_ext(self._tgt, 0, flags)
        buf = (ctypes.c_uint8 * n)()
        L.llama_state_seq_get_data_ext(self._tgt, buf, n, 0, flags)
        return bytes(buf)

    def restore_target_state(self, blob: bytes, partial: bool = True) -> bool:
        """Put back a state taken with :meth:`target_state` (same ``partial``)."""
        L, _ = llama()
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        return L.llama_state_seq_set_data_ext(self._tgt, buf, len(blob), 0, flags) != 0

    # -- tokens ---------------------------------------------------------------------------
    def chat(self, m: LoadedModel) -> ModelTemplate:
        """The model's chat template through llama-cpp-python's Jinja2ChatFormatter."""
        if not m.template:
            raise EngineError(f"{m.path}: the model has no chat template; use raw prompts (--raw)")
        if m.chat is None:
            m.chat = ModelTemplate(m.template, jinja_render(m.template, m.bos, m.eos),
                                   lambda s: self.tokenize(m, s, add_special=False), model=m.path)
        return m.chat

    def prompt_text(self, text: str, raw: bool, thinking: bool | None = None) -> str:
        """The text the model is given: ``text`` as it is, or through the chat template."""
        m = self._m
        assert m is not None
        if raw:
            return text
        try:
            return self.chat(m).prompt(text, thinking)
        except UserError:  # a template past the bounds refuses the model (ModelFileError), not one run
            raise
        except Exception as e:
            raise EngineError(f"{m.path}: the chat template failed ({e}); use --raw") from None

    def prompt_tokens(self, text: str, raw: bool, thinking: bool | None = None) -> list[int]:
        m = self._m
        assert m is not None
        key = (text, raw, thinking)
        if key not in self._prompt_cache:
            self._prompt_cache[key] = self.tokenize(m, self.prompt_text(text, raw, thinking))
        return self._prompt_cache[key]

    def tokenize(self, m: LoadedModel, text: str, add_special: bool = True) -> list[int]:
        """llama.cpp's tokenizer (special tokens parsed)."""
        L, _ = llama()
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(m.vocab, data, len(data), buf, n_max, add_special, True)
        if n < 0:
            buf = (L.llama_token * -n)()
            n = L.llama_tokenize(m.vocab, data, len(data), buf, -n, add_special, True)
        return list(buf[:n])

    def count_tokens(self, model: str, text: str) -> int:
        with self._lock:
            return len(self.tokenize(self.load(model), text, add_special=False))

    def top_two(self, model: str, prompt: Sequence[int], answer: Sequence[int], sampler: Sampler,
                cancel: CancelToken) -> TopTwo | None:
        """Not read in process (its decode state belongs to the sweep's arm): None."""
        return None

    # -- generation -----------------------------------------------------------------------
    def eog_tokens(self, m: LoadedModel) -> tuple[int, ...]:
        """The model's end-of-generation tokens (the server biases them to -inf for ignore_eos)."""
        if m.eog is None:
            L, _ = llama()
            m.eog = eog_tokens(L, m.vocab, m.n_vocab)
        return m.eog

    def generate(self, model: str, arm: Arm, text: str, *, raw: bool,
                 n_predict: int, sampler: Sampler, cancel: CancelToken,
                 ignore_eos: bool = False, thinking: bool | None = None) -> Generator[Progress, None, Generation]:
        problem = self.mode_problem(arm)
        if problem:
            raise ModeUnavailable(problem)
        k, p_min = arm.k, arm.p_min
        with self._lock:
            m = self.load(model)
            mtp = bool(k)
            self._ensure_contexts(mtp, k or 0)
            prompt = self.prompt_tokens(text, raw, thinking)
            if not prompt:
                raise EngineError("the prompt tokenized to nothing")
            n_ctx = self.n_ctx()  # the context llama.cpp made (ctx_size 0: the model's own)
            if len(prompt) + n_predict + 1 > n_ctx:
                raise EngineError(f"prompt ({len(prompt)} tokens) + n_predict ({n_predict}) exceed "
                                  f"the context size {n_ctx}; raise --ctx-size")
        loop = DecodeLoop(self, m, mtp, k or 0, p_min or 0.0, sampler, ignore_eos,
                          self.synth_rates if mtp else None)
        result = yield from loop.run(prompt, n_predict, cancel)
        if raw:
            return result
        chat = self.chat(m)
        return dataclasses.replace(result, thinking=chat.sent(thinking), reasoning_n=chat.reasoning_n(
            self.prompt_text(text, raw, thinking), result.tokens))
