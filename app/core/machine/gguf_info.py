"""GGUF header reading: metadata and the tensor table, never the tensor data.

A small, bounded parser of its own (rather than ``gguf.GGUFReader``, which maps and parses the
whole file) so that broken files give one clear error fast: empty files, random bytes, a header
cut short, tensor data past the end of the file, absurd counts. A hostile header too: arrays of
arrays are read without recursion and to a bounded depth, and the lengths, the number of values
and the header's size have limits; over one is one ModelFileError naming the file and the limit.
Every header in the app is read here.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import struct
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

from app.core.common.errors import CUT_SHORT, ModelFileError, os_problem
from app.core.common import units

GGUF_MAGIC = b"GGUF"
MAX_KV = 1_000_000
MAX_TENSORS = 1_000_000
MAX_STRING = 64 * 1024 * 1024
MAX_KEY = 65_535  # the GGUF spec's limit on a key's length
MAX_ARRAY = 200_000_000
KEEP_ARRAY = 1_000_000  # arrays longer than this keep only their length
# a hostile header is bounded too: llama.cpp itself reads no array of arrays, the gguf package
# writes them; a real header (a 262k-token vocabulary and its merges) has about a million values
MAX_DEPTH = 8  # levels of arrays in arrays
MAX_ITEMS = 16_000_000  # values read one by one: keys, strings, arrays, tensors
MAX_HEADER_BYTES = 512 * 2**20  # the metadata and the tensor table end within this
MAX_LAYERS = 100_000  # block_count, nextn_predict_layers, full_attention_interval
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
_U64 = struct.Struct("<Q")
_BLOCK = 1 << 20  # string arrays are read at most this much at a time

# headers read lately, by file identity (path, inode, size, modification and change times): a sweep
# reads its model's header a dozen times (a 150,000-token vocabulary is 0.1-0.4 s each on 2 cores)
CACHED_HEADERS = 4
SETTLED_S = 2.0  # a file modified this recently is not cached (its next change may keep the same times)
_CACHE: OrderedDict[tuple[Any, ...], GGUFHeader] = OrderedDict()
_CACHE_LOCK = threading.Lock()

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
    """Reads values with every length checked against the file and the limits above. Arrays of
    arrays are read with an explicit stack, never by recursion, so no depth of nesting can exhaust
    Python's stack; the depth itself is bounded by MAX_DEPTH."""

    def __init__(self, f: BinaryIO, size: int, name: str):
        self.f, self.size, self.name = f, size, name
        self.items = 0

    def hostile(self, why: str) -> ModelFileError:
        return ModelFileError(f"{self.name}: corrupt or hostile GGUF header ({why})")

    def count(self, n: int = 1) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise self.hostile(f"more than {MAX_ITEMS:,} keys, strings, arrays and tensors")

    def cut_short(self, what: str, end: int) -> ModelFileError:
        """The header runs past the end of the file: a download that stopped early, most often."""
        return ModelFileError(f"{self.name}: {CUT_SHORT}: the GGUF header is truncated (it ends while reading "
                              f"{what}: the file has {self.size:,} bytes, the header needs at least {end:,})")

    def need(self, n: int, what: str) -> None:
        """``n`` more bytes must lie in the file and within the header limit."""
        end = self.f.tell() + n
        if end > self.size:
            raise self.cut_short(what, end)
        if end > MAX_HEADER_BYTES:
            raise self.hostile(f"the header is larger than {units.size(MAX_HEADER_BYTES)}, in {what}")

    def read(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = self.f.read(n)
        if len(b) != n:  # the file shrank while it was read
            raise self.cut_short(what, self.f.tell() - len(b) + n)
        return b

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def string_length(self, what: str) -> int:
        n: int = self.unpack("<Q", what)
        if n > MAX_STRING:
            raise self.hostile(f"{what} has a string of {n:,} bytes, over the limit of {MAX_STRING:,}")
        if self.f.tell() + n > self.size:
            raise self.cut_short(what, self.f.tell() + n)
        self.count()
        return n

    def string(self, what: str) -> str:
        return self.read(self.string_length(what), what).decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, keep: bool = True) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype != _ARRAY:
            raise ModelFileError(f"{self.name}: corrupt GGUF header ({what} has unknown value type {vtype})")
        root: list[Any] = []
        # each frame: the list being filled and how many nested arrays it still has to read
        stack: list[list[Any]] = [[root, 1]]
        while stack:
            frame = stack[-1]
            if frame[1] == 0:
                stack.pop()
                continue
            frame[1] -= 1
            itype = self.unpack("<I", what)
            n = self.unpack("<Q", what)
            self.count()
            if n > MAX_ARRAY:
                raise self.hostile(f"{what} has an array of {n:,} items, over the limit of {MAX_ARRAY:,}")
            if itype == _ARRAY:
                if len(stack) >= MAX_DEPTH:
                    raise self.hostile(f"metadata arrays nested deeper than {MAX_DEPTH} levels, in {what}")
                child: list[Any] = []
                frame[0].append(child)
                stack.append([child, n])
            else:
                frame[0].append(self.leaf_array(itype, n, what, keep))
        return root[0]

    def leaf_array(self, itype: int, n: int, what: str, keep: bool) -> list[Any]:
        """An array of scalars (read or skipped in one go) or of strings."""
        if itype in _SCALARS:
            fmt = _SCALARS[itype]
            width = struct.calcsize(fmt)
            self.need(n * width, what)
            if not keep or n > KEEP_ARRAY:
                self.f.seek(n * width, os.SEEK_CUR)
                return _Skipped(n)
            return list(struct.unpack(f"<{n}{fmt[1]}", self.read(n * width, what)))
        if itype == _STRING:
            return self.strings(n, what, keep and n <= KEEP_ARRAY)
        raise ModelFileError(f"{self.name}: corrupt GGUF header ({what} has unknown item type {itype})")

    def strings(self, n: int, what: str, keep: bool) -> list[Any]:
        """An array of ``n`` length-prefixed strings, walked in a buffer read a block at a time (a
        real vocabulary is 150,000-260,000 strings: read one by one from the file, each header read
        took about a second here), with the checks ``string_length`` and ``need`` make on each."""
        out: list[str] = []
        start = first = self.f.tell()  # the file's position of buf[0]; of the array
        buf, off, done = b"", 0, 0

        def more(want: int) -> None:
            """buf[off:] holds at least ``want`` bytes (buf starts at off from now), else the error
            ``need`` gives."""
            nonlocal start, buf, off
            end = start + off + want
            if end > self.size:
                raise self.cut_short(what, end)
            if end > MAX_HEADER_BYTES:
                raise self.hostile(f"the header is larger than {units.size(MAX_HEADER_BYTES)}, in {what}")
            have = len(buf) - off
            # about what the strings left need (8 bytes each at least, then their mean so far), at
            # most a block: past the array's end it reads a few strings' worth, never the tensor data
            mean = (start + off - first) / done if done else 8
            guess = int((n - done) * mean)
            self.f.seek(start + len(buf))
            buf = buf[off:] + self.f.read(max(want - have, min(guess, _BLOCK)))
            start, off = start + off, 0
            if len(buf) < want:  # the file shrank while it was read
                raise self.cut_short(what, end)

        for _ in range(n):
            if off + 8 > len(buf):
                more(8)
            (ln,) = _U64.unpack_from(buf, off)
            off += 8
            if ln > MAX_STRING:
                raise self.hostile(f"{what} has a string of {ln:,} bytes, over the limit of {MAX_STRING:,}")
            self.count()
            if off + ln > len(buf):
                more(ln)
            if keep:
                out.append(buf[off:off + ln].decode("utf-8", errors="replace"))
            off += ln
            done += 1
        self.f.seek(start + off)
        return out if keep else _Skipped(n)


class _Skipped(list[Any]):
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


# what a file that is not a GGUF often is, by its first bytes (a download that saved an error page,
# an archive, a program): said in words instead of the bytes
_KNOWN_STARTS = ((b"<!DO", "a web page (HTML), not a model: a download may have saved an error page"),
                 (b"<!do", "a web page (HTML), not a model: a download may have saved an error page"),
                 (b"<htm", "a web page (HTML), not a model: a download may have saved an error page"),
                 (b"<HTM", "a web page (HTML), not a model: a download may have saved an error page"),
                 (b"PK\x03\x04", "a zip archive: unpack it and choose the .gguf inside"),
                 (b"\x1f\x8b", "a gzip archive: unpack it and choose the .gguf inside"),
                 (b"\x7fELF", "a program (ELF), not a model"),
                 (b"version https://git-lfs", "a Git LFS pointer, not the model: download the file itself"))


def what_it_starts_with(head: bytes) -> str:
    """The first bytes of a file that is not a GGUF, in words: what it looks like when known, else
    its first four characters as text (printable ASCII) or as hex bytes; never a Python bytes repr."""
    for start, what in _KNOWN_STARTS:
        if head.startswith(start):
            return f"it looks like {what}"
    first = head[:4]
    if first and all(32 <= b < 127 for b in first):
        return f'it starts with the text "{first.decode("ascii")}" instead of "GGUF"'
    return f'it starts with the bytes {first.hex(" ")} instead of "GGUF" (47 47 55 46)'


def check_model_path(path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` when it names a non-empty file this process can see; else one ModelFileError in
    words ("no such {what}", a folder, an empty file, or the OS error's cause: permission denied,
    a file where a folder should be, ...)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelFileError(f"{p}: no such {what}") from None
    except OSError as e:
        raise ModelFileError(os_problem(e, p)) from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelFileError(f"{p}: is a folder, not a GGUF file")
    if st.st_size == 0:
        raise ModelFileError(f"{p}: the file is empty (0 bytes), not a GGUF model")
    return p


def read_header(path: str | os.PathLike[str], keep_arrays: bool = True, *, name: str | None = None) -> GGUFHeader:
    """Parse one GGUF file's header and tensor table; check that the tensor data lies in the file.
    Every error is one ModelFileError naming the file (``name``, when given, instead of the path:
    a download checked before it is moved into place)."""
    p = check_model_path(path)
    label = name or str(p)
    try:
        f = open(p, "rb")
    except OSError as e:
        raise ModelFileError(os_problem(e, label)) from None
    with f:
        st = os.fstat(f.fileno())
        key = (str(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, keep_arrays)
        with _CACHE_LOCK:
            hit = _CACHE.get(key)
            if hit is not None:
                _CACHE.move_to_end(key)
                return hit
        hdr = _parse(f, p, st.st_size, label, keep_arrays)
    if time.time() - st.st_mtime > SETTLED_S:  # a file written just now may change again within its clock's tick
        with _CACHE_LOCK:
            _CACHE[key] = hdr
            while len(_CACHE) > CACHED_HEADERS:
                _CACHE.popitem(last=False)
    return hdr


def _parse(f: BinaryIO, p: Path, size: int, label: str, keep_arrays: bool) -> GGUFHeader:
    """The header of the open file ``f`` (read_header's)."""
    r = _Reader(f, size, label)
    magic = f.read(4)
    if magic != GGUF_MAGIC:
        f.seek(0)
        raise ModelFileError(f"{label}: not a GGUF file: {what_it_starts_with(f.read(32))}")
    version = r.unpack("<I", "version")
    if version not in (2, 3):
        raise ModelFileError(f"{label}: unsupported GGUF version {version}")
    n_tensors = r.unpack("<Q", "tensor count")
    n_kv = r.unpack("<Q", "key count")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise ModelFileError(f"{label}: corrupt GGUF header (claims {n_tensors} tensors, {n_kv} keys; "
                             f"the limits are {MAX_TENSORS:,} and {MAX_KV:,})")
    meta: dict[str, Any] = {}
    for i in range(n_kv):
        key = r.string(f"key #{i}")
        if len(key) > MAX_KEY:
            raise r.hostile(f"key #{i} is {len(key):,} bytes long, over the GGUF limit of {MAX_KEY:,}")
        shown = _shown(key)
        vtype = r.unpack("<I", f"type of {shown}")
        keep = keep_arrays or key.startswith(("synthetic.", "general."))
        meta[key] = r.value(vtype, shown, keep)
    _check_numbers(meta, r)
    tensors = []
    for i in range(n_tensors):
        tname = r.string(f"tensor name #{i}")
        shown = _shown(tname)
        nd = r.unpack("<I", f"dims of {shown}")
        if nd > 8:
            raise ModelFileError(f"{label}: corrupt GGUF header (tensor {shown!r} has {nd} dimensions)")
        shape = tuple(r.unpack("<Q", f"shape of {shown}") for _ in range(nd))
        ttype = r.unpack("<I", f"type of {shown}")
        off = r.unpack("<Q", f"offset of {shown}")
        n_el = 1
        for s in shape:
            n_el *= s
        tensors.append(TensorInfo(tname, shape, ttype, off, _type_nbytes(ttype, n_el, label, shown)))
    align = meta.get("general.alignment") or DEFAULT_ALIGNMENT
    pos = f.tell()
    data_offset = (pos + align - 1) // align * align
    for t in tensors:
        if data_offset + t.offset + t.nbytes > size:
            raise ModelFileError(
                f"{label}: {CUT_SHORT}: its tensor data is truncated or corrupt (tensor {_shown(t.name)!r} ends "
                f"at byte {data_offset + t.offset + t.nbytes:,}, but the file has {size:,} bytes)")
    return GGUFHeader(str(p), version, meta, tuple(tensors), data_offset, size)


def _check_numbers(meta: dict[str, Any], r: _Reader) -> None:
    """The keys used as counts and sizes are whole numbers in range, so nothing downstream loops
    over a hostile 2**63 layers or divides by an alignment of 0 or a text."""
    arch = meta.get("general.architecture", "")
    if not isinstance(arch, str):
        raise r.hostile(f"general.architecture is {_short(arch)}, not a text")
    limits = {"general.alignment": 2**30, f"{arch}.block_count": MAX_LAYERS,
              f"{arch}.nextn_predict_layers": MAX_LAYERS, f"{arch}.full_attention_interval": MAX_LAYERS}
    for key, top in limits.items():
        v = meta.get(key)
        if v is not None and (type(v) is not int or not 0 <= v <= top):
            raise r.hostile(f"{key} is {_short(v)}, not a whole number from 0 to {top:,}")
    align = meta.get("general.alignment")
    if align and align & (align - 1):
        raise r.hostile(f"general.alignment is {align}, not a power of two")


def _short(v: Any) -> str:
    if isinstance(v, list):
        return f"an array of {len(v):,} items"
    return _shown(repr(v), 40)


def _shown(text: str, width: int = 80) -> str:
    """A name from the file, cut to a length a message can hold."""
    return text if len(text) <= width else text[:width - 3] + "..."


def split_parts(path: str | os.PathLike[str]) -> list[Path]:
    """All parts of a split GGUF (``-00001-of-0000N``), or just the file itself."""
    p = Path(path)
    m = _SPLIT_RE.fullmatch(p.name)
    if not m:
        return [p]
    n = int(m.group("n"))
    return [p.with_name(f"{m.group('stem')}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def check_gguf_file(path: str | os.PathLike[str]) -> GGUFHeader:
    """Check that the file, every split part of it, is a readable GGUF (reads each part's header),
    so that a bad file fails here, clearly, not in llama.cpp; returns the first part's header."""
    parts = split_parts(path)
    hdr = read_header(parts[0])
    for extra in parts[1:]:
        read_header(extra, keep_arrays=False)
    return hdr
