"""An exported command keeps a secret as a reference its shell resolves (issue 56): pasted as it
is, ``<your api-key>`` would become the key. bash ``"$LLAMA_API_KEY"``, PowerShell
``$env:LLAMA_API_KEY``, cmd ``"%LLAMA_API_KEY%"``, with one line saying to set it."""

from __future__ import annotations

import os
import subprocess

import pytest

from app.core.engines.render import render, render_script, secret_note

ARGV = ["llama-server", "-m", "/m/a b.gguf", "--api-key", "<your api-key>", "--port", "8081"]


@pytest.mark.parametrize("shell, ref", [("bash", '--api-key "$LLAMA_API_KEY"'),
                                        ("powershell", "--api-key $env:LLAMA_API_KEY"),
                                        ("cmd", '--api-key "%LLAMA_API_KEY%"')])
def test_the_key_is_a_reference_in_each_shell(shell, ref):
    line = render(ARGV, shell, env_secrets=True)
    assert ref in line and "<your" not in line, line
    assert "LLAMA_API_KEY" in (secret_note(ARGV, shell) or "")
    script = render_script(ARGV, shell, env_secrets=True).decode()
    assert ref in script and "%%LLAMA" not in script  # a .cmd script reads %V% as the variable too
    # without env_secrets (the command box showing a pasted command) the placeholder stays
    assert "<your api-key>" in render(ARGV, shell)


def test_bash_passes_the_variables_value_as_one_argument():
    line = render(["printf", "[%s]", "--api-key", "<your api-key>", "--hf-token", "<your hf-token>"], "bash",
                  env_secrets=True)
    env = {**os.environ, "LLAMA_API_KEY": "k e y$1", "HF_TOKEN": "hf_x"}
    out = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=10).stdout
    assert out == "[--api-key][k e y$1][--hf-token][hf_x]"


def test_no_secret_no_note():
    assert secret_note(["llama-server", "-m", "/m.gguf"], "bash") is None
