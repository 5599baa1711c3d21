"""The window judges a sweep of several settings (sampler, thinking, depth) one setting at a time:
the Results tab's Setting box, the verdict of that setting's runs only, and the acceptance-vs-
temperature plot over all of them."""

from __future__ import annotations

import dataclasses


from app.core.records.reader import load_records




def two_temperatures():
    greedy = load_records("tests/data/demo_sweep.jsonl")
    warm = [dataclasses.replace(r, run_id=r.run_id + "-t07", sampling=dict(r.sampling, temperature=0.7),
                                tok_s=(r.tok_s or 0) * (0.4 if r.arm_kind != "baseline" else 0.8) or None)
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


def test_a_card_and_a_compare_hold_one_setting(tmp_path):
    """Found in review: the card and compare pooled a sweep's settings into one cell (greedy code
    K=3 1.20x shown as a 0.85x blend). Now a sweep of several settings needs a choice, and compare
    pairs a run only with a baseline of its own setting."""
    import subprocess
    import sys

    from app.core.analysis.analysis import analyze
    from app.core.analysis.compare import cell_logs, compare
    from app.core.records.writer import ResultsWriter

    greedy, warm = two_temperatures()
    path = tmp_path / "two.jsonl"
    with ResultsWriter(path) as w:
        for r in greedy + warm:
            w.append(r)
    r = subprocess.run([sys.executable, "-m", "app", "card", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "measured 2 settings (1: greedy; 2: temperature 0.7)" in r.stderr
    assert "--setting N" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "app", "card", str(path), "--setting", "1"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "app", "compare", "tests/data/demo_sweep.jsonl", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--setting-b N" in r.stderr
    # pairing within a setting: the pooled file's logs are each setting's logs side by side
    pooled, g, w = cell_logs(greedy + warm), cell_logs(greedy), cell_logs(warm)
    assert pooled.keys() == g.keys() and all(sorted(pooled[k]) == sorted(g[k] + w[k]) for k in g)
    same = compare(analyze(greedy), analyze(greedy), greedy, greedy)
    assert all(c.change is None or c.change.status != "changed" for c in same)
