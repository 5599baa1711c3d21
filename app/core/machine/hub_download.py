"""Downloads from the Hub that survive a dropped connection *and* an app restart: a ``.part``
file beside the target plus a small JSON of what it is (repo, commit, size, sha256), continued
with HTTP Range requests through the client ``huggingface_hub`` itself uses; the file is hashed
after the last byte and moved into place only when whole and verified. The token travels only
in the Authorization header to the Hub's own origin and is never logged or written anywhere."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

from app.core.common import filelock
from app.core.common.atomic import write_text_atomic
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError, write_reason
from app.core.machine.hub import HubClient, HubError, _hf, explain
from app.core.machine.hub_names import SHA256_RE, SHA_RE, check_revision, target_path
from app.core.machine.modelinfo import inspect

CHUNK = 1 << 20
READ_TIMEOUT_S = 1.0  # short reads: cancel lands within about a second
DEFAULT_STALL_S = 30.0


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
    import httpx2  # deferred: the HTTP client huggingface_hub brings (heavy); _hf() above loaded it

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
