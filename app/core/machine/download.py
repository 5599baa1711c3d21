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
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from app.core.common import filelock
from app.core.common import jsonsafe
from app.core.common.atomic import write_text_atomic
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError, network_problem, write_reason
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
        raise UserError(f"{folder}: cannot create the {what} ({e.strerror or e})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{folder}: cannot write there (permission denied); choose another {what}")


def write_failed(path: Path, e: OSError, done: int) -> UserError:
    kept = (f"; the {done:,} bytes downloaded so far are kept, run the download again to continue"
            if done else "")
    return UserError(f"{path}: cannot write ({write_reason(e)}){kept}")


def locked(dest: Path):
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
        yield from _fetch(url, dest, label=label, meta=meta, expected_sha256=expected_sha256,
                          expected_size=expected_size, cancel=cancel, stall_timeout=stall_timeout,
                          session=session, headers_for=headers_for, error=error,
                          explain=explain or (lambda e, what: _default_explain(e, what, url)), status_error=status_error,
                          listed_by=listed_by, accept=accept)
    finally:
        if own:  # made here: closed here, however the download ends
            session.close()


def _fetch(url: str, dest: Path, *, label: str, meta: dict[str, Any], expected_sha256: str,
           expected_size: int, cancel: CancelToken, stall_timeout: float, session: Any,
           headers_for: Callable[[str], dict[str, str]] | None, error: type[UserError],
           explain: Callable[[Exception, str], str], status_error: Callable[[Any], Exception] | None,
           listed_by: str, accept: Callable[[Path], None] | None) -> Iterator[DownloadProgress | Fetched]:
    import httpx2  # the HTTP client: loaded only when something is downloaded

    part = dest.with_name(dest.name + ".part")
    meta_path = dest.with_name(dest.name + ".part.json")
    if dest.is_dir():
        raise UserError(f"{dest}: a folder is in the way of the download; move it")
    if dest.is_file() and dest.stat().st_size == expected_size:  # already downloaded: verified again
        got = None
        for ev in hash_with_progress(dest, cancel):
            if isinstance(ev, str):
                got = ev
            else:
                yield ev
        if got == expected_sha256:
            _accept_or_delete(dest, accept, label, error)
            yield Fetched(dest, expected_sha256, expected_size, 0)
            return
    start = 0
    if part.exists():
        try:
            old = jsonsafe.loads(meta_path.read_text())
        except (OSError, ValueError):
            old = None
        if old == meta and part.stat().st_size <= expected_size:
            start = part.stat().st_size
        else:
            part.unlink()
    need = expected_size - start
    free = shutil.disk_usage(dest.parent).free
    if need > free:
        raise UserError(f"{dest.parent}: not enough disk space for {label}: needs "
                        f"{size(need, 2, 'GiB')} more, {size(free, 2, 'GiB')} free")
    try:
        write_text_atomic(meta_path, json.dumps(meta))
    except OSError as e:
        raise write_failed(meta_path, e, 0) from None
    done = start
    t0 = time.monotonic()
    last_emit = 0.0
    last_data = time.monotonic()
    restarted = False
    while done < expected_size or expected_size == 0:
        cancel.check()
        headers = {"Accept-Encoding": "identity"}
        if done:
            headers["Range"] = f"bytes={done}-"
        if headers_for:
            headers.update(headers_for(url))
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
                    raise error(f"downloading {label}: the server has fewer bytes than "
                                f"the {expected_size:,} {listed_by} listed (416 at byte {done:,}); the "
                                "partial download was removed")
                if resp.status_code >= 400:
                    err = status_error(resp) if status_error else StatusError(resp)
                    raise error(explain(err, f"downloading {label}"))
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
                                raise error(f"{label}: the server sent more than the "
                                            f"{expected_size} bytes {listed_by} listed")
                            now = time.monotonic()
                            if now - last_emit > 0.2:
                                last_emit = now
                                speed = (done - start) / max(now - t0, 1e-6)
                                eta = (expected_size - done) / speed if speed > 0 else None
                                yield DownloadProgress(done, expected_size, speed, eta, start)
                except OSError as e:  # the disk (httpx's own errors are not OSErrors)
                    raise write_failed(part, e, _size_or_zero(part)) from None
            if expected_size == 0:
                break
        except (httpx2.TimeoutException, httpx2.RemoteProtocolError, httpx2.ReadError,
                httpx2.ConnectError) as e:
            if cancel.cancelled:
                raise Cancelled() from None
            if isinstance(e, httpx2.ConnectError) and done == start and time.monotonic() - t0 > stall_timeout:
                raise error(explain(e, f"downloading {label}")) from None
            if time.monotonic() - last_data > stall_timeout:
                raise error(f"downloading {label}: the server stopped sending for "
                            f"{stall_timeout:.0f} s ({done:,} of {expected_size:,} bytes kept; run "
                            "the download again to continue)") from None
            if isinstance(e, httpx2.ConnectError):
                cancel.wait(0.5)
            continue  # reconnect and continue from `done`
    if not part.exists():
        open(part, "wb").close()  # an empty file: nothing was sent
    got = None
    for ev in hash_with_progress(part, cancel):
        if isinstance(ev, str):
            got = ev
        else:
            yield ev
    got_size = part.stat().st_size
    if got != expected_sha256 or got_size != expected_size:
        part.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
        raise error(f"{label}: checksum mismatch after download (sha256 {got[:12]}..., "
                    f"{got_size:,} bytes; expected {expected_sha256[:12]}..., {expected_size:,} bytes); "
                    "the partial download was deleted, try again")
    _accept_or_delete(part, accept, label, error, meta_path)
    try:
        os.replace(part, dest)
    except OSError as e:
        raise write_failed(dest, e, 0) from None
    meta_path.unlink(missing_ok=True)
    yield Fetched(dest, got, got_size, start)


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
    def __init__(self, resp):
        super().__init__(resp.headers.get("X-Error-Message") or f"HTTP {resp.status_code}")
        self.response = resp
        self.code = resp.headers.get("X-Error-Code")

