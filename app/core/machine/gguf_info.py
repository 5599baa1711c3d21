"""GGUF header reading: metadata and the tensor table, never the tensor data.

A small, bounded parser of its own (rather than ``gguf.GGUFReader``, which maps and parses the
whole file) so that broken files give one clear error fast: empty files, random bytes, a header
cut short, tensor data past the end of the file, absurd counts.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
from pathlib import Path
from typing import Any, BinaryIO

from app.core.common.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
MAX_KV = 1_000_000
MAX_TENSORS = 1_000_000
MAX_STRING = 64 * 1024 * 1024
MAX_ARRAY = 200_000_000
KEEP_ARRAY = 1_000_000  # arrays longer than this keep only their length
DEFAULT_ALIGNMENT = 32

# architectures with an MTP draft graph in llama.cpp (see shared reference §4.1)
MTP_ARCHS = frozenset({
    "qwen3next", "qwen35", "qwen35moe", "deepseek2", "deepseek32", "deepseek4", "glm4moe",
    "glm-dsa", "step35", "bailingmoe3", "cohere2moe", "nemotron_h_moe", "hy_v3", "mimo2",
    "qwen4exp", "gemma4-assistant",
})

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<n>\d{5})\.gguf$")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first)
    ggml_type: int
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclasses.dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_key(self, name: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{name}", default)

    @property
    def block_count(self) -> int:
        return int(self.arch_key("block_count", 0) or 0)

    @property
    def nextn_layers(self) -> int:
        return int(self.arch_key("nextn_predict_layers", 0) or 0)

    @property
    def has_mtp(self) -> bool:
        """MTP heads present: nextn_predict_layers > 0 and the probed eh_proj tensor exists."""
        if self.nextn_layers <= 0:
            return False
        names = {t.name for t in self.tensors}
        if self.arch == "gemma4-assistant":
            return any(n.startswith("nextn.") for n in names)
        return f"blk.{self.block_count - 1}.nextn.eh_proj.weight" in names

    def mtp_problem(self) -> str | None:
        """Why this file cannot run MTP, or None when it can."""
        if self.nextn_layers <= 0:
            return (f"{self.path}: the model has no MTP heads "
                    f"({self.arch or 'unknown'}.nextn_predict_layers is missing or 0)")
        if not self.has_mtp:
            return (f"{self.path}: {self.arch}.nextn_predict_layers is {self.nextn_layers} but the "
                    f"NextN tensors (blk.{self.block_count - 1}.nextn.eh_proj.weight) are missing")
        if self.arch not in MTP_ARCHS:
            return f"{self.path}: llama.cpp has no MTP draft graph for architecture {self.arch!r}"
        return None

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)


class _Reader:
    def __init__(self, f: BinaryIO, path: str, size: int):
        self.f, self.path, self.size = f, path, size

    def read(self, n: int, what: str) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ModelFileError(f"{self.path}: the GGUF header is truncated (ends while reading {what})")
        return b

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        if n > MAX_STRING or self.f.tell() + n > self.size:
            raise ModelFileError(f"{self.path}: corrupt GGUF header ({what} has an impossible length {n})")
        return self.read(n, what).decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, keep: bool = True) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            itype = self.unpack("<I", what)
            n = self.unpack("<Q", what)
            if n > MAX_ARRAY:
                raise ModelFileError(f"{self.path}: corrupt GGUF header ({what} claims {n} items)")
            if itype in _SCALARS:
                fmt = _SCALARS[itype]
                width = struct.calcsize(fmt)
                if self.f.tell() + n * width > self.size:
                    raise ModelFileError(f"{self.path}: the GGUF header is truncated (in {what})")
                if not keep or n > KEEP_ARRAY:
                    self.f.seek(n * width, os.SEEK_CUR)
                    return _Skipped(n)
                raw = self.read(n * width, what)
                return list(struct.unpack(f"<{n}{fmt[1]}", raw))
            if itype == _STRING:
                if not keep or n > KEEP_ARRAY:
                    for _ in range(n):
                        ln = self.unpack("<Q", what)
                        if ln > MAX_STRING or self.f.tell() + ln > self.size:
                            raise ModelFileError(f"{self.path}: corrupt GGUF header (in {what})")
                        self.f.seek(ln, os.SEEK_CUR)
                    return _Skipped(n)
                return [self.string(what) for _ in range(n)]
            if itype == _ARRAY:
                return [self.value(_ARRAY, what, keep) for _ in range(n)]
            raise ModelFileError(f"{self.path}: corrupt GGUF header ({what} has unknown item type {itype})")
        raise ModelFileError(f"{self.path}: corrupt GGUF header ({what} has unknown value type {vtype})")


class _Skipped(list):
    """A long array whose items were not kept; ``len()`` still tells its length."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def __len__(self) -> int:  # pragma: no cover - trivial
        return self.n


def _type_nbytes(ggml_type: int, n_elements: int, path: str, name: str) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # deferred: the gguf package loads numpy (heavy)

    try:
        qt = GGMLQuantizationType(ggml_type)
        block, size = GGML_QUANT_SIZES[qt]
    except (ValueError, KeyError):
        raise ModelFileError(f"{path}: tensor {name!r} has an unknown ggml type {ggml_type}") from None
    return (n_elements // block) * size


def check_model_path(path: str | os.PathLike) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(f"{p}: no such file")
    if p.is_dir():
        raise ModelFileError(f"{p}: is a folder, not a GGUF file")
    try:
        size = p.stat().st_size
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read ({e.strerror})") from None
    if size == 0:
        raise ModelFileError(f"{p}: the file is empty (0 bytes), not a GGUF model")
    return p


def read_header(path: str | os.PathLike, keep_arrays: bool = True) -> GGUFHeader:
    """Parse one GGUF file's header and tensor table; check that the tensor data lies in the file."""
    p = check_model_path(path)
    size = p.stat().st_size
    try:
        f = open(p, "rb")
    except OSError as e:
        raise ModelFileError(f"{p}: cannot open ({e.strerror})") from None
    with f:
        r = _Reader(f, str(p), size)
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFileError(f"{p}: not a GGUF file (starts with {magic[:4]!r}, expected b'GGUF')")
        version = r.unpack("<I", "version")
        if version not in (2, 3):
            raise ModelFileError(f"{p}: unsupported GGUF version {version}")
        n_tensors = r.unpack("<Q", "tensor count")
        n_kv = r.unpack("<Q", "key count")
        if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
            raise ModelFileError(f"{p}: corrupt GGUF header (claims {n_tensors} tensors, {n_kv} keys)")
        meta: dict[str, Any] = {}
        for i in range(n_kv):
            key = r.string(f"key #{i}")
            vtype = r.unpack("<I", f"type of {key}")
            keep = keep_arrays or key.startswith(("synthetic.", "general."))
            meta[key] = r.value(vtype, key, keep)
        tensors = []
        for i in range(n_tensors):
            name = r.string(f"tensor name #{i}")
            nd = r.unpack("<I", f"dims of {name}")
            if nd > 8:
                raise ModelFileError(f"{p}: corrupt GGUF header (tensor {name!r} has {nd} dimensions)")
            shape = tuple(r.unpack("<Q", f"shape of {name}") for _ in range(nd))
            ttype = r.unpack("<I", f"type of {name}")
            off = r.unpack("<Q", f"offset of {name}")
            n_el = 1
            for s in shape:
                n_el *= s
            tensors.append(TensorInfo(name, shape, ttype, off, _type_nbytes(ttype, n_el, str(p), name)))
        align = int(meta.get("general.alignment", DEFAULT_ALIGNMENT) or DEFAULT_ALIGNMENT)
        pos = f.tell()
        data_offset = (pos + align - 1) // align * align
    for t in tensors:
        if data_offset + t.offset + t.nbytes > size:
            raise ModelFileError(
                f"{p}: the file is truncated or corrupt (tensor {t.name!r} data ends at byte "
                f"{data_offset + t.offset + t.nbytes}, but the file has {size} bytes)")
    return GGUFHeader(str(p), version, meta, tuple(tensors), data_offset, size)


def split_parts(path: str | os.PathLike) -> list[Path]:
    """All parts of a split GGUF (``-00001-of-0000N``), or just the file itself."""
    p = Path(path)
    m = _SPLIT_RE.fullmatch(p.name)
    if not m:
        return [p]
    n = int(m.group("n"))
    return [p.with_name(f"{m.group('stem')}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def validate_model(path: str | os.PathLike) -> GGUFHeader:
    """Read the header (of every split part) so that a bad file fails here, clearly, not in llama.cpp."""
    parts = split_parts(path)
    hdr = read_header(parts[0])
    for extra in parts[1:]:
        read_header(extra, keep_arrays=False)
    return hdr
