"""Exported commands: one argv builder, rendered for bash, PowerShell and cmd, parsed back exactly."""

from __future__ import annotations

import shlex

import pytest

from app.core.commands import (Capabilities, ServerConfig, build_server_argv, parse_help, render,
                               render_preset)
from app.core.report import CURRENT_CAPS

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
]


def argv_for(model):
    return build_server_argv("/opt/llama cpp/llama-server", ServerConfig(model, spec_k=3, p_min=0.5),
                             CURRENT_CAPS)


# --- reverse parsers (documented rules) ---------------------------------------------------

def parse_powershell(line: str) -> list[str]:
    """Single-quoted strings ('' is a quote), bare words; leading call operator '& '."""
    assert line.startswith("& ")
    s, i, out = line[2:], 0, []
    while i < len(s):
        if s[i] == " ":
            i += 1
            continue
        if s[i] == "'":
            i += 1
            buf = []
            while True:
                if s[i] == "'" and i + 1 < len(s) and s[i + 1] == "'":
                    buf.append("'")
                    i += 2
                elif s[i] == "'":
                    i += 1
                    break
                else:
                    buf.append(s[i])
                    i += 1
            out.append("".join(buf))
        else:
            j = s.find(" ", i)
            j = len(s) if j < 0 else j
            word = s[i:j]
            assert not set(word) & set("$`'\"&|<>(){};@#"), word
            out.append(word)
            i = j
    return out


def parse_cmd(line: str) -> list[str]:
    """cmd.exe script layer (^ escapes outside quotes, %% is %), then CommandLineToArgvW rules."""
    stage, quoted, i = [], False, 0
    while i < len(line):
        c = line[i]
        if c == '"':
            quoted = not quoted
            stage.append(c)
        elif c == "^" and not quoted:
            i += 1
            stage.append(line[i])
        elif c == "%":
            assert line[i + 1] == "%", "lone % would expand a variable"
            stage.append("%")
            i += 1
        else:
            assert quoted or c not in "&|<>()", f"unescaped {c!r} at {i}"
            stage.append(c)
        i += 1
    s = "".join(stage)
    out, i, n = [], 0, len(s)
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
                if inq and i + 1 < n and s[i + 1] == '"':
                    buf.append('"')
                    i += 2
                    continue
                inq = not inq
                i += 1
                continue
            buf.append(s[i])
            i += 1
        out.append("".join(buf))
    return out


@pytest.mark.parametrize("model", TRICKY)
def test_bash_round_trip(model):
    argv = argv_for(model)
    assert shlex.split(render(argv, "bash")) == argv


@pytest.mark.parametrize("model", TRICKY)
def test_powershell_round_trip(model):
    argv = argv_for(model)
    line = render(argv, "powershell")
    assert parse_powershell(line) == argv
    assert "$" not in line.replace("'$HOME", "").split("'")[0]  # no variable outside quotes


@pytest.mark.parametrize("model", TRICKY)
def test_cmd_round_trip(model):
    argv = argv_for(model)
    assert parse_cmd(render(argv, "cmd")) == argv


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
