"""The window judges a sweep of several settings (sampler, thinking, depth) one setting at a time:
the Results tab's Setting box, the verdict of that setting's runs only, and the acceptance-vs-
temperature plot over all of them."""

from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtCore import QSettings

from app.core.records.reader import load_records


@pytest.fixture
def state(qtbot, tmp_path):
    from app.gui.state import AppState

    s = AppState(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    yield s
    s.cancel_all(10000)


def two_temperatures():
    greedy = load_records("tests/data/demo_sweep.jsonl")
    warm = [dataclasses.replace(r, run_id=r.run_id + "-t07", sampling=dict(r.sampling, temperature=0.7),
                                tok_s=(r.tok_s or 0) * (0.5 if r.arm != "baseline" else 1.0) or None)
            for r in greedy]
    return greedy, warm


def test_the_results_tab_judges_one_setting_at_a_time(state, qtbot):
    from app.gui.tabs.results import ResultsTab

    tab = ResultsTab(state)
    qtbot.addWidget(tab)
    greedy, warm = two_temperatures()
    state.set_results(greedy + warm, None)
    box = tab.setting_box
    assert not box.isHidden() and [box.itemText(i) for i in range(box.count())] == ["greedy", "temperature 0.7"]
    first = {r.run_id for r in state.verdict.records}
    assert first == {r.run_id for r in greedy}  # the verdict holds within one setting, never pooled
    speed = {(c.task, c.arm): c.ratio.estimate for c in state.verdict.analysis.cells if c.ratio and c.ratio.estimate}
    box.activated.emit(1)
    assert {r.run_id for r in state.verdict.records} == {r.run_id for r in warm}
    assert state.setting_index == 1 and box.currentIndex() == 1
    # its speculative runs at half the speed: each cell's speedup is half the first setting's
    warm_speed = {(c.task, c.arm): c.ratio.estimate for c in state.verdict.analysis.cells
                  if c.ratio and c.ratio.estimate}
    assert speed.keys() == warm_speed.keys() and all(abs(warm_speed[k] / speed[k] - 0.5) < 1e-9 for k in speed)
    assert tab.temperature.lines and all(item.isVisible() for item in tab.temperature.lines.values())
    # one setting: no box
    state.set_results(greedy, None)
    assert box.isHidden() and state.setting_index == 0 and state.setting_labels == []
