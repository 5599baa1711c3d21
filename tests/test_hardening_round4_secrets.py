"""Hardening round four (issue 53), secrets in new spellings and a results file's own flags:
secrets are found by their shape as well as their name (a URL's password, a JSON value whose key
looks like a key, token, secret or password, the value after any secret flag however the words
around it are parsed), and one function (common.redact) masks them wherever text leaves: the
records written and read, llama-server's own lines, the CLI's streams, the window's box, and the
exported commands that the report and the card show. A results file's ``server_args`` are outside
text: only the flags the rule for the user's command keeps reach a command, a report or a card,
never one the measurement owns (defect 21). Real CLI processes, a real llama-server, real files."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from app.core.common.redact import MASK, redact
from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter
from helpers import clear_sweep_file, cli, make_record

WEBUI = "sk-webui-SEKRET-0815"
URL_PW = "url-SEKRET-4711"
KEY = "key-SEKRET-1234"
KEY2 = "alias-SEKRET-5678"
HFT = "hft-SEKRET-9012"
HF = "hf_SEKRETabcdefghijklmnop0123"
NESTED = "nested-SEKRET-3456"
SECRETS = (WEBUI, URL_PW, KEY, KEY2, HFT, HF, NESTED, "SEKRET")
MMU_URL = f"https://user:{URL_PW}@127.0.0.1:18401/mmproj.gguf"
WEBUI_JSON = json.dumps({"apiKey": WEBUI, "theme": "dark", "auth": {"password": NESTED}})
# what a results file someone sent may hold in server_args: a kept flag, secrets in every spelling,
# and the flags the measurement owns
HOSTILE_ARGS = ["-fa", "on", "--webui-config", WEBUI_JSON, "-mmu", MMU_URL, "--api-key", KEY, "--hf-token", HF,
                f"-hft={HFT}", "-a", "--api-key", KEY2, "--host", "0.0.0.0", "--port", "18499", "-np", "4",
                "--metrics", "--log-file", "/tmp/mtp-owned.log", "--slots", "-m", "/other/model.gguf",
                "--spec-type", "draft-mtp", "--rpc", "10.9.9.9:50052"]
OWNED = ("--host", "0.0.0.0", "--port", "18499", "-np", "--metrics", "--log-file", "/tmp/mtp-owned.log", "--slots",
         "/other/model.gguf", "--rpc", "10.9.9.9:50052")


def _no_secret(text: str) -> None:
    for s in SECRETS:
        assert s not in text, (s, text)


# ---- secrets by shape and by name -------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    f'--webui-config {{"apiKey":"{WEBUI}"}}',
    f"--webui-config '{{\"apiKey\": \"{WEBUI}\", \"x\": 1}}'",
    f'{{"a": [{{"b": {{"client_secret": "{NESTED}"}}}}]}}',  # any nesting
    f'{{\\"auth\\":{{\\"password\\":\\"{NESTED}\\"}}}}',  # JSON inside a JSON string
    f'{{""token"":""{NESTED}""}}',  # cmd's doubled quotes
    f"{{'password': 'a\\'{NESTED}'}}",  # single quotes, an escaped quote inside
    f'{{"credentials": {{"user": "u", "pw": "{NESTED}"}}, "n": 2}}',  # an object under a secret key: whole
    f"{{apiKey: '{WEBUI}'}}",  # JSON5: no quotes on the key
    f"-mmu {MMU_URL}",
    f"http://h:1/x?token={NESTED}&y=2",
    f"--hf-token {HF}", f"-hft {HFT}", f"-hft={HFT}", f"--api-key={KEY}",
    f"-a --api-key {KEY}",  # the key is masked however -a is parsed
    f"--api-key --hf-token {HFT}",
    f"llama-server: error: failed to download {MMU_URL}: Connection refused",
])
def test_secrets_by_shape_and_name_are_masked(text):
    out = redact(text)
    _no_secret(out)
    assert MASK in out


def test_what_is_no_secret_stays():
    for text in ("--override-kv tokenizer.ggml.add_bos_token=bool:false", "give the key with --api-key-file FILE",
                 "press any key: continue", "print_info: BOS token        = 1 '<s>'", '{"max_tokens": 5}',
                 "llama-server --api-key '<your api-key>' -fa on", "see http://127.0.0.1:8080/health"):
        assert redact(text) == text


def test_an_argument_list_is_masked_however_it_is_parsed():
    from app.core.common.redact import redact_args

    args = ["-a", "--api-key", KEY, "-fa", "on", f"-hft={HFT}", "--hf-token", "--api-key", KEY2,
            "--webui-config", WEBUI_JSON, "-mmu", MMU_URL, "--api-key", "<your api-key>"]
    out = redact_args(args)
    _no_secret(" ".join(out))
    assert out[:5] == ("-a", "--api-key", MASK, "-fa", "on") and out[-2:] == ("--api-key", "<your api-key>")
    assert len(out) == len(args)


# ---- the records written and read ---------------------------------------------------------------------


def test_the_records_writer_and_reader_mask_secrets(tmp_path):
    """A run record's flags and error (llama-server's own lines quoting -mmu's URL) are written
    masked; a file written by another hand is masked as it is read."""
    path = tmp_path / "r.jsonl"
    rec = make_record(server_args=tuple(HOSTILE_ARGS), status="failed",
                      error=f"llama-server exited during start-up: failed to download {MMU_URL}")
    with ResultsWriter(path) as w:
        w.append(rec)
    raw = path.read_text(encoding="utf-8")
    _no_secret(raw)
    assert "-fa" in raw and "--webui-config" in raw  # the flags are there, their secrets not
    hand = tmp_path / "hand.jsonl"
    hand.write_text(rec.to_json() + "\n", encoding="utf-8")  # as another program writes it
    assert WEBUI in hand.read_text(encoding="utf-8")
    (got,) = load_records(hand)
    _no_secret(" ".join(got.server_args or ()) + str(got.error))


# ---- a results file someone sent: recommend, its report, card --------------------------------------


def _hostile_file(tmp_path: Path, model: str) -> Path:
    """A sweep written by hand: each run's server_args hold secrets and owned flags (as JSON, the
    way a file from elsewhere holds them, not through the app's writer)."""
    path = tmp_path / "sent.jsonl"
    clear_sweep_file(path, model=model)
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        d["server_args"] = HOSTILE_ARGS
        d["engine"] = "server"
        lines.append(json.dumps(d))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.server
def test_a_results_file_echoes_no_secret_and_no_owned_flag(tmp_path, make_model, server_bin):
    """Defect 4 (a file's server_args with --api-key, --hf-token, credentials, --webui-config's
    apiKey) and defect 21 (owned flags in the command to paste): recommend's text, JSON and
    report, card's JSON and row hold none of them; the kept flag (-fa on) stays."""
    model = str(make_model(0.3))
    path = _hostile_file(tmp_path, model)
    report = tmp_path / "report.md"
    text = cli("recommend", str(path), "--server-bin", server_bin, "--report", str(report))
    assert text.returncode == 0, text.stderr
    js = cli("recommend", str(path), "--server-bin", server_bin, "--json")
    assert js.returncode == 0, js.stderr
    card = cli("card", str(path), "--json")
    assert card.returncode == 0, card.stderr
    row = cli("card", str(path))
    assert row.returncode == 0, row.stderr
    seen = "".join(r.stdout + r.stderr for r in (text, js, card, row)) + report.read_text(encoding="utf-8")
    _no_secret(seen)
    d = json.loads(js.stdout)
    argvs = [d["argv"], *(t["argv"] for t in d["per_task"])]
    for argv in argvs:
        assert argv is not None and argv[1:3] == ["-m", model]
        assert argv[argv.index("-fa") + 1] == "on"
        assert not set(OWNED) & set(argv), argv
        assert argv.count("-m") == 1 and not set(argv) & {"-a", "--api-key", "--hf-token", "-hft"}
    commands = [d["command"], *(t["command"] for t in d["per_task"])]
    in_report = report.read_text(encoding="utf-8")
    for owned in ("--port", "--host", "--metrics", "--log-file", "--slots", "/other/model.gguf", "10.9.9.9"):
        assert owned not in in_report and not any(owned in c for c in commands), owned
    flags = json.loads(card.stdout)["server_flags"]
    assert flags.startswith("with -fa on") and "--port" not in flags and "--metrics" not in flags, flags


@pytest.mark.server
def test_a_real_sweep_with_webui_configs_api_key_records_and_prints_none(tmp_path, make_model, server_bin):
    """``bench --server-command "... --webui-config '{"apiKey":"sk-..."}'"``, a real short sweep:
    whether the flag is measured with or refused, no secret is printed or recorded, and
    recommend on the file prints and reports none."""
    model = make_model(0.3)
    out = tmp_path / "r.jsonl"
    cmd = (f"{shlex.quote(server_bin)} -m {shlex.quote(str(model))} --webui-config {shlex.quote(WEBUI_JSON)} "
           "-fa on -c 512")
    r = cli("bench", "--server-command", cmd, "--k", "2", "--tasks", "code", "--reps", "1", "--n-predict", "16",
            "--out", str(out), timeout=600)
    assert "Traceback" not in r.stderr and "--webui-config" in r.stdout + r.stderr
    _no_secret(r.stdout + r.stderr)
    if r.returncode != 0:  # refused: one line naming the flag, nothing measured
        assert not out.exists()
        return
    _no_secret(out.read_text(encoding="utf-8"))
    report = tmp_path / "report.md"
    rec = cli("recommend", str(out), "--server-bin", server_bin, "--report", str(report))
    assert "Traceback" not in rec.stderr
    _no_secret(rec.stdout + rec.stderr + (report.read_text(encoding="utf-8") if report.exists() else ""))


# ---- the user's own command: -mmu's URL and llama-server's own lines ------------------------------


@pytest.mark.server
def test_llama_servers_own_lines_quoting_the_url_are_masked(tmp_path, make_model, server_bin):
    """A server started with -mmu URL (a password in it) fails fetching it; its own lines, the
    start error and the server's log file hold no password."""
    from app.core.common.cancel import CancelToken
    from app.core.common.errors import EngineError
    from app.core.engines.commands import ServerConfig
    from app.core.engines.server.binary import probe_capabilities
    from app.core.engines.server.process import ServerProcess

    caps = probe_capabilities(server_bin)
    cfg = ServerConfig(model=str(make_model(0.3)), ctx_size=512, extra=("-mmu", MMU_URL))
    log = tmp_path / "server.log"
    srv = ServerProcess(server_bin, caps, cfg, log_path=log)
    try:
        with pytest.raises(EngineError) as e:
            srv.start(CancelToken(), timeout=60)
    finally:
        srv.stop()
    lines = "\n".join(srv.log)
    assert "127.0.0.1:18401" in lines + str(e.value)  # the server did quote the URL
    _no_secret(str(e.value) + lines + log.read_text(encoding="utf-8"))


@pytest.mark.server
def test_the_cli_prints_no_password_of_a_commands_url(tmp_path, make_model, server_bin):
    """``probe --server-command "llama-server -m M -mmu https://u:pw@..."``: whatever is done with
    the flag (measured with, or refused), neither the note, the server's lines nor the error
    shows the password."""
    model = make_model(0.3)
    cmd = f"{shlex.quote(server_bin)} -m {shlex.quote(str(model))} -mmu {shlex.quote(MMU_URL)} -c 512"
    r = cli("probe", "--server-command", cmd, "--out", str(tmp_path / "p.jsonl"), timeout=240)
    assert "Traceback" not in r.stderr
    assert "-mmu" in r.stdout + r.stderr  # the flag is named
    _no_secret(r.stdout + r.stderr)
    if (tmp_path / "p.jsonl").exists():
        _no_secret((tmp_path / "p.jsonl").read_text(encoding="utf-8"))


def test_the_windows_box_shows_no_password(window, make_model, server_bin):
    pytest.importorskip("PySide6")
    model = make_model(0.3)
    box = window.start_tab.command_box
    box.setChecked(True)
    box.edit.setPlainText(f"{shlex.quote(server_bin)} -m {shlex.quote(str(model))} -mmu {shlex.quote(MMU_URL)} "
                          f"--webui-config {shlex.quote(WEBUI_JSON)} -fa on")
    box.use_btn.click()
    assert box.status.text()
    _no_secret(box.status.text() + (window.state.last_error or ""))


# ---- the command to paste: the user's command and a setting's flags from the file ----------------


def test_the_exported_command_masks_a_secret_of_the_users_own_command():
    """recommend --server-command with --webui-config's apiKey and -mmu's password: the command,
    its preset and argv hold neither; the placeholder for --api-key stays."""
    from app.core.analysis.recommend import Pick
    from app.core.records.arm import Arm
    from app.core.verdict.export import export_command

    base = ("llama-server", "-m", "/abs/M.gguf", "-fa", "on", "--webui-config", WEBUI_JSON, "-mmu", MMU_URL,
            "--api-key", "<your api-key>")
    e = export_command(Pick("code", Arm(2, 0.0, "draft-mtp"), None, ""), "/abs/M.gguf", None, None, base_argv=base)
    _no_secret(e.command + e.preset + " ".join(e.argv))
    assert e.argv[e.argv.index("--api-key") + 1] == "<your api-key>" and "-fa" in e.argv


def test_a_settings_flags_from_the_file_bring_no_owned_flag():
    """Defect 21 through an axis sweep: the flags that set one setting apart (settings.flag_difference
    of the file's server_args) join the user's command only where the rule keeps them."""
    from app.core.verdict.joint import with_setting

    base = ("llama-server", "-m", "/abs/M.gguf", "-fa", "on", "-ub", "64")
    out = with_setting(base, [("-ub", "128"), ("--port", "18499"), ("--host", "0.0.0.0"), ("--metrics",),
                              ("--api-key", KEY), ("-m", "/other/model.gguf")], None)
    assert out == ("llama-server", "-m", "/abs/M.gguf", "-fa", "on", "-ub", "128"), out


@pytest.mark.parametrize("shell", ["bash", "powershell", "cmd"])
def test_the_exported_commands_variable_stays_and_its_json_stays_json(shell):
    """The exported command reads a secret from a variable (render.secret_reference); the CLI's
    output passes through redact, which masked the reference (`--api-key [redacted]`) and, inside
    a --json answer, only the backslash of its escaped quote, breaking the JSON (`recommend
    --server-command ... --json` could not be read: seen in CI). The reference stays, a real key
    beside it is masked whole, and the JSON still parses."""
    from app.core.common.redact import redact
    from app.core.engines.render import render

    argv = ["llama-server", "-m", "m.gguf", "--api-key", "<your api-key>", "--hf-token", "<your hf-token>"]
    text = render(argv, shell, env_secrets=True)
    assert redact(text) == text and "LLAMA_API_KEY" in text and "HF_TOKEN" in text
    answer = json.dumps({"command": text, "argv": argv})
    assert json.loads(redact(answer)) == {"command": text, "argv": argv}
    leaked = json.dumps({"command": 'llama-server --api-key "sk-live-123456" -m m.gguf'})
    assert json.loads(redact(leaked)) == {"command": "llama-server --api-key [redacted] -m m.gguf"}
