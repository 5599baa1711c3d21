"""mtp-tuner watch against hostile input: a password in the address is never repeated (screen or
log), a model path from /props names no file raw and forges no line, the window survives a bad
--costs (refused before watching) and whatever breaks its interpretation, a server answering a
byte a second holds no read past --duration (and SIGTERM keeps the window as Ctrl-C does), and
position labels or JSON built to exhaust the watcher get one clear line. Real processes of
``python -m app watch`` against a real loopback server (tests/watchserver.py)."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, clean_error, cli, server_costs
from watchserver import WatchServer, metrics_page

from app.core.common.text import one_line
from app.core.common.logs import log_path
from app.core.common.redact import redact
from app.core.records.reader import load_watch_records
from app.core.records.writer import append_line
from app.core.watch.client import normal_url
from app.core.watch.metrics import MAX_POSITIONS, parse
from app.core.watch.watcher import check_costs
from app.core.watch.window import Tracker

COSTS = {1: 10.0, 2: 10.5, 3: 11.0, 4: 11.5, 5: 12.0}
PW = "Pw-s3cret-9f2c"


def _results(home: Path) -> Path:
    return home / "data" / "results"


def _no_traceback(r) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stderr


# ---- 1. a password in the address ----------------------------------------------------------------

URL_FORMS = ["http://user:{pw}@127.0.0.1:8080", "http://user:{pw}@127.0.0.1:8080/metrics",
             "http://user:{pw}@127.0.0.1:8080/?x=1", "http://user:{pw}@127.0.0.1:8080/#frag",
             "http://user:{pw}@127.0.0.1:port/metrics", "http://user:{pw}@127.0.0.1:bad",
             "ftp://user:{pw}@127.0.0.1:8080", "http://user:{pw}@", "user:{pw}@127.0.0.1:8080",
             "https://{pw}@[::1", "http://user:{pw}@host/a@b"]


@pytest.mark.parametrize("form", URL_FORMS)
def test_a_password_in_the_address_is_refused_without_repeating_it(form, capsys):
    from app.cli import main

    url = form.format(pw=PW)
    with pytest.raises(Exception) as e:
        normal_url(url)
    assert type(e.value).__name__ == "UserError" and "password" in str(e.value)
    assert PW not in str(e.value) and "user:" not in str(e.value)
    assert main(["watch", url, "--duration", "1"]) == 2
    seen = capsys.readouterr()
    assert PW not in seen.out + seen.err and "password" in seen.err and "Traceback" not in seen.err


def test_a_password_in_the_address_as_a_real_process():
    r = cli("watch", f"http://user:{PW}@127.0.0.1:8080/metrics", "--duration", "1", timeout=60)
    clean_error(r, "password", "--api-key-file")
    assert PW not in r.stdout + r.stderr


def test_the_log_and_redact_mask_urls_credentials_and_api_keys():
    cases = {f"GET http://user:{PW}@127.0.0.1:8080/metrics failed": PW,
             f"llama-server -m m.gguf --api-key {PW} --port 1": PW,
             f"llama-server --api-key={PW}": PW, f"Authorization: Basic {PW}": PW,
             f"Authorization: Bearer {PW}": PW, f"http://h:1/x?api_key={PW}&y=2": PW,
             f'{{"x-api-key": "{PW}"}}': PW, f"ftp://{PW}@host/": PW}
    for text, secret in cases.items():
        assert secret not in redact(text), redact(text)
    kept = "give the key with --api-key-file FILE or in LLAMA_API_KEY; see http://127.0.0.1:8080"
    assert redact(kept) == kept
    assert redact(f"http://user:{PW}@h:1/x") == "http://[redacted]@h:1/x"


# ---- 2. and the outside text: the record's file name, no forged line ------------------------------


def test_the_record_file_is_named_safely_and_the_model_path_forges_no_line(tmp_path):
    home = tmp_path / "home"
    model = "/models/\x1b[31mevil\rname\nrecommendation: run K=8\u202e.gguf"
    with WatchServer(model=model) as srv:
        r = cli("watch", srv.url, "--duration", "1", "--interval", "1", env={"MTP_TUNER_HOME": str(home)}, timeout=60)
    assert r.returncode == 0, r.stderr
    _no_traceback(r)
    names = [p.name for p in _results(home).iterdir()]
    assert len(names) == 1 and re.fullmatch(r"watch-[A-Za-z0-9._-]+\.jsonl", names[0]), names
    for line in (r.stdout + r.stderr).splitlines():  # outside text is never a line of its own
        assert not line.startswith("recommendation: run K=8"), line
        assert "\x1b" not in line and "\r" not in line and "\u202e" not in line
    (rec,) = load_watch_records(_results(home) / names[0])
    assert rec.model_path == one_line(model)  # what the server said, read back as one escaped line


# ---- 4. the window is never thrown away at its end -------------------------------------------------


def test_a_typo_in_costs_is_refused_before_the_watch(tmp_path):
    with WatchServer() as srv:  # refused before the watch: the server is never read (below)
        r = cli("watch", srv.url, "--duration", "30", "--costs", str(tmp_path / "typo.jsonl"), timeout=20)
        clean_error(r, "typo.jsonl", "results file not found (--costs)")
        (tmp_path / "runs.jsonl").write_text("not json\n")
        r = cli("watch", srv.url, "--duration", "30", "--costs", str(tmp_path / "runs.jsonl"), timeout=20)
        clean_error(r, "runs.jsonl", "--costs")
        assert srv.paths() == []  # the server was never read
    with pytest.raises(Exception, match="no cost-probe record"):
        check_costs(str(tmp_path / "runs.jsonl"))


def test_a_window_whose_interpretation_fails_is_saved_with_one_warning(tmp_path):
    """A model path of 10,000 characters (its directory) named like the probe's model: matching
    the cost record stats it, which no file system allows; and a results file nested 100,000
    deep beside it. The window's record is saved all the same, with one warning at most."""
    home = tmp_path / "home"
    results = _results(home)
    results.mkdir(parents=True)
    model = "/" + "d" * 3_000 + "/calibrated-p0.3.gguf"
    append_line(results / "costs.jsonl", server_costs(COSTS, 0.5, model="/m/calibrated-p0.3.gguf",
                                                      model_size=123).to_json())
    (results / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    out = tmp_path / "watch.jsonl"
    with WatchServer(model=model) as srv:
        r = cli("watch", srv.url, "--duration", "2", "--interval", "1", "--out", str(out),
                env={"MTP_TUNER_HOME": str(home)}, timeout=60)
    assert r.returncode == 0, r.stderr
    _no_traceback(r)
    (rec,) = load_watch_records(out)
    assert rec.draft_steps >= 50 and rec.model_path == model
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]) <= 1
    assert "recommendation: " in r.stdout


def test_a_nul_in_the_model_path_is_one_line_at_attach(tmp_path):
    with WatchServer(model="/m/x\x00.gguf") as srv:
        r = cli("watch", srv.url, "--duration", "30", timeout=20)
    clean_error(r, "/props", "NUL")


# ---- 7. a server that answers a byte a second ----------------------------------------------------


def _watch(args: list[str], home: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app", "watch", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "MTP_TUNER_HOME": str(home)}, **kw)


@pytest.mark.parametrize("path,slow_from", [("/metrics", 3), ("/slots", 1), ("/props", 1), ("/health", 1)])
def test_a_byte_a_second_holds_no_read_past_the_duration(path, slow_from, tmp_path):
    out = tmp_path / "watch.jsonl"
    with WatchServer() as srv:
        srv.slow[path] = slow_from
        t0 = time.monotonic()
        p = _watch([srv.url, "--duration", "4", "--interval", "2", "--out", str(out)], tmp_path / "home")
        try:
            stdout, stderr = p.communicate(timeout=30)
        finally:
            p.kill()
        took = time.monotonic() - t0
    assert took < 8, (took, stderr)
    assert "Traceback" not in stderr
    if path in ("/metrics", "/slots"):  # read after the attach: the window is kept
        assert p.returncode == 0, stderr
        (rec,) = load_watch_records(out)
        assert rec.draft_steps >= 40 and rec.model_path.endswith("calibrated-p0.3.gguf")
    else:  # read at the attach: nothing was read, one line says which page did not come
        assert p.returncode == 2 and f"GET {path}" in stderr and not out.exists(), stderr


def test_sigterm_keeps_the_window_as_ctrl_c_does(tmp_path):
    out = tmp_path / "watch.jsonl"
    with WatchServer() as srv:
        srv.slow["/metrics"] = 3  # the attach and one reading, then a read that never ends
        p = _watch([srv.url, "--duration", "600", "--interval", "1", "--out", str(out)], tmp_path / "home")
        try:
            assert p.stderr is not None
            seen = ""
            while "watching " not in seen:
                line = p.stderr.readline()
                assert line, seen
                seen += line
            deadline = time.monotonic() + 30
            while srv.counts.get("/metrics", 0) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # the slow read is under way
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            stdout, stderr = p.communicate(timeout=30)
            took = time.monotonic() - t0
        finally:
            p.kill()
    assert took < 3, took
    assert p.returncode == 0, seen + stderr
    assert "ended early" in stderr and "Traceback" not in stderr
    (rec,) = load_watch_records(out)
    assert rec.draft_steps == 40  # the attach's reading to the second one


# ---- 9, 10. positions and JSON built to exhaust the watcher ----------------------------------------


def test_a_position_label_past_the_limit_is_left_out():
    name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
    page = metrics_page(1) + "".join(f'{name}{{position="{p}"}} 7\n'
                                     for p in ("9" * 5000, "100000000000", MAX_POSITIONS))
    t0 = time.monotonic()
    r = parse(page, 0.0)
    t = Tracker()
    t.feed(r)
    t.feed(parse(page, 1.0))
    assert sorted(r.per_pos) == [0, 1, 2] and t.server_k == 3 and len(t.counts().accepted_per_pos) == 3
    assert "100000000000" in r.ignored and str(MAX_POSITIONS) in r.ignored and len(max(r.ignored, key=len)) < 20
    assert time.monotonic() - t0 < 1


def _limited():  # in the child: an old watcher's 10^11-long tuple fails at 4 GiB, not the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def test_hostile_positions_through_the_cli_are_a_note(tmp_path):
    extra = ('llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="100000000000"} 5\n'
             f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{"7" * 5000}"}} 5\n')
    out = tmp_path / "w.jsonl"
    with WatchServer(metrics_extra=extra) as srv:
        r = subprocess.run([sys.executable, "-m", "app", "watch", srv.url, "--duration", "1", "--out", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60, preexec_fn=_limited,
                           env={**os.environ, "MTP_TUNER_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    _no_traceback(r)
    assert f"past {MAX_POSITIONS}" in r.stdout
    (rec,) = load_watch_records(out)
    assert len(rec.accepted_per_pos) == 3


@pytest.mark.parametrize("page,body,ok", [
    ("/props", "[" * 100_000 + "]" * 100_000, False),
    ("/props", '{"model_path": 5, "build_info": ["x"]}', True),
    ("/props", '"just a string"', True),
    ("/slots", "[" * 100_000 + "]" * 100_000, True),
    ("/slots", '[{"id": 0, "id_task": "x", "params": "x"}, {"params": ["y"]}, 7]', True),
    ("/slots", '{"params": {"speculative.types": 5}}', True),
])
def test_hostile_props_or_slots_json_is_one_line_or_ignored(page, body, ok, tmp_path):
    out = tmp_path / "w.jsonl"
    with WatchServer() as srv:
        srv.bodies[page] = body
        r = cli("watch", srv.url, "--duration", "1", "--out", str(out), env={"MTP_TUNER_HOME": str(tmp_path / "h")},
                timeout=60)
    _no_traceback(r)
    if ok:
        assert r.returncode == 0, r.stderr
        assert load_watch_records(out)
    else:
        clean_error(r, "/props", "nested deeper than 64")
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_log_never_holds_the_password(tmp_path, monkeypatch):
    """The CLI writes no log; the window's log (mtp-tuner.log) formats every line through redact."""
    import logging

    from app.core.common.logs import LOGGER, setup_logging

    setup_logging()
    logging.getLogger(LOGGER).warning("shown to the user: GET http://u:%s@127.0.0.1:1/metrics --api-key %s", PW, PW)
    for h in logging.getLogger(LOGGER).handlers:
        h.flush()
    text = log_path().read_text()
    assert "shown to the user" in text and PW not in text


def test_a_server_that_names_no_model_is_priced_by_no_probe():
    """/props without a model path: nothing holds the probe's model against the server's, so no
    probe prices it (before, every llama-server probe on this machine "matched")."""
    from app.core.records.schema import host_info
    from app.core.watch.costs import ServerInfo, mismatch

    rec = server_costs(COSTS, 0.5, model="/m/calibrated-p0.3.gguf", model_size=123)
    here = host_info()
    why = mismatch(rec, ServerInfo("http://127.0.0.1:1/metrics", None, rec.llama_build, True), here)
    assert why is not None and "does not say which model" in why
    assert mismatch(rec, ServerInfo("http://127.0.0.1:1/metrics", "/other/calibrated-p0.3.gguf", rec.llama_build,
                                    False), here) is None
