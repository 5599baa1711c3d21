"""One story on every screen (app.gui.story), offscreen: a sweep whose verdict is withheld (the
machine was busy) says so on the Results banner, its plot, the Sweep tab's decisions, the Start
page and Export, never "decided" and never green; Copy, Save and Confirm wait for a command; each
task's answer comes before the mix's; and Results opens scrolled to the top, a second time too."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("PySide6")

from conftest import ROOT  # noqa: E402
from helpers import clear_sweep_file  # noqa: E402

DEMO_SWEEP = ROOT / "tests" / "data" / "demo_sweep.jsonl"
GREEN = "#2e7d32"


def busy_sweep(path):
    """The clear sweep (code 1.5x faster at K=2, story 0.6x) with its K=1 runs (a third of them)
    disturbed by cc1plus: the quiet runs still say code is faster at K=2, and the verdict is withheld."""
    from app.core.measure.busy import DISTURBED

    recs = clear_sweep_file(path)
    return [dataclasses.replace(r, flags=(DISTURBED,), other_cpu=0.84, other_top={"name": "cc1plus", "cpu": 0.84})
            if r.k == 1 else r for r in recs]


def _green_pixels(image) -> int:
    from PySide6.QtGui import QColor

    green = QColor(GREEN).rgb()
    return sum(1 for y in range(0, image.height(), 2) for x in range(0, image.width(), 2)
               if image.pixel(x, y) == green)


def test_a_withheld_sweep_says_withheld_everywhere_and_nothing_is_green(window, tmp_path):
    from app.core.analysis.decide import TaskDecision
    from app.core.analysis.stats import Ratio
    from app.core.records.arm import Arm
    from app.core.session.events import Decisions
    from app.gui.services.sweep import SweepEnd
    from app.gui.story import State
    from app.gui.story import answer_html

    st = window.state
    records = busy_sweep(tmp_path / "busy.jsonl")
    st.set_results(records, None)
    v = st.verdict
    assert v is not None and v.withheld
    # the quiet runs alone still say code is reliably faster: the plot would have been green
    assert v.analysis.cell("code", Arm(2)).ratio.verdict == "faster"
    res = window.results_tab
    rows = res.banner.rows
    assert set(rows) == {"", "code", "story"}
    for row in rows.values():
        text = row.line.text()
        assert row.state is State.WITHHELD and "withheld" in text
        assert "faster" not in text and "decided" not in text and GREEN not in text
        assert not row.button.isEnabled()  # no command to ask Export for
    # the plot under it: every setting marked withheld, none green, none "faster"
    cells = res.intervals.card.cells
    assert cells and all(c.verdict == "withheld" for c in cells)
    assert res.intervals.image is not None and _green_pixels(res.intervals.image) == 0
    # the Sweep tab: the runs had decided code, the verdict takes it back
    code = TaskDecision("code", True, Arm(2), Ratio(6, 1.5, 1.45, 1.55, 0.01, 0.9), reason="precise")
    story = TaskDecision("story", True, None, Ratio(6, 0.6, 0.58, 0.62, 0.01, 0.9), reason="below 1")
    sweep = window.sweep_tab
    sweep.on_event(Decisions((code, story), 40, 2560, 60.0, 0.0, True, "decided"))
    assert "every task is decided" in sweep.decisions.head.text()  # before the verdict is built
    sweep._ended(SweepEnd(False, True, None, "Finished"))
    head, lines = sweep.decisions.head.text(), sweep.decisions.lines.text()
    assert "decided" not in head and "decided" not in lines and GREEN not in lines
    assert head.startswith("No decision after 40 runs, 60 s: verdict withheld: the machine was busy")
    assert "cc1plus" in head and lines.count("withheld") == 2
    # the Start page and Export
    page = answer_html(v)
    assert "withheld" in page and "faster" not in page and "decided" not in page and GREEN not in page
    export = window.export_tab
    export.show_verdict(v)
    assert export.command.toPlainText() == "" and "withheld" in export.command.placeholderText()
    assert not any(b.isEnabled() for b in export.command_buttons)


def test_each_answer_has_its_state_and_only_a_decided_one_is_green(tmp_path):
    from app.core.verdict import build_verdict
    from app.gui.story import State, answers

    got = {a.scope: a for a in answers(build_verdict(clear_sweep_file(tmp_path / "clear.jsonl")))}
    assert list(got) == ["code", "story", ""]  # the tasks, then the mix
    assert got["code"].state is State.DECIDED and got["code"].color == GREEN and got["code"].has_command
    assert got["story"].state is State.DECIDED and "slower" in got["story"].line  # sure: leave it off
    # the mix: 1.00x [0.99, 1.01], no setting 3 % faster: decided, leave it off (no gain worth having)
    assert got[""].state is State.DECIDED and got[""].color != GREEN
    assert got[""].line.startswith("Your mix (code 50 %, stories 50 %): leave it off: at most +1 % (no gain worth having; 1.00x")


def test_confirm_and_copy_wait_for_a_command(window, tmp_path):
    export = window.export_tab
    assert not export.confirm_btn.isEnabled()  # nothing shown yet
    window.results_tab.open_results(str(DEMO_SWEEP))
    assert export.current_export is not None
    assert export.confirm_btn.isEnabled() and all(b.isEnabled() for b in export.command_buttons)
    window.state.set_results(busy_sweep(tmp_path / "busy.jsonl"), None)
    assert export.current_export is None and not export.confirm_btn.isEnabled()
    export.confirm_with_server()  # asked anyway (e.g. by a shortcut): one line, no run
    assert export.confirm_job is None and "withheld" in window.state.last_error


def test_each_task_comes_before_the_mix(window):
    from app.gui.story import answer_html

    window.results_tab.open_results(str(DEMO_SWEEP))
    banner = window.results_tab.banner

    def row_of(scope: str) -> int:
        return banner.grid.getItemPosition(banner.grid.indexOf(banner.rows[scope].line))[0]

    assert max(row_of(t) for t in ("code", "story", "tongue-twister")) < row_of("")
    page = answer_html(window.state.verdict)
    assert max(page.index(t) for t in ("Code: ", "Stories: ", "Tongue-twisters: ")) < page.index("Your mix (")
    # the tasks in bold, the mix after them
    assert banner.rows["code"].line.font().bold() and not banner.rows[""].line.font().bold()


def test_results_opens_scrolled_to_the_top_after_a_second_sweep(window, qtbot):
    from PySide6.QtCore import QCoreApplication

    win = window
    win.resize(1240, 700)
    win.show()
    win.tabs.setCurrentWidget(win.results_tab)
    res = win.results_tab
    res.open_results(str(DEMO_SWEEP))
    res.advanced.toggle.click()  # opened: scrolled down to it
    bar = res.body_scroll.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.value() > 0, timeout=5000)
    res.open_results(str(DEMO_SWEEP))  # the next sweep's verdict
    for _ in range(5):
        QCoreApplication.processEvents()
    assert bar.maximum() > 0 and bar.value() == 0
