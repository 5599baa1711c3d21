"""The window tells a sweep of placements over RPC workers as one story: the Results banner says
where drafting runs (the sentence recommend prints), the rows judge that placement's setting, and
its command (Export) carries the placement's flags after --rpc."""

from __future__ import annotations

import random

from test_placements import DEFAULT, MTP_LOCAL, OT, RPC_ARG, WORKERS, _runs


def test_the_banner_rows_and_export_follow_the_placement_that_pays(state, qtbot):
    from app.core.verdict.joint import joint_verdict
    from app.gui.story import answers
    from app.gui.tabs.results import ResultsTab

    tab = ResultsTab(state)
    qtbot.addWidget(tab)
    rng = random.Random(4)
    runs = _runs(DEFAULT, 100, 0.5, 0, rng) + _runs(MTP_LOCAL, 100, 1.3, 100, rng) + _runs(WORKERS, 90, 1.3, 200, rng)
    state.set_results(runs, None)
    sentence = joint_verdict(runs).sentence
    assert state.where == sentence and sentence.startswith("over this link keep the MTP block on this machine: K=2")
    assert f"Where drafting runs: {sentence}" in tab.banner.what.text()
    box = tab.setting_box
    assert [box.itemText(i) for i in range(box.count())] == [
        "llama.cpp's own split", "MTP block on this machine", "all but the MTP block on the workers"]
    assert state.setting_index == 1 and box.currentIndex() == 1  # the placement that pays, judged first
    (code,) = answers(state.verdict)
    assert "K=2" in code.line and "turn" in code.line.lower()
    argv = code.command.export.argv  # what Export shows for it
    assert argv[3:7] == (*RPC_ARG, "-ot", OT) and "--spec-type" in argv
    # nothing pays: the reference judged, no placement in the command
    rng = random.Random(6)
    state.set_results(_runs(DEFAULT, 100, 0.4, 0, rng) + _runs(MTP_LOCAL, 100, 0.2, 100, rng), None)
    assert state.setting_index == 0 and state.where.startswith("over this link nothing pays")
    (code,) = answers(state.verdict)
    assert "-ot" not in code.command.export.argv and "--spec-type" not in code.command.export.argv
    # a sweep without placements: no such line
    state.set_results(_runs(DEFAULT, 100, 1.3, 0, rng), None)
    assert state.where == "" and "Where drafting runs" not in tab.banner.what.text()


def test_the_sweep_tab_offers_the_placements_only_over_rpc_workers(state, sweep_tab, make_model):
    """The Sweep tab's "Where drafting runs" (Advanced): disabled, saying why, without workers;
    with the Machine tab's workers, its choice is the request's placements, as bench --placements."""
    from app.core.measure.placements import AUTO, DEFAULT as OWN, DRAFTER_LOCAL, MTP_LOCAL as LOCAL
    from app.core.session.sweep import prepare

    box = sweep_tab.form.placements
    assert [box.itemText(i) for i in range(box.count())] == [
        "llama.cpp's own split only", "try every placement (auto)",
        "drafter-local: drafter on this machine, and the own split",
        "mtp-local: MTP block on this machine, and the own split",
        "workers: all but the MTP block on the workers, and the own split"]
    state.set_model(str(make_model(0.3)))
    box.setCurrentIndex(1)
    assert not box.isEnabled() and "add workers on the Machine tab" in box.toolTip()
    assert sweep_tab.form.request().placements == ()  # no workers: the sweep as before
    state.rpc_workers = ("127.0.0.1:51501", "127.0.0.1:51502")
    state.rpc_workers_changed.emit()
    assert box.isEnabled() and "The verdict names the placement that pays" in box.toolTip()
    request = sweep_tab.form.request()
    assert request.placements == (AUTO,) and request.engine.rpc == state.rpc_workers
    assert prepare(request).request.placements == (AUTO,)  # the session takes it, as from the CLI
    box.setCurrentIndex(3)
    assert sweep_tab.form.request().placements == (OWN, LOCAL)
    box.setCurrentIndex(2)
    assert sweep_tab.form.request().placements == (OWN, DRAFTER_LOCAL)
    box.setCurrentIndex(0)
    assert sweep_tab.form.request().placements == ()
    state.rpc_workers = ()
    state.rpc_workers_changed.emit()
    assert not box.isEnabled()


def test_a_recorded_sweep_of_placements_tells_one_story_on_results_and_export(state, qtbot):
    """A real sweep of placements over two loopback workers on a busy machine
    (tests/data/placements_sweep.jsonl): the banner's "Where drafting runs" line is marked
    provisional as its rows are (never a plain answer above rows that say "for now"); Export shows
    the same line, whose setting its command is for, the command with --rpc and each worker's."""
    from pathlib import Path

    from app.core.records.reader import load_records
    from app.gui.tabs.export import ExportTab
    from app.gui.tabs.results import ResultsTab
    from app.gui.story import State, answers
    from conftest import make_tab

    results, export = ResultsTab(state), make_tab(ExportTab, state)
    qtbot.addWidget(results)
    qtbot.addWidget(export)
    path = Path(__file__).parent / "data" / "placements_sweep.jsonl"
    state.set_results(load_records(str(path), []), path)
    assert all(a.state is State.PROVISIONAL for a in answers(state.verdict))
    line = ("Where drafting runs: over this link nothing pays: no placement makes speculation faster; leave it off "
            "(provisional: measured while the machine was busy)")
    assert line in results.banner.what.text()
    assert export.verdict_label.text().startswith(
        "\u26a0 Provisional command: measured while python was busy, 23 of 25 runs disturbed: provisional; run "
        f"again when quiet to confirm.\n\n{line}\nThe command below is for: llama.cpp's own split\n\nyour task mix")
    text = export.command.toPlainText()
    assert "--rpc 127.0.0.1:46781,127.0.0.1:40443" in text and "-ot" not in text  # nothing pays: no placement
    assert "ggml-rpc-server -H 127.0.0.1 -p 46781" in text and "ggml-rpc-server -H 127.0.0.1 -p 40443" in text
    # the workers' lines are comments of the shell: the box stays a script that runs here
    first, *rest = text.splitlines()
    assert first.startswith(export.current_export.argv[0]) and rest and all(ln.startswith("# ") for ln in rest)
    results.setting_box.setCurrentIndex(1)  # the user judges the MTP block on this machine: its command says so
    results.setting_box.activated.emit(1)
    assert "The command below is for: MTP block on this machine" in export.verdict_label.text()
    assert r"-ot 'blk\.8\.=CPU'" in export.command.toPlainText()
