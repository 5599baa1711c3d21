"""Separate drafter GGUFs (``-md FILE``): what a drafter is, from its header alone, and whether it
drafts for a target in a speculative mode. Checked before any server starts; each problem is one
line naming the file and the cause (a UserError).

Kinds (``ModelInfo.drafter_kind``; "model" when it is none of them):

* ``gemma4-assistant``: draft-mtp for a Gemma 4 target. It reads the target's KV cache and its
  token embedding, and the target's hidden state of width ``embedding_length_out``.
* ``mtp-head``: an mtp-only GGUF (NextN blocks without the trunk, ``convert_hf_to_gguf.py --mtp``),
  draft-mtp for the model it was cut from (same architecture, same width).
* ``eagle3``, ``dflash``, ``dspark``: drafters trained for one target that read its hidden states
  (draft-eagle3, draft-dflash, draft-dspark); converted with the target's tokenizer.
* ``model``: an ordinary causal LM, draft-simple, when its vocabulary passes llama.cpp's own
  check (``common_speculative_are_compatible``, common/speculative.cpp).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable

from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.common import spec_modes
from app.core.common.spec_modes import DRAFTER_MODES, MTP, SPEC_TYPES
from app.core.machine.download import hash_with_progress
from app.core.machine.gguf_info import GGUFHeader, check_gguf_file, check_model_path
from app.core.machine.modelinfo import ModelInfo, drafter_text, inspect

_MODE_ARCH = {"draft-eagle3": "eagle3", "draft-dflash": "dflash", "draft-dspark": "dflash (with a Markov head)"}
# common_speculative_are_compatible's constants
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """A vocabulary in three values: its size, a sha256 of its token texts in order (None when
    the file lists none) and llama.cpp's vocabulary type (``tokenizer.ggml.model``: llama, gpt2...)."""

    n_vocab: int | None
    tokens_sha256: str | None
    model_kind: str | None


@dataclasses.dataclass(frozen=True)
class _Vocab:
    fingerprint: Fingerprint
    tokens: tuple[str, ...] | None
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool


@dataclasses.dataclass(frozen=True)
class DrafterInfo:
    path: str
    arch: str
    kind: str  # "gemma4-assistant" | "mtp-head" | "eagle3" | "dflash" | "dspark" | "model"
    n_vocab: int | None
    tokens_sha256: str | None
    n_embd: int | None
    input_width: int | None  # the target hidden-state width it reads (assistant: embedding_length_out)
    weight_bytes: int
    shares_target_kv: bool  # no KV cache of its own (the Gemma 4 assistant)
    size: int
    sha256: str | None = None
    info: ModelInfo | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def modes(self) -> tuple[str, ...]:
        """The --spec-type modes it drafts with, its own first."""
        return DRAFTER_MODES[self.kind]

    def describe(self) -> str:
        return drafter_text(self.info) if self.info else f"{self.kind} drafter"

    def record(self) -> dict[str, Any]:
        """The drafter as a results record keeps it (schema 3): its absolute path as given (a link,
        e.g. in the Hugging Face cache, keeps its name), sha256, arch and size."""
        return {"path": os.path.abspath(self.path), "sha256": self.sha256 or file_sha256(self.path),
                "arch": self.arch, "size": self.size}


# a file as the caches know it: its resolved path, size and modification time (None, None: missing)
_Key = tuple[str, int | None, int | None]
_FINGERPRINTS: dict[_Key, Fingerprint] = {}
_INFOS: dict[_Key, DrafterInfo] = {}
_VOCABS: OrderedDict[_Key, _Vocab] = OrderedDict()  # a few: a token list can be 250k strings
_SHAS: dict[_Key, str] = {}
_KEEP_VOCABS = 4
_LOCK = threading.Lock()  # the window's workers may ask at the same time; headers are read unlocked


def _key(path: str | os.PathLike[str]) -> _Key:
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError:
        return (str(p), None, None)
    return (str(p.resolve()), st.st_size, st.st_mtime_ns)


def _read_vocab(hdr: GGUFHeader) -> _Vocab:
    kv = hdr.metadata
    toks = kv.get("tokenizer.ggml.tokens")
    tokens = tuple(toks) if type(toks) is list and toks else None  # a _Skipped list kept only its length
    n_vocab = len(toks) if isinstance(toks, list) and len(toks) else None
    if n_vocab is None:
        emb = next((t for t in hdr.tensors if t.name == "token_embd.weight" and len(t.shape) == 2), None)
        n_vocab = int(emb.shape[1]) if emb else None
    sha = None
    if tokens:
        h = hashlib.sha256()
        for t in tokens:
            b = str(t).encode("utf-8", "surrogatepass")
            h.update(len(b).to_bytes(4, "little"))
            h.update(b)
        sha = h.hexdigest()
    kind = kv.get("tokenizer.ggml.model")
    kind = str(kind) if kind is not None else None

    def tok_id(name: str) -> int | None:
        v = kv.get(f"tokenizer.ggml.{name}_token_id")
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    def flag(name: str, default: bool) -> bool:
        v = kv.get(f"tokenizer.ggml.add_{name}_token")
        return bool(v) if isinstance(v, (bool, int)) else default

    # llama.cpp's defaults when the file says nothing: SPM vocabularies add BOS, others do not
    return _Vocab(Fingerprint(n_vocab, sha, kind), tokens, tok_id("bos"), tok_id("eos"),
                  flag("bos", kind == "llama"), flag("eos", False))


def _load(path: str | os.PathLike[str]) -> tuple[DrafterInfo, _Vocab]:
    """Read a GGUF's header once: its drafter summary and its vocabulary, both cached by (path,
    size, modification time)."""
    key = _key(path)
    with _LOCK:
        info, vocab = _INFOS.get(key), _VOCABS.get(key)
        if info is not None and vocab is not None:
            _VOCABS.move_to_end(key)
            return info, vocab
    p = Path(path).expanduser()
    hdr = check_gguf_file(p)
    m = inspect(p, header=hdr)
    vocab = _read_vocab(hdr)
    kind = m.drafter_kind or "model"
    width = m.n_embd_out if kind == "gemma4-assistant" else (m.n_embd if kind == "mtp-head" else None)
    with _LOCK:
        old = _INFOS.get(key)
        info = DrafterInfo(str(p), m.arch, kind, vocab.fingerprint.n_vocab, vocab.fingerprint.tokens_sha256,
                           m.n_embd, width, m.weight_bytes, kind == "gemma4-assistant", m.file_size,
                           old.sha256 if old else _SHAS.get(key), m)
        _INFOS[key] = info
        _FINGERPRINTS[key] = vocab.fingerprint
        _VOCABS[key] = vocab
        while len(_VOCABS) > _KEEP_VOCABS:
            _VOCABS.popitem(last=False)
    return info, vocab


def tokenizer_fingerprint(path: str | os.PathLike[str]) -> Fingerprint:
    """The vocabulary of a GGUF, from its header (cached by path, size and modification time)."""
    fp = _FINGERPRINTS.get(_key(path))
    return fp if fp is not None else _load(path)[1].fingerprint


def file_sha256(path: str | os.PathLike[str], cancel: CancelToken | None = None) -> str:
    """sha256 of the file as it lies on disk (app.core.machine.download's hashing), cached by path,
    size and modification time."""
    key = _key(path)
    if key in _SHAS:
        return _SHAS[key]
    digest = ""
    for ev in hash_with_progress(Path(path).expanduser(), cancel or CancelToken()):
        if isinstance(ev, str):
            digest = ev
    _SHAS[key] = digest
    return digest


def inspect_drafter(path: str | os.PathLike[str], *, with_sha256: bool = False,
                    cancel: CancelToken | None = None) -> DrafterInfo:
    """What a drafter file is (any GGUF: an ordinary model is kind "model"). ``with_sha256`` also
    hashes the whole file (slow for big files; cancellable)."""
    p = Path(path).expanduser()
    check_model_path(p, "drafter file")
    info = _load(p)[0]
    if with_sha256 and info.sha256 is None:
        info = dataclasses.replace(info, sha256=file_sha256(p, cancel))
        _INFOS[_key(p)] = info
    return info


def _modes(mode: str) -> list[str]:
    # llama-server's list (draft-mtp,ngram-mod) or a combined mode's name (draft-mtp+ngram-mod)
    modes = [m.strip() for m in str(mode).replace(spec_modes.COMBINE, ",").split(",") if m.strip()] or ["none"]
    for m in modes:
        if m not in SPEC_TYPES:
            raise UserError(f"unknown speculative type {m!r} (--spec-type): llama.cpp's are {', '.join(SPEC_TYPES)}")
    return modes


def _target(target: str | os.PathLike[str] | ModelInfo) -> tuple[ModelInfo, str]:
    if isinstance(target, ModelInfo):
        return target, target.path
    p = Path(target).expanduser()
    info = _load(p)[0].info
    assert info is not None  # _load keeps the model's summary in every DrafterInfo it makes
    return info, str(p)


def check_pair(target: str | os.PathLike[str] | ModelInfo, drafter: str | os.PathLike[str] | None,
               mode: str) -> DrafterInfo | None:
    """Does ``drafter`` draft for ``target`` with ``--spec-type mode``? Returns the drafter's
    summary (None when the mode runs without one), or raises a one-line UserError: a missing
    file, a mode that takes no drafter or needs one, a file that is no drafter for the mode,
    another vocabulary, the wrong width. Reads headers only; starts nothing."""
    modes = _modes(mode)
    drafting = [m for m in modes if (row := spec_modes.mode(m)) is not None and row.takes_drafter]
    if drafter is None or not str(drafter).strip():
        need = [m for m in modes if (row := spec_modes.mode(m)) is not None and row.needs_drafter]
        if need:
            raise UserError(f"--spec-type {need[0]} needs a drafter GGUF (-md FILE): "
                            + ("a smaller model with the target's vocabulary" if need[0] == "draft-simple"
                               else f"an {_MODE_ARCH[need[0]]} drafter converted for the target"))
        return None
    p = Path(drafter).expanduser()
    if not drafting:
        why = "no speculation" if modes == ["none"] else "it drafts from the text itself"
        raise UserError(f"{p}: --spec-type {','.join(modes)} takes no drafter ({why}); leave the drafter out "
                        "or choose a draft-* mode")
    check_model_path(p, "drafter file")
    t, t_path = _target(target)
    d, d_vocab = _load(p)
    usable = [m for m in drafting if m in d.modes]
    if not usable:
        raise UserError(_not_a_drafter(p, d, drafting[0]))
    mode = usable[0]
    if d.kind == "gemma4-assistant" and t.arch != "gemma4":
        raise UserError(f"{p} is a gemma4-assistant drafter, made for a Gemma 4 target; {t_path} is "
                        f"{t.arch or 'of unknown architecture'}")
    if d.kind == "mtp-head" and d.arch != t.arch:
        raise UserError(f"{p} is the MTP head of a {d.arch} model; {t_path} is {t.arch or 'of unknown architecture'}: "
                        "give the mtp- file cut from this target")
    if d.input_width and t.n_embd and d.input_width != t.n_embd:
        key = "gemma4-assistant.embedding_length_out" if d.kind == "gemma4-assistant" else f"{d.arch}.embedding_length"
        raise UserError(f"{p}: a drafter of the wrong width: it reads a target hidden state of {d.input_width} "
                        f"({key}), {t_path} has width {t.n_embd} ({t.arch}.embedding_length)")
    problem = _vocab_problem(d_vocab, _load(t_path)[1], mode)
    if problem:
        raise UserError(f"{p}: a drafter with another vocabulary than {t_path}: {problem}")
    return d


def _not_a_drafter(p: Path, d: DrafterInfo, want: str) -> str:
    if d.kind == "model":
        what = f"{p} is an ordinary {d.arch or 'GGUF'} model, not a drafter"
        if want == MTP:
            own = " (it has MTP heads of its own: use it as the target, with no drafter)" if (
                d.info and d.info.has_mtp) else ""
            return (f"{what}{own}: draft-mtp takes a gemma4-assistant or an mtp-only GGUF made for the target "
                    "(or no drafter, for the target's own MTP heads); an ordinary model with the target's "
                    "vocabulary drafts with draft-simple")
        return f"{what}: {want} takes an {_MODE_ARCH[want]} drafter converted for the target; an ordinary model " \
               "drafts with draft-simple"
    why = {"gemma4-assistant": " (it reads the target's KV cache and hidden state)",
           "mtp-head": " (NextN blocks without a trunk: they read the target's hidden state)"}.get(d.kind, "")
    article = "an" if d.kind[0] in "aeiou" else "a"
    return f"{p} is {article} {d.kind} drafter{why}: it drafts with --spec-type {' or '.join(d.modes)}, not {want}"


def _token(t: str) -> str:
    r = repr(t)
    return r if len(r) <= 40 else r[:37] + "...'"


def _first_difference(a: tuple[str, ...], b: tuple[str, ...], start: int = 0) -> int | None:
    for i in range(start, min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return None


def _vocab_problem(d: _Vocab, t: _Vocab, mode: str) -> str | None:
    """Why the drafter's vocabulary does not do for the target's, or None. draft-simple follows
    llama.cpp's common_speculative_are_compatible (type, BOS/EOS, size within 128, token texts from
    id 5 on). The other modes (llama.cpp checks nothing there) need the target's vocabulary size
    and the same token texts from id 5 on: they share its embeddings or were converted from its
    tokenizer, so a token id must mean the same in both."""
    fd, ft = d.fingerprint, t.fingerprint
    if mode == "draft-simple":
        if fd.model_kind != ft.model_kind:
            return (f"tokenizer type {fd.model_kind} in the drafter, {ft.model_kind} in the target "
                    "(tokenizer.ggml.model)")
        for name, da, ta, di, ti in (("BOS", d.add_bos, t.add_bos, d.bos, t.bos),
                                     ("EOS", d.add_eos, t.add_eos, d.eos, t.eos)):
            if da != ta or (da and di != ti):
                return (f"the {name} token differs (added: {da} in the drafter, {ta} in the target; "
                        f"id {di} vs {ti})")
        if fd.n_vocab and ft.n_vocab and abs(fd.n_vocab - ft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
            return (f"{fd.n_vocab} tokens in the drafter, {ft.n_vocab} in the target (llama.cpp allows a "
                    f"difference of at most {VOCAB_MAX_SIZE_DIFFERENCE})")
    elif fd.n_vocab and ft.n_vocab and fd.n_vocab != ft.n_vocab:
        return f"{fd.n_vocab} tokens in the drafter, {ft.n_vocab} in the target"
    if d.tokens and t.tokens and fd.tokens_sha256 != ft.tokens_sha256:
        i = _first_difference(d.tokens, t.tokens, VOCAB_CHECK_START_TOKEN_ID)
        if i is not None:
            return f"token {i} is {_token(d.tokens[i])} in the drafter, {_token(t.tokens[i])} in the target"
    return None


def matching_drafters(target: str | os.PathLike[str] | ModelInfo, paths: Iterable[str | os.PathLike[str]],
                      cancel: CancelToken | None = None) -> list[Path]:
    """The GGUFs among ``paths`` that pass :func:`check_pair` with ``target`` for one of their own
    drafting modes: the vocabulary fingerprint first (cheap, cached), then the full check. Left
    out: the target itself, unreadable files, and ordinary models not smaller than the target (no
    drafter for it)."""
    t, t_path = _target(target)
    ft = tokenizer_fingerprint(t_path)
    t_key = _key(t_path)[0]
    out = []
    for path in paths:
        if cancel is not None:
            cancel.check()
        p = Path(path).expanduser()
        if _key(p)[0] == t_key:
            continue
        try:
            fp = tokenizer_fingerprint(p)
            if fp.model_kind != ft.model_kind or (
                    fp.n_vocab and ft.n_vocab and abs(fp.n_vocab - ft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE):
                continue
            d = inspect_drafter(p)
        except UserError:
            continue
        if d.kind == "model" and d.weight_bytes >= t.weight_bytes:
            continue
        for m in d.modes:
            try:
                check_pair(t, p, m)
            except UserError:
                continue
            out.append(p)
            break
    return out
