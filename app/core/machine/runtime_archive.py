"""Unpacking a llama.cpp release archive safely (.zip, .tar.gz): every member checked before
anything is written (no absolute or ``..`` paths, no device names, no links pointing outside; links
inside become copies), and finding llama-server in a build folder."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Iterator

from app.core.common.errors import UserError, write_reason
from app.core.machine.hub_names import check_relative_name
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


@contextlib.contextmanager
def _members(archive: Path) -> Iterator[list[tuple[str, str, Any, bool]]]:
    """One view of a .zip or .tar.gz, every member checked before anything is written:
    (name, kind, what, executable) with kind "dir", "file" (what: opens its bytes) or "link"
    (what: the member it names inside the archive)."""
    lower = archive.name.lower()
    out: list[tuple[str, str, Any, bool]] = []
    if lower.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for i in z.infolist():
                n = _member_ok(i.filename, archive)
                mode = i.external_attr >> 16
                if stat.S_ISLNK(mode):
                    out.append((n, "link", _link_target(n, z.read(i).decode("utf-8", "replace"), archive), False))
                else:
                    out.append((n, "dir" if i.is_dir() else "file", functools.partial(z.open, i),
                                bool(mode & 0o111)))
            yield out
    elif lower.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(archive, "r:*") as t:
            for m in t.getmembers():
                n = _member_ok(m.name, archive)
                if m.issym():
                    out.append((n, "link", _link_target(n, m.linkname, archive), False))
                elif m.islnk():
                    out.append((n, "link", _link_target("x", _member_ok(m.linkname, archive), archive), False))
                elif m.isdir() or m.isfile():
                    out.append((n, "dir" if m.isdir() else "file", functools.partial(_tar_member, t, m),
                                bool(m.mode & 0o111)))
                else:
                    raise RuntimeInstallError(f"{archive}: the archive member {m.name[:200]!r} is a device "
                                              "or pipe; refused, nothing installed")
            yield out
    else:
        raise RuntimeInstallError(f"{archive}: not a .zip or .tar.gz archive")


def _tar_member(t: tarfile.TarFile, m: tarfile.TarInfo):
    src = t.extractfile(m)
    assert src is not None  # a regular file always has its bytes
    return src


def safe_extract(archive: Path, dest: Path) -> None:
    """Unpack a .zip or .tar.gz into ``dest`` (an empty folder). Every member is checked before
    anything is written: no absolute or '..' paths, no devices; a symlink (upstream Linux archives
    link ``libllama.so`` to its versioned file) is never created: it becomes a copy of the file it
    names inside the archive, and one that points outside is refused."""
    try:
        with _members(archive) as members:
            links = {n: target for n, kind, target, _ in members if kind == "link"}
            for n, kind, opener, executable in members:
                if not n or kind == "link":
                    continue
                out = _inside(dest, n, archive)
                if kind == "dir":
                    out.mkdir(parents=True, exist_ok=True)
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                with opener() as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                out.chmod(0o755 if executable or out.suffix in (".exe", ".dll") else 0o644)
        for link, target in sorted(links.items()):
            seen = {link}
            while target in links and target not in seen:  # a link to a link
                seen.add(target)
                target = links[target]
            src = _inside(dest, target, archive)
            if not src.is_file() or src.is_symlink():
                raise RuntimeInstallError(f"{archive}: the link {link!r} names {target!r}, which is not a file in "
                                    "the archive; refused, nothing installed")
            out = _inside(dest, link, archive)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        if isinstance(e, OSError) and e.filename and str(dest) in str(e.filename):
            raise RuntimeInstallError(f"{dest}: cannot unpack there ({write_reason(e)})") from None
        raise RuntimeInstallError(f"{archive}: not a readable archive ({type(e).__name__}: {e})") from None


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
