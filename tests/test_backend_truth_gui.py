"""The window's side of backend truth (where a run really ran): the Export tab asks once for "use
it anyway" before it copies or saves a command measured on the CPU of a machine that has a GPU;
the Machine tab shows, per engine, the device it will really use."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from PySide6.QtGui import QGuiApplication  # noqa: E402

from app.core.engines.devices import CPU  # noqa: E402
from app.core.verdict.verdict import CPU_MARK  # noqa: E402
from conftest import make_tab  # noqa: E402
from tests.helpers import DEMO_V1, gpu_records  # noqa: E402




def test_export_asks_once_before_copying_or_saving_a_cpu_verdict(state, qtbot, tmp_path, monkeypatch):
    from app.gui.tabs.export import ExportTab

    export = make_tab(ExportTab, state)
    qtbot.addWidget(export)
    asked: list[str] = []
    answer = [False]
    monkeypatch.setattr(export, "ask_use_anyway", lambda w: asked.append(w) or answer[0])
    state.set_results(gpu_records(0, "all", backend=CPU), DEMO_V1)
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

    export = make_tab(ExportTab, state)
    qtbot.addWidget(export)
    monkeypatch.setattr(export, "ask_use_anyway", lambda w: pytest.fail("asked for a GPU verdict"))
    state.set_results(gpu_records(33, "all"), DEMO_V1)
    assert state.verdict.gpu_warning is None and CPU_MARK not in export.verdict_label.text()
    export.copy_command()
    assert QGuiApplication.clipboard().text() == state.verdict.export.command


def test_machine_tab_shows_each_engines_device(state, qtbot):
    from app.gui.tabs.machine import MachineTab

    tab = make_tab(MachineTab, state)
    qtbot.addWidget(tab)
    tab.check_engines()
    qtbot.waitUntil(lambda: tab.engines_job is None, timeout=120000)
    text = tab.engines_label.text()
    assert text.startswith("engines (the device each will really use):"), text
    assert "in-process (llama-cpp-python): " in text and "llama-server" in text
    assert "sweeps use by default: no GPU in this machine" in text  # the state's choice, said where it is shown


def _wait_choice(state, qtbot):
    engines = state.services.engines
    qtbot.waitUntil(lambda: engines.job is None and engines.choice is not None, timeout=120000)
    return engines.choice


def test_sweep_tab_says_which_device_will_be_measured_before_start(state, qtbot):
    """Real engines (this machine: CPU llama-cpp-python and a CPU llama-server): showing the Sweep tab
    asks them; the label says the CPU, and says it again for llama-server when the user picks it."""
    from app.gui.tabs.sweep import SweepTab

    sweep = make_tab(SweepTab, state)
    qtbot.addWidget(sweep)
    assert sweep.form.device_label.text() == ""
    sweep.show()  # shown: the engines are asked before any Start
    assert sweep.form.device_label.text() == "will measure on: asking the engines for their devices…"
    choice = _wait_choice(state, qtbot)
    assert choice.kind == "inprocess" and sweep.form.engine_box.currentText() == "in-process"
    assert sweep.form.device_label.text().startswith("will measure on: CPU (in-process; this build has no GPU backend)")
    sweep.form.engine_box.setCurrentIndex(1)  # the user picks llama-server
    sweep.form.engine_box.activated.emit(1)
    text = sweep.form.device_label.text()
    assert text.startswith("will measure on: CPU (llama-server ") and "--list-devices shows no GPU" in text, text
    assert "the engine for this machine would be in-process" in text
    # a runtime change asks the engines again; the user's pick stays
    state.services.runtimes.changed.emit()
    assert state.services.engines.job is not None and state.services.engines.choice is None
    _wait_choice(state, qtbot)
    assert sweep.form.engine_box.currentText() == "llama-server" and "llama-server" in sweep.form.device_label.text()
    assert not state.errors


def test_sweep_tab_defaults_to_the_engine_on_the_gpu(state, qtbot):
    """The engine check's choice from recorded answers (an RTX 3060 and a CUDA runtime): the Sweep tab picks
    llama-server and names the GPU; a later choice does not override an engine the user picked."""
    from app.core.engines.devices import choose_engine, host_gpu_names
    from app.gui.tabs.sweep import SweepTab
    from tests.helpers import INPROC_CPU, INPROC_METAL, LIST_CUDA, gpu_snapshot, server_info

    sweep = make_tab(SweepTab, state)
    qtbot.addWidget(sweep)
    engines = state.services.engines
    hw = gpu_snapshot()
    engines.choice = choose_engine(host_gpu_names(hw), (INPROC_CPU, None), (server_info(LIST_CUDA), None),
                                        runtime="b6123-cuda")
    engines.choice_changed.emit(engines.choice)
    assert sweep.form.engine_box.currentText() == "llama-server"
    assert sweep.form.device_label.text() == ("will measure on: NVIDIA GeForce RTX 3060 via llama-server b6123, runtime "
                                         "b6123-cuda (CUDA)")
    sweep.form.engine_box.setCurrentIndex(0)
    sweep.form.engine_box.activated.emit(0)  # the user wants in-process anyway: told it is not the GPU
    assert sweep.form.device_label.text().startswith("will measure on: CPU (in-process; this build has no GPU backend), "
                                                f"not your {hw.gpus[0].name}")
    engines.choice_changed.emit(engines.choice)  # asked again (a runtime change): same answer
    assert sweep.form.engine_box.currentText() == "in-process"  # the user's pick, kept
    # a fresh tab on a Mac with a Metal llama-cpp-python: in-process, on the GPU
    mac = make_tab(SweepTab, state)
    qtbot.addWidget(mac)
    mac.form.engine_box.setCurrentIndex(1)  # e.g. a Run again of a llama-server plan: not the user's pick
    engines.choice = choose_engine(["Apple M5 Max"], (INPROC_METAL, None), (server_info(LIST_CUDA), None))
    engines.choice_changed.emit(engines.choice)
    assert mac.form.engine_box.currentText() == "in-process"
    assert mac.form.device_label.text() == "will measure on: Apple M5 Max (in-process llama-cpp-python 0.3.16, Metal)"
