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
