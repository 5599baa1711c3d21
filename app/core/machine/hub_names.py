"""Hub names that are safe to use: repo ids, revisions, and file names a Hub listing offers,
checked before anything is saved, and the one place a download's target path is made (inside
the models folder under both POSIX and Windows rules)."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath

from app.core.common.errors import UserError

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
# Names Windows keeps for devices, whatever the extension ("NUL.gguf" is the null device).
_WIN_DEVICES = re.compile(r"^(CON|PRN|AUX|NUL|CONIN\$|CONOUT\$|COM[0-9¹²³]|LPT[0-9¹²³])(\..*)?$", re.IGNORECASE)
_WIN_FORBIDDEN = set('<>:"|?*\\')
REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]{0,254}$")


def check_relative_name(name: object) -> str:
    """A relative ``a/b/c`` name that is safe to write below a folder on every OS, or a UserError
    saying why not: no absolute, drive, UNC or device paths, no backslashes or other characters
    Windows refuses, no empty, ``.`` or ``..`` parts (nor ones Windows would trim into them), no
    control or invisible format characters. Used for Hub file names and llama.cpp archive members
    and runtime names alike."""
    if not isinstance(name, str) or not name:
        raise UserError(f"{name!r}: not a file name")
    shown = repr(name)[:200]
    if len(name) > 1024:
        raise UserError(f"{shown}: the file name is too long")
    for ch in name:
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            raise UserError(f"{shown}: the file name has a control or invisible character "
                            f"(U+{ord(ch):04X}); refused")
        if ch in _WIN_FORBIDDEN:
            raise UserError(f"{shown}: the file name has {ch!r}, which is not allowed in a file name "
                            "on Windows (drive, device or backslash path); refused")
    if name.startswith("/"):
        raise UserError(f"{shown}: an absolute path, not a file inside the repo; refused")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise UserError(f"{shown}: the file name has an empty, '.' or '..' part; refused")
        if part != part.rstrip(". "):
            raise UserError(f"{shown}: a part of the file name ends in a dot or a space (Windows "
                            "would change it); refused")
        if _WIN_DEVICES.match(part.rstrip()):
            raise UserError(f"{shown}: {part!r} names a device on Windows; refused")
    return name


def check_file_name(name: object) -> str:
    """A Hub-listed file name that is safe to save under a models folder on every OS
    (:func:`check_relative_name`) and names a ``.gguf``, or a UserError saying why not."""
    check_relative_name(name)
    assert isinstance(name, str)
    shown = repr(name)[:200]
    if not name.lower().endswith(".gguf"):
        raise UserError(f"{shown}: not a .gguf file")
    return name


def check_repo_id(repo: object) -> str:
    if not isinstance(repo, str) or not REPO_RE.fullmatch(repo) or ".." in repo:
        raise UserError(f"{repo!r}: not a Hub repo id (owner/name)")
    return repo


def check_revision(rev: object) -> str:
    """A branch, tag or commit id: letters, digits and ``._/+-``, no ``..`` or ``//``."""
    if not isinstance(rev, str) or not REVISION_RE.fullmatch(rev) or ".." in rev or "//" in rev \
            or rev.endswith("/"):
        raise UserError(f"{str(rev)[:80]!r}: not a usable revision (branch, tag or commit id)")
    return rev


def _stays_inside(rel: str, flavour: type[PurePath]) -> bool:
    """Does the relative path ``rel`` stay below the folder it is joined to, under these rules?"""
    r = flavour(rel)
    return not r.anchor and ".." not in r.parts


def target_path(models_dir: Path, repo: str, filename: str) -> Path:
    """Where a repo's file is saved: ``models_dir/owner__name/filename``. The one place every
    download path is made: the name must pass :func:`check_file_name` and the result must stay
    inside the repo's folder under both POSIX and Windows rules."""
    check_repo_id(repo)
    check_file_name(filename)
    safe_repo = repo.replace("/", "__")
    rel = f"{safe_repo}/{filename}"
    for flavour in (PurePosixPath, PureWindowsPath):
        if not _stays_inside(rel, flavour):
            raise UserError(f"{filename!r}: would be saved outside the models folder; refused")
    root = Path(models_dir)
    dest = root.joinpath(safe_repo, *filename.split("/"))
    if os.path.commonpath([os.path.abspath(root), os.path.abspath(dest)]) != os.path.abspath(root):
        raise UserError(f"{filename!r}: would be saved outside {root}; refused")
    return dest
