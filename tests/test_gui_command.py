"""The window's "Start from my llama-server command" box: a pasted command is read, checked and
taken by the state (the Start page and the Sweep tab show it alike), sweeps then run llama-server
with its flags, and Export answers with it; a problem is one line; secrets are never shown."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

pytest.importorskip("PySide6")

from app.core.engines.base import EngineKind  # noqa: E402
from helpers import clear_sweep_file  # noqa: E402

KEPT = ("-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-c", "4096")
SECRET = "pasted-secret-0815"


def test_a_pasted_command_is_the_sweeps_and_the_answers(window, make_model, server_bin, tmp_path):
    model = make_model(0.0)
    box = window.start_tab.command_box
    assert not box.isChecked() and not box.use_btn.isEnabled()  # folded until ticked
    box.setChecked(True)
    box.edit.setPlainText(f"{shlex.quote(server_bin)} \\\n  -m {shlex.quote(str(model))} {' '.join(KEPT)} \\\n"
                          f"  --port 8081 --api-key {SECRET} --spec-type ngram-mod")
    box.use_btn.click()
    state = window.state
    assert state.own_command.command is not None and state.own_command.command.kept == KEPT and state.model == str(model)
    other = window.sweep_tab.command_box  # the Sweep tab's box shows the same command
    for b in (box, other):
        assert "replaced while measuring: --port 8081, --spec-type ngram-mod" in b.status.text()
        assert SECRET not in b.edit.toPlainText() + b.status.text() and "<your api-key>" in b.edit.toPlainText()
    settings = state.engine_settings(EngineKind.INPROCESS)
    assert settings.kind is EngineKind.SERVER and settings.user_args == KEPT and settings.ctx_size == 4096
    assert settings.server_bin == server_bin
    # the answer: the user's command (port and key placeholder kept) plus the picked flags
    path = tmp_path / "r.jsonl"
    records = [dataclasses.replace(r, server_args=KEPT) for r in clear_sweep_file(path, model=str(model))]
    state.set_results(records, path)
    window.export_tab.scope_box.setCurrentText("code")
    argv = list(window.export_tab.current_export.argv)
    assert argv == [server_bin, "-m", str(model), *KEPT, "--port", "8081", "--api-key", "<your api-key>",
                    "--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "--spec-draft-type-k", "q8_0",
                    "--spec-draft-type-v", "q8_0"]
    assert SECRET not in window.export_tab.command.toPlainText()
    # pasted as it is, the command reads the key from a variable the shell resolves, and says to set it
    for shell, ref in (("bash", '--api-key "$LLAMA_API_KEY"'), ("powershell", "--api-key $env:LLAMA_API_KEY"),
                       ("cmd", '--api-key "%LLAMA_API_KEY%"')):
        state.set_shell(shell)
        shown = window.export_tab.command.toPlainText()
        assert ref in shown and "<your api-key>" not in shown and SECRET not in shown, shown
        assert shown.splitlines()[0].startswith(("# set LLAMA_API_KEY", "REM set LLAMA_API_KEY")), shown
    box.clear_btn.click()
    assert state.own_command.command is None and state.engine_settings(EngineKind.INPROCESS).user_args is None


def test_a_bad_command_is_one_line_and_changes_nothing(window, make_model):
    box = window.sweep_tab.command_box
    box.setChecked(True)
    box.edit.setPlainText(f"llama-server -m {make_model(0.0)} -c 512; rm -rf ~")
    box.use_btn.click()
    assert window.state.own_command.command is None
    assert "would run or expand; nothing is run here" in box.status.text() and "\n" not in box.status.text()
