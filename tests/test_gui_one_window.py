"""One truthful window (issue 56): what the window shows follows the user's choices. Unticking
"Start from my llama-server command" turns the command off (the next sweep's request carries no
user flags and Export drops them); a new model clears the Start page's answer, names whose cost
curve the Machine tab shows and drops Export's Confirm line; with every panel open the window
fits a 1366x768 or 1280x720 screen (Advanced settings and the command box scroll inside it)."""

from __future__ import annotations

import shlex
from pathlib import Path

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
    from app.core.engines.server.binary import bundled_server_binary

    if argv[0] == bundled_server_binary():  # no other llama-server here: the line under it says so, and what to press
        said = window.export_tab.checked_label.text()
        assert "the tuner's own llama-server" in said and 'Machine tab > Get llama.cpp for this machine gets one' in said, said


def _confirm(export, monkeypatch, fast) -> str:
    """Export's Confirm, answered by a recorded llama-server run of the pick (as test_gui_export)."""
    import dataclasses

    import app.core.session.confirm as C
    import app.core.session.sweep as S
    from app.core.records.prompt import Prompt
    from app.core.session.events import RunFinished
    from PySide6.QtCore import QCoreApplication

    from app.core.records.arm import Arm

    pair = [r for r in export.state.verdict.records if r.task == "code" and r.measured_arm in (fast.measured_arm, Arm())]

    def replay(request, cancel):
        for r in pair:  # the plain command's run and the pick's, as llama-server answered them
            yield RunFinished(dataclasses.replace(r, engine="server", llama_build="b9999"))

    monkeypatch.setattr(S, "prepare", lambda req: type("P", (), {"request": req})())
    monkeypatch.setattr(S, "run", replay)
    monkeypatch.setattr(C, "known_prompts", lambda model, f: {"code": Prompt("code", "code", "x")})
    export.confirm_with_server()
    assert export.confirm_job is None or export.confirm_job.wait(10000)
    for _ in range(50):
        QCoreApplication.processEvents()
        if "starting" not in export.confirm_label.text() and export.confirm_label.text():
            break
    assert export.confirm_label.text().startswith("llama-server timed"), export.confirm_label.text()
    return export.confirm_label.text()


def test_a_new_model_or_setting_takes_what_was_derived_from_the_old_one(window, make_model, tmp_path, monkeypatch):
    import dataclasses

    from app.gui.services.sweep import SweepEnd
    from helpers import fake_costs

    state, start, machine, export = window.state, window.start_tab, window.machine_tab, window.export_tab
    demo = state.model
    path = tmp_path / "r.jsonl"
    records = clear_sweep_file(path, model=demo)
    state.set_results(records, path)
    start.running = True  # the page's Tune for me ends with this sweep shown: its answer
    start._sweep_finished(SweepEnd(cancelled=False, shown=True, session=None, status=""))
    assert "code" in start.answer.text()
    state.add_probe(dataclasses.replace(fake_costs({1: 10.0, 2: 11.0, 3: 12.0}, 2.0), model_path=demo))
    assert "not the chosen model" not in machine.probe_verdict.text()
    fast = next(r for r in records if r.task == "code" and r.k == 2)
    export.select("code")
    text = _confirm(export, monkeypatch, fast)
    state.set_shell("powershell")  # the same command in another shell: the line stays
    assert export.confirm_label.text() == text
    export.select("mix")  # another command (the mix's, no MTP flags): the line goes
    assert export.confirm_label.text() == ""
    export.select("code")
    _confirm(export, monkeypatch, fast)
    # another model: the answer, the Confirm line go; the curve says whose it is
    other = make_model(0.0)
    start.choose_model(str(other))
    assert state.model == str(other)
    assert start.answer.text() == ""
    assert export.confirm_label.text() == ""
    whose = machine.probe_verdict.text()
    assert whose.startswith(f"This curve is {Path(demo).name}'s, not the chosen model's ({other.name})"), whose
    assert Path(demo).name in machine.probe_plot.plotItem.titleLabel.text


# room for a title bar and a taskbar: what a 1366x768 or 1280x720 screen leaves the window itself
FRAME = 48


@pytest.mark.parametrize("screen", [(1366, 768), (1280, 720)])
def test_with_every_panel_open_the_window_fits_the_screen(window, qtbot, screen):
    from PySide6.QtWidgets import QApplication, QScrollArea

    width, height = screen
    window.show()
    window.start_tab.command_box.setChecked(True)  # the command box shown (both pages)
    window.sweep_tab.command_box.setChecked(True)
    window.sweep_tab.form.show_advanced(True)  # Sweep > Advanced open
    for i in range(window.tabs.count()):  # every page in turn: the window never needs more than the screen
        window.tabs.setCurrentIndex(i)
        window.resize(width, height - FRAME)
        QApplication.processEvents()
        hint = window.minimumSizeHint()
        assert hint.height() <= height - FRAME and hint.width() <= width, (window.tabs.tabText(i), hint)
        assert window.height() == height - FRAME, (window.tabs.tabText(i), window.height())
    # the pages that grow scroll inside the window; their rows keep their own height (none drawn over another)
    for page in (window.start_tab, window.sweep_tab):
        window.tabs.setCurrentWidget(page)
        QApplication.processEvents()
        area = page.findChild(QScrollArea)
        content = area.widget()
        assert content.height() >= content.minimumSizeHint().height()
        taller = content.minimumSizeHint().height() > area.viewport().height()
        assert (area.verticalScrollBar().maximum() > 0) == taller  # taller than the window: it scrolls


@pytest.mark.parametrize("screen", [(1366, 768), (1366, 720), (1280, 720)])
def test_advanced_keeps_rows_of_its_form_with_the_command_box_open(window, screen):
    """With the Sweep tab's command box open, Advanced was squeezed to about two rows (68 px at
    1366x720). Now it shows at least ADVANCED_ROWS rows of its form, a field's height each, and the
    part above the plots scrolls instead; the window still fits the screen."""
    from PySide6.QtWidgets import QApplication, QFormLayout

    rows = 4  # of its form, at the least (app.gui.tabs.sweep.advanced.ADVANCED_ROWS)
    width, height = screen
    tab = window.sweep_tab
    window.show()
    window.tabs.setCurrentWidget(tab)
    window.resize(width, height - FRAME)
    tab.command_box.setChecked(True)  # the command box open, then Advanced
    tab.form.show_advanced(True)
    for _ in range(3):
        QApplication.processEvents()
    assert window.height() == height - FRAME and window.minimumSizeHint().height() <= height - FRAME
    area = tab.form.advanced_area
    form = tab.form.advanced_groups["Runs"].layout()  # its fields, as drawn in Advanced's view
    fields = [form.itemAt(i, QFormLayout.ItemRole.FieldRole).widget() for i in range(form.rowCount())]
    top = tab.top.viewport()  # drawn in Advanced's view, and that part of it in the window's
    seen = [w for w in fields if w is not None
            and w.mapTo(area.viewport(), w.rect().bottomLeft()).y() <= area.viewport().height()
            and 0 <= w.mapTo(top, w.rect().topLeft()).y() and w.mapTo(top, w.rect().bottomLeft()).y() <= top.height()]
    assert len(seen) >= rows, (len(seen), area.viewport().height())
    assert tab.top.verticalScrollBar().maximum() > 0  # the rest above the plots scrolls
    assert all(p.height() >= 150 for p in tab.plots.widgets)  # the plots are not strips either
