"""Catalog, Hub listing and downloads with the real huggingface_hub against a local test Hub."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from app.core.machine import download, hub, hub_download
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError
from conftest import EMPTY_GGUF, ROOT
from conftest import HUB_REPO as REPO
from hubserver import COMMIT


def dl(client, file, dest, repo=REPO, **kw):
    out = None
    for ev in hub_download.download(client, repo, file, models_dir=dest, **kw):
        out = ev
    return out


def test_catalog_loads_and_validates(tmp_path):
    cat = hub.load_catalog()
    assert len(cat) >= 4 and {"unsloth/Qwen3.6-27B-MTP-GGUF", "unsloth/Qwen3.6-35B-A3B-MTP-GGUF"} <= {e.repo for e in cat}
    assert any(e.drafter for e in cat if e.arch == "gemma4")
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"models": [{"repo": "x", "arch": "a", "kind": "dense", "notes": "n"}]}))
    with pytest.raises(UserError, match="owner/name"):
        hub.load_catalog(bad)
    bad.write_text(json.dumps({"models": [{"repo": "a/b", "arch": "a", "kind": "huge", "notes": "n"}]}))
    with pytest.raises(UserError, match="dense or moe"):
        hub.load_catalog(bad)


def test_listing_search_and_quants(fake_hub):
    c = hub.HubClient(fake_hub.url)
    rf = c.repo_files(REPO)
    assert rf.commit == COMMIT
    names = {q.name: q for q in rf.quants}
    assert set(names) == {"Q8_0", "F16", "Q4_K_M"}
    assert len(names["Q4_K_M"].files) == 2 and names["Q4_K_M"].size == 150 + 2 * len(EMPTY_GGUF)
    q8 = names["Q8_0"].first
    assert q8.sha256 == hashlib.sha256(fake_hub.repos[REPO].files["tiny-Q8_0.gguf"]).hexdigest()
    merged = hub.merged_search(c, "mtp", hub.load_catalog())
    repos = [e.repo for e in merged]
    assert REPO in repos and "unsloth/Qwen3.6-27B-MTP-GGUF" in repos
    assert repos.index("unsloth/Qwen3.6-27B-MTP-GGUF") < repos.index(REPO)  # catalog first
    assert all("authorization" not in {k.lower() for k in h} for _, _, h in fake_hub.requests)  # no token


def test_download_completes_verifies_and_inspects(fake_hub, tmp_path):
    res = dl(hub.HubClient(fake_hub.url), "tiny-Q8_0.gguf", tmp_path)
    assert res.path.exists() and res.has_mtp is True and res.commit == COMMIT
    assert res.sha256 == hashlib.sha256(res.path.read_bytes()).hexdigest()
    assert not list(tmp_path.rglob("*.part*"))
    assert [m.has_mtp for m in hub.local_library(tmp_path, include_hf_cache=False)] == [True]


def test_checksum_mismatch_is_refused_and_nothing_is_presented(fake_hub, tmp_path):
    fake_hub.corrupt = True
    with pytest.raises(hub.HubError, match="checksum mismatch"):
        dl(hub.HubClient(fake_hub.url), "blob-F16.gguf", tmp_path)
    assert not list(tmp_path.rglob("*.gguf")) and not list(tmp_path.rglob("*.part*"))
    assert hub.local_library(tmp_path, include_hf_cache=False) == []


def test_resume_in_a_new_process_continues_from_the_bytes_on_disk(fake_hub, tmp_path):
    size = len(fake_hub.repos[REPO].files["blob-F16.gguf"])
    # then silent for good: only the client's own stall timeout (2 s) can end the download
    fake_hub.stall_after = 2 * 2**20 + 12345
    cmd = [sys.executable, "-m", "app", "models", "download", REPO, "blob-F16.gguf", "--endpoint", fake_hub.url,
           "--dest", str(tmp_path), "--stall-timeout", "2"]
    # timeout=120: a guard against a hang (60 x the stall timeout given), not a speed target
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"stopped sending for 2 s ({fake_hub.stall_after:,} of {size:,} bytes kept" in r.stderr, r.stderr
    part = next(tmp_path.rglob("*.gguf.part"))
    kept = part.stat().st_size
    assert kept == fake_hub.stall_after
    served_before = fake_hub.bytes_served
    fake_hub.stall_after = None
    r = subprocess.run(cmd + ["--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["resumed_from"] == kept and out["size"] == size
    assert fake_hub.bytes_served - served_before == size - kept  # no restart from zero
    ranges = [v for m, p, h in fake_hub.requests if m == "GET" and "blob-F16" in p
              for k, v in h.items() if k.lower() == "range"]
    assert ranges[-1] == f"bytes={kept}-"


@pytest.mark.parametrize("case, match", [
    ("missing_repo", "no such repo"),
    ("missing_file", "no file"),
    ("gated_anonymous", "gated"),
    ("gated_wrong_token", "gated"),
])
def test_errors_are_clear(fake_hub, tmp_path, case, match):
    fake_hub.valid_token = "right-token"
    token = "wrong-token" if case == "gated_wrong_token" else None
    c = hub.HubClient(fake_hub.url, token)
    repo = {"missing_repo": "tester/nope", "gated_anonymous": "tester/Gated-MTP-GGUF",
            "gated_wrong_token": "tester/Gated-MTP-GGUF"}.get(case, REPO)
    with pytest.raises(hub.HubError, match=match) as ei:
        dl(c, "nope.gguf" if case == "missing_file" else "g-Q4_K_M.gguf", tmp_path, repo=repo)
    # answered at once: one listing request, no retry with back-off, no download started
    assert [(m, p.split("?")[0]) for m, p, _ in fake_hub.requests] == [
        ("GET", f"/api/models/{repo}/revision/main")], fake_hub.requests
    assert "wrong-token" not in str(ei.value) and "right-token" not in str(ei.value)
    if case == "gated_wrong_token":
        seen = {v for _, _, h in fake_hub.requests for k, v in h.items() if k.lower() == "authorization"}
        assert seen == {"Bearer wrong-token"}


def test_gated_repo_with_the_right_token(fake_hub, tmp_path):
    fake_hub.valid_token = "right-token"
    res = dl(hub.HubClient(fake_hub.url, "right-token"), "g-Q4_K_M.gguf", tmp_path, repo="tester/Gated-MTP-GGUF")
    assert res.path.exists()
    assert "right-token" not in repr(hub.HubClient(fake_hub.url, "right-token"))


def test_refused_connection_is_clear_and_fast(tmp_path, monkeypatch):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    # "fast" as a count, not a clock: one connection attempt, no retries with back-off
    attempts = []
    real = socket.create_connection

    def counting(address, *a, **kw):
        attempts.append(address)
        return real(address, *a, **kw)

    monkeypatch.setattr(socket, "create_connection", counting)
    with pytest.raises(hub.HubError, match="cannot reach 127.0.0.1:.*connection was refused"):
        hub.HubClient(f"http://127.0.0.1:{port}").repo_files(REPO)
    assert [a[1] for a in attempts] == [port], attempts


def test_stalled_server_gives_up_in_bounded_time(fake_hub, tmp_path):
    fake_hub.stall_after = 1000  # then silent for good: only the client's stall timeout ends it
    stall = 2.0
    size = len(fake_hub.repos[REPO].files["blob-F16.gguf"])
    err = []

    def run():
        try:
            dl(hub.HubClient(fake_hub.url), "blob-F16.gguf", tmp_path, stall_timeout=stall)
        except hub.HubError as e:
            err.append((time.monotonic(), str(e)))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    # a guard against a hang (30 x the stall timeout given), not a speed target
    t.join(30 * stall)
    assert not t.is_alive(), "the download did not give up on a server that stopped sending"
    assert len(err) == 1
    given_up, msg = err[0]
    assert f"stopped sending for 2 s (1,000 of {size:,} bytes kept" in msg, msg
    assert next(tmp_path.rglob("*.gguf.part")).stat().st_size == 1000
    # and not before the stall timeout (a first short read timeout is retried): the client got its
    # last byte after the server sent it, so it waited at least this long. A lower bound on a wait
    # the code itself makes: a slower machine only makes it longer.
    assert given_up - fake_hub.last_sent_at >= stall


def test_cancel_while_the_server_stalls_lands_and_presents_no_model(fake_hub, tmp_path):
    fake_hub.stall_after = 3 * 2**20  # then silent for good
    cancel = CancelToken()
    err = []

    def run():
        try:
            dl(hub.HubClient(fake_hub.url), "blob-F16.gguf", tmp_path, cancel=cancel)
        except Cancelled:
            err.append("cancelled")

    def gets():
        return [{k.lower(): v for k, v in h.items()} for m, p, h in list(fake_hub.requests)
                if m == "GET" and "blob-F16" in p]

    t = threading.Thread(target=run, daemon=True)
    t.start()
    # wait for an event, not a time: the client timed out a read on the stalled server and asked
    # again from the bytes it has (Range), so it now sits in a read that gets no data
    resumed = f"bytes={fake_hub.stall_after}-"
    deadline = time.monotonic() + 60  # only a guard against waiting forever
    while not any(h.get("range") == resumed for h in gets()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(h.get("range") == resumed for h in gets()), "the client never retried the stalled read"
    n_gets = len(gets())
    cancel.cancel()
    # a guard against a hang, not a speed target: the cancel lands at the next short read timeout,
    # not after the stall timeout (30 s) or never; 10 x that read timeout is generous. The read
    # timeout itself is what makes "cancel lands within about a second" (the window's promise).
    assert download.READ_TIMEOUT_S <= 1.0
    t.join(10 * download.READ_TIMEOUT_S)
    assert not t.is_alive(), "cancel did not land while the server was stalled"
    assert err == ["cancelled"]
    assert len(gets()) == n_gets  # no request after the cancel
    assert next(tmp_path.rglob("*.gguf.part")).stat().st_size == fake_hub.stall_after  # bytes kept
    assert not list(tmp_path.rglob("*.gguf"))  # only the .part, which is never presented as a model
    assert hub.local_library(tmp_path, include_hf_cache=False) == []


def test_not_enough_disk_is_refused_before_start(fake_hub, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    du = namedtuple("du", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: du(10**6, 10**6 - 1000, 1000))
    with pytest.raises(UserError, match="not enough disk space"):
        dl(hub.HubClient(fake_hub.url), "blob-F16.gguf", tmp_path)
    assert not any(m == "GET" and "/resolve/" in p for m, p, _ in fake_hub.requests)


def test_models_list_works_offline():
    r = subprocess.run([sys.executable, "-m", "app", "models", "list", "--json"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert any(e["repo"] == "unsloth/Qwen3.6-27B-MTP-GGUF" for e in json.loads(r.stdout)["catalog"])


def test_files_cli_shows_quants_with_fit_badges(fake_hub):
    r = subprocess.run([sys.executable, "-m", "app", "models", "files", REPO, "--endpoint", fake_hub.url, "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d["fit"]) == {"Q8_0", "F16", "Q4_K_M"} and all(v for v in d["fit"].values())
    assert hub.size_fit(10 * 2**30, 24 * 2**30, 64 * 2**30, False) == "fits on GPU"
    # 20.5 GiB on a 24 GiB card: weights + 15 % (23.6) fit, but not with the 1 GiB llama.cpp keeps free
    assert hub.size_fit(int(20.5 * 2**30), 24 * 2**30, 64 * 2**30, False) == "partial offload (-ngl), slow"
    assert hub.size_fit(22 * 2**30, 12 * 2**30, 64 * 2**30, True) == "fits with --n-cpu-moe"
    assert hub.size_fit(22 * 2**30, 12 * 2**30, 64 * 2**30, False) == "partial offload (-ngl), slow"
    assert hub.size_fit(200 * 2**30, 12 * 2**30, 32 * 2**30, True) == "too large"
    assert hub.size_fit(3 * 2**30, None, 16 * 2**30, False) == "fits in RAM (CPU)"
