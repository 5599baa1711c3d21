"""Hugging Face Hub: catalog of known MTP GGUF repos, live search, repo files with sizes and
sha256, and downloads that survive a dropped connection *and* an app restart.

``huggingface_hub`` gives metadata, URLs and auth; it resumes only inside one call and checks
sizes, not sha256 (shared/reference/hf_hub_protocol.md). So the transfer is ours: a ``.part``
file beside the target plus a small JSON of what it is (repo, commit, size, sha256), continued
with HTTP Range requests through the client ``huggingface_hub`` itself uses; the file is hashed
after the last byte and moved into place only when whole and verified. The token travels only in
the Authorization header to the Hub's own origin and is never logged or written anywhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
import unicodedata
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from app.core.common import filelock
from app.core.common.atomic import write_text_atomic
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError, write_reason
from app.core.common.resources import resource

CHUNK = 1 << 20
READ_TIMEOUT_S = 1.0  # short reads: cancel lands within about a second
DEFAULT_STALL_S = 30.0
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
QUANT_RE = re.compile(r"(?:^|[-_.])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_[A-Z0-9]+)*))(?=[-_.])",
                      re.IGNORECASE)
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


class HubError(UserError):
    """A Hub request that failed; the message says why in plain words."""


def _prepare_env() -> None:
    """Settings ``huggingface_hub`` reads at import: no telemetry lookup, plain HTTP."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _hf():
    _prepare_env()
    import huggingface_hub

    return huggingface_hub


# ------------------------------------------------------------------------------------------
# catalog


@dataclasses.dataclass(frozen=True)
class CatalogEntry:
    repo: str
    arch: str
    kind: str  # "dense" | "moe"
    notes: str
    drafter: str | None = None  # a separate drafter repo (Gemma 4 assistant)
    source: str = "catalog"


CATALOG_KEYS = {"repo": str, "arch": str, "kind": str, "notes": str}


def load_catalog(path: str | os.PathLike | None = None) -> list[CatalogEntry]:
    p = Path(path) if path else resource("catalog.json")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{p}: cannot read the model catalog ({e})") from None
    entries = data.get("models") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise UserError(f"{p}: the catalog needs a top-level 'models' list")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise UserError(f"{p}: catalog entry {i + 1} is not an object")
        for k, t in CATALOG_KEYS.items():
            if not isinstance(e.get(k), t) or not e.get(k):
                raise UserError(f"{p}: catalog entry {i + 1} needs a non-empty {k!r}")
        if e["kind"] not in ("dense", "moe"):
            raise UserError(f"{p}: catalog entry {e['repo']}: kind must be dense or moe")
        if not re.match(r"^[\w.-]+/[\w.-]+$", e["repo"]):
            raise UserError(f"{p}: catalog entry {i + 1}: {e['repo']!r} is not an owner/name repo id")
        out.append(CatalogEntry(e["repo"], e["arch"], e["kind"], e["notes"], e.get("drafter")))
    return out


# ------------------------------------------------------------------------------------------
# client


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int | None
    sha256: str | None


@dataclasses.dataclass(frozen=True)
class Quant:
    name: str
    files: tuple[RemoteFile, ...]  # split parts in order

    @property
    def size(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def first(self) -> RemoteFile:
        return self.files[0]


@dataclasses.dataclass(frozen=True)
class RepoFiles:
    repo: str
    commit: str
    ggufs: tuple[RemoteFile, ...]
    quants: tuple[Quant, ...]
    refused: tuple[str, ...] = ()  # listed names not safe to save (each with the reason)


def quant_name(filename: str) -> str:
    stem = SPLIT_RE.sub(".gguf", Path(filename).name)
    matches = QUANT_RE.findall(stem)
    return matches[-1].upper() if matches else Path(stem).stem


def group_quants(files: list[RemoteFile]) -> list[Quant]:
    groups: dict[str, list[RemoteFile]] = {}
    for f in files:
        key = SPLIT_RE.sub("", f.path)
        groups.setdefault(key, []).append(f)
    out = []
    for key, fs in groups.items():
        fs.sort(key=lambda f: f.path)
        out.append(Quant(quant_name(fs[0].path), tuple(fs)))
    out.sort(key=lambda q: q.size)
    return out


class HubClient:
    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout: float = 15.0):
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        self._token = token
        self.timeout = timeout

    def __repr__(self) -> str:  # never show the token
        return f"HubClient({self.endpoint!r}, token={'set' if self._token else 'none'})"

    def _api(self):
        return _hf().HfApi(endpoint=self.endpoint, token=self._token if self._token else False)

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # mapped to one plain sentence
            raise HubError(explain(e, what, self.endpoint)) from None

    def search(self, query: str, limit: int = 50) -> list[CatalogEntry]:
        """Hub repos whose id matches ``query`` and says GGUF and MTP. One request: ``list_models``
        retries a failed connection five times with back-off (about 24 s offline), so this
        asks once, with the client's own timeout, and an unreachable Hub is said at once."""
        hf = _hf()

        def call() -> list:
            r = hf.get_session().get(f"{self.endpoint}/api/models", params={"search": query, "limit": limit},
                                     headers=hf.utils.build_hf_headers(token=self._token or False),
                                     timeout=self.timeout)
            hf.utils.hf_raise_for_status(r)
            data = r.json()
            if not isinstance(data, list):
                raise ValueError("the Hub's answer is not a list of models")
            return data

        out = []
        for m in self._call(f"search for {query!r}", call):
            rid = m.get("id") if isinstance(m, dict) else None
            if not isinstance(rid, str):
                continue
            low = rid.lower()
            if "gguf" in low and "mtp" in low:
                out.append(CatalogEntry(rid, "", "dense", "found by search", source="search"))
        return out

    def repo_files(self, repo: str, revision: str = "main") -> RepoFiles:
        check_repo_id(repo)
        check_revision(revision)
        info = self._call(f"listing {repo}", lambda: self._api().model_info(
            repo, revision=revision, files_metadata=True, timeout=self.timeout))
        files, refused = [], []
        for s in info.siblings or []:
            name = getattr(s, "rfilename", None)
            if not isinstance(name, str) or not name.lower().endswith(".gguf"):
                continue
            try:
                check_file_name(name)
            except UserError as e:  # a hostile or broken listing: never offered for download
                refused.append(str(e))
                continue
            lfs = getattr(s, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
            size = getattr(lfs, "size", None) if lfs is not None else None
            size = size if size is not None else s.size
            files.append(RemoteFile(name, size if _is_size(size) else None,
                                    sha if isinstance(sha, str) and SHA256_RE.fullmatch(sha) else None))
        commit = info.sha or revision
        if not isinstance(commit, str) or not (SHA_RE.fullmatch(commit) or commit == revision):
            raise HubError(f"listing {repo}: the Hub answered an invalid commit id {str(commit)[:80]!r}")
        return RepoFiles(repo, commit, tuple(files), tuple(group_quants(files)), tuple(refused))


def _is_size(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def size_fit(size: int, gpu_bytes: int | None, ram_bytes: int | None, moe: bool | None,
             overhead: float = 1.15) -> str:
    """A fit badge before download, from the file size alone (weights) plus ~15 % for KV cache,
    MTP context and buffers at a modest context, and on a GPU the 1 GiB llama.cpp keeps free;
    ``mtp-tuner inspect`` gives the exact figure after."""
    from app.core.machine.modelinfo import DEVICE_MARGIN

    need = size * overhead
    if gpu_bytes:
        if need + DEVICE_MARGIN <= gpu_bytes:
            return "fits on GPU"
        if moe and ram_bytes and need - gpu_bytes < ram_bytes * 0.8:
            return "fits with --n-cpu-moe"
        if ram_bytes and need - gpu_bytes < ram_bytes * 0.8:
            return "partial offload (-ngl), slow"
        return "too large"
    if ram_bytes:
        return "fits in RAM (CPU)" if need <= ram_bytes * 0.8 else "too large"
    return "unknown"


def merged_search(client: HubClient | None, query: str, catalog: list[CatalogEntry]) -> list[CatalogEntry]:
    """Catalog entries matching the query first, then live results not already in the catalog."""
    q = query.lower()
    out = [e for e in catalog if q in e.repo.lower() or q in e.arch.lower()]
    if client is not None:
        known = {e.repo for e in catalog}
        out += [e for e in client.search(query) if e.repo not in known]
    return out


def explain(e: Exception, what: str, endpoint: str) -> str:
    """One sentence for a failed Hub request (never includes headers or the token)."""
    name = type(e).__name__
    status = getattr(getattr(e, "response", None), "status_code", None)
    host = urlparse(endpoint).netloc or endpoint
    if name == "GatedRepoError":
        return (f"{what}: the repo is gated: accept its license on the Hub, then give a token "
                "with read access (--token-file or HF_TOKEN)")
    if name == "RepositoryNotFoundError":
        return f"{what}: no such repo on {host} (or it is private and needs a token)"
    if name == "RevisionNotFoundError":
        return f"{what}: no such revision"
    if name in ("RemoteEntryNotFoundError", "EntryNotFoundError"):
        return f"{what}: no such file in the repo"
    if name == "DisabledRepoError":
        return f"{what}: the repo is disabled on the Hub"
    if name == "OfflineModeIsEnabled":
        return f"{what}: offline mode is on (HF_HUB_OFFLINE)"
    if "ConnectError" in name or isinstance(e, ConnectionRefusedError):
        return f"{what}: cannot connect to {host} (no network, or the server is down)"
    if "Timeout" in name or isinstance(e, TimeoutError):
        return f"{what}: {host} did not answer in time"
    if status in (401, 403):
        return f"{what}: access denied ({status}); the repo may be gated or private: give a token"
    if status == 404:
        return f"{what}: not found (404)"
    if status:
        return f"{what}: the Hub answered {status}"
    return f"{what}: {name}: {str(e).splitlines()[0][:200] if str(e) else 'failed'}"


# ------------------------------------------------------------------------------------------
# download


@dataclasses.dataclass(frozen=True)
class DownloadProgress:
    done: int
    total: int
    speed_bps: float
    eta_s: float | None
    resumed_from: int
    phase: str = "download"  # "download", then "verify" (sha256 of the finished file)


@dataclasses.dataclass(frozen=True)
class DownloadResult:
    path: Path
    sha256: str
    size: int
    commit: str
    resumed_from: int
    has_mtp: bool | None
    mtp_note: str | None


# Names Windows keeps for devices, whatever the extension ("NUL.gguf" is the null device).
_WIN_DEVICES = re.compile(r"^(CON|PRN|AUX|NUL|CONIN\$|CONOUT\$|COM[0-9¹²³]|LPT[0-9¹²³])(\..*)?$", re.IGNORECASE)
_WIN_FORBIDDEN = set('<>:"|?*\\')
REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]{0,254}$")


def check_file_name(name: object) -> str:
    """A Hub-listed file name that is safe to save under a models folder on every OS, or a
    UserError saying why not. Only plain relative ``a/b.gguf`` names pass: no absolute, drive,
    UNC or device paths, no backslashes, no empty, ``.`` or ``..`` parts (nor ones Windows would
    trim into them), no control or invisible format characters."""
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


def download(client: HubClient, repo: str, filename: str, *, revision: str = "main",
             models_dir: str | os.PathLike, expected_sha256: str | None = None,
             expected_size: int | None = None, cancel: CancelToken | None = None,
             stall_timeout: float = DEFAULT_STALL_S) -> Iterator[DownloadProgress | DownloadResult]:
    """Download one file, resuming a ``.part`` left by an earlier run; yields progress, then the
    result. Raises HubError / UserError / Cancelled; never presents an unverified file.

    One download per target at a time, across processes (the window and the CLI alike): a
    second one is refused with the holder's pid. The sha256 is computed over the finished
    ``.part`` as it lies on disk, so the bytes checked are the bytes moved into place."""
    cancel = cancel or CancelToken()
    check_revision(revision)
    dest = target_path(Path(models_dir), repo, filename)  # refuses unsafe names before anything
    commit = revision
    if not SHA_RE.fullmatch(revision) or expected_sha256 is None or expected_size is None:
        rf = client.repo_files(repo, revision)
        commit = rf.commit
        match = [f for f in rf.ggufs if f.path == filename]
        if not match:
            raise HubError(f"{repo}: no file {filename!r} at {revision}")
        expected_sha256 = expected_sha256 or match[0].sha256
        expected_size = expected_size if expected_size is not None else match[0].size
    if not expected_sha256:
        raise HubError(f"{repo}/{filename}: the Hub gives no sha256 for it, so it cannot be verified")
    if not SHA256_RE.fullmatch(expected_sha256):
        raise HubError(f"{repo}/{filename}: the Hub's sha256 {expected_sha256[:80]!r} is not a sha256")
    if not isinstance(expected_size, int) or isinstance(expected_size, bool) or expected_size < 0:
        raise HubError(f"{repo}/{filename}: the Hub gives no usable size for it ({expected_size!r})")
    _make_folder(dest.parent)
    with filelock.exclusive(dest.with_name(dest.name + ".lock"),
                            f"{dest}: already downloading (pid {{pid}}); wait for that download "
                            "to finish, then run this again"):
        yield from _download_locked(client, repo, filename, dest, commit, expected_sha256,
                                    expected_size, cancel, stall_timeout)


def _make_folder(folder: Path) -> None:
    above = folder
    while not above.exists() and above != above.parent:
        above = above.parent
    if above.exists() and not above.is_dir():
        raise UserError(f"{above}: is a file, not a folder; choose another models folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{folder}: cannot create the models folder ({e.strerror or e})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{folder}: cannot write there (permission denied); choose another models folder")


def _write_failed(path: Path, e: OSError, done: int) -> UserError:
    kept = (f"; the {done:,} bytes downloaded so far are kept, run the download again to continue"
            if done else "")
    return UserError(f"{path}: cannot write ({write_reason(e)}){kept}")


def _download_locked(client: HubClient, repo: str, filename: str, dest: Path, commit: str,
                     expected_sha256: str, expected_size: int, cancel: CancelToken,
                     stall_timeout: float) -> Iterator[DownloadProgress | DownloadResult]:
    hf = _hf()
    part = dest.with_name(dest.name + ".part")
    meta_path = dest.with_name(dest.name + ".part.json")
    meta = {"repo": repo, "file": filename, "commit": commit, "sha256": expected_sha256, "size": expected_size}
    if dest.is_dir():
        raise UserError(f"{dest}: a folder is in the way of the download; move it")
    if dest.exists() and dest.stat().st_size == expected_size and _sha256_file(dest) == expected_sha256:
        yield _finish(dest, expected_sha256, expected_size, commit, 0)
        return
    start = 0
    if part.exists():
        try:
            old = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            old = None
        if old == meta and part.stat().st_size <= expected_size:
            start = part.stat().st_size
        else:
            part.unlink()
    need = expected_size - start
    free = shutil.disk_usage(dest.parent).free
    if need > free:
        raise UserError(f"{dest.parent}: not enough disk space for {filename}: needs "
                        f"{need / 2**30:.2f} GiB more, {free / 2**30:.2f} GiB free")
    try:
        write_text_atomic(meta_path, json.dumps(meta))
    except OSError as e:
        raise _write_failed(meta_path, e, 0) from None
    url = hf.hf_hub_url(repo, filename, revision=commit, endpoint=client.endpoint)
    done = start
    t0 = time.monotonic()
    last_emit = 0.0
    last_data = time.monotonic()
    session = hf.get_session()
    import httpx2

    auth_origin = urlparse(client.endpoint).netloc
    restarted = False
    while done < expected_size or expected_size == 0:
        cancel.check()
        headers = {"Accept-Encoding": "identity"}
        if done:
            headers["Range"] = f"bytes={done}-"
        if client._token and urlparse(url).netloc == auth_origin:
            headers["Authorization"] = f"Bearer {client._token}"
        try:
            with session.stream("GET", url, headers=headers, follow_redirects=True,
                                timeout=httpx2.Timeout(15.0, read=READ_TIMEOUT_S)) as resp:
                if resp.status_code == 416:
                    # "range not satisfiable": the server has fewer bytes than the part on disk,
                    # so the part is not of this file; start over once, and if the server still
                    # disagrees with the listing, drop the part so a retry does not ask again
                    part.unlink(missing_ok=True)
                    if done and not restarted:
                        restarted, done, start = True, 0, 0
                        continue
                    meta_path.unlink(missing_ok=True)
                    raise HubError(f"downloading {repo}/{filename}: the server has fewer bytes than "
                                   f"the {expected_size:,} the Hub listed (416 at byte {done:,}); the "
                                   "partial download was removed")
                if resp.status_code >= 400:
                    err = _status_error(resp)
                    raise HubError(explain(err, f"downloading {repo}/{filename}", client.endpoint))
                if done and resp.status_code == 200:  # the server ignored Range: start over
                    done = 0
                mode = "ab" if done else "wb"
                try:
                    with open(part, mode) as f:
                        for chunk in resp.iter_bytes():
                            if cancel.cancelled:
                                raise Cancelled()
                            f.write(chunk)
                            done += len(chunk)
                            last_data = time.monotonic()
                            if done > expected_size:
                                raise HubError(f"{repo}/{filename}: the server sent more than the "
                                               f"{expected_size} bytes the Hub listed")
                            now = time.monotonic()
                            if now - last_emit > 0.2:
                                last_emit = now
                                speed = (done - start) / max(now - t0, 1e-6)
                                eta = (expected_size - done) / speed if speed > 0 else None
                                yield DownloadProgress(done, expected_size, speed, eta, start)
                except OSError as e:  # the disk (httpx's own errors are not OSErrors)
                    raise _write_failed(part, e, _size_or_zero(part)) from None
            if expected_size == 0:
                break
        except (httpx2.TimeoutException, httpx2.RemoteProtocolError, httpx2.ReadError,
                httpx2.ConnectError) as e:
            if cancel.cancelled:
                raise Cancelled() from None
            if isinstance(e, httpx2.ConnectError) and done == start and time.monotonic() - t0 > stall_timeout:
                raise HubError(explain(e, f"downloading {repo}/{filename}", client.endpoint)) from None
            if time.monotonic() - last_data > stall_timeout:
                raise HubError(f"downloading {repo}/{filename}: the server stopped sending for "
                               f"{stall_timeout:.0f} s ({done:,} of {expected_size:,} bytes kept; run "
                               "the download again to continue)") from None
            if isinstance(e, httpx2.ConnectError):
                cancel.wait(0.5)
            continue  # reconnect and continue from `done`
    if not part.exists():
        open(part, "wb").close()  # an empty file: nothing was sent
    got = None
    for ev in _hash_with_progress(part, cancel):
        if isinstance(ev, str):
            got = ev
        else:
            yield ev
    size = part.stat().st_size
    if got != expected_sha256 or size != expected_size:
        part.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
        raise HubError(f"{repo}/{filename}: checksum mismatch after download (sha256 {got[:12]}..., "
                       f"{size:,} bytes; expected {expected_sha256[:12]}..., {expected_size:,} bytes); "
                       "the partial download was deleted, try again")
    try:
        os.replace(part, dest)
    except OSError as e:
        raise _write_failed(dest, e, 0) from None
    meta_path.unlink(missing_ok=True)
    yield _finish(dest, got, size, commit, start)


def _size_or_zero(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _hash_with_progress(p: Path, cancel: CancelToken) -> Iterator[DownloadProgress | str]:
    """sha256 of a file as it lies on disk, with progress ("verifying") and cancel; the hex
    digest comes last, as a str."""
    h = hashlib.sha256()
    total = p.stat().st_size
    done = 0
    t0 = last = time.monotonic()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            cancel.check()
            h.update(block)
            done += len(block)
            now = time.monotonic()
            if now - last > 0.2 or done == total:
                last = now
                speed = done / max(now - t0, 1e-6)
                yield DownloadProgress(done, total, speed, (total - done) / speed if speed else None, 0,
                                       phase="verify")
    yield h.hexdigest()


class _StatusError(Exception):
    def __init__(self, resp):
        super().__init__(resp.headers.get("X-Error-Message") or f"HTTP {resp.status_code}")
        self.response = resp
        self.code = resp.headers.get("X-Error-Code")


def _status_error(resp) -> Exception:
    e = _StatusError(resp)
    names = {"GatedRepo": "GatedRepoError", "RepoNotFound": "RepositoryNotFoundError",
             "EntryNotFound": "RemoteEntryNotFoundError", "RevisionNotFound": "RevisionNotFoundError"}
    if e.code in names:
        return type(names[e.code], (_StatusError,), {})(resp)
    return e


def _finish(dest: Path, sha: str, size: int, commit: str, resumed: int) -> DownloadResult:
    has_mtp = note = None
    try:
        from app.core.machine.modelinfo import inspect

        info = inspect(dest)
        has_mtp, note = info.has_mtp, info.mtp_note
    except UserError as e:
        note = f"downloaded, but the file does not read as a GGUF: {e}"
    return DownloadResult(dest, sha, size, commit, resumed, has_mtp, note)


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------
# local library


@dataclasses.dataclass(frozen=True)
class LocalModel:
    path: str
    size: int
    where: str  # "models folder", "Hugging Face cache", or a user folder
    has_mtp: bool | None
    arch: str | None
    problem: str | None


def local_library(models_dir: Path, extra_dirs: list[Path] = (), include_hf_cache: bool = True) -> list[LocalModel]:
    seen: set[str] = set()
    out: list[LocalModel] = []
    roots = [(Path(models_dir), "models folder")] + [(Path(d), str(d)) for d in extra_dirs]
    if include_hf_cache:
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" /
                                                                        "huggingface")) / "hub")
        roots.append((hub, "Hugging Face cache"))
    for root, where in roots:
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("*.gguf")):
            if SPLIT_RE.search(p.name) and not p.name.endswith("-00001-of-" + p.name[-10:-5] + ".gguf"):
                continue  # later parts of a split model belong to its first part
            key = str(p.resolve())
            if key in seen:
                continue
            seen.add(key)
            try:
                from app.core.machine.modelinfo import inspect

                info = inspect(p)
                out.append(LocalModel(str(p), info.file_size, where, info.has_mtp, info.arch, None))
            except UserError as e:
                out.append(LocalModel(str(p), p.stat().st_size if p.exists() else 0, where, None, None, str(e)))
    return out
