"""The window's side of issue #15: the Export tab asks once for "use it anyway" before it copies
or saves a command measured on the CPU of a machine that has a GPU; the Machine tab shows, per
engine, the device it will really use."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402

from app.core.engines.devices import CPU  # noqa: E402
from app.core.verdict.verdict import CPU_MARK  # noqa: E402
from test_backend_truth import DEMO_V1, _gpu_records  # noqa: E402


@pytest.fixture
def state(qtbot, tmp_path):
    from app.gui.state import AppState

    s = AppState(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    s.errors = []
    s.error.connect(s.errors.append)
    yield s
    s.cancel_all(10000)


def test_export_asks_once_before_copying_or_saving_a_cpu_verdict(state, qtbot, tmp_path, monkeypatch):
    from app.gui.tabs.export import ExportTab

    export = ExportTab(state)
    qtbot.addWidget(export)
    asked: list[str] = []
    answer = [False]
    monkeypatch.setattr(export, "ask_use_anyway", lambda w: asked.append(w) or answer[0])
    state.set_results(_gpu_records(0, "all", backend=CPU), DEMO_V1)
    assert state.verdict.gpu_warning.startswith(CPU_MARK) and CPU_MARK in export.verdict_label.text()
    QGuiApplication.clipboard().setText("before")
    export.copy_command()  # refused: nothing copied
    assert len(asked) == 1 and QGuiApplication.clipboard().text() == "before"
    assert export.save_preset(str(tmp_path / "p.ini")) is None and not (tmp_path / "p.ini").exists()
    assert len(asked) == 2  # refused, so asked again
    answer[0] = True
    export.copy_command()
    assert QGuiApplication.clipboard().text() == state.verdict.export.command
    assert export.save_preset(str(tmp_path / "p.ini")) and (tmp_path / "p.ini").exists()
    assert len(asked) == 3  # "use it anyway" once: the save after it did not ask again


def test_export_does_not_ask_for_a_gpu_verdict(state, qtbot, tmp_path, monkeypatch):
    from app.gui.tabs.export import ExportTab

    export = ExportTab(state)
    qtbot.addWidget(export)
    monkeypatch.setattr(export, "ask_use_anyway", lambda w: pytest.fail("asked for a GPU verdict"))
    state.set_results(_gpu_records(33, "all"), DEMO_V1)
    assert state.verdict.gpu_warning is None and CPU_MARK not in export.verdict_label.text()
    export.copy_command()
    assert QGuiApplication.clipboard().text() == state.verdict.export.command


def test_machine_tab_shows_each_engines_device(state, qtbot):
    from app.gui.tabs.machine import MachineTab

    tab = MachineTab(state)
    qtbot.addWidget(tab)
    tab.check_engines()
    qtbot.waitUntil(lambda: tab.engines_job is None, timeout=120000)
    text = tab.engines_label.text()
    assert text.startswith("engines (the device each will really use):"), text
    assert "in-process (llama-cpp-python): " in text and "llama-server" in text
