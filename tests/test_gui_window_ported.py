"""Window tests that lived in other test files (test_demo_tasks, test_hardening, test_export), on
the tabs-and-AppState window: the originals reached into the old mixin window's attributes."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from app.core.engines import calibrated_demo  # noqa: E402


def _col(table, header):
    return [table.horizontalHeaderItem(c).text().strip() for c in range(table.columnCount())].index(header)


def test_the_windows_demo_sweep_is_the_clis_and_tasks_differ(window, qtbot):
    sweep, table = window.sweep_tab, window.results_tab.table
    assert (sweep.k_edit.text(), sweep.npredict.value(), sweep.reps.value()) == (
        calibrated_demo.DEMO_KS, calibrated_demo.DEMO_TOKENS, calibrated_demo.DEMO_REPS)
    assert {t for t, cb in sweep.task_boxes.items() if cb.isChecked()} == set(calibrated_demo.DEMO_TASK_P)
    with qtbot.waitSignal(window.state.sweep_finished, timeout=180000):
        sweep.start_btn.click()
    assert {r.prompt_id for r in window.state.records} == {f"demo-{t}" for t in calibrated_demo.DEMO_TASK_P}
    # the alpha column (acceptance per drafted token, two decimals): finer than the rounded percentage
    alpha = _col(table, "alpha")
    rows = {(table.item(r, 0).text(), table.item(r, 1).text()): table.item(r, alpha).text()
            for r in range(table.rowCount())}
    for k in (1, 2, 3):
        acc = [float(rows[(t, f"K={k}")]) for t in ("code", "tongue-twister", "story")]
        assert acc[0] > acc[1] > acc[2], (k, acc)


def test_the_window_shows_one_sweep_of_a_mixed_file_and_offers_the_other(window, tmp_path):
    from test_hardening import two_model_file

    path = tmp_path / "mixed.jsonl"
    two_model_file(path)
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "run_id": "cut", "sta\n')  # a cut line, ended by a later writer
    results, state = window.results_tab, window.state
    results.open_results(str(path))
    box = results.file_sweep_box
    verdicts = lambda: [results.table.item(r, _col(results.table, "verdict")).text()  # noqa: E731
                        for r in range(results.table.rowCount())]
    assert not box.isHidden() and box.count() == 2 and box.currentData() == "new222"
    assert {r.sweep_id for r in state.records} == {"new222"}
    notes = results.findings.toPlainText()
    assert "holds 2 sweeps of 2 models; showing the latest: new222" in notes
    assert f"{path} line 25: cut short" in notes
    assert verdicts() == ["baseline", "slower"]
    box.setCurrentIndex(1)
    box.activated.emit(1)
    assert {r.sweep_id for r in state.records} == {"old111"}
    assert "showing the one asked for: old111" in results.findings.toPlainText()
    assert verdicts() == ["baseline", "faster"]
    assert "A-Q4_0.gguf" in window.export_tab.command.toPlainText()
