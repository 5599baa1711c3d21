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
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from .atomic import write_text_atomic
from .cancel import CancelToken
from .errors import Cancelled, UserError
from .resources import resource

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
        models = self._call(f"search for {query!r}",
                            lambda: list(self._api().list_models(search=query, limit=limit)))
        out = []
        for m in models:
            rid = getattr(m, "id", None) or ""
            low = rid.lower()
            if "gguf" in low and "mtp" in low:
                out.append(CatalogEntry(rid, "", "dense", "found by search", source="search"))
        return out

    def repo_files(self, repo: str, revision: str = "main") -> RepoFiles:
        info = self._call(f"listing {repo}", lambda: self._api().model_info(
            repo, revision=revision, files_metadata=True, timeout=self.timeout))
        files = []
        for s in info.siblings or []:
            if not s.rfilename.lower().endswith(".gguf"):
                continue
            lfs = getattr(s, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
            size = getattr(lfs, "size", None) if lfs is not None else None
            files.append(RemoteFile(s.rfilename, size if size is not None else s.size, sha))
        commit = info.sha or revision
        return RepoFiles(repo, commit, tuple(files), tuple(group_quants(files)))


def size_fit(size: int, gpu_bytes: int | None, ram_bytes: int | None, moe: bool | None,
             overhead: float = 1.15) -> str:
    """A fit badge before download, from the file size alone (weights) plus ~15 % for KV cache,
    MTP context and buffers at a modest context, and on a GPU the 1 GiB llama.cpp keeps free;
    ``mtp-tuner inspect`` gives the exact figure after."""
    from .modelinfo import DEVICE_MARGIN

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


@dataclasses.dataclass(frozen=True)
class DownloadResult:
    path: Path
    sha256: str
    size: int
    commit: str
    resumed_from: int
    has_mtp: bool | None
    mtp_note: str | None


def target_path(models_dir: Path, repo: str, filename: str) -> Path:
    safe_repo = repo.replace("/", "__")
    parts = [p for p in Path(filename).parts if p not in ("..", ".", "/")]
    return Path(models_dir) / safe_repo / Path(*parts)


def download(client: HubClient, repo: str, filename: str, *, revision: str = "main",
             models_dir: str | os.PathLike, expected_sha256: str | None = None,
             expected_size: int | None = None, cancel: CancelToken | None = None,
             stall_timeout: float = DEFAULT_STALL_S) -> Iterator[DownloadProgress | DownloadResult]:
    """Download one file, resuming a ``.part`` left by an earlier run; yields progress, then the
    result. Raises HubError / UserError / Cancelled; never presents an unverified file."""
    hf = _hf()
    cancel = cancel or CancelToken()
    commit = revision
    if not SHA_RE.match(revision) or expected_sha256 is None or expected_size is None:
        rf = client.repo_files(repo, revision)
        commit = rf.commit
        match = [f for f in rf.ggufs if f.path == filename]
        if not match:
            raise HubError(f"{repo}: no file {filename!r} at {revision}")
        expected_sha256 = expected_sha256 or match[0].sha256
        expected_size = expected_size if expected_size is not None else match[0].size
    if not expected_sha256:
        raise HubError(f"{repo}/{filename}: the Hub gives no sha256 for it, so it cannot be verified")
    dest = target_path(Path(models_dir), repo, filename)
    part = dest.with_name(dest.name + ".part")
    meta_path = dest.with_name(dest.name + ".part.json")
    meta = {"repo": repo, "file": filename, "commit": commit, "sha256": expected_sha256, "size": expected_size}
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and dest.stat().st_size == expected_size and _sha256_file(dest) == expected_sha256:
        yield _finish(dest, expected_sha256, expected_size or 0, commit, 0)
        return
    start = 0
    if part.exists():
        try:
            old = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            old = None
        if old == meta and part.stat().st_size <= (expected_size or 0):
            start = part.stat().st_size
        else:
            part.unlink()
    need = (expected_size or 0) - start
    free = shutil.disk_usage(dest.parent).free
    if need > free:
        raise UserError(f"{dest.parent}: not enough disk space for {filename}: needs "
                        f"{need / 2**30:.2f} GiB more, {free / 2**30:.2f} GiB free")
    write_text_atomic(meta_path, json.dumps(meta))
    url = hf.hf_hub_url(repo, filename, revision=commit, endpoint=client.endpoint)
    hasher = hashlib.sha256()
    if start:
        with open(part, "rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                hasher.update(block)
    done = start
    t0 = time.monotonic()
    last_emit = 0.0
    last_data = time.monotonic()
    session = hf.get_session()
    import httpx2

    auth_origin = urlparse(client.endpoint).netloc
    while done < (expected_size or 0) or expected_size == 0:
        cancel.check()
        headers = {"Accept-Encoding": "identity"}
        if done:
            headers["Range"] = f"bytes={done}-"
        if client._token and urlparse(url).netloc == auth_origin:
            headers["Authorization"] = f"Bearer {client._token}"
        try:
            with session.stream("GET", url, headers=headers, follow_redirects=True,
                                timeout=httpx2.Timeout(15.0, read=READ_TIMEOUT_S)) as resp:
                if resp.status_code == 416 and done == expected_size:
                    break
                if resp.status_code >= 400:
                    err = _status_error(resp)
                    raise HubError(explain(err, f"downloading {repo}/{filename}", client.endpoint))
                if done and resp.status_code == 200:  # the server ignored Range: start over
                    done = 0
                    hasher = hashlib.sha256()
                    open(part, "wb").close()
                mode = "ab" if done else "wb"
                with open(part, mode) as f:
                    for chunk in resp.iter_bytes():
                        if cancel.cancelled:
                            raise Cancelled()
                        f.write(chunk)
                        hasher.update(chunk)
                        done += len(chunk)
                        last_data = time.monotonic()
                        if done > (expected_size or 0):
                            raise HubError(f"{repo}/{filename}: the server sent more than the "
                                           f"{expected_size} bytes the Hub listed")
                        now = time.monotonic()
                        if now - last_emit > 0.2:
                            last_emit = now
                            speed = (done - start) / max(now - t0, 1e-6)
                            eta = ((expected_size or 0) - done) / speed if speed > 0 else None
                            yield DownloadProgress(done, expected_size or 0, speed, eta, start)
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
    got = hasher.hexdigest()
    if got != expected_sha256:
        part.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
        raise HubError(f"{repo}/{filename}: checksum mismatch after download (sha256 {got[:12]}..., "
                       f"expected {expected_sha256[:12]}...); the file was deleted, try again")
    os.replace(part, dest)
    meta_path.unlink(missing_ok=True)
    yield DownloadProgress(done, expected_size or 0, 0.0, 0.0, start)
    yield _finish(dest, got, done, commit, start)


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
        from .modelinfo import inspect

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
                from .modelinfo import inspect

                info = inspect(p)
                out.append(LocalModel(str(p), info.file_size, where, info.has_mtp, info.arch, None))
            except UserError as e:
                out.append(LocalModel(str(p), p.stat().st_size if p.exists() else 0, where, None, None, str(e)))
    return out
