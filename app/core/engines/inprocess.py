"""In-process engine on llama-cpp-python's low-level API: one model load per sweep.

Baseline greedy decode and an MTP speculative loop that mirrors llama-server (common/speculative.cpp
``draft-mtp`` + the server's verify/accept/rollback): the target's hidden state feeds the NextN head,
up to K tokens are drafted (stopping early when the draft's top probability is below p_min), all
of them plus one are verified in ONE target batch, the longest matching prefix plus the target's
token is accepted and both contexts are rolled back, recurrent (DeltaNet) state included. Drafted
and accepted tokens are counted exactly as llama.cpp counts them.

Order of operations and pitfalls: shared/reference/inprocess_mtp_loop.md.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import os
import threading
import time
from typing import Generator

import numpy as np

from app.core.common.cancel import CancelToken
from app.core.engines.base import Generation, Progress, confounder_flags, default_threads, reason_lines
from app.core.common.errors import Cancelled, EngineError, ModelFileError, MtpUnavailable
from app.core.machine.gguf_info import GGUFHeader, validate_model

PROGRESS_EVERY_S = 0.05
_log_lock = threading.Lock()
_LOG: collections.deque[str] = collections.deque(maxlen=500)
_backend_ready = False
_log_cb = None


def _llama():
    """Import llama_cpp lazily (heavy), init the backend once, route its log into a buffer."""
    global _backend_ready, _log_cb
    try:
        import llama_cpp as L
        from llama_cpp import llama_cpp_ext as X
    except Exception as e:  # pragma: no cover - depends on the install
        raise EngineError(f"llama-cpp-python is not usable here ({e}); reinstall mtp-tuner") from None
    if not _backend_ready:
        @L.llama_log_callback
        def _cb(level, text, _user):  # pragma: no cover - called from C
            try:
                s = text.decode("utf-8", errors="replace")
            except Exception:
                return
            with _log_lock:
                if _LOG and not _LOG[-1].endswith("\n"):
                    _LOG[-1] += s
                else:
                    _LOG.append(s)

        _log_cb = _cb
        L.llama_log_set(_log_cb, ctypes.c_void_p(0))
        L.llama_backend_init()
        _backend_ready = True
        import atexit

        # llama.cpp may log while the interpreter tears down; a Python callback freed by then
        # would crash the process at exit
        atexit.register(lambda: L.llama_log_set(ctypes.cast(None, L.llama_log_callback), ctypes.c_void_p(0)))
    return L, X


def recent_log(n: int = 30) -> list[str]:
    with _log_lock:
        return [ln.rstrip("\n") for ln in list(_LOG)[-n:]]


def _reasons() -> str:
    r = reason_lines(recent_log(60), limit=4)
    return "; ".join(r)


def llama_cpp_version() -> str:
    try:
        import llama_cpp

        return f"llama-cpp-python {llama_cpp.__version__}"
    except Exception:
        return "llama-cpp-python (unavailable)"


def fill_batch(b, toks, pos0: int, logits, embs=None, demb: np.ndarray | None = None,
               n_embd: int = 0) -> None:
    """Fill a llama_batch for sequence 0 at positions pos0.. (with hidden-state rows if given)."""
    b.n_tokens = len(toks)
    for i, t in enumerate(toks):
        b.token[i] = int(t)
        b.pos[i] = pos0 + i
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = 0
        b.logits[i] = logits[i]
    if embs is not None:
        for i, e in enumerate(embs):
            demb[i * n_embd:(i + 1) * n_embd] = e


def decode_or_raise(L, ctx, b, what: str) -> None:
    rc = L.llama_decode(ctx, b)
    if rc != 0:
        raise EngineError(f"llama_decode failed during {what} (code {rc})"
                          + (f": {_reasons()}" if _reasons() else ""))


@dataclasses.dataclass
class _Loaded:
    path: str
    header: GGUFHeader
    model: object
    vocab: object
    n_vocab: int
    n_embd: int
    has_mtp: bool
    template: str | None
    bos: str
    eos: str


@dataclasses.dataclass(frozen=True)
class RawContexts:
    """A loaded model's llama.cpp handles, for the cost probe's timed decodes: the low-level API
    (L, and X for the MTP extension), the model, the target and MTP contexts and their batches,
    and the hidden-row buffer that fill_batch copies from."""

    L: object
    X: object
    model: _Loaded
    target: object
    draft: object | None
    target_batch: object
    draft_batch: object | None
    hidden_rows: np.ndarray | None


class InProcessEngine:
    """One model load per sweep; a target context (and an MTP context when needed) reused by
    every arm. ``loads`` counts model loads (a K x p_min sweep must load once)."""

    name = "inprocess"

    def __init__(self, *, ctx_size: int = 4096, threads: int | None = None, n_gpu_layers: int = -1,
                 n_batch: int = 2048, n_ubatch: int = 512, max_k: int = 8, flash_attn: str = "auto"):
        if flash_attn not in ("auto", "on", "off"):
            raise EngineError(f"flash attention must be auto, on or off, got {flash_attn!r}")
        self.flash_attn = flash_attn
        self.ctx_size, self.n_batch, self.n_ubatch = ctx_size, n_batch, n_ubatch
        self.threads = threads or default_threads() or max(1, min(os.cpu_count() or 1, 8))
        self.n_gpu_layers = n_gpu_layers
        self.max_k = max_k
        self.loads = 0
        self._m: _Loaded | None = None
        self._tgt = None
        self._dft = None
        self._tgt_rs = -1
        self._tb = None
        self._db = None
        self._db_tokens = None
        self._demb: np.ndarray | None = None
        self._prompt_cache: dict[tuple[str, bool], list[int]] = {}
        self._lock = threading.Lock()

    # -- properties the runner reads --------------------------------------------------------
    @property
    def build(self) -> str:
        return llama_cpp_version()

    def check_mtp(self) -> None:
        _llama()  # raise a clear error early if the library is unusable

    def prepare(self, plan) -> None:
        """Size the recurrent-state snapshots for the widest K of the plan (the runner calls this)."""
        ks = [a.k for a in plan.arms if a.k]
        if ks:
            self.max_k = max(ks)

    def raw_contexts(self, path: str, max_batch: int) -> RawContexts:
        """Load ``path`` and size the contexts for decodes of up to ``max_batch`` tokens; the handles
        stay owned by this engine (valid until close())."""
        m = self.load(path)
        self._ensure_contexts(m.has_mtp, max_batch)
        L, X = _llama()
        return RawContexts(L, X, m, self._tgt, self._dft, self._tb, self._db, self._demb)

    def ready_limit(self, model: str, n_configs: int) -> int | None:
        """Every configuration is ready at once: one model load serves all of them."""
        return None

    # -- model and contexts ---------------------------------------------------------------
    def load(self, path: str) -> _Loaded:
        if self._m is not None and self._m.path == str(path):
            return self._m
        self._unload()
        L, X = _llama()
        hdr = validate_model(path)
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = self.n_gpu_layers
        has_mtp = hdr.mtp_problem() is None and hdr.arch != "gemma4-assistant"
        mp.load_mtp = bool(has_mtp)
        model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            raise ModelFileError(f"{path}: llama.cpp could not load the model"
                                 + (f" ({_reasons()})" if _reasons() else ""))
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

        self._m = _Loaded(str(path), hdr, model, vocab, L.llama_vocab_n_tokens(vocab),
                          L.llama_model_n_embd_out(model), has_mtp,
                          tmpl.decode("utf-8", errors="replace") if tmpl else None,
                          tok_text("tokenizer.ggml.bos_token_id"), tok_text("tokenizer.ggml.eos_token_id"))
        self._prompt_cache.clear()
        return self._m

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
        L, X = _llama()
        m = self._m
        assert m is not None
        want_rs = max(self.max_k, k) if m.has_mtp else 0
        if self._tgt is not None and self._tgt_rs < want_rs:
            self._free_contexts()
        if self._tgt is None:
            tgt = L.llama_init_from_model(m.model, self._ctx_params(L, want_rs, False))
            if not tgt:
                raise EngineError(f"{m.path}: llama.cpp could not create a context"
                                  + (f" ({_reasons()})" if _reasons() else ""))
            self._tgt, self._tgt_rs = tgt, want_rs
            self._tb = L.llama_batch_init(max(self.n_batch, self.max_k + 1), 0, 1)
        if need_mtp and self._dft is None:
            if not m.has_mtp:
                raise MtpUnavailable(m.header.mtp_problem() or f"{m.path}: no MTP layers")
            dft = L.llama_init_from_model(m.model, self._ctx_params(L, 0, True))
            if not dft:
                raise MtpUnavailable(f"{m.path}: llama.cpp could not create the MTP context"
                                     + (f" ({_reasons()})" if _reasons() else ""))
            self._dft = dft
            X.llama_set_embeddings_nextn(dft, True, True)
            n = max(self.n_batch, self.max_k + 1)
            self._db = L.llama_batch_init(n, m.n_embd, 1)
            self._db_tokens = (L.llama_token * n)()
            self._db.token = ctypes.cast(self._db_tokens, ctypes.POINTER(L.llama_token))
            self._demb = np.ctypeslib.as_array(self._db.embd, shape=(n * m.n_embd,))

    def _free_contexts(self) -> None:
        if self._tgt is None and self._dft is None:
            return
        L, _ = _llama()
        if self._db is not None:
            self._db.token = ctypes.POINTER(L.llama_token)()  # ours: must not be freed by llama
            L.llama_batch_free(self._db)
            self._db = self._db_tokens = self._demb = None
        if self._tb is not None:
            L.llama_batch_free(self._tb)
            self._tb = None
        if self._dft is not None:
            L.llama_free(self._dft)
            self._dft = None
        if self._tgt is not None:
            L.llama_free(self._tgt)
            self._tgt = None
        self._tgt_rs = -1

    def _unload(self) -> None:
        self._free_contexts()
        if self._m is not None:
            L, _ = _llama()
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
        L, _ = _llama()
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        n = L.llama_state_seq_get_size_ext(self._tgt, 0, flags)
        buf = (ctypes.c_uint8 * n)()
        L.llama_state_seq_get_data_ext(self._tgt, buf, n, 0, flags)
        return bytes(buf)

    def restore_target_state(self, blob: bytes, partial: bool = True) -> bool:
        """Put back a state taken with :meth:`target_state` (same ``partial``)."""
        L, _ = _llama()
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        return L.llama_state_seq_set_data_ext(self._tgt, buf, len(blob), 0, flags) != 0

    # -- tokens ---------------------------------------------------------------------------
    def prompt_tokens(self, text: str, raw: bool) -> list[int]:
        L, _ = _llama()
        m = self._m
        assert m is not None
        key = (text, raw)
        if key in self._prompt_cache:
            return self._prompt_cache[key]
        prompt = text
        if not raw:
            if not m.template:
                raise EngineError(f"{m.path}: the model has no chat template; use raw prompts (--raw)")
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            try:
                prompt = Jinja2ChatFormatter(m.template, m.eos, m.bos)(
                    messages=[{"role": "user", "content": text}]).prompt
            except Exception as e:
                raise EngineError(f"{m.path}: the chat template failed ({e}); use --raw") from None
        data = prompt.encode("utf-8")
        n_max = len(data) + 16
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(m.vocab, data, len(data), buf, n_max, True, True)
        if n < 0:
            buf = (L.llama_token * -n)()
            n = L.llama_tokenize(m.vocab, data, len(data), buf, -n, True, True)
        toks = list(buf[:n])
        self._prompt_cache[key] = toks
        return toks

    # -- generation -----------------------------------------------------------------------
    def generate(self, model: str, k: int | None, p_min: float | None, text: str, *, raw: bool,
                 n_predict: int, temperature: float, seed: int, cancel: CancelToken,
                 ignore_eos: bool = False) -> Generator[Progress, None, Generation]:
        with self._lock:
            m = self.load(model)
            mtp = bool(k)
            self._ensure_contexts(mtp, k or 0)
            prompt = self.prompt_tokens(text, raw)
            if not prompt:
                raise EngineError("the prompt tokenized to nothing")
            if len(prompt) + n_predict + 1 > self.ctx_size:
                raise EngineError(f"prompt ({len(prompt)} tokens) + n_predict ({n_predict}) exceed "
                                  f"the context size {self.ctx_size}; raise --ctx-size")
        loop = _Loop(self, m, mtp, k or 0, p_min or 0.0, temperature, seed, ignore_eos)
        result = yield from loop.run(prompt, n_predict, cancel)
        return result


class _Loop:
    """One request: prompt, then plain or speculative steps until n_predict tokens."""

    def __init__(self, eng: InProcessEngine, m: _Loaded, mtp: bool, k: int, p_min: float,
                 temperature: float, seed: int, ignore_eos: bool):
        self.L, self.X = _llama()
        self.eng, self.m = eng, m
        self.mtp, self.k, self.p_min = mtp, k, p_min
        self.temp = temperature
        self.rng = np.random.default_rng(seed)
        self.ignore_eos = ignore_eos
        self.tgt, self.dft = eng._tgt, eng._dft
        self.mem_t = self.L.llama_get_memory(self.tgt)
        self.mem_d = self.L.llama_get_memory(self.dft) if mtp else None
        self.pending_h = np.zeros(m.n_embd, np.float32)
        self.draft_n = self.accepted = 0
        self.is_recurrent = bool(self.L.llama_model_is_hybrid(m.model) or self.L.llama_model_is_recurrent(m.model))
        self.use_ckpt = mtp and self.is_recurrent and self.L.llama_n_rs_seq(self.tgt) < k

    def _fill(self, b, toks, pos0, logits, embs=None) -> None:
        fill_batch(b, toks, pos0, logits, embs, self.eng._demb, self.m.n_embd)

    def _decode(self, ctx, b, what: str) -> None:
        decode_or_raise(self.L, ctx, b, what)

    def _logits(self, ctx, i: int) -> np.ndarray:
        ptr = self.L.llama_get_logits_ith(ctx, i)
        if not ptr:
            raise EngineError(f"no logits for row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.m.n_vocab,))

    def _target_h(self, n: int) -> np.ndarray:
        ptr = self.X.llama_get_embeddings_nextn(self.tgt)
        if not ptr:
            raise EngineError("the target gave no hidden states for the MTP head")
        return np.ctypeslib.as_array(ptr, shape=(n, self.m.n_embd)).copy()

    def _sample(self, logits: np.ndarray) -> int:
        if self.temp <= 0:
            return int(np.argmax(logits))
        # llama.cpp's default chain, reduced: top-k 40, top-p 0.95, min-p 0.05, temperature, dist
        idx = np.argpartition(logits, -40)[-40:] if logits.size > 40 else np.arange(logits.size)
        idx = idx[np.argsort(-logits[idx])]
        z = logits[idx].astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        keep = np.cumsum(p) - p < 0.95
        keep &= p >= 0.05 * p[0]
        idx, z = idx[keep], z[keep] / self.temp
        q = np.exp(z - z.max())
        q /= q.sum()
        return int(idx[self.rng.choice(len(idx), p=q)])

    def _catch_up(self, toks: list[int], pos0: int, H: np.ndarray) -> None:
        """MTP context: token x_p at position p paired with the target h of position p-1."""
        rows = [self.pending_h] + [H[i - 1] for i in range(1, len(toks))]
        db = self.eng._db
        self._fill(db, toks, pos0, [0] * len(toks), rows)
        self._decode(self.dft, db, "the MTP catch-up")
        self.pending_h = H[-1].copy()

    def _is_eog(self, t: int) -> bool:
        return (not self.ignore_eos) and bool(self.L.llama_vocab_is_eog(self.m.vocab, t))

    def run(self, prompt: list[int], n_predict: int, cancel: CancelToken) -> Generator[Progress, None, Generation]:
        L, X = self.L, self.X
        L.llama_memory_clear(self.mem_t, True)
        if self.m.has_mtp:
            X.llama_set_embeddings_nextn(self.tgt, bool(self.mtp), False)
        if self.mtp:
            L.llama_memory_clear(self.mem_d, True)
        tb = self.eng._tb
        nb = max(self.eng.n_batch, 1)
        t0 = time.perf_counter()
        # prompt, in chunks; catch-up after each chunk
        for start in range(0, len(prompt), nb):
            cancel.check()
            chunk = prompt[start:start + nb]
            last = start + len(chunk) == len(prompt)
            self._fill(tb, chunk, start, [0] * (len(chunk) - 1) + [1 if last else 0])
            self._decode(self.tgt, tb, "the prompt")
            if self.mtp:
                self._catch_up(chunk, start, self._target_h(len(chunk)))
        t_prompt = time.perf_counter()
        first = self._sample(self._logits(self.tgt, len(prompt) - 1 - (len(prompt) - 1) // nb * nb))
        out, times = [first], [time.perf_counter() - t0]
        n_past, id_last = len(prompt), first
        last_emit = 0.0
        done = self._is_eog(first)
        while not done and len(out) < n_predict:
            if cancel.cancelled:
                raise Cancelled()
            budget = min(self.k, n_predict - len(out) - 1) if self.mtp else 0
            draft = self._draft(id_last, n_past, budget) if budget > 0 else []
            if not draft:
                ids = self._plain_step(id_last, n_past)
            else:
                ids = self._verify(id_last, n_past, draft)
            now = time.perf_counter() - t0
            for t in ids:
                out.append(t)
                times.append(now)
                if self._is_eog(t):
                    done = True
                    break
            n_past += len(ids)
            id_last = ids[-1]
            if now - last_emit > PROGRESS_EVERY_S:
                last_emit = now
                yield Progress(len(out), now)
        dt_prompt = t_prompt - t0
        gen = Generation(
            tokens=tuple(out), token_times=tuple(times), prompt_tokens=tuple(prompt),
            text=self._detok(out), engine_tok_s=None, predicted_n=len(out),
            draft_n=self.draft_n if self.mtp else None, draft_accepted=self.accepted if self.mtp else None,
            prompt_n=len(prompt), prompt_ms=dt_prompt * 1000,
            prompt_tok_s=len(prompt) / dt_prompt if dt_prompt > 0 else None, speculative=self.mtp,
            engine_flags=confounder_flags(recent_log(500)))
        return gen

    def _plain_step(self, id_last: int, n_past: int) -> list[int]:
        tb = self.eng._tb
        self._fill(tb, [id_last], n_past, [1])
        self._decode(self.tgt, tb, "decoding")
        if self.mtp:
            self._catch_up([id_last], n_past, self._target_h(1))
        return [self._sample(self._logits(self.tgt, 0))]

    def _draft(self, id_last: int, n_past: int, budget: int) -> list[int]:
        L, X = self.L, self.X
        db = self.eng._db
        draft: list[int] = []
        self._fill(db, [id_last], n_past, [1], [self.pending_h])
        self._decode(self.dft, db, "drafting")
        while True:
            logits = self._logits(self.dft, 0)
            t = int(np.argmax(logits))
            if self.p_min > 0:
                top = np.partition(logits, -10)[-10:] if logits.size > 10 else logits
                e = np.exp(top - top.max())
                if e.max() / e.sum() < self.p_min:
                    break
            draft.append(t)
            if len(draft) >= budget:
                break
            hp = X.llama_get_embeddings_nextn_ith(self.dft, 0)
            if not hp:
                raise EngineError("the MTP context gave no hidden state")
            h = np.ctypeslib.as_array(hp, shape=(self.m.n_embd,)).copy()
            self._fill(db, [t], n_past + len(draft), [1], [h])
            self._decode(self.dft, db, "drafting")
        L.llama_memory_seq_rm(self.mem_d, 0, n_past, -1)
        self.draft_n += len(draft)
        return draft

    def _verify(self, id_last: int, n_past: int, draft: list[int]) -> list[int]:
        L = self.L
        tb = self.eng._tb
        toks = [id_last] + draft
        ckpt = self.eng.target_state() if self.use_ckpt else None
        self._fill(tb, toks, n_past, [1] * len(toks))
        self._decode(self.tgt, tb, "verification")  # ONE decode: recurrent snapshots need it
        H = self._target_h(len(toks))
        self._catch_up(toks, n_past, H)
        ids: list[int] = []
        for i, d in enumerate(draft):
            t = self._sample(self._logits(self.tgt, i))
            ids.append(t)
            if t != d:
                break
        else:
            ids.append(self._sample(self._logits(self.tgt, len(draft))))
        n_acc = len(ids) - 1
        self.accepted += n_acc
        self.pending_h = H[n_acc].copy()
        keep = n_past + 1 + n_acc
        if keep < n_past + len(toks):
            if not L.llama_memory_seq_rm(self.mem_t, 0, keep, -1):
                if ckpt is None:
                    raise EngineError("the target could not roll back its state after a rejected "
                                      "draft (recurrent-state snapshots too few)")
                self._restore_and_replay(ckpt, toks[:1 + n_acc], n_past)
            L.llama_memory_seq_rm(self.mem_d, 0, keep, -1)
        return ids

    def _restore_and_replay(self, ckpt: bytes, toks: list[int], n_past: int) -> None:
        L = self.L
        self.eng.restore_target_state(ckpt)
        if not L.llama_memory_seq_rm(self.mem_t, 0, n_past, -1):
            raise EngineError("the target could not restore its state checkpoint")
        X = self.X
        X.llama_set_embeddings_nextn(self.tgt, False, False)
        tb = self.eng._tb
        self._fill(tb, toks, n_past, [0] * len(toks))
        self._decode(self.tgt, tb, "the replay after a rejected draft")
        X.llama_set_embeddings_nextn(self.tgt, True, False)

    def _detok(self, toks: list[int]) -> str:
        L = self.L
        parts = []
        buf = ctypes.create_string_buffer(256)
        for t in toks:
            n = L.llama_token_to_piece(self.m.vocab, t, buf, len(buf), 0, False)
            if n > 0:
                parts.append(buf.raw[:n])
        return b"".join(parts).decode("utf-8", errors="replace")
