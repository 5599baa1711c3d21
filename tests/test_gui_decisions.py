"""The Sweep tab's decision panel, fed the session's Decisions events through the tab's own event
handler (as a running sweep feeds them): decided tasks in green, undecided in amber with what they
are undecided between, the time to decide all counting down, and the final state when a budget
ends the sweep."""

from __future__ import annotations

from app.core.analysis.decide import TaskDecision
from app.core.analysis.stats import Ratio
from app.core.records.arm import Arm
from app.core.session.events import Decisions

K2 = Arm(2, 0.0)
K1 = Arm(1, 0.0)
CODE = TaskDecision("code", True, K2, Ratio(6, 1.38, 1.33, 1.43, 0.01, 0.9), reason="precise and clear of the others")
STORY = TaskDecision("story", False, None, Ratio(4, 0.98, 0.90, 1.07, 0.03, 0.4), (None, K1), K1, 6,
                     "reaches down to 1", eta_s=70.0)


def test_the_panel_shows_each_task_decided_or_not_and_counts_down(window):
    tab = window.sweep_tab
    assert not tab.decisions.isVisible()
    tab.sweeps._event(Decisions((CODE, STORY), 10, 640, 25.0, 130.0, False, ""))  # as a sweep sends it: the clock too
    assert not tab.decisions.isHidden()
    assert tab.decisions.head.text() == "Toward a decision: 1 of 2 tasks decided after 10 runs; about 2 min to decide all"
    lines = tab.decisions.lines.text()
    assert "code: decided, pays: K=2 1.38x ±4 %" in lines and "#2e7d32" in lines.split("<br>")[0]
    assert "story: undecided, off vs K=1, about 1 min" in lines
    assert "#b26a00" in lines.split("<br>")[1]
    # the next step: story is decided too, and the ETA is gone
    off = TaskDecision("story", True, None, Ratio(8, 0.95, 0.92, 0.99, 0.01, 0.4, anytime=True),
                       reason="every interval lies below 1", outcome="slower")
    tab.sweeps._event(Decisions((CODE, off), 14, 896, 35.0, 0.0, False, ""))
    assert tab.decisions.head.text() == "Toward a decision: 2 of 2 tasks decided after 14 runs"
    assert "story: decided, slower: leave it off (best 0.95x [0.92, 0.99, anytime])" in tab.decisions.lines.text()


def test_a_budget_that_ends_the_sweep_says_what_is_undecided(window):
    tab = window.sweep_tab
    tab.on_event(Decisions((CODE, STORY), 20, 1280, 121.0, 70.0, True, "budget"))
    assert tab.decisions.head.text() == "Decisions (the time budget ran out): 1 of 2 tasks decided after 20 runs, 121 s"
    lines = tab.decisions.lines.text()
    assert "story: undecided between off and K=1 (now 0.98x [0.90, 1.07]); about 1 more minute would decide it" in lines
