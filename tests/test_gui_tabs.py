"""The window's tabs beyond the basic sweep: prompts, model search and download, live plots, results
history and exports, the export tab's files and llama-server confirmation, the adaptive mode, the
log and the one-dialog crash path, light/dark plots."""

from __future__ import annotations

import csv
import json
import logging
import subprocess
import sys

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QObject, Signal  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.core.common.paths import results_dir, user_prompts_path  # noqa: E402
from conftest import HUB_REPO, ROOT  # noqa: E402


def _small(win, k="1,2", n=32, reps=2, tasks=("code", "story")):
    win.sweep_tab.form.k_edit.setText(k)
    win.sweep_tab.form.npredict.setValue(n)
    win.sweep_tab.form.reps.setValue(reps)
    win.sweep_tab.form.per_task.setValue(1)
    for t, cb in win.sweep_tab.form.task_boxes.items():
        cb.setChecked(t in tasks)


def _sweep(win, qtbot, **kw):
    _small(win, **kw)
    with qtbot.waitSignal(win.state.sweep_finished, timeout=120000):
        win.sweep_tab.start_btn.click()


def _rows(table):
    return [[table.item(r, c).text() for c in range(table.columnCount())] for r in range(table.rowCount())]


def _col(table, header):
    """The column of a table with this header (the columns come from the core's field lists)."""
    return [table.horizontalHeaderItem(c).text().strip() for c in range(table.columnCount())].index(header)


# -- prompts --------------------------------------------------------------------------------
def test_own_prompts_are_saved_offered_as_a_task_and_swept(window, qtbot, tmp_path):
    win = window
    win.prompts_tab.new_prompt()
    win.prompts_tab.prompt_id.setText("mine-sql")
    win.prompts_tab.prompt_task.setCurrentText("sql")
    win.prompts_tab.prompt_text.setPlainText("Write a SQL query that lists the ten best customers by revenue.")
    win.prompts_tab.save_prompt()
    saved = json.loads(user_prompts_path().read_text())
    assert saved == [{"id": "mine-sql", "task": "sql", "text": win.prompts_tab.prompt_text.toPlainText(), "lang": ""}]
    assert ["mine-sql", "sql", "", "yours"] == _rows(win.prompts_tab.prompt_table)[-1][:4]
    assert "sql" in win.sweep_tab.form.task_boxes  # a new task type is offered in the sweep
    # export, delete, import back
    out = tmp_path / "exported.json"
    win.prompts_tab.export_prompts(str(out))
    assert json.loads(out.read_text())[0]["id"] == "mine-sql"
    win.prompts_tab.prompt_id.setText("mine-sql")
    win.prompts_tab.delete_prompt()
    assert not win.prompts_tab.user_prompt_list and "sql" not in win.sweep_tab.form.task_boxes
    win.prompts_tab.import_prompts(str(out))
    assert [q.id for q in win.prompts_tab.user_prompt_list] == ["mine-sql"]
    # the sweep runs the user's task with its prompt
    _sweep(win, qtbot, k="1", n=16, reps=1, tasks=("sql",))
    assert {r.prompt_id for r in win.state.records} == {"mine-sql"} and all(r.status == "ok" for r in win.state.records)


def test_bad_prompt_input_is_one_clear_message(window, tmp_path):
    win = window
    win.prompts_tab.new_prompt()
    win.prompts_tab.prompt_id.setText("x")
    win.prompts_tab.save_prompt()
    assert win.state.last_error == "the prompt needs text"
    bad = tmp_path / "bad.json"
    bad.write_text("[{\"id\": \"a\"}]")
    win.prompts_tab.import_prompts(str(bad))
    assert str(bad) in win.state.last_error and "missing task, text" in win.state.last_error
    win.prompts_tab.prompt_id.setText("story-en-cats")
    win.prompts_tab.delete_prompt()
    assert "only your own prompts" in win.state.last_error


# -- model: search, files with fit badges, download ------------------------------------------
def test_search_list_files_and_download_from_a_hub(window, qtbot, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    win = window
    win.model_tab.search_edit.setText("tiny-mtp")
    win.model_tab.search_models()
    qtbot.waitUntil(lambda: win.model_tab.search_btn.isEnabled(), timeout=20000)
    repos = [r[0] for r in _rows(win.model_tab.repos)]
    assert repos == [HUB_REPO]
    win.model_tab.repos.selectRow(0)
    qtbot.waitUntil(lambda: win.model_tab.files.rowCount() == 3, timeout=20000)
    files = {r[0]: r for r in _rows(win.model_tab.files)}
    assert set(files) == {"Q8_0", "F16", "Q4_K_M"}
    assert files["Q8_0"][2] in ("fits in RAM (CPU)", "fits on GPU")  # a fit badge
    assert "(2 parts)" in files["Q4_K_M"][3]
    win.model_tab.files.selectRow([r[0] for r in _rows(win.model_tab.files)].index("Q8_0"))
    with qtbot.waitSignal(win.model_tab.download_finished, timeout=30000):
        win.model_tab.download_btn.click()
    path = win.model_tab.model_edit.text()
    assert path.endswith("tiny-Q8_0.gguf") and "sha256 verified; MTP heads present" in win.model_tab.download_label.text()
    assert path in [r[0] for r in _rows(win.model_tab.library)]
    assert "MTP heads: yes" in win.model_tab.model_info.toPlainText()
    assert [r[0] for r in _rows(win.model_tab.fit_table)] == ["baseline", "mtp"]


def test_hub_unreachable_is_one_message_and_the_catalog_still_shows(window, qtbot):
    win = window  # conftest points HF_ENDPOINT at a dead port
    win.model_tab.search_edit.setText("qwen3.6")
    win.model_tab.search_models()
    assert any("Qwen3.6-27B" in r[0] for r in _rows(win.model_tab.repos))  # the catalog answers at once
    qtbot.waitUntil(lambda: win.model_tab.search_btn.isEnabled(), timeout=30000)
    assert "127.0.0.1:9" in win.model_tab.download_label.text()
    assert any("Qwen3.6-27B" in r[0] for r in _rows(win.model_tab.repos))


# -- sweep: live plots; results: history, compare, exports; export tab ------------------------
def test_live_plots_exports_history_and_compare(window, qtbot, tmp_path):
    win = window
    _sweep(win, qtbot)
    first = win.state.results_path
    # live plots hold the same acceptance and speedups as the table
    table = {(r[0], r[1]): r for r in _rows(win.results_tab.table)}
    acc, spd = _col(win.results_tab.table, "accept"), _col(win.results_tab.table, "speedup [95% CI]")
    xs, ys = win.sweep_tab.plots.acc_items["code"].getData()
    assert list(xs) == [1, 2] and [f"{y:.0f}%" for y in ys] == [table[("code", "K=1")][acc], table[("code", "K=2")][acc]]
    pts, bars = win.sweep_tab.plots.speedup_items["story"]
    assert [f"{y:.2f}x" for y in pts.getData()[1]] == [table[("story", "K=1")][spd].split()[0],
                                                       table[("story", "K=2")][spd].split()[0]]
    assert bars.opts["top"] is not None and len(bars.opts["top"]) == 2
    assert [round(x) for x in pts.getData()[0]] == [1, 2]  # beside K, shifted per task
    assert win.sweep_tab.plots.speed_plot.title.startswith("Last run: ") and win.sweep_tab.progress_label.text().endswith(", done")
    assert len(win.sweep_tab.plots.speed_curve.getData()[0]) > 0  # the last run's tok/s over time
    # exports
    p_csv, p_json = win.results_tab.export_data("csv", str(tmp_path / "t.csv")), win.results_tab.export_data("json", str(tmp_path / "t.json"))
    rows = list(csv.DictReader(open(p_csv)))
    assert len(rows) == win.results_tab.table.rowCount() and rows[1]["arm"] == _rows(win.results_tab.table)[1][1]
    assert len(json.loads(open(p_json).read())["cells"]) == win.results_tab.table.rowCount()
    png, svg = win.results_tab.export_plot("png", str(tmp_path / "b.png")), win.results_tab.export_plot("svg", str(tmp_path / "b.svg"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and "<svg" in open(svg).read()
    md = open(win.results_tab.export_report(str(tmp_path / "r.md"))).read()
    assert md.startswith("# MTP Tuner report") and "--parallel 1" in md
    script = win.export_tab.save_script(str(tmp_path / "run.sh"))
    text = open(script).read()
    assert text.startswith("#!/bin/sh\n") and win.export_tab.command.toPlainText() in text
    assert "parallel" in open(win.export_tab.save_preset(str(tmp_path / "p.ini"))).read()
    # a second sweep, then history: open the first and compare with the second
    _sweep(win, qtbot, k="2")
    second = win.state.results_path
    win.results_tab.refresh_history()
    assert {win.results_tab.history_box.itemData(i) for i in range(win.results_tab.history_box.count())} >= {str(first), str(second)}
    win.results_tab.open_results(str(first))
    assert win.results_tab.table.rowCount() == 6 and win.state.results_path == first
    win.results_tab.compare_results(str(second))
    comp = {(r[0], r[1]): r for r in _rows(win.results_tab.compare_table)}
    assert comp[("code", "K=2")][2] and comp[("code", "K=2")][3]  # tok/s in both
    assert comp[("code", "K=1")][3] == "-"  # only in the first
    assert "only the measurements differ" in win.results_tab.compare_label.text()  # same build, model, settings
    # equivalence: greedy MTP gives the baseline's tokens
    assert {r[4] for r in _rows(win.results_tab.equiv_table)} == {"yes"}


def test_run_again_repeats_the_shown_sweep_and_compares(window, qtbot):
    win = window
    _sweep(win, qtbot, k="1,2", n=16, reps=2, tasks=("code",))
    first = win.state.results_path
    first_shape = sorted((r.task, r.prompt_id, r.k or 0, r.rep) for r in win.state.records)
    win.sweep_tab.form.k_edit.setText("3")  # the form changed since: Run again still repeats the shown sweep
    win.sweep_tab.form.reps.setValue(1)
    with qtbot.waitSignal(win.state.sweep_finished, timeout=120000):
        win.results_tab.run_again()
    assert win.state.results_path != first and win.sweep_tab.form.k_edit.text() == "1,2" and win.sweep_tab.form.reps.value() == 2
    assert sorted((r.task, r.prompt_id, r.k or 0, r.rep) for r in win.state.records) == first_shape
    text = win.results_tab.compare_label.text()
    assert text.startswith(f"A: {first}\nB: {win.state.results_path}") and "only the measurements differ" in text
    assert "\nllama.cpp builds: A llama-cpp-python " in text and text.split("\n")[2].endswith("(the same)")
    assert win.results_tab.results_tabs.currentWidget() is win.results_tab.compare_page and win.results_tab.compare_table.rowCount() == 3


def test_opening_a_bad_results_file_is_one_clear_message(window, tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text("not json\n")
    window.results_tab.open_results(str(bad))
    assert str(bad) in window.state.last_error
    for name, data in (("model.gguf", b"GGUF" + bytes(range(256)) * 8), ("junk.jsonl", bytes(range(128, 256)) * 64)):
        p = tmp_path / name
        p.write_bytes(data)
        window.state.last_error = None
        window.results_tab.open_results(str(p))
        assert str(p) in window.state.last_error
        window.results_tab.compare_results(str(p))  # nothing shown yet: says so, no traceback
        assert window.state.last_error


def test_a_broken_probe_record_still_shows_the_runs(window, qtbot, tmp_path):
    _sweep(window, qtbot, k="1", n=16, reps=1, tasks=("code",))
    path = tmp_path / "with-probe.jsonl"
    path.write_text(window.state.results_path.read_text()
                    + '{"schema_version": 1, "run_id": "c1", "record_type": "cost", "t_ms": 3}\n')
    window.results_tab.open_results(str(path))
    assert window.state.results_path == path and window.results_tab.table.rowCount() == 2
    # a bad cost record is left out and said with the file's other lines left out (issue 36), not an error
    assert any("line 3: not a valid cost-probe record" in n for n in window.state.file_notes), window.state.file_notes


def test_confirm_with_llama_server_shows_both_speeds(window, qtbot, server_bin):
    win = window
    win.machine_tab.server_edit.setText(server_bin)
    _sweep(win, qtbot, k="2", n=32, reps=1, tasks=("code",))
    # the command's flags are checked against that binary on a worker, then the command redrawn
    from app.core.engines.server.binary import probe_capabilities

    want = f"Flags checked against: {probe_capabilities(server_bin).version}"
    qtbot.waitUntil(lambda: win.export_tab.checked_label.text().startswith(want), timeout=60000)
    win.sweep_tab.form.mix_edit.setText("code=1")
    win.sweep_tab.form._mix_changed()
    with qtbot.waitSignal(win.export_tab.confirm_finished, timeout=120000):
        win.export_tab.confirm_btn.click()
    text = win.export_tab.confirm_label.text()
    head, details = text.split("\n", 1)  # in words first, then both speeds
    # what it timed (the pick, or the plain command when the pick is to leave it off), nothing else
    assert head.startswith("llama-server timed ") and "confirms" not in head, head
    assert details.startswith("llama-server (") and "tok/s" in details and "the sweep (inprocess) measured" in details


def test_machine_tab_shows_the_roofline_of_the_chosen_model(window, qtbot):
    import dataclasses

    from app.core.machine import hardware as H
    from app.core.machine.fit import bytes_per_token
    from app.core.machine.modelinfo import inspect
    from tests.helpers import RTX3060, RecordedNVML

    win = window
    qtbot.waitUntil(lambda: win.model_tab.model_edit.text() != "", timeout=5000)
    win.machine_tab.show_hardware()
    text = win.machine_tab.hw_text.toPlainText()  # this machine: CPU only, RAM bandwidth unknown
    assert "roofline for" in text and "iB read per generated token; no ceiling" in text
    assert "MTP adds" in win.model_tab.fit_label.text()  # the Model tab's fit says what MTP costs in memory
    gpus, _ = H.nvml_gpus(RecordedNVML([RTX3060]))
    win.state.set_hardware(dataclasses.replace(H.snapshot(), gpus=tuple(gpus)))  # the tab redraws
    want = 360.2e9 / bytes_per_token(inspect(win.model_tab.model_edit.text()))
    line = next(ln for ln in win.machine_tab.hw_text.toPlainText().splitlines() if "tok/s at" in ln)
    assert line.strip().startswith("at most ") and abs(float(line.split()[2]) / want - 1) < 0.01, line


def test_checking_llama_server_never_blocks_the_window(window, qtbot, server_bin, tmp_path):
    win = window
    hang = tmp_path / "llama-server"
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    win.machine_tab.server_edit.setText(str(hang))
    win.machine_tab.check_server()  # returns at once: --version/--help run on a worker
    assert "checking" in win.machine_tab.server_label.text() and win.services.capabilities.reading()
    win.show()
    win.close()  # closing cancels the check and kills the hung child (the fixture checks for children)
    assert not any(job.is_running() for job in win.jobs)
    qtbot.waitUntil(lambda: not win.services.capabilities.reading(), timeout=5000)
    win.machine_tab.server_edit.setText(server_bin)
    win.machine_tab.check_server()
    qtbot.waitUntil(lambda: "draft-mtp supported" in win.machine_tab.server_label.text(), timeout=60000)


def test_checking_llama_server_saves_the_path_it_checked(window, qtbot, tmp_path):
    """A path typed while the check runs is not saved as checked: the one asked about is, and the
    field shows what the state holds."""
    from PySide6.QtCore import QSettings

    fake = tmp_path / "llama-server"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "version: 1 (abc)"; '
                    'else echo "--model FNAME"; fi\n')
    fake.chmod(0o755)
    tab = window.machine_tab
    tab.server_edit.setText(str(fake))
    tab.check_server()  # the answer comes on the GUI thread later, never before this returns
    tab.server_edit.setText(str(tmp_path / "typed-meanwhile"))
    qtbot.waitUntil(lambda: "build" in tab.server_label.text(), timeout=60000)
    assert QSettings("mtp-tuner", "mtp-tuner").value("server_bin", "") == str(fake)
    assert window.state.server_bin == str(fake) and tab.server_edit.text() == str(fake)


@pytest.mark.parametrize("pays", [True, False])
def test_adaptive_mode_runs_and_names_a_pick(window, qtbot, monkeypatch, pays):
    # the cost probe answers recorded costs, so which branch is checked does not depend on how
    # loaded this machine is: wide verifies cheap (K=1, 2 can pay) or dear (no K can pay)
    from app.core.measure import probe  # the in-process probe the session's entry point runs
    from app.core.analysis import breakeven
    from tests.helpers import fake_costs

    cost = fake_costs({1: 10.0, 2: 11.0, 3: 12.0} if pays else {1: 10.0, 2: 40.0, 3: 60.0}, 0.5 if pays else 5.0)
    probes = []

    def recorded_probe(model, **kw):
        probes.append(model)
        yield cost

    monkeypatch.setattr(probe, "run_probe", recorded_probe)
    win = window
    win.sweep_tab.form.mode_box.setCurrentText("adaptive")
    _small(win, k="1,2", n=32, reps=2, tasks=("code",))
    with qtbot.waitSignal(win.state.sweep_finished, timeout=300000):
        win.sweep_tab.start_btn.click()
    text = win.sweep_tab.progress_label.text()
    assert "adaptive: done after" in text, text
    assert len(probes) == 1
    # the adaptive sweep's cost probe is shown on the Machine tab
    assert win.state.probe_record is cost and win.machine_tab.probe_verdict.text().endswith(win.state.probe_text)  # and whose, for another model
    costs = breakeven.Costs.from_probe(cost)
    viable = [k for k in (1, 2) if breakeven.predicted_speedup(1.0, k, costs) > 1.0]
    assert viable == ([1, 2] if pays else [])
    if pays:
        assert win.state.records and win.results_tab.table.rowCount() >= 2
    else:
        assert not win.state.records and "leave MTP off" in text and "no draft width can pay" in text


# -- log, crash dialog, Help menu, palette -------------------------------------------------------
class _Boom(QObject):
    fire = Signal()


def test_an_exception_in_a_slot_shows_one_dialog_and_lands_in_the_log(qtbot):
    from app.core.common.logs import log_path, setup_logging
    from app.gui.crash import CrashHandler

    setup_logging()
    handler = CrashHandler(log_path()).install()
    try:
        boom = _Boom()

        def bad_slot():
            raise RuntimeError("kaboom in a slot")

        boom.fire.connect(bad_slot)
        boom.fire.emit()
        boom.fire.emit()  # a second error while the dialog is open: logged, no second dialog
        assert handler.logged == 2 and handler.shown == 1
        assert isinstance(handler.dialog, QMessageBox) and handler.dialog.isVisible()
        assert "kaboom in a slot" in handler.dialog.text() and str(log_path()) in handler.dialog.text()
        for h in logging.getLogger("mtp_tuner").handlers:
            h.flush()
        log = log_path().read_text()
        assert log.count("uncaught RuntimeError: kaboom in a slot") == 2 and "Traceback" in log
        handler.dialog.close()
    finally:
        handler.uninstall()


def test_help_opens_the_log_folder(window, monkeypatch):
    from PySide6.QtGui import QDesktopServices

    from app.core.common.paths import log_dir

    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(lambda url: opened.append(url.toLocalFile()) or True))
    window.open_log_action.trigger()
    assert opened == [str(log_dir())]


def test_plots_follow_a_dark_palette(window, qtbot):
    from PySide6.QtGui import QColor, QGuiApplication, QPalette
    from PySide6.QtWidgets import QApplication

    from app.gui import common

    light = QGuiApplication.palette()
    assert window.results_tab.be_plot.backgroundBrush().color().lightness() >= 128
    dark = QPalette()
    for role, color in ((QPalette.Window, "#202020"), (QPalette.Base, "#181818"), (QPalette.Text, "#e0e0e0"),
                        (QPalette.WindowText, "#e0e0e0")):
        dark.setColor(role, QColor(color))
    try:
        QApplication.setPalette(dark)  # what the OS does when it switches to dark
        qtbot.waitUntil(lambda: window.results_tab.be_plot.backgroundBrush().color().lightness() < 128, timeout=3000)
        assert common.is_dark() and window.sweep_tab.plots.acc_plot.backgroundBrush().color().lightness() < 128
    finally:
        QApplication.setPalette(light)
    qtbot.waitUntil(lambda: window.results_tab.be_plot.backgroundBrush().color().lightness() >= 128, timeout=3000)


def test_smoke_test_mode_runs_the_demo_and_logs_init_finished(tmp_path):
    env = {**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-c", "import sys; from app.gui.main import main; sys.exit(main(['--smoke-test']))"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    from app.core.common.logs import log_path

    log = log_path().read_text()
    assert r.returncode == 0, r.stderr[-2000:]
    assert "init finished" in log and "smoke test passed" in log and "start: mtp-tuner" in log
    assert results_dir().is_dir()


def test_download_cancel_then_resume_in_the_window(window, qtbot, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    win = window
    fake_hub.stall_after = 2 * 2**20  # the server stops sending after 2 MiB of the 6 MiB file
    fake_hub.stall_seconds = 30
    win.model_tab.search_edit.setText("tiny-mtp")
    win.model_tab.search_models()
    qtbot.waitUntil(lambda: win.model_tab.search_btn.isEnabled() and win.model_tab.repos.rowCount() == 1, timeout=20000)
    win.model_tab.repos.selectRow(0)
    qtbot.waitUntil(lambda: win.model_tab.files.rowCount() == 3, timeout=20000)
    win.model_tab.files.selectRow([win.model_tab.files.item(r, 0).text() for r in range(win.model_tab.files.rowCount())].index("F16"))
    win.model_tab.download_btn.click()
    from app.core.common.paths import models_dir

    def on_disk() -> int:
        return sum(p.stat().st_size for p in models_dir().rglob("*.part"))

    qtbot.waitUntil(lambda: on_disk() >= 2**20, timeout=20000)  # cancel once 1 MiB reached the disk
    from app.core.machine.download import READ_TIMEOUT_S

    # a guard against a hang, not a speed target: the cancel lands at the next chunk or, with the
    # server stalled, at the next short read timeout; 10 x that read timeout is generous
    with qtbot.waitSignal(win.model_tab.download_finished, timeout=int(10_000 * READ_TIMEOUT_S)):
        win.model_tab.download_cancel_btn.click()
    assert "download cancelled" in win.model_tab.download_label.text() and win.model_tab.download_btn.isEnabled()
    fake_hub.stall_after = None
    served = fake_hub.bytes_served
    with qtbot.waitSignal(win.model_tab.download_finished, timeout=30000):
        win.model_tab.download_btn.click()
    assert "sha256 verified" in win.model_tab.download_label.text()
    # resumed from the bytes on disk (what had reached the disk when cancelled, up to the 2 MiB
    # served), not started over
    assert fake_hub.bytes_served - served < 6 * 2**20 - 2**19
    assert win.model_tab.model_edit.text().endswith("blob-F16.gguf")


def test_the_cancel_buttons_cancel_their_own_job_and_nothing_without_one(state, qtbot):
    from conftest import make_tab
    from app.gui.tabs.machine import MachineTab
    from app.gui.tabs.model import ModelTab

    class Job:
        cancelled = False

        def cancel(self):
            self.cancelled = True

    model, machine = make_tab(ModelTab, state), make_tab(MachineTab, state)
    for t in (model, machine):
        qtbot.addWidget(t)
    buttons = ((model, "download_job", model.download_cancel_btn), (machine, "probe_job", machine.probe_cancel_btn),
               (machine, "runtime_job", machine.runtime_cancel_btn))
    for tab, attr, button in buttons:
        button.setEnabled(True)
        button.click()  # no job yet: nothing to cancel, no error
        job = Job()
        setattr(tab, attr, job)
        button.click()
        assert job.cancelled, attr
