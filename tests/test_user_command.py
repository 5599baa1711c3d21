"""The user's own llama-server command: split as bash, PowerShell and cmd would (quoting, line
continuations), shell metacharacters refused, flags checked against --help and sorted (kept,
replaced while measuring, secret)."""

from __future__ import annotations

import pytest

from app.core.engines.commands import Capabilities
from app.core.engines.render import render
from app.core.engines.shell_split import CommandError, guess_shell, split_command
from app.core.engines.user_command import (help_flags, option_value, parse_argv, read_command_file,
                                           without_options)

HELP = """----- common params -----
-h,    --help, --usage                  print usage and exit
-t,    --threads N                      number of CPU threads
-c,    --ctx-size N                     size of the prompt context
-fa,   --flash-attn [on|off|auto]       set Flash Attention use
-ctk,  --cache-type-k TYPE              KV cache data type for K
-ctv,  --cache-type-v TYPE              KV cache data type for V
-kvo,  --kv-offload, -nkvo, --no-kv-offload
-Cr,   --cpu-range lo-hi                range of CPUs for affinity
--control-vector-layer-range START END
-ot,   --override-tensor <tensor name pattern>=<buffer type>,...
-ncmoe, --n-cpu-moe N                   keep the MoE weights of the first N layers in the CPU
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM
-m,    --model FNAME                    model path to load
-hf,   -hfr, --hf-repo <user>/<model>[:quant]
-lv,   --verbosity, --log-verbosity N   Set the verbosity threshold
-np,   --parallel N                     number of server slots
--host HOST                             IP addresses to listen on
--port PORT                             port to listen (default: 8080)
--api-key KEY                           API key to use for authentication
--api-key-file FNAME                    path to file containing API keys
-hft,  --hf-token TOKEN                 Hugging Face access token
--metrics                               enable prometheus compatible metrics endpoint
--spec-type none,draft-simple,draft-mtp,ngram-mod
--spec-draft-n-max N                    number of tokens to draft
--spec-draft-model, -md, --model-draft FNAME
"""
CAPS = Capabilities(flags=frozenset(help_flags(HELP)), version="b1 (test)", help_text=HELP)
USER = ("llama-server -m M.gguf -ngl 99 --n-cpu-moe 24 -c 131072 -fa on -np 1 -ctk q8_0 -ctv q8_0 "
        "--api-key s3cret --port 8080 --spec-type draft-mtp --spec-draft-n-max 3 -md d.gguf")


def test_help_arity_and_aliases():
    flags = help_flags(HELP)
    assert flags["-c"].arity == 1 and flags["--ctx-size"].aliases == {"-c", "--ctx-size"}
    assert flags["-kvo"].arity == 0 and "--no-kv-offload" in flags["-kvo"].aliases
    assert flags["--cpu-range"].arity == 1  # a lowercase value name, one space after the flag
    assert flags["--control-vector-layer-range"].arity == 2
    assert flags["-ot"].arity == 1 and flags["--spec-type"].arity == 1
    assert flags["-fa"].optional and flags["--metrics"].arity == 0
    assert "-h" in flags and "print" not in flags


def test_sorted_by_owner():
    cmd = parse_argv(split_command(USER)[0], "bash", CAPS)
    assert cmd.model == "M.gguf"
    assert cmd.kept == ("-ngl", "99", "--n-cpu-moe", "24", "-c", "131072", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0")
    assert cmd.replaced == ("-np 1", "--port 8080", "--spec-type draft-mtp", "--spec-draft-n-max 3", "-md d.gguf")
    assert cmd.secrets == ("--api-key",)
    base = cmd.base_argv()
    assert "s3cret" not in base and "--spec-type" not in base and "-md" not in base
    assert base[:3] == ("llama-server", "-m", "M.gguf") and base[base.index("--api-key") + 1] == "<your api-key>"
    assert base.index("-np") < base.index("--port")  # the user's order
    assert "s3cret" not in cmd.note() and "--port 8080" in cmd.note()
    assert cmd.value("ctx_size") == "131072" and cmd.value("n_gpu_layers") == "99" and cmd.value("threads") is None


@pytest.mark.parametrize("text, message", [
    ("llama-server -m M.gguf --flash-atn on", "did you mean --flash-attn"),
    ("llama-server -m M.gguf --nonsense", "word 4 of the command is not a flag of this llama-server (b1 (test))"),
    ("llama-server -m M.gguf -c", "-c (word 4 of the command) needs a value"),
    ("llama-server -m M.gguf stray", "word 4 of the command is not a flag"),
    ("llama-server -c 4096", "names no model"),
    ("llama-server -hf org/model:Q4_K_M", "downloads its model"),
    ("llama-cli -m M.gguf", "must start with llama-server"),
])
def test_problems_one_line(text, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_argv(split_command(text)[0], "bash", CAPS)


def test_values_by_help():
    """-fa's bracketed value is taken only when one follows; --ctx-size=N is two words (llama-server
    takes no '='); a negative number is a value."""
    cmd = parse_argv(["llama-server", "-m", "M", "-fa", "-ngl", "-1", "--ctx-size=512", "-kvo", "-fa", "off"],
                     "bash", CAPS)
    assert cmd.groups[1:] == (("-fa",), ("-ngl", "-1"), ("--ctx-size", "512"), ("-kvo",), ("-fa", "off"))
    assert cmd.value("ctx_size") == "512"


@pytest.mark.parametrize("text", [
    "llama-server -m M.gguf; rm -rf ~", "llama-server -m M.gguf && echo hi", "llama-server -m M.gguf | tee x",
    "llama-server -m M.gguf > log", "llama-server -m $(whoami).gguf", 'llama-server -m "`id`.gguf"',
    "llama-server -m $HOME/M.gguf", 'llama-server -m "${HOME}/M.gguf"', "llama-server -m M.gguf & ",
    "llama-server -m M.gguf\nrm -rf /", "llama-server -m M.gguf # comment",
])
def test_bash_metacharacters_refused(text):
    with pytest.raises(CommandError, match="bash would run or expand"):
        split_command(text, "bash")


def test_metacharacters_in_single_quotes_are_text():
    assert split_command("llama-server -m 'a;b|c$(d)`e`.gguf'")[0] == ["llama-server", "-m", "a;b|c$(d)`e`.gguf"]


@pytest.mark.parametrize("text, shell", [
    ('& "C:\\llama\\llama-server.exe" -m M.gguf; Remove-Item x', "powershell"),
    ("llama-server.exe -m $env:USERPROFILE\\M.gguf", "powershell"),
    ('llama-server.exe -m "$(Get-Location)\\M.gguf"', "powershell"),
    ("llama-server.exe -m M.gguf | Out-File x", "powershell"),
    ("C:\\llama\\llama-server.exe -m M.gguf & del x", "cmd"),
    ("C:\\llama\\llama-server.exe -m %USERPROFILE%\\M.gguf", "cmd"),
    ('C:\\llama\\llama-server.exe -m M.gguf ^\n -c 512 > out.txt', "cmd"),
])
def test_windows_metacharacters_refused(text, shell):
    with pytest.raises(CommandError, match="would run or expand"):
        split_command(text, shell)


@pytest.mark.parametrize("text, shell, argv", [
    ("llama-server \\\n  -m 'my model.gguf' \\\n  -c 4096", "bash",
     ["llama-server", "-m", "my model.gguf", "-c", "4096"]),
    ('llama-server -m "it\'s \\"here\\".gguf" -ot blk\\.4\\.=CPU', "bash",
     ["llama-server", "-m", 'it\'s "here".gguf', "-ot", "blk.4.=CPU"]),
    ("& 'C:\\Program Files\\llama\\llama-server.exe' `\n  -m 'C:\\m\\it''s.gguf' `\n  -c 4096", "powershell",
     ["C:\\Program Files\\llama\\llama-server.exe", "-m", "C:\\m\\it's.gguf", "-c", "4096"]),
    ('"C:\\Program Files\\llama\\llama-server.exe" ^\n  -m "C:\\my models\\M.gguf" ^\n  -ot blk^&x', "cmd",
     ["C:\\Program Files\\llama\\llama-server.exe", "-m", "C:\\my models\\M.gguf", "-ot", "blk&x"]),
])
def test_continuations_and_quoting(text, shell, argv):
    assert guess_shell(text) == shell
    assert split_command(text) == (argv, shell)


ODD = ["llama-server", "-m", "/models/my model's \"best\" 50%.gguf", "-ot", r"blk\.4\.=CPU", "--chat-template-kwargs",
       '{"enable_thinking":false}', "-ts", "1,1", "--alias", "a&b|c^d(e)", "--x", "", "--y", "tab\there", "-ngl", "-1",
       "--z", "back\\slash\\\\", "--w", "$HOME `x` $(y)"]


@pytest.mark.parametrize("shell", ["bash", "powershell", "cmd"])
def test_round_trip_with_render(shell):
    """What the export writes for a shell reads back as the same argv (render's inverse)."""
    assert split_command(render(ODD, shell), shell)[0] == ODD


def test_engine_options_dropped_with_their_values():
    args = ("-c", "4096", "-fa", "on", "--threads=4", "-ngl", "99", "-ctk", "q8_0")
    assert without_options(args, ("ctx_size", "threads", "n_gpu_layers")) == ("-fa", "on", "-ctk", "q8_0")
    assert option_value(args, "threads") == "4" and option_value(args, "cache_type_k") == "q8_0"


def test_command_file(tmp_path):
    f = tmp_path / "serve.sh"
    f.write_text("#!/bin/sh\n# my server\nllama-server -m M.gguf \\\n  -c 4096\n", encoding="utf-8")
    assert split_command(read_command_file(f))[0] == ["llama-server", "-m", "M.gguf", "-c", "4096"]
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (70 * 1024))
    with pytest.raises(Exception, match="more than the 64 KiB"):
        read_command_file(big)


def test_export_is_the_users_command_plus_the_pick():
    """The picked flags after the user's own, in their order; leave it off: their command as it is."""
    from app.core.analysis.recommend import Pick
    from app.core.records.arm import Arm
    from app.core.verdict.export import export_command

    base = parse_argv(split_command(USER)[0], "bash", CAPS).base_argv()
    e = export_command(Pick("code", Arm(3, 0.0, "draft-mtp"), None, ""), "/abs/M.gguf", None, None, base_argv=base,
                       shell="powershell")
    assert e.argv == (*base, "--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-type-k", "q8_0",
                      "--spec-draft-type-v", "q8_0")
    assert "s3cret" not in e.command and "--api-key $env:LLAMA_API_KEY " in e.command and "<your" not in e.command and e.command.startswith("& ")
    off = export_command(Pick("code", None, None, "leave MTP off"), "/abs/M.gguf", None, None, base_argv=base)
    assert off.argv == base
    ngram = export_command(Pick("code", Arm(None, None, "ngram-mod"), None, ""), "/abs/M.gguf", None, None,
                           base_argv=base, thinking=False)
    assert ngram.argv == (*base, "--spec-type", "ngram-mod", "--reasoning", "off")


def test_records_carry_the_flags_and_old_files_read(tmp_path):
    """server_args (schema 7) round-trips through a results file, both readers; a record without
    it (older files, the tuner's own flags) reads as None; compare and the card say "with ..."."""
    import dataclasses
    import json

    from app.core.analysis.compare import server_flags, setting_changes
    from app.core.records.reader import load_records
    from app.core.records.schema import RunRecord
    from helpers import clear_sweep_file

    kept = ("-fa", "on", "-ctk", "q8_0", "-c", "4096")
    plain = clear_sweep_file(tmp_path / "plain.jsonl")
    mine = [dataclasses.replace(r, server_args=kept) for r in plain]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(r.to_json() for r in mine) + "\n", encoding="utf-8")
    assert {r.server_args for r in load_records(path)} == {kept}
    assert RunRecord.from_dict(json.loads(mine[0].to_json())).server_args == kept
    assert {r.server_args for r in load_records(tmp_path / "plain.jsonl")} == {None}
    old = json.loads(plain[0].to_json())
    del old["server_args"]
    assert RunRecord.from_dict(old).server_args is None
    with pytest.raises(ValueError, match="server_args"):
        RunRecord.from_dict({**old, "server_args": "-fa on"})
    assert server_flags(mine) == "with -fa on -ctk q8_0 -c 4096" and server_flags(plain) == ""
    assert ("llama-server flags", "the tuner's own", "with -fa on -ctk q8_0 -c 4096") in setting_changes(plain, mine)


def test_the_card_says_what_was_measured(tmp_path):
    import dataclasses

    from app.core.verdict.card import card_of, setup_line
    from helpers import clear_sweep_file

    runs = [dataclasses.replace(r, server_args=("-fa", "on", "-ctk", "q8_0"), engine="server") for r in
            clear_sweep_file(tmp_path / "r.jsonl")]
    card = card_of(runs)
    assert card.server_flags == "with -fa on -ctk q8_0" and "server engine with -fa on -ctk q8_0 ·" in setup_line(card)


def test_the_cost_probe_gets_the_users_flags(monkeypatch):
    """probe_costs hands llama-server's probe the user's flags (its ServerEngine starts every server
    with them, less -c, -t and -ngl, which the engine writes itself)."""
    from app.core.engines.base import EngineKind, EngineSettings
    from app.core.measure import server_probe
    from app.core.session.cost_probe import probe_costs

    seen = {}
    monkeypatch.setattr(server_probe, "run_server_probe", lambda *a, **kw: seen.update(kw) or iter(()))
    kept = ("-fa", "on", "-c", "4096", "-ctk", "q8_0")
    list(probe_costs(EngineSettings(kind=EngineKind.SERVER, user_args=kept), "/m.gguf"))
    assert seen["user_args"] == kept
    assert without_options(kept, ("ctx_size", "threads", "n_gpu_layers")) == ("-fa", "on", "-ctk", "q8_0")
