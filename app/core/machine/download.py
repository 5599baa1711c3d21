"""The one resumable download: a ``.part`` file beside the target plus a small JSON of what it is
(the caller's description: url or repo/commit, size, sha256), continued with HTTP Range requests
after a dropped connection or an app restart; hashed after the last byte and moved into place
only when whole and verified. One download per target at a time, across processes (a file lock).

Used by the Hub downloads (app.core.machine.hub_download) and the llama.cpp runtime downloads
(app.core.engines.server.runtime_install)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable, Generator, Iterator
from urllib.parse import urlparse

from app.core.common import filelock
from app.core.common import jsonsafe
from app.core.common.atomic import write_text_atomic
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError, network_problem, os_reason
from app.core.common.units import amount, size

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
class Fetched:
    """A whole, verified file at ``path`` (``resumed_from``: bytes kept from an earlier try)."""
    path: Path
    sha256: str
    size: int
    resumed_from: int


def make_folder(folder: Path, what: str = "models folder") -> None:
    above = folder
    while not above.exists() and above != above.parent:
        above = above.parent
    if above.exists() and not above.is_dir():
        raise UserError(f"{above}: is a file, not a folder; choose another {what}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{folder}: cannot create the {what} ({os_reason(e)})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{folder}: cannot write there (permission denied); choose another {what}")


def write_failed(path: Path, e: OSError, done: int) -> UserError:
    kept = (f"; the {done:,} bytes downloaded so far are kept, run the download again to continue"
            if done else "")
    return UserError(f"{path}: cannot write ({os_reason(e)}){kept}")


def locked(dest: Path) -> AbstractContextManager[None]:
    """The lock that makes one download per target (the window and the CLI alike)."""
    return filelock.exclusive(dest.with_name(dest.name + ".lock"),
                              f"{dest}: already downloading (pid {{pid}}); wait for that download "
                              "to finish, then run this again")


def _default_explain(e: Exception, what: str, url: str = "") -> str:
    status = getattr(getattr(e, "response", None), "status_code", None)
    name = type(e).__name__
    offline = network_problem(e, urlparse(url).netloc or "the server", what)
    if offline:
        return offline
    if status == 404:
        return f"{what}: not found (404)"
    if status:
        return f"{what}: the server answered {status}"
    return f"{what}: {name}: {str(e).splitlines()[0][:200] if str(e) else 'failed'}"


def fetch_locked(url: str, dest: Path, *, label: str, meta: dict[str, Any], expected_sha256: str,
                 expected_size: int, cancel: CancelToken, stall_timeout: float = DEFAULT_STALL_S,
                 session: Any = None, headers_for: Callable[[str], dict[str, str]] | None = None,
                 error: type[UserError] = UserError,
                 explain: Callable[[Exception, str], str] | None = None,
                 status_error: Callable[[Any], Exception] | None = None,
                 listed_by: str = "the listing",
                 accept: Callable[[Path], None] | None = None) -> Iterator[DownloadProgress | Fetched]:
    """Download ``url`` to ``dest`` (the caller holds :func:`locked`), resuming a ``.part`` whose
    JSON equals ``meta``; yields progress, then :class:`Fetched`. Raises ``error`` (a UserError)
    or Cancelled; never leaves an unverified file at ``dest``.

    ``accept``, when given, checks the whole, verified file before it is moved into place (and a
    verified file already at ``dest``): a UserError from it deletes the file and is raised as
    ``error`` with its reason."""
    import httpx2  # deferred: the HTTP client huggingface_hub brings (heavy)

    own = session is None
    if own:
        session = httpx2.Client()
    try:
        yield from _fetch(_Job(url, dest, label, meta, expected_sha256, expected_size, cancel, stall_timeout,
                               session, headers_for, error,
                               explain or (lambda e, what: _default_explain(e, what, url)), status_error,
                               listed_by, accept))
    finally:
        if own:  # made here: closed here, however the download ends
            session.close()


@dataclasses.dataclass(frozen=True)
class _Job:
    """One download as :func:`fetch_locked` was asked for it; the steps below share it."""
    url: str
    dest: Path
    label: str
    meta: dict[str, Any]
    sha256: str
    size: int
    cancel: CancelToken
    stall_timeout: float
    session: Any
    headers_for: Callable[[str], dict[str, str]] | None
    error: type[UserError]
    explain: Callable[[Exception, str], str]
    status_error: Callable[[Any], Exception] | None
    listed_by: str
    accept: Callable[[Path], None] | None

    @property
    def part(self) -> Path:
        return self.dest.with_name(self.dest.name + ".part")

    @property
    def meta_path(self) -> Path:
        return self.dest.with_name(self.dest.name + ".part.json")


@dataclasses.dataclass
class _Transfer:
    """Where a download stands: the bytes in the part file, where this download started (a
    resumed part's size), when it started, when progress was last shown, when data last came
    (the stall limit), and whether it already started over once (a 416)."""
    done: int
    start: int
    t0: float = dataclasses.field(default_factory=time.monotonic)
    last_emit: float = 0.0
    last_data: float = dataclasses.field(default_factory=time.monotonic)
    restarted: bool = False


def _fetch(job: _Job) -> Iterator[DownloadProgress | Fetched]:
    """The download's steps: a verified file already at ``dest`` is the answer; else the part
    file is resumed (or begun), the rest received, and the whole verified and moved into place."""
    if job.dest.is_dir():
        raise UserError(f"{job.dest}: a folder is in the way of the download; move it")
    if job.dest.is_file() and job.dest.stat().st_size == job.size:  # already downloaded: verified again
        got = yield from _hashed(job.dest, job.cancel)
        if got == job.sha256:
            _accept_or_delete(job.dest, job.accept, job.label, job.error)
            yield Fetched(job.dest, job.sha256, job.size, 0)
            return
    start = _resume_point(job)
    need = job.size - start
    free = shutil.disk_usage(job.dest.parent).free
    if need > free:
        raise UserError(f"{job.dest.parent}: not enough disk space for {job.label}: needs "
                        f"{size(need, 2, 'GiB')} more, {size(free, 2, 'GiB')} free")
    try:
        write_text_atomic(job.meta_path, json.dumps(job.meta))
    except OSError as e:
        raise write_failed(job.meta_path, e, 0) from None
    start = yield from _receive(job, _Transfer(start, start))
    yield from _verify_and_place(job, start)


def _resume_point(job: _Job) -> int:
    """The bytes of a part file to continue from: its size when its JSON is this download's and it
    is no longer than the file; else 0, and a part that is not this download's is deleted."""
    if not job.part.exists():
        return 0
    try:
        old = jsonsafe.loads(job.meta_path.read_text())
    except (OSError, ValueError):
        old = None
    if old == job.meta and job.part.stat().st_size <= job.size:
        return job.part.stat().st_size
    job.part.unlink()
    return 0


def _receive(job: _Job, st: _Transfer) -> Generator[DownloadProgress, None, int]:
    """Receive the file after ``st.done`` into the part file, reconnecting after a dropped
    connection and continuing from where it stopped; returns where the download started (0 when
    the server made it start over)."""
    import httpx2  # the HTTP client: loaded only when something is downloaded

    while st.done < job.size or job.size == 0:
        job.cancel.check()
        headers = {"Accept-Encoding": "identity"}
        if st.done:
            headers["Range"] = f"bytes={st.done}-"
        if job.headers_for:
            headers.update(job.headers_for(job.url))
        try:
            with job.session.stream("GET", job.url, headers=headers, follow_redirects=True,
                                    timeout=httpx2.Timeout(15.0, read=READ_TIMEOUT_S)) as resp:
                if not _answer_usable(job, resp, st):
                    continue
                yield from _write(job, resp, st)
            if job.size == 0:
                break
        except (httpx2.TimeoutException, httpx2.RemoteProtocolError, httpx2.ReadError,
                httpx2.ConnectError) as e:
            _wait_or_give_up(job, e, isinstance(e, httpx2.ConnectError), st)
            continue  # reconnect and continue from `done`
    return st.start


def _answer_usable(job: _Job, resp: Any, st: _Transfer) -> bool:
    """Whether the server's answer is the file to write from ``st.done``: False to ask again from
    the first byte (a 416 for a part on disk, once); an error answer raises ``job.error``. A
    server that ignored Range sends it all: ``st.done`` goes back to 0."""
    if resp.status_code == 416:
        # "range not satisfiable": the server has fewer bytes than the part on disk,
        # so the part is not of this file; start over once, and if the server still
        # disagrees with the listing, drop the part so a retry does not ask again
        job.part.unlink(missing_ok=True)
        if st.done and not st.restarted:
            st.restarted, st.done, st.start = True, 0, 0
            return False
        job.meta_path.unlink(missing_ok=True)
        raise job.error(f"downloading {job.label}: the server has fewer bytes than "
                        f"the {job.size:,} {job.listed_by} listed (416 at byte {st.done:,}); the "
                        "partial download was removed")
    if resp.status_code >= 400:
        err = job.status_error(resp) if job.status_error else StatusError(resp)
        raise job.error(job.explain(err, f"downloading {job.label}"))
    if st.done and resp.status_code == 200:  # the server ignored Range: start over
        st.done = 0
    return True


def _write(job: _Job, resp: Any, st: _Transfer) -> Iterator[DownloadProgress]:
    """The answer's bytes appended to the part file (or written anew from byte 0), with progress
    about every 0.2 s; more bytes than the listing gave raise ``job.error``."""
    try:
        with open(job.part, "ab" if st.done else "wb") as f:
            for chunk in resp.iter_bytes():
                if job.cancel.cancelled:
                    raise Cancelled()
                f.write(chunk)
                st.done += len(chunk)
                st.last_data = time.monotonic()
                if st.done > job.size:
                    raise job.error(f"{job.label}: the server sent more than the "
                                    f"{job.size} bytes {job.listed_by} listed")
                now = time.monotonic()
                if now - st.last_emit > 0.2:
                    st.last_emit = now
                    speed = (st.done - st.start) / max(now - st.t0, 1e-6)
                    eta = (job.size - st.done) / speed if speed > 0 else None
                    yield DownloadProgress(st.done, job.size, speed, eta, st.start)
    except OSError as e:  # the disk (httpx's own errors are not OSErrors)
        raise write_failed(job.part, e, _size_or_zero(job.part)) from None


def _wait_or_give_up(job: _Job, e: Exception, connect_error: bool, st: _Transfer) -> None:
    """After a dropped or refused connection: raise when cancelled, when no connection came within
    the stall limit, or when no data came for that long; else return to reconnect (after a short
    wait when the connection was refused)."""
    if job.cancel.cancelled:
        raise Cancelled() from None
    if connect_error and st.done == st.start and time.monotonic() - st.t0 > job.stall_timeout:
        raise job.error(job.explain(e, f"downloading {job.label}")) from None
    if time.monotonic() - st.last_data > job.stall_timeout:
        raise job.error(f"downloading {job.label}: the server stopped sending for "
                        f"{job.stall_timeout:.0f} s ({st.done:,} of {job.size:,} bytes kept; run "
                        "the download again to continue)") from None
    if connect_error:
        job.cancel.wait(0.5)


def _verify_and_place(job: _Job, start: int) -> Iterator[DownloadProgress | Fetched]:
    """The received file hashed (with progress) and checked against the listing, accepted, and
    moved to ``dest``; a file that is not the one listed is deleted and raises ``job.error``."""
    part, meta_path = job.part, job.meta_path
    if not part.exists():
        open(part, "wb").close()  # an empty file: nothing was sent
    got = yield from _hashed(part, job.cancel)
    got_size = part.stat().st_size
    if got != job.sha256 or got_size != job.size:
        part.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
        raise job.error(f"{job.label}: checksum mismatch after download (sha256 {got[:12]}..., "
                        f"{got_size:,} bytes; expected {job.sha256[:12]}..., {job.size:,} bytes); "
                        "the partial download was deleted, try again")
    _accept_or_delete(part, job.accept, job.label, job.error, meta_path)
    try:
        os.replace(part, job.dest)
    except OSError as e:
        raise write_failed(job.dest, e, 0) from None
    meta_path.unlink(missing_ok=True)
    yield Fetched(job.dest, got, got_size, start)


def _hashed(p: Path, cancel: CancelToken) -> Generator[DownloadProgress, None, str]:
    """:func:`hash_with_progress` as a step: yields its progress, returns the hex digest."""
    got = ""
    for ev in hash_with_progress(p, cancel):
        if isinstance(ev, str):
            got = ev
        else:
            yield ev
    return got


def _accept_or_delete(p: Path, accept: Callable[[Path], None] | None, label: str, error: type[UserError],
                      *also: Path) -> None:
    if accept is None:
        return
    try:
        accept(p)
    except UserError as e:
        for q in (p, *also):
            q.unlink(missing_ok=True)
        raise error(f"downloading {label}: {e}; the downloaded file was deleted") from None


def _size_or_zero(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def hash_with_progress(p: Path, cancel: CancelToken) -> Iterator[DownloadProgress | str]:
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


def progress_text(ev: DownloadProgress) -> str:
    """One line for a download's progress, the same in the CLI and the window."""
    eta = f", {ev.eta_s:.0f} s left" if ev.eta_s else ""
    return (("verifying sha256: " if ev.phase == "verify" else "")
            + f"{amount(ev.done, 'MiB', 1)}/{size(ev.total, 1, 'MiB')}, {size(ev.speed_bps, 1, 'MiB')}/s{eta}"
            + (f" (resumed at {size(ev.resumed_from, 1, 'MiB')})" if ev.resumed_from else ""))


class StatusError(Exception):
    """An HTTP answer >= 400, with the Hub's X-Error-Message / X-Error-Code when it gives them."""
    def __init__(self, resp: Any) -> None:
        super().__init__(resp.headers.get("X-Error-Message") or f"HTTP {resp.status_code}")
        self.response = resp
        self.code = resp.headers.get("X-Error-Code")

