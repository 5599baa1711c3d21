"""The plots read at the moments that matter: a task has one colour in every sweep and every plot,
the live speedup axis stays readable while early intervals are wide (cut and marked at its edge),
acceptance is on 0-100 %, an empty plot says what will appear, the legend sits outside the data,
the break-even plot says where its costs came from; and the window fits 1280x720 with long file
names in its combo boxes, its comparison able to take the whole pane."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import datetime as _dt

import pytest

pytest.importorskip("PySide6")

import pyqtgraph as pg  # noqa: E402

from app.core.records.arm import Arm  # noqa: E402
from conftest import make_tab  # noqa: E402
from tests.helpers import fake_costs, make_record  # noqa: E402

T0 = _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)
MODEL = "/m"  # the fake probe's model


def runs(tasks, ratios=None, reps: int = 3, ks=(1, 2), acc: dict | None = None) -> list:
    """Paired runs of ``tasks`` in that order: a baseline and K in ``ks`` per repetition, MTP's
    tok/s the baseline's times ``ratios[task][rep]`` (default 1.2), acceptance ``acc[task]``."""
    recs = []
    for rep in range(reps):
        for task in tasks:
            for arm in [Arm(), *(Arm(k) for k in ks)]:
                r = (ratios or {}).get(task, [1.2] * reps)[rep] if not arm.is_baseline else 1.0
                a = (acc or {}).get(task, 0.6)
                i = len(recs)
                recs.append(make_record(arm, run_id=f"r{i}", sweep_id="s", task=task, prompt_id=f"{task}1",
                                        rep=rep, model_path=MODEL, tok_s=40.0 * r, tok_s_engine=None,
                                        draft_n=None if arm.is_baseline else 100,
                                        draft_accepted=None if arm.is_baseline else round(100 * a),
                                        acceptance=None if arm.is_baseline else a,
                                        timestamp_utc=(T0 + _dt.timedelta(seconds=i)).isoformat()))
    return recs


def color_of(item) -> str:
    return pg.mkBrush(item.opts["symbolBrush"]).color().name()


def test_a_task_has_the_same_colour_in_every_sweep_whatever_the_order(sweep_tab, state, qtbot):
    from app.core.analysis.analysis import analyze
    from app.gui.common import OTHER_COLORS, task_color
    from app.gui.tabs.results import ResultsTab

    plots = sweep_tab.plots
    plots.show_analysis(analyze(runs(["code", "story"])))
    first = {t: color_of(plots.acc_items[t]) for t in ("code", "story")}
    plots.show_analysis(analyze(runs(["tongue-twister", "story", "code"])))  # another sweep, another order
    second = {t: color_of(plots.acc_items[t]) for t in ("code", "story", "tongue-twister")}
    assert second["code"] == first["code"] and second["story"] == first["story"]
    assert len(set(second.values())) == 3
    assert color_of(plots.speedup_items["code"][0]) == first["code"]  # the speedup points too
    # the Results tab's plots: the break-even dots and the position lines in the same colours
    tab = make_tab(ResultsTab, state)
    qtbot.addWidget(tab)
    state.set_results(runs(["story", "code"]), None, cost_records=[])
    dots = [i for i in tab.be_plot.getPlotItem().items if isinstance(i, pg.ScatterPlotItem)]
    assert {i.data["data"][0]: i.opts["brush"].color().name() for i in dots} == first
    # a name of the user's own: from its hash, the same each time, and not one of the fixed ones
    assert task_color("my-own-task") == task_color("my-own-task") in OTHER_COLORS
    assert task_color("Code") == task_color("code") and task_color("My prompts") == task_color("my prompts")


def test_the_live_speedup_axis_stays_readable_with_an_outlier_interval(sweep_tab):
    """Two repetitions of 1.0x and 1.6x: an interval of about 0.06-25x. The axis keeps the estimates
    readable, within the clamp; the interval is cut at the edge and marked with a caret there."""
    from app.core.analysis.analysis import analyze
    from app.gui.tabs.sweep.plots import CLAMP

    plots = sweep_tab.plots
    recs = runs(["code", "story"], ratios={"code": [1.0, 1.6], "story": [1.1, 1.12]}, reps=2, ks=(1,))
    plots.prepare(["code", "story"], [Arm(), Arm(1)])
    plots.set_analysis(analyze(recs))
    plots.repaint(force=True)
    pts, bars = plots.speedup_items["code"]
    est = float(pts.getData()[1][0])
    top, bottom = est + float(bars.opts["top"][0]), est - float(bars.opts["bottom"][0])
    assert top > 10 and bottom < 0.2  # the outlier interval this test is about
    a, b = plots.speedup_range
    lo, hi = plots.speedup_plot.getViewBox().viewRange()[1]
    assert (lo, hi) == pytest.approx((a, b))
    assert CLAMP[0] <= a < est < b <= CLAMP[1] and b - a <= 2.0  # every estimate readable, not flat on 1.0
    carets = {(s.symbol(), round(s.pos().y(), 3)) for s in plots.clip_items["code"].points()}
    assert {sym for sym, _ in carets} == {"t1", "t"}  # cut at the top (up) and at the bottom (down)
    assert all(a <= y <= b for _, y in carets)
    assert len(plots.clip_items["story"].points()) == 0  # a narrow interval is drawn whole, unmarked
    # the axis ticks are round: a step of 1, 2, 2.5 or 5 x 10^n
    step = plots.speedup_plot.getAxis("left")._tickSpacing[0][0]
    assert f"{step:.3g}".lstrip("0.").rstrip("0") in {"1", "2", "5"}


def test_a_speedup_is_drawn_with_its_interval_and_an_unknown_end_at_the_estimate():
    from app.core.analysis.analysis import CellStats
    from app.core.analysis.stats import Ratio, Summary
    from app.gui.tabs.sweep.plots import _speedup

    def cell(ratio):
        return CellStats("code", Arm(2), Summary.of([10.0]), ratio, None, None, None, (), 0, 0)

    assert _speedup(cell(Ratio(3, 1.5, 1.2, 2.0, None, None))) == pytest.approx((1.5, 0.3, 0.5))
    assert _speedup(cell(Ratio(1, 1.5, None, None, None, None))) == (1.5, 0.0, 0.0)
    assert _speedup(cell(Ratio(0, None, None, None, None, None))) is None  # no pairs yet: no point
    assert _speedup(cell(None)) is None  # the baseline


def test_acceptance_is_on_a_0_to_100_percent_axis(sweep_tab, state, qtbot):
    from app.core.analysis.analysis import analyze
    from app.gui.tabs.results import ResultsTab

    plots = sweep_tab.plots
    # 95.5-96.5 %: autoscale made a cliff of it
    plots.show_analysis(analyze(runs(["code", "story"], acc={"code": 0.955, "story": 0.965})))
    lo, hi = plots.acc_plot.getViewBox().viewRange()[1]
    assert -10 <= lo <= 0 and 100 <= hi <= 110
    tab = make_tab(ResultsTab, state)
    qtbot.addWidget(tab)
    state.set_results(runs(["code"]), None, cost_records=[])
    for pw in (tab.positions.plot, tab.temperature.plot):
        lo, hi = pw.getViewBox().viewRange()[1]
        assert -10 <= lo <= 0 and 100 <= hi <= 110


def test_an_empty_plot_says_what_will_appear(sweep_tab, qtbot):
    from app.core.analysis.analysis import analyze
    from app.gui.common import is_empty_shown

    plots = sweep_tab.plots
    for pw in (plots.acc_plot, plots.speedup_plot):
        assert is_empty_shown(pw) and "appears here once the first runs finish" in pw.empty_message
        assert pw.empty_item.toPlainText().startswith("The ")
        assert not pw.getAxis("left").isVisible() and not pw.getAxis("bottom").isVisible()  # no 0-1 axes
    assert plots.speed_plot.shows_empty and "appears here" in plots.speed_plot.empty
    plots.show_analysis(analyze(runs(["code"])))
    for pw in (plots.acc_plot, plots.speedup_plot):
        assert not is_empty_shown(pw) and pw.getAxis("left").isVisible()
    plots.speed_plot.setData([0.1, 0.2, 0.3], [40, 41, 42])
    assert not plots.speed_plot.shows_empty
    plots.prepare(["story"], [Arm(), Arm(1)])  # a new sweep: empty again until its first runs
    assert is_empty_shown(plots.speedup_plot) and plots.speed_plot.shows_empty


def test_items_added_through_the_plot_widget_end_its_empty_state(qtbot):
    """pyqtgraph's PlotWidget binds the plot item's addItem when it is made: an item added
    through the widget (pw.addItem) is watched by the empty state too, as one added through
    pw.plot or the plot item is; pw.clear empties it again."""
    from app.gui.common import make_plot

    pw = make_plot("t", "x", "y", legend=False)
    qtbot.addWidget(pw)
    pts = pg.ScatterPlotItem()
    pw.addItem(pts)
    qtbot.wait(20)
    assert pw.empty_item.isVisible()
    pts.setData(x=[1, 2], y=[1, 2])
    qtbot.wait(20)  # the check runs on the next event-loop turn, without being asked
    assert not pw.empty_item.isVisible() and pw.getAxis("bottom").isVisible()
    pw.clear()
    qtbot.wait(20)
    assert pw.empty_item.isVisible()


def test_legends_sit_outside_the_data(sweep_tab, qtbot):
    from PySide6.QtWidgets import QApplication

    from app.core.analysis.analysis import analyze

    plots = sweep_tab.plots
    plots.show_analysis(analyze(runs(["code", "story", "tongue-twister", "chat", "my prompts"])))
    sweep_tab.resize(1280, 380)  # plots about 120 px high: five entries do not fit at their ease
    sweep_tab.show()
    qtbot.waitExposed(sweep_tab)
    QApplication.processEvents()
    # shown, the tab asks the engines for their devices on a worker: let it answer (no worker left)
    qtbot.waitUntil(lambda: sweep_tab.form.engines.job is None, timeout=120000)
    for pw in (plots.acc_plot, plots.speedup_plot):
        pi = pw.getPlotItem()
        legend, vb = pi.legend.mapRectToScene(pi.legend.boundingRect()), pi.vb.mapRectToScene(pi.vb.boundingRect())
        assert len(pi.legend.items) == 5 and legend.left() >= vb.right() - 1  # right of the data, not on it
        assert vb.width() > 150 and legend.right() <= pw.width() + 1
        assert pw.height() < 160 and pi.geometry().height() <= pw.height() + 1  # the x axis not pushed out


def test_the_break_even_title_names_its_costs(state, qtbot):
    from app.gui.tabs.results import ResultsTab

    tab = make_tab(ResultsTab, state)
    qtbot.addWidget(tab)
    recs = runs(["code", "story"], acc={"code": 0.9, "story": 0.3}, ks=(1, 2, 3))
    probe = dataclasses.replace(fake_costs({1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0}, 2.0),  # a probe of these runs' set-up
                                model_path=recs[0].model_path, llama_build=recs[0].llama_build, engine=recs[0].engine)
    state.set_results(recs, None, cost_records=[probe])
    assert state.verdict.cost_source == "probe"
    title = tab.be_plot.getPlotItem().titleLabel.text
    assert "costs: cost probe" in title
    labels = [label.text for _, label in tab.be_plot.getPlotItem().legend.items]
    assert labels[-2:] == ["code", "story"] and labels[0].startswith("K=1")  # the tasks named, by colour
    state.set_results(recs, None, cost_records=[])  # no probe: the runs' own costs
    assert state.verdict.cost_source == "fitted from the runs"
    assert "costs: fitted from the runs" in tab.be_plot.getPlotItem().titleLabel.text


def test_the_window_fits_1280x720_with_long_file_names(window, tmp_path):
    from app.core.common.paths import results_dir

    d = results_dir()
    d.mkdir(parents=True, exist_ok=True)
    long = "calibrated-demo-embedding-code0.05-tongue-twister0.4-story0.9-a-long-model-name-Q4_K_M-" * 2
    for i in range(3):
        (d / f"{long}{i}.jsonl").write_text("")
    path = d / f"{long}shown.jsonl"
    path.write_text("")
    window.state.set_results(runs(["code", "story"]), path, cost_records=[])
    window.results_tab.refresh_history()
    box = window.results_tab.compare_box
    assert box.count() == 4 and Path(box.itemData(0, 3)).parent == d  # the whole file in its tooltip
    hint = window.minimumSizeHint()
    assert hint.width() <= 1280 and hint.height() <= 720, hint
    for i in range(window.tabs.count()):  # every tab, not only the one shown
        tab = window.tabs.widget(i).minimumSizeHint()
        assert tab.width() <= 1260 and tab.height() <= 640, (window.tabs.tabText(i), tab)


def test_the_comparison_can_take_the_whole_pane(state, qtbot):
    from app.gui.tabs.results import ResultsTab

    tab = make_tab(ResultsTab, state)
    qtbot.addWidget(tab)
    tab.show()
    tab.advanced.set_open(True)  # the comparison lives in the Advanced section
    tab.results_tabs.setCurrentWidget(tab.compare_page)
    top = tab.be_plot.parentWidget()
    assert top.isVisible()
    tab.whole_pane.click()
    assert not top.isVisible() and tab.compare_table.isVisible()
    tab.whole_pane.click()
    assert top.isVisible()
