"""The one resumable download (app.core.machine.download): what it owns it closes, a file
already in place is verified with progress and cancel, and its progress is one line of text."""

from __future__ import annotations

import hashlib

import pytest

from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.machine import download as D


class _Client:
    made: list["_Client"] = []

    def __init__(self, *a, **k):
        self.closed = False
        _Client.made.append(self)

    def close(self):
        self.closed = True


@pytest.fixture
def clients(monkeypatch):
    import httpx2

    _Client.made = []
    monkeypatch.setattr(httpx2, "Client", _Client)
    return _Client.made


def _fetch(dest, data, **kw):
    return D.fetch_locked("http://127.0.0.1:9/x", dest, label="x", meta={}, expected_sha256=hashlib.sha256(data).hexdigest(),
                          expected_size=len(data), cancel=kw.pop("cancel", CancelToken()), **kw)


def test_the_client_it_makes_is_closed_however_it_ends(tmp_path, clients):
    dest = tmp_path / "f.bin"
    dest.write_bytes(b"abc")
    evs = list(_fetch(dest, b"abc"))  # already there: no request
    assert isinstance(evs[-1], D.Fetched) and len(clients) == 1 and clients[0].closed
    (tmp_path / "d.bin").mkdir()
    with pytest.raises(UserError, match="a folder is in the way"):
        list(_fetch(tmp_path / "d.bin", b"abc"))
    assert len(clients) == 2 and clients[1].closed
    mine = _Client()
    list(_fetch(dest, b"abc", session=mine))
    assert not mine.closed  # the caller's session is the caller's to close


def test_a_file_already_in_place_is_verified_with_progress_and_cancel(tmp_path, clients):
    dest = tmp_path / "f.bin"
    data = b"x" * (3 * D.CHUNK + 5)
    dest.write_bytes(data)
    evs = list(_fetch(dest, data))
    verify = [e for e in evs if isinstance(e, D.DownloadProgress)]
    assert verify and all(e.phase == "verify" for e in verify) and verify[-1].done == len(data)
    assert isinstance(evs[-1], D.Fetched) and evs[-1].resumed_from == 0
    cancel = CancelToken()
    cancel.cancel()
    from app.core.common.errors import Cancelled

    with pytest.raises(Cancelled):
        list(_fetch(dest, data, cancel=cancel))


@pytest.mark.parametrize("ev, text", [
    (D.DownloadProgress(3 << 20, 10 << 20, 1 << 20, 7.0, 0), "3.0/10.0 MiB, 1.0 MiB/s, 7 s left"),
    (D.DownloadProgress(3 << 20, 10 << 20, 1 << 20, None, 2 << 20), "3.0/10.0 MiB, 1.0 MiB/s (resumed at 2.0 MiB)"),
    (D.DownloadProgress(10 << 20, 10 << 20, 5 << 20, 0.0, 0, phase="verify"), "verifying sha256: 10.0/10.0 MiB, 5.0 MiB/s"),
])
def test_progress_is_one_line_of_text(ev, text):
    assert D.progress_text(ev) == text


def test_one_status_error_for_both_downloads():
    from app.core.machine import hub_download

    assert not hasattr(hub_download, "_StatusError") and not hasattr(D, "_StatusError")
    assert issubclass(type(hub_download._status_error(type("R", (), {"headers": {"X-Error-Code": "GatedRepo"},
                                                                      "status_code": 401})())), D.StatusError)
