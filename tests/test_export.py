"""Exported commands: one argv builder, rendered for bash, PowerShell and cmd, parsed back exactly."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.engines.commands import Capabilities, ServerConfig, build_server_argv, parse_help
from app.core.engines.render import render, render_preset, render_script
from app.core.common.errors import UserError
from app.core.verdict.export import CURRENT_CAPS

TRICKY = [
    "/home/u/My Models/qwen 27b.gguf",
    "C:\\Users\\Jo O'Neil\\models\\it's.gguf",
    'a "quoted" name.gguf',
    "$HOME/`whoami`/$(id).gguf",
    "100% sure!.gguf",
    "a&b|c<d>e^f(g).gguf",
    "日本語のモデル ✓.gguf",
    "trailing backslash\\",
    "back\\\\slashes\\\"mixed.gguf",
    "",
    "C:\\Users\\Bob\u2019s PC\\m.gguf",
    "\u2018single\u2019 \u201alow\u201b \u2019\u2019 \u2018'\u2019.gguf",
    "C:\\Users\\Ana Mar\u00eda\\m.gguf",
    "a%b%c %PATH% %%.gguf",
    "C:\\tools\\%x\\m.gguf",
    "tab\there.gguf",
]
# what only a shell whose quotes can hold them carries (bash, PowerShell); cmd refuses them
LINE_BREAKS = ["/models/two\nlines.gguf", "C:\\m\\cr\rhere.gguf", "crlf\r\n.gguf", "esc\x1b[31m.gguf",
               "ctrl-z\x1a.gguf"]


def argv_for(model):
    return build_server_argv("/opt/llama cpp/llama-server", ServerConfig(model, spec_k=3, p_min=0.5),
                             CURRENT_CAPS)


# --- reverse parsers (documented rules) ---------------------------------------------------

# PowerShell's tokenizer takes any of these as a single quote: it opens and closes a single-quoted
# string, and two of them in a row inside one stand for the second (CharExtensions.IsSingleQuote)
PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
# what argument mode takes literally as a bare word: a flag, a plain integer, or a letter-led word
PS_BARE = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*|0|[1-9][0-9]*|[A-Za-z][A-Za-z0-9_.-]*")


def parse_powershell(line: str) -> list[str]:
    """PowerShell's rules for single-quoted strings and bare words; leading call operator '& '."""
    assert line.startswith("& ")
    s, i, out = line[2:], 0, []
    while i < len(s):
        if s[i] == " ":
            i += 1
            continue
        if s[i] in PS_SINGLE_QUOTES:
            i += 1
            buf = []
            while True:
                assert i < len(s), "unterminated single-quoted string"
                if s[i] in PS_SINGLE_QUOTES and i + 1 < len(s) and s[i + 1] in PS_SINGLE_QUOTES:
                    buf.append(s[i + 1])
                    i += 2
                elif s[i] in PS_SINGLE_QUOTES:
                    i += 1
                    break
                else:
                    buf.append(s[i])
                    i += 1
            assert i == len(s) or s[i] == " ", f"the string closed early, before {s[i:i + 20]!r}"
            out.append("".join(buf))
        else:
            j = s.find(" ", i)
            j = len(s) if j < 0 else j
            word = s[i:j]
            assert PS_BARE.fullmatch(word), f"bare word PowerShell may not take literally: {word!r}"
            out.append(word)
            i = j
    return out


def parse_cmd(line: str, script: bool = True) -> list[str]:
    """cmd.exe's layer (^ escapes outside quotes; in a script %% is %, in an open window a % must be
    followed by a quote so that no variable name can start there), then the Microsoft C runtime's
    rules: the program name up to a space outside quotes, no escapes; the arguments with
    backslash-quote escapes. A "" inside quotes (read differently by old and new runtimes) is refused."""
    assert "\n" not in line and "\r" not in line, "a line break ends a cmd command"
    stage, quoted, i = [], False, 0
    while i < len(line):
        c = line[i]
        assert c == "\t" or ord(c) >= 32, f"control character {c!r} in a cmd line"
        if c == '"':
            quoted = not quoted
            stage.append(c)
        elif c == "^" and not quoted:
            i += 1
            stage.append(line[i])
        elif c == "%" and script:
            assert line[i + 1] == "%", "lone % would expand a variable"
            stage.append("%")
            i += 1
        elif c == "%":
            assert line[i + 1:i + 2] == '"', "a % not followed by a quote could start a variable name"
            stage.append("%")
        else:
            assert quoted or c not in "&|<>()", f"unescaped {c!r} at {i}"
            stage.append(c)
        i += 1
    s = "".join(stage)
    n = len(s)
    i, buf, inq = 0, [], False
    while i < n and (inq or s[i] not in " \t"):  # the program name
        if s[i] == '"':
            inq = not inq
        else:
            buf.append(s[i])
        i += 1
    out = ["".join(buf)]
    while i < n:
        while i < n and s[i] in " \t":
            i += 1
        if i >= n:
            break
        buf, inq = [], False
        while i < n and (inq or s[i] not in " \t"):
            if s[i] == "\\":
                j = i
                while j < n and s[j] == "\\":
                    j += 1
                nb = j - i
                if j < n and s[j] == '"':
                    buf.append("\\" * (nb // 2))
                    if nb % 2:
                        buf.append('"')
                        i = j + 1
                    else:
                        i = j
                    continue
                buf.append("\\" * nb)
                i = j
                continue
            if s[i] == '"':
                assert not (inq and i + 1 < n and s[i + 1] == '"'), '"" inside quotes reads differently by runtime'
                inq = not inq
                i += 1
                continue
            buf.append(s[i])
            i += 1
        out.append("".join(buf))
    return out


def bash_argv(argv: list[str]) -> list[str]:
    """What a real bash hands to a program from the bash line for ``argv``: printf runs in front of
    it and writes each argument it gets, NUL-terminated."""
    line = render(["printf", "%s\\0", *argv], "bash")
    r = subprocess.run(["bash", "-c", line], capture_output=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode("utf-8").split("\0")[:-1]


needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")


@needs_bash
@pytest.mark.parametrize("model", TRICKY + LINE_BREAKS)
def test_bash_round_trip_through_real_bash(model):
    argv = argv_for(model)
    assert shlex.split(render(argv, "bash")) == argv
    assert bash_argv(argv) == argv


@pytest.mark.parametrize("model", TRICKY + LINE_BREAKS)
def test_powershell_round_trip(model):
    argv = argv_for(model)
    line = render(argv, "powershell")
    assert parse_powershell(line) == argv
    assert "$" not in line.replace("'$HOME", "").split("'")[0]  # no variable outside quotes


def test_powershell_doubles_typographic_apostrophes():
    """PowerShell closes a single-quoted string at ’ ‘ ‚ ‛ as at ': each is doubled."""
    line = render(["llama-server", "-m", "C:\\Users\\Bob\u2019s PC\\m.gguf"], "powershell")
    assert line == "& 'llama-server' -m 'C:\\Users\\Bob\u2019\u2019s PC\\m.gguf'"
    for q in "\u2018\u2019\u201a\u201b'":
        assert parse_powershell(render(["x", f"a{q}b{q}{q}"], "powershell")) == ["x", f"a{q}b{q}{q}"]


def test_powershell_bare_words_are_only_what_argument_mode_takes_literally():
    # a comma makes an array (two arguments), a number literal may be converted (0x10, 1kb, 1e3)
    for word in ("a,b", "0x10", "1kb", "1e3", "007", "0.50", "C:/m.gguf"):
        assert render(["x", word], "powershell") == f"& 'x' '{word}'"
    assert render(["x", "--ctx-size", "4096", "-fa", "on", "q8_0"], "powershell") == \
        "& 'x' --ctx-size 4096 -fa on q8_0"


@pytest.mark.parametrize("model", TRICKY)
def test_cmd_round_trip(model):
    argv = argv_for(model)
    assert parse_cmd(render(argv, "cmd"), script=False) == argv  # typed or pasted into an open window
    line = script_command(render_script(argv, "cmd"))
    assert parse_cmd(line, script=True) == argv


def test_cmd_percent_differs_between_an_open_window_and_a_script():
    argv = ["C:\\llama\\llama-server.exe", "-m", "C:\\100%\\m.gguf"]
    assert render(argv, "cmd") == 'C:\\llama\\llama-server.exe -m "C:\\100"%"\\m.gguf"'
    assert script_command(render_script(argv, "cmd")) == 'C:\\llama\\llama-server.exe -m "C:\\100%%\\m.gguf"'


@pytest.mark.parametrize("model", LINE_BREAKS + ["bell\a.gguf"])
def test_cmd_refuses_a_line_break_or_control_character_naming_the_argument(model):
    argv = argv_for(model)
    with pytest.raises(UserError, match=r"cmd.*the value of --model.*(line break|control character)"):
        render(argv, "cmd")
    with pytest.raises(UserError, match="--model"):
        render_script(argv, "cmd")


def test_every_shell_refuses_a_nul_that_no_argument_can_hold():
    for shell in ("bash", "powershell", "cmd"):
        with pytest.raises(UserError, match=r"the llama-server path.*NUL"):
            render(["llama\0server", "-m", "m.gguf"], shell)
        with pytest.raises(UserError, match=r"the value of -m .*NUL"):
            render(["llama-server", "-m", "m\0.gguf"], shell)


def test_every_shell_refuses_text_that_is_not_valid_unicode():
    # a file name in another encoding decodes to lone surrogates, which no UTF-8 script can hold
    for shell in ("bash", "powershell", "cmd"):
        with pytest.raises(UserError, match=r"the value of --model is not valid text.*\\udcff"):
            render_script(["llama-server", "--model", "m\udcff.gguf"], shell)


def test_export_command_turns_a_line_break_for_cmd_into_one_clear_error():
    from app.core.analysis.recommend import Pick
    from app.core.verdict.export import export_command

    pick = Pick(scope="mix", arm=None, ratio=None, reason="baseline")
    with pytest.raises(UserError, match="--model"):
        export_command(pick, "C:\\a\nb.gguf", None, None, shell="cmd")
    exp = export_command(pick, "C:\\a\nb.gguf", None, None, shell="powershell")
    assert parse_powershell(exp.command) == list(exp.argv) and "C:\\a\nb.gguf" in exp.argv


# --- saved scripts ------------------------------------------------------------------------

def script_command(data: bytes) -> str:
    """The line of a .cmd script that runs llama-server: the second line, or, in a script that
    switches the code page, the line right after the switch."""
    lines = data.decode("utf-8").split("\r\n")
    assert lines[0] == "@echo off" and lines[-1] == ""
    if "chcp 65001 >nul" in lines:
        return lines[lines.index("chcp 65001 >nul") + 1]
    assert len(lines) == 3, lines
    return lines[1]


def test_cmd_script_switches_to_utf8_and_back_when_the_command_is_not_ascii():
    argv = argv_for("C:\\Users\\Ana Mar\u00eda\\m.gguf")
    data = render_script(argv, "cmd")
    assert not data.startswith(b"\xef\xbb\xbf")  # cmd would read a BOM as part of the first command
    text = data.decode("utf-8")
    assert "\n" not in text.replace("\r\n", "")  # CRLF only
    lines = text.split("\r\n")
    assert lines[0] == "@echo off"
    assert "chcp 65001 >nul" in lines, f"cmd would read Mar\u00eda in the console's code page: {lines}"
    run = lines.index(script_command(data))
    assert "Mar\u00eda" in lines[run]
    before, after = lines[:run], lines[run + 1:]
    assert all(ln.isascii() for ln in before + after)  # read before the switch, or in any code page
    save = next(i for i, ln in enumerate(before) if "('chcp')" in ln)
    switch = before.index("chcp 65001 >nul")
    assert save < switch  # the old code page is read before the switch
    var = re.search(r'set /a "(\w+)=', before[save]).group(1)
    assert any(f"chcp %{var}% >nul" in ln for ln in after)  # and restored after llama-server
    rc = re.fullmatch(r'set "(\w+)=%ERRORLEVEL%"', after[0]).group(1)  # llama-server's exit code
    assert after[-2:] == [f"exit /b %{rc}%", ""]  # comes back from the script


def test_cmd_script_of_an_ascii_command_needs_no_code_page_switch():
    data = render_script(argv_for("C:\\models\\m.gguf"), "cmd")
    assert b"chcp" not in data and data.startswith(b"@echo off\r\n") and data.endswith(b"\r\n")
    assert data.decode("ascii").count("\r\n") == 2


def test_powershell_script_has_a_bom_only_when_not_ascii():
    # Windows PowerShell 5.1 reads a .ps1 without a BOM in the ANSI code page
    data = render_script(argv_for("C:\\Users\\Ana Mar\u00eda\\m.gguf"), "powershell")
    assert data.startswith(b"\xef\xbb\xbf") and data[3:].decode("utf-8").startswith("& ")
    assert parse_powershell(data[3:].decode("utf-8").rstrip("\n")) == argv_for("C:\\Users\\Ana Mar\u00eda\\m.gguf")
    assert render_script(argv_for("m.gguf"), "powershell").startswith(b"& ")


@needs_bash
@pytest.mark.parametrize("model", ["/models/two\nlines.gguf", "cr\rhere.gguf", "Ana Mar\u00eda.gguf"])
def test_bash_script_keeps_line_breaks_inside_quotes(model, tmp_path):
    argv = ["printf", "%s\\0", "-m", model]
    script = tmp_path / "run.sh"
    script.write_bytes(render_script(argv, "bash"))
    r = subprocess.run(["sh", str(script)], capture_output=True, timeout=10)
    assert r.stdout.decode("utf-8").split("\0")[:-1] == argv[2:]


# --- property tests -----------------------------------------------------------------------

ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)
# cmd carries any text without line breaks and control characters (tab is fine)
C0_BUT_TAB = "".join(chr(i) for i in range(32) if i != 9)
CMD_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=C0_BUT_TAB), max_size=40)
QUOTE_HEAVY = st.text(st.sampled_from(list("'\u2018\u2019\u201a\u201b\"\\ %&^()!$`a\n")), max_size=20)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(ANY_TEXT, QUOTE_HEAVY), max_size=6))
def test_powershell_quoting_round_trips_any_text(args):
    argv = ["llama-server", *args]
    assert parse_powershell(render(argv, "powershell")) == argv


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(CMD_TEXT, QUOTE_HEAVY.map(lambda t: t.replace("\n", ""))), max_size=6),
       st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=C0_BUT_TAB + '"'), min_size=1,
               max_size=30))
def test_cmd_quoting_round_trips_any_text_in_a_window_and_in_a_script(args, binary):
    argv = [binary, *args]
    assert parse_cmd(render(argv, "cmd"), script=False) == argv
    assert parse_cmd(script_command(render_script(argv, "cmd")), script=True) == argv


@settings(max_examples=200)
@given(CMD_TEXT, st.sampled_from(C0_BUT_TAB), CMD_TEXT)
def test_cmd_refuses_any_control_character(head, control, tail):
    with pytest.raises(UserError, match="the value of --model"):
        render(["llama-server", "--model", head + control + tail], "cmd")


@needs_bash
@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(ANY_TEXT, QUOTE_HEAVY), min_size=1, max_size=5))
def test_bash_quoting_round_trips_any_text_through_real_bash(args):
    assert bash_argv(args) == args


def test_export_always_has_one_slot_and_mtp_flags():
    argv = argv_for("m.gguf")
    assert argv[argv.index("--parallel") + 1] == "1"
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3"


def test_export_skips_tuning_flags_the_binary_lacks_and_uses_old_names():
    old_help = """
-m,    --model FNAME        model path
-np,   --parallel N         slots
-c,    --ctx-size N         context
--spec-type none,draft-mtp  types
--draft-max, --draft N      draft tokens
--draft-p-min P             p min
"""
    caps = Capabilities(flags=parse_help(old_help), spec_types=frozenset({"draft-mtp"}))
    skipped: list[str] = []
    argv = build_server_argv("llama-server", ServerConfig("m.gguf", spec_k=2, p_min=0.3, n_gpu_layers="999",
                                                          flash_attn="on"), caps, skipped=skipped)
    assert "--draft-max" in argv and "--draft-p-min" in argv
    assert "--spec-draft-n-max" not in argv and "-ngl" not in argv and "--n-gpu-layers" not in argv
    assert skipped == ["--n-gpu-layers", "--flash-attn"]


def test_preset_ini_section():
    text = render_preset(argv_for("/m/q.gguf"))
    assert text.startswith("[mtp-tuner]\n")
    assert "model = /m/q.gguf\n" in text and "spec-draft-n-max = 3\n" in text and "parallel = 1\n" in text


def test_preset_refuses_a_value_with_a_line_break_instead_of_writing_extra_lines():
    """A model path with a line break made the preset's INI grow a line of its own
    (`model = /m/a` then `port = 1.gguf`); now the preset is refused, and the export says why
    while the (quoted) command is still given."""
    from app.core.analysis.recommend import Pick
    from app.core.records.arm import Arm
    from app.core.verdict.export import export_command

    with pytest.raises(ValueError, match="line break"):
        render_preset(argv_for("/m/a\nport = 1.gguf"))
    pick = Pick("mix", Arm(2, 0.0), None, "K=2")
    exp = export_command(pick, "/m/a\nport = 1.gguf", None, None, shell="bash")
    assert exp.preset.startswith("; no preset: the model value") and exp.preset.count("\n") == 1
    assert "port = 1" not in exp.preset.splitlines()
    assert "'/m/a\nport = 1.gguf'" in exp.command
    assert "model = /m/q.gguf\n" in render_preset(argv_for("/m/q.gguf"))  # a plain path as before
