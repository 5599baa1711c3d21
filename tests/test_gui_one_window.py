"""One truthful window (issue 56): what the window shows follows the user's choices. Unticking
"Start from my llama-server command" turns the command off (the next sweep's request carries no
user flags and Export drops them); a new model clears the Start page's answer, names whose cost
curve the Machine tab shows and drops Export's Confirm line; with every panel open the window
fits a 1366x768 or 1280x720 screen (Advanced settings and the command box scroll inside it)."""

from __future__ import annotations

import shlex

import pytest

pytest.importorskip("PySide6")

from app.core.engines.base import EngineKind  # noqa: E402
from helpers import clear_sweep_file  # noqa: E402

KEPT = ("-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0")


def _paste(window, model, server_bin) -> None:
    box = window.start_tab.command_box
    box.setChecked(True)
    box.edit.setPlainText(f"{shlex.quote(server_bin)} -m {shlex.quote(str(model))} {' '.join(KEPT)}")
    box.use_btn.click()
    assert window.state.own_command.command is not None and window.state.own_command.command.kept == KEPT


@pytest.mark.parametrize("where", ["start_tab", "sweep_tab"])
def test_unticking_the_command_box_turns_the_command_off(window, make_model, server_bin, tmp_path, where):
    model = make_model(0.0)
    _paste(window, model, server_bin)
    state = window.state
    assert state.engine_settings(EngineKind.INPROCESS).user_args == KEPT  # ticked: the sweeps carry it
    getattr(window, where).command_box.setChecked(False)  # the user unticks it (on either page)
    assert state.own_command.command is None
    for box in (window.start_tab.command_box, window.sweep_tab.command_box):
        assert not box.isChecked()  # both boxes say it is off
    # the next sweep's request: Tune for me's and the Sweep tab's carry no user flags
    assert window.start_tab.request().engine.user_args is None
    assert window.sweep_tab.form.request().engine.user_args is None
    assert state.engine_settings(EngineKind.SERVER).user_args is None
    # Export answers with the sweep's own command, not the pasted one
    path = tmp_path / "r.jsonl"
    state.set_results(clear_sweep_file(path, model=str(model)), path)
    window.export_tab.scope_box.setCurrentText("code")
    argv = list(window.export_tab.current_export.argv)
    assert "-ctk" not in argv and "-fa" not in argv, argv
