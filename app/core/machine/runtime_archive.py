"""Unpacking a llama.cpp release archive safely (.zip, .tar.gz): every member checked before
anything is written (no absolute or ``..`` paths, no device names, no links pointing outside; links
inside become copies), the unpacked size bounded (from the listed sizes and the free disk space
before anything is written, and counted again while writing), and finding llama-server in a build
folder."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import IO, Any, Callable, Iterator, NamedTuple

from app.core.common.errors import UserError, os_reason
from app.core.machine.hub_names import check_relative_name
from app.core.machine.modelinfo import size_text
from app.core.machine.runtimes import SERVER_NAMES, RuntimeInstallError


# ------------------------------------------------------------------------------------------
# unpacking


def _member_ok(name: str, archive: Path) -> str:
    """A member name that stays inside the folder it is unpacked into and can be written there on
    every OS (:func:`check_relative_name`), as ``a/b/c`` (``./`` parts and a folder's trailing
    ``/`` dropped; "" for the archive's top folder), else RuntimeInstallError."""
    n = name.replace("\\", "/")
    for flavour in (PurePosixPath, PureWindowsPath):
        p = flavour(name)
        if p.anchor or ".." in p.parts:
            raise RuntimeInstallError(f"{archive}: the archive member {name[:200]!r} would be written outside "
                                "the runtime folder (absolute or '..' path); refused, nothing installed")
    n = "/".join(part for part in n.split("/") if part not in ("", "."))
    if n:
        try:
            check_relative_name(n)
        except UserError as e:
            raise RuntimeInstallError(f"{archive}: archive member {e}, nothing installed") from None
    return n


def _link_target(link_name: str, target: str, archive: Path) -> str:
    """Where a symlink member points, as a name inside the archive; refused when it leaves it
    (a backslash separates parts, as Windows would read it)."""
    target = target.replace("\\", "/")
    if target.startswith("/") or PureWindowsPath(target).anchor:
        raise RuntimeInstallError(f"{archive}: the archive member {link_name!r} is a link to an absolute path "
                            f"({target[:200]!r}); refused, nothing installed")
    parts: list[str] = list(PurePosixPath(link_name).parent.parts)
    for part in PurePosixPath(target).parts:
        if part == "..":
            if not parts:
                raise RuntimeInstallError(f"{archive}: the archive member {link_name!r} links outside the "
                                    f"archive ({target[:200]!r}); refused, nothing installed")
            parts.pop()
        elif part != ".":
            parts.append(part)
    name = "/".join(parts)
    if name:
        try:
            check_relative_name(name)
        except UserError as e:
            raise RuntimeInstallError(f"{archive}: the archive member {link_name!r} links to {target[:200]!r}: "
                                      f"{e}, nothing installed") from None
    return name


def _inside(dest: Path, rel: str, archive: Path) -> Path:
    """``dest/rel``, refused unless it stays under ``dest``."""
    out = dest.joinpath(*rel.split("/")) if rel else dest
    root = os.path.abspath(dest)
    try:
        inside = os.path.commonpath([root, os.path.abspath(out)]) == root
    except ValueError:  # another drive (Windows)
        inside = False
    if not inside:
        raise RuntimeInstallError(f"{archive}: the archive member {rel[:200]!r} would be written outside "
                                  "the runtime folder; refused, nothing installed")
    return out


# ------------------------------------------------------------------------------------------
# bounds

MAX_BYTES_ENV = "MTP_TUNER_RUNTIME_MAX_BYTES"
# what a runtime's archives together may unpack to: room for the largest upstream builds (a
# Windows CUDA build with its CUDA runtime) that stops an archive that unpacks to far more
DEFAULT_MAX_BYTES = 4 << 30
MAX_MEMBERS = 20_000  # upstream archives hold under 200
_CHUNK = 1 << 20


def unpack_limit() -> int:
    """The most bytes one runtime's archives may unpack to: $MTP_TUNER_RUNTIME_MAX_BYTES, else
    :data:`DEFAULT_MAX_BYTES`."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20 or int(raw) <= 0:
        raise RuntimeInstallError(f"{MAX_BYTES_ENV}={raw[:40]!r}: not a positive whole number of bytes")
    return int(raw)


class Budget:
    """What the archives of one runtime may unpack to, all together (``limit`` bytes): checked
    from the sizes the archives list before anything is written, and counted again while writing,
    so a member that holds more than it lists stops at the limit."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = unpack_limit() if limit is None else limit
        self.used = 0

    def refuse(self, archive: Path, what: str) -> RuntimeInstallError:
        return RuntimeInstallError(
            f"{archive}: {what} more than {size_text(self.limit)} ({self.limit:,} bytes), the limit on what a "
            f"runtime may unpack to (set {MAX_BYTES_ENV} to change it); refused, nothing installed")

    def check(self, archive: Path, listed: int) -> None:
        if self.used + listed > self.limit:
            raise self.refuse(archive, "lists" if not self.used else "with the archives before it lists")

    def take(self, archive: Path, n: int) -> None:
        self.used += n
        if self.used > self.limit:
            raise self.refuse(archive, "unpacks to")


class _Member(NamedTuple):
    name: str
    kind: str  # "dir", "file", "link"
    what: Any  # a file: opens its bytes; a link: the member it names inside the archive
    executable: bool
    size: int  # as listed (a link: its file's, as it becomes a copy)


def _unreadable(archive: Path, e: BaseException) -> RuntimeInstallError:
    return RuntimeInstallError(f"{archive}: not a readable archive ({type(e).__name__}: "
                               f"{str(e).splitlines()[0][:200] if str(e) else 'no detail'})")


# reading an archive that is cut, corrupt or in a format it does not support (an encrypted or
# unusually compressed zip: RuntimeError, NotImplementedError)
_READ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, tarfile.TarError, EOFError, zlib.error, OSError,
                RuntimeError, NotImplementedError, ValueError)


@contextlib.contextmanager
def _reading(archive: Path) -> Iterator[None]:
    try:
        yield
    except UserError:
        raise
    except _READ_ERRORS as e:
        raise _unreadable(archive, e) from None


@contextlib.contextmanager
def _writing(dest: Path) -> Iterator[None]:
    """A failed write in the folder being unpacked into: the disk, not the archive (a full disk and
    a file-size limit named as such)."""
    try:
        yield
    except OSError as e:
        raise RuntimeInstallError(f"{e.filename or dest}: cannot unpack there ({os_reason(e)}); "
                                  "nothing installed") from None


def _add(out: list[_Member], m: _Member, archive: Path, budget: Budget, listed: int) -> int:
    """Append a member, refusing the archive as soon as it lists too many members or bytes."""
    out.append(m)
    if len(out) > MAX_MEMBERS:
        raise RuntimeInstallError(f"{archive}: lists more than {MAX_MEMBERS:,} members; not a llama.cpp build, "
                                  "refused, nothing installed")
    listed += m.size
    budget.check(archive, listed)
    return listed


@contextlib.contextmanager
def _members(archive: Path, budget: Budget) -> Iterator[list[_Member]]:
    """One view of a .zip or .tar.gz, every member checked before anything is written, and the
    sizes it lists (a link counted as the copy it becomes) within ``budget``."""
    lower = archive.name.lower()
    out: list[_Member] = []
    listed = 0
    if lower.endswith(".zip"):
        with _reading(archive):
            z = zipfile.ZipFile(archive)
        with z:
            for i in z.infolist():
                n = _member_ok(i.filename, archive)
                mode = i.external_attr >> 16
                if stat.S_ISLNK(mode):
                    with _reading(archive), z.open(i) as f:
                        target = f.read(4097)
                    if len(target) > 4096:
                        raise RuntimeInstallError(f"{archive}: the archive member {n[:200]!r} is a link whose "
                                                  "target is over 4 KiB long; refused, nothing installed")
                    m = _Member(n, "link", _link_target(n, target.decode("utf-8", "replace"), archive), False, 0)
                elif i.is_dir():
                    m = _Member(n, "dir", None, False, 0)
                else:
                    m = _Member(n, "file", functools.partial(z.open, i), bool(mode & 0o111), i.file_size)
                listed = _add(out, m, archive, budget, listed)
            yield _with_link_sizes(out, archive, budget)
    elif lower.endswith((".tar.gz", ".tgz", ".tar")):
        with _reading(archive):
            t = tarfile.open(archive, "r:*")
        with t:
            with _reading(archive):  # read member by member: a long listing stops at the limit
                for ti in t:
                    n = _member_ok(ti.name, archive)
                    if ti.issym():
                        m = _Member(n, "link", _link_target(n, ti.linkname, archive), False, 0)
                    elif ti.islnk():
                        m = _Member(n, "link", _link_target("x", _member_ok(ti.linkname, archive), archive), False, 0)
                    elif ti.isdir() or ti.isfile():
                        m = _Member(n, "dir" if ti.isdir() else "file", functools.partial(_tar_member, t, ti),
                                    bool(ti.mode & 0o111), ti.size if ti.isfile() else 0)
                    else:
                        raise RuntimeInstallError(f"{archive}: the archive member {ti.name[:200]!r} is a device "
                                                  "or pipe; refused, nothing installed")
                    listed = _add(out, m, archive, budget, listed)
            yield _with_link_sizes(out, archive, budget)
    else:
        raise RuntimeInstallError(f"{archive}: not a .zip or .tar.gz archive")


def _resolve(links: dict[str, str], link: str) -> str:
    """What a link names in the end (a link to a link followed; a loop stops where it closes)."""
    target, seen = links[link], {link}
    while target in links and target not in seen:
        seen.add(target)
        target = links[target]
    return target


def _with_link_sizes(members: list[_Member], archive: Path, budget: Budget) -> list[_Member]:
    """The members, each link with the size of the file it becomes a copy of, all within ``budget``."""
    links = {m.name: m.what for m in members if m.kind == "link"}
    if not links:
        return members
    sizes = {m.name: m.size for m in members if m.kind == "file"}
    members = [m._replace(size=sizes.get(_resolve(links, m.name), 0)) if m.kind == "link" else m for m in members]
    budget.check(archive, sum(m.size for m in members))
    return members


def _tar_member(t: tarfile.TarFile, m: tarfile.TarInfo) -> IO[bytes]:
    src = t.extractfile(m)
    assert src is not None  # a regular file always has its bytes
    return src


def _check_disk(archive: Path, dest: Path, need: int) -> None:
    try:
        free = shutil.disk_usage(dest).free
    except OSError:
        return  # not knowable here: the writes will say
    if need > free:
        raise RuntimeInstallError(f"{dest}: not enough disk space to unpack {archive.name}: it unpacks to "
                                  f"{size_text(need)} ({need:,} bytes), {size_text(free)} free; nothing installed")


def _copy(opener: Callable[[], Any], out: Path, archive: Path, budget: Budget) -> None:
    """One member's bytes into ``out``, counted against ``budget`` as they are written."""
    with _reading(archive):
        src = opener()
    with src, _writing(out), open(out, "wb") as dst:
        while True:
            with _reading(archive):
                chunk = src.read(_CHUNK)
            if not chunk:
                break
            budget.take(archive, len(chunk))
            dst.write(chunk)


def safe_extract(archive: Path, dest: Path, budget: Budget | None = None) -> None:
    """Unpack a .zip or .tar.gz into ``dest`` (an empty folder). Every member is checked before
    anything is written: no absolute or '..' paths, no devices; a symlink (upstream Linux archives
    link ``libllama.so`` to its versioned file) is never created: it becomes a copy of the file it
    names inside the archive, and one that points outside is refused. What it unpacks to stays
    within ``budget`` (default: :func:`unpack_limit`; one budget for all the archives of one
    runtime) and the free disk space, checked from the listed sizes first, then counted."""
    budget = budget or Budget()
    with _members(archive, budget) as members:
        _check_disk(archive, dest, sum(m.size for m in members))
        links = {m.name: m.what for m in members if m.kind == "link"}
        for m in members:
            if not m.name or m.kind == "link":
                continue
            out = _inside(dest, m.name, archive)
            with _writing(out):
                (out if m.kind == "dir" else out.parent).mkdir(parents=True, exist_ok=True)
            if m.kind == "file":
                _copy(m.what, out, archive, budget)
                with _writing(out):
                    out.chmod(0o755 if m.executable or out.suffix in (".exe", ".dll") else 0o644)
    for link in sorted(links):
        target = _resolve(links, link)
        src = _inside(dest, target, archive)
        if not src.is_file() or src.is_symlink():
            raise RuntimeInstallError(f"{archive}: the link {link!r} names {target!r}, which is not a file in "
                                      "the archive; refused, nothing installed")
        out = _inside(dest, link, archive)
        with _writing(out):
            budget.take(archive, src.stat().st_size)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)


def find_server(folder: Path) -> Path | None:
    """llama-server in a build folder: at its top, under ``build/bin/``, or the same one folder down
    (upstream archives unpack to ``llama-bNNNN/``). Never a deep search: a folder picked by hand
    may be a home directory."""
    places = [folder, folder / "build" / "bin"]
    try:
        subs = sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        subs = []
    for sub in subs:
        places += [sub, sub / "build" / "bin"]
    for place in places:
        for name in SERVER_NAMES:
            if (place / name).is_file():
                return place / name
    return None
