"""Downloads from the Hub that survive a dropped connection *and* an app restart: a ``.part``
file beside the target plus a small JSON of what it is (repo, commit, size, sha256), continued
with HTTP Range requests through the client ``huggingface_hub`` itself uses; the file is hashed
after the last byte and moved into place only when whole and verified. The token travels only
in the Authorization header to the Hub's own origin and is never logged or written anywhere."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.machine.download import (DEFAULT_STALL_S, DownloadProgress, Fetched, StatusError,
                                        fetch_locked, locked, make_folder)
from app.core.machine.gguf_info import read_header
from app.core.machine.hub import HubClient, HubError, _hf, explain
from app.core.machine.hub_names import SHA256_RE, SHA_RE, check_revision, target_path
from app.core.machine.modelinfo import inspect

@dataclasses.dataclass(frozen=True)
class DownloadResult:
    path: Path
    sha256: str
    size: int
    commit: str
    resumed_from: int
    has_mtp: bool | None
    mtp_note: str | None


def download(client: HubClient, repo: str, filename: str, *, revision: str = "main",
             models_dir: str | os.PathLike[str], expected_sha256: str | None = None,
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
    with locked(dest):
        yield from _download_locked(client, repo, filename, dest, commit, expected_sha256,
                                    expected_size, cancel, stall_timeout)


def _make_folder(folder: Path) -> None:
    make_folder(folder, "models folder")


def _download_locked(client: HubClient, repo: str, filename: str, dest: Path, commit: str,
                     expected_sha256: str, expected_size: int, cancel: CancelToken,
                     stall_timeout: float) -> Iterator[DownloadProgress | DownloadResult]:
    hf = _hf()
    meta = {"repo": repo, "file": filename, "commit": commit, "sha256": expected_sha256, "size": expected_size}
    url = hf.hf_hub_url(repo, filename, revision=commit, endpoint=client.endpoint)
    auth_origin = urlparse(client.endpoint).netloc

    def headers_for(u: str) -> dict[str, str]:
        # the token travels only to the Hub's own origin
        if client._token and urlparse(u).netloc == auth_origin:
            return {"Authorization": f"Bearer {client._token}"}
        return {}

    for ev in fetch_locked(url, dest, label=f"{repo}/{filename}", meta=meta,
                           expected_sha256=expected_sha256, expected_size=expected_size,
                           cancel=cancel, stall_timeout=stall_timeout, session=hf.get_session(),
                           headers_for=headers_for, error=HubError,
                           explain=lambda e, what: explain(e, what, client.endpoint),
                           status_error=_status_error, listed_by="the Hub",
                           accept=lambda p: _check_header(p, dest)):
        if isinstance(ev, Fetched):
            yield _finish(ev.path, ev.sha256, ev.size, commit, ev.resumed_from)
        else:
            yield ev


def _check_header(p: Path, dest: Path) -> None:
    """A downloaded file must read as a GGUF (the bounded header reader: no hostile nesting,
    lengths or counts) before it is kept in the models folder; else it is deleted with the reason."""
    read_header(p, keep_arrays=False, name=str(dest))


def _status_error(resp: Any) -> Exception:
    """``resp``: the HTTP session's answer (requests' or httpx's Response)."""
    e = StatusError(resp)
    names = {"GatedRepo": "GatedRepoError", "RepoNotFound": "RepositoryNotFoundError",
             "EntryNotFound": "RemoteEntryNotFoundError", "RevisionNotFound": "RevisionNotFoundError"}
    if e.code in names:
        named: type[StatusError] = type(names[e.code], (StatusError,), {})
        return named(resp)
    return e


def _finish(dest: Path, sha: str, size: int, commit: str, resumed: int) -> DownloadResult:
    has_mtp = note = None
    try:
        info = inspect(dest)
        has_mtp, note = info.has_mtp, info.mtp_note
    except UserError as e:
        note = f"downloaded, but the file does not read as a GGUF: {e}"
    return DownloadResult(dest, sha, size, commit, resumed, has_mtp, note)
