"""Secrets never appear in a message: a Hub token with a line break or another control character
is refused without being repeated, every Hub error and every log line is redacted, and the
servers the app starts never receive the token. Real CLI processes against the test Hub, a real
llama-server, the real log file."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import psutil
import pytest

from app.core.common.logs import LOGGER, log_path, setup_logging
from app.core.common.errors import UserError
from app.core.machine import hub
from tests.helpers import clean_error, cli

GATED = "tester/Gated-MTP-GGUF"
ONE = "hf_SecretPartOne0123456789abcdefXY"
TWO = "hf_SecretPartTwo0123456789abcdefXY"
PIECES = ("SecretPartOne", "SecretPartTwo")


def _no_secret(r) -> None:
    """Neither half of the token in stdout, stderr or the log (when the command wrote one)."""
    seen = r.stdout + r.stderr
    log = log_path()
    if log.exists():
        seen += log.read_text(encoding="utf-8", errors="replace")
    for piece in PIECES:
        assert piece not in seen, seen


def _commands(fake_hub, dest: Path) -> list[tuple[str, ...]]:
    ep = ("--endpoint", fake_hub.url)
    return [("models", "files", GATED, *ep),
            ("models", "search", "gated-mtp", *ep),
            ("models", "download", GATED, "g-Q4_K_M.gguf", "--dest", str(dest), *ep)]


@pytest.mark.parametrize("sep", ["\n", "\r", "\t", "\r\n"])
def test_a_token_with_a_control_character_is_refused_without_repeating_it(fake_hub, tmp_path, sep):
    fake_hub.valid_token = ONE
    token = ONE + sep + TWO
    for argv in _commands(fake_hub, tmp_path / "models"):
        r = cli(*argv, env={"HF_TOKEN": token})
        clean_error(r, "HF_TOKEN: the token holds a line break or other control character; it must be one line")
        _no_secret(r)
    # the same from a token file with two lines; nothing reached the Hub, nothing was saved
    tf = tmp_path / "token"
    tf.write_text(ONE + "\n" + TWO + "\n")
    for argv in _commands(fake_hub, tmp_path / "models"):
        r = cli(*argv, "--token-file", str(tf))
        clean_error(r, f"{tf}: the token holds a line break")
        _no_secret(r)
    assert not any(k.lower() == "authorization" for _, _, h in fake_hub.requests for k in h)
    assert not (tmp_path / "models").exists()


def test_other_variables_and_the_right_token_with_its_newline(fake_hub, tmp_path):
    fake_hub.valid_token = ONE
    r = cli("models", "files", GATED, "--endpoint", fake_hub.url,
            env={"HUGGING_FACE_HUB_TOKEN": ONE + "\n" + TWO})
    clean_error(r, "HUGGING_FACE_HUB_TOKEN: the token holds a line break")
    _no_secret(r)
    r = cli("models", "files", GATED, "--endpoint", fake_hub.url, env={"HF_TOKEN": "hf_Secret Part\u00e9One"})
    clean_error(r, "HF_TOKEN: the token holds a space or a non-ASCII character")
    assert "SecretPart" not in r.stderr
    # a file's final newline is no line break in the token: the gated repo lists
    tf = tmp_path / "token"
    tf.write_text(ONE + "\n")
    r = cli("models", "files", GATED, "--endpoint", fake_hub.url, "--token-file", str(tf))
    assert r.returncode == 0 and "g-Q4_K_M.gguf" in r.stdout, r.stderr
    r = cli("models", "files", GATED, "--endpoint", fake_hub.url, env={"HUGGING_FACE_HUB_TOKEN": ONE})
    assert r.returncode == 0 and "g-Q4_K_M.gguf" in r.stdout, r.stderr
    _no_secret(r)


def test_a_hub_error_carrying_the_request_headers_is_redacted(fake_hub):
    """The error httpx raises for a header it cannot send quotes the header; explain() is where
    every Hub failure (listing, search, download) becomes a message."""
    hf = hub._hf()
    with pytest.raises(Exception) as ei:
        hf.get_session().get(f"{fake_hub.url}/api/models", headers={"Authorization": f"Bearer {ONE}\n{TWO}"})
    assert "SecretPartOne" in str(ei.value)  # the real exception does carry it
    msg = hub.explain(ei.value, f"listing {GATED}", fake_hub.url)
    assert msg.startswith(f"listing {GATED}: ")
    assert not any(p in msg for p in PIECES), msg
    with pytest.raises(UserError, match="control character") as ei2:
        hub.HubClient(fake_hub.url, ONE + "\n" + TWO)
    assert not any(p in str(ei2.value) for p in PIECES)


def test_the_log_never_holds_the_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", ONE + "\n" + TWO)  # what the user set, read or not
    path = setup_logging()
    log = logging.getLogger(LOGGER)
    try:
        raise RuntimeError(f"Illegal header value b'Bearer {ONE}\\n{TWO}'")
    except RuntimeError:
        log.exception("library refresh failed with %s", ONE)
    for h in log.handlers:
        h.flush()
    text = path.read_text(encoding="utf-8")
    assert "library refresh failed" in text and "RuntimeError" in text and "Traceback" in text
    assert not any(p in text for p in PIECES), text


def test_the_window_reads_the_token_as_the_cli_does(window, qtbot, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    fake_hub.valid_token = ONE
    tab = window.model_tab
    monkeypatch.setenv("HF_TOKEN", ONE + "\r" + TWO)
    tab.search_edit.setText("gated-mtp")
    tab.search_models()
    qtbot.waitUntil(lambda: tab.search_btn.isEnabled(), timeout=20000)
    assert "HF_TOKEN: the token holds a line break" in (window.state.last_error or "")
    assert not any(p in window.state.last_error + tab.download_label.text() for p in PIECES)
    monkeypatch.setenv("HF_TOKEN", ONE + "\n")  # the right token: the gated repo lists
    tab.search_models()
    qtbot.waitUntil(lambda: tab.search_btn.isEnabled(), timeout=20000)
    tab.repos.selectRow([e.repo for e in tab._repo_entries].index(GATED))
    qtbot.waitUntil(lambda: tab.files.rowCount() == 1, timeout=20000)
    seen = {v for _, _, h in fake_hub.requests for k, v in h.items() if k.lower() == "authorization"}
    assert seen == {f"Bearer {ONE}"}


@pytest.mark.server
def test_llama_server_never_gets_the_hub_token(server_bin, make_model, monkeypatch):
    from app.core.common.cancel import CancelToken
    from app.core.engines.server.engine import ServerEngine
    from app.core.records.arm import Arm

    monkeypatch.setenv("HF_TOKEN", ONE)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", TWO)
    eng = ServerEngine(server_bin, ctx_size=2048)
    try:
        srv = eng.server(eng.config_for(str(make_model(0.0)), Arm()), CancelToken())
        environ = Path(f"/proc/{srv.pid}/environ").read_bytes().split(b"\0")
        assert psutil.Process(srv.pid).name().startswith("llama-server")
        names = {e.split(b"=", 1)[0] for e in environ if e}
        assert b"LLAMA_API_KEY" in names and b"PATH" in names  # the environment it was given
        assert not names & {b"HF_TOKEN", b"HUGGING_FACE_HUB_TOKEN"}
        assert not any(p.encode() in e for e in environ for p in PIECES)
    finally:
        eng.close()


def test_the_windows_error_paths_never_show_the_token(qtbot, capfd):
    """An unexpected error in a slot (the crash dialog, its details, the stderr line, the log) and
    in a worker (the message it reports) carrying the header the Hub client could not send."""
    from PySide6.QtCore import QObject, Signal

    from app.gui.adapter import CoreJob
    from app.gui.crash import CrashHandler

    leak = f"Illegal header value b'Bearer {ONE}\\n{TWO}'"

    class Boom(QObject):
        fire = Signal()

    setup_logging()
    handler = CrashHandler(log_path()).install()
    try:
        boom = Boom()

        def bad_slot():
            raise RuntimeError(leak)

        boom.fire.connect(bad_slot)
        boom.fire.emit()
        box = handler.dialog
        assert box is not None and "Illegal header value" in box.text()
        shown = box.text() + box.detailedText() + capfd.readouterr().err
        box.close()
    finally:
        handler.uninstall()

    def factory(cancel):
        raise RuntimeError(leak)
        yield

    job = CoreJob(factory)
    failed: list[str] = []
    job.failed.connect(failed.append)
    with qtbot.waitSignal(job.finished, timeout=20000):
        job.start()
    assert failed and "Illegal header value" in failed[0]
    for h in logging.getLogger(LOGGER).handlers:
        h.flush()
    shown += failed[0] + log_path().read_text(encoding="utf-8")
    assert not any(p in shown for p in PIECES), shown
