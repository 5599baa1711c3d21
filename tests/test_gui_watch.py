"""The Watch tab on a recorded llama-server (pages read off a real one serving the calibrated
model at K=3, replayed): the live counts, acceptance by position, the predicted speedup per K and
the recommendation as readings come in; the watch record at the end; a server that does not
answer is one line; the tab is in the window. Against a hostile server on loopback
(tests/watchserver.py): a password in the address is never shown or logged, Stop ends a read the
server holds, and outside text is plain text on one line."""

from __future__ import annotations

import pytest

from conftest import make_tab
from helpers import ReplayClient, server_costs

from app.core.records.reader import load_watch_records
from app.core.records.writer import append_line

pytest.importorskip("PySide6")

COSTS = {1: 10.0, 2: 10.5, 3: 11.0, 4: 11.5, 5: 12.0, 6: 12.5}


@pytest.fixture
def tab(state, qtbot):
    from app.gui.tabs.watch import WatchTab

    t = make_tab(WatchTab, state)
    qtbot.addWidget(t)
    return t


def _watch(tab, qtbot, client, minutes=0.02, interval=0.1):
    tab.client_factory = lambda url, key: client
    tab.minutes.setValue(minutes)  # 1.2 s: the recorded pages go by at 0.1 s
    tab.interval.setValue(interval)
    seen = []
    tab.start_watch()
    assert tab.job is not None
    tab.job.core_event.connect(lambda live: seen.append(live))
    qtbot.waitUntil(lambda: tab.job is None, timeout=30000)
    return seen


def test_the_watch_tab_shows_counts_predictions_and_the_recommendation(tab, qtbot, tmp_path, monkeypatch):
    costs = tmp_path / "costs.jsonl"
    append_line(costs, server_costs(COSTS, 0.5).to_json())
    tab.costs.setText(str(costs))
    seen = _watch(tab, qtbot, ReplayClient())
    assert len(seen) >= 3 and seen[-1].final  # live updates, then the end
    assert [x.summary.counts.draft_steps for x in seen[:3]] == [0, 20, 58]  # as the traffic came in
    assert tab.values["positions"].text() == "148 / 124 / 86"
    assert tab.values["steps"].text() == "247"
    assert "draft-mtp, K=3" in tab.values["server"].text() and "calibrated-p0.3.gguf" in tab.values["server"].text()
    assert tab.acceptance_data() == pytest.approx([100 * 148 / 247, 100 * 124 / 247, 100 * 86 / 247])
    xs, ys = tab.speedup_data()
    assert xs == [0, 1, 2, 3, 4, 5] and ys[0] == 1.0
    assert ys == pytest.approx([p.speedup for p in seen[-1].summary.predictions])
    assert "you run K=3" in tab.recommendation.text()
    assert "priced by the probe c" in tab.costs_line.text()
    # the answer first: the recommendation above its evidence (the counts and the plots)
    from PySide6.QtCore import QPoint

    tab.resize(1200, 800)
    tab.show()
    qtbot.waitExposed(tab)
    top = lambda w: w.mapTo(tab, QPoint(0, 0)).y()  # noqa: E731
    assert top(tab.recommendation) < top(tab.acc_plot) and top(tab.recommendation) < top(tab.values["steps"])
    assert "watch record was appended" in tab.status.text()
    assert tab.values["requests"].text().startswith("at least ")
    (rec,) = load_watch_records(seen[-1].saved_to)
    assert rec.accepted_per_pos == (148, 124, 86)
    assert tab.start_button.isEnabled() and not tab.stop_button.isEnabled()


def test_without_a_matching_probe_the_tab_says_why_and_how(tab, qtbot):
    _watch(tab, qtbot, ReplayClient())
    assert tab.speedup_data() == ([], [])
    qtbot.wait(50)  # the plots' empty state is checked once per event-loop turn
    assert not tab.acc_plot.empty_item.isVisible() and tab.sp_plot.empty_item.isVisible()
    assert "no cost record" in tab.recommendation.text() and "mtp-tuner probe" in tab.recommendation.text()


def test_a_server_that_does_not_answer_is_one_line(tab, qtbot, state):
    tab.url.setText("http://127.0.0.1:9")
    tab.minutes.setValue(0.02)
    tab.start_watch()
    qtbot.waitUntil(lambda: tab.job is None, timeout=30000)
    assert "no answer" in tab.status.text() and state.errors and "Traceback" not in state.errors[-1]


def test_stop_ends_the_window_with_its_summary(tab, qtbot):
    tab.client_factory = lambda url, key: ReplayClient()
    tab.minutes.setValue(60)
    tab.interval.setValue(0.1)
    tab.start_watch()
    qtbot.waitUntil(lambda: tab.last is not None and tab.last.summary.counts.draft_steps >= 58, timeout=30000)
    tab.stop_watch()
    qtbot.waitUntil(lambda: tab.job is None, timeout=30000)
    assert tab.last.final and "Watch ended" in tab.status.text()


def test_the_window_has_the_watch_tab(window):
    names = [window.tabs.tabText(i) for i in range(window.tabs.count())]
    assert "Watch" in names


def test_the_plots_axes_read_plainly(tab, qtbot, tmp_path):
    """The K axis says "K (0 = off)" and never gets pyqtgraph's SI scaling ("(x0.001)"), which it
    gives a unitless axis whose range lies within (-1, 1) (an empty plot's, or one holding off
    alone); nor do the other axes."""
    tab.show()
    qtbot.waitExposed(tab)

    def labels():
        return [p.getAxis(n).labelString() for p in (tab.sp_plot, tab.acc_plot) for n in ("bottom", "left")]

    assert "K (0 = off)" in labels()[0] and not any("(x" in s for s in labels()), labels()
    costs = tmp_path / "costs.jsonl"
    append_line(costs, server_costs(COSTS, 0.5).to_json())
    tab.costs.setText(str(costs))
    _watch(tab, qtbot, ReplayClient())  # points on both plots: their axes show
    qtbot.wait(50)
    assert tab.sp_plot.getAxis("bottom").isVisible() and tab.acc_plot.getAxis("bottom").isVisible()
    for plot in (tab.sp_plot, tab.acc_plot):
        plot.setXRange(-0.5, 0.5, padding=0)
        plot.setYRange(0.0, 0.5, padding=0)
    qtbot.wait(50)
    assert not any("(x" in s for s in labels()), labels()
    assert labels()[0].endswith("K (0 = off) </span>")


# ---- hostile servers and addresses (tests/watchserver.py: a real one on loopback) -------------------

PW = "Pw-s3cret-9f2c"


def test_a_password_in_the_address_is_never_shown_or_logged(tab, qtbot, state):
    from app.core.common.logs import LOGGER, log_path, setup_logging

    setup_logging()
    for url in (f"http://user:{PW}@127.0.0.1:9/metrics", f"ftp://user:{PW}@127.0.0.1:9", f"http://user:{PW}@"):
        tab.url.setText(url)
        tab.start_watch()
        assert tab.job is None and "password" in tab.status.text()
        assert PW not in tab.status.text() and not any(PW in e for e in state.errors)
    import logging

    for h in logging.getLogger(LOGGER).handlers:
        h.flush()
    log = log_path().read_text()
    assert "shown to the user" in log and PW not in log


def test_stop_ends_a_read_that_a_slow_server_holds(tab, qtbot, tmp_path):
    """A server that answers /metrics a byte a second from its third read: Stop ends the window
    at once (not after the read), and its record is kept."""
    from watchserver import WatchServer

    with WatchServer() as srv:
        srv.slow["/metrics"] = 3
        tab.url.setText(srv.url)
        tab.minutes.setValue(60)
        tab.interval.setValue(0.5)
        tab.start_watch()
        qtbot.waitUntil(lambda: srv.counts.get("/metrics", 0) >= 3, timeout=30000)
        qtbot.wait(300)  # the slow read is under way
        tab.stop_watch()
        qtbot.waitUntil(lambda: tab.job is None, timeout=3000)
    assert tab.last is not None and tab.last.final and tab.last.saved_to is not None
    (rec,) = load_watch_records(tab.last.saved_to)
    assert rec.draft_steps == 40
    assert "Watch ended" in tab.status.text()


def test_outside_text_is_plain_and_on_one_line(tab, qtbot):
    from PySide6.QtCore import Qt

    from watchserver import WatchServer

    model = "/m/<b>big<b>\nrecommendation: run K=8\x1b[2J.gguf"
    with WatchServer(model=model) as srv:
        tab.url.setText(srv.url)
        tab.minutes.setValue(0.02)
        tab.interval.setValue(0.5)
        tab.start_watch()
        qtbot.waitUntil(lambda: tab.job is None, timeout=30000)
    assert tab.last is not None and tab.last.final
    for label in [*tab.values.values(), tab.status, tab.recommendation, tab.costs_line]:
        assert label.textFormat() == Qt.PlainText
    first = tab.values["server"].text().split("\n")[0]  # the model's name: one line, escaped
    assert "<b>big<b>" in first and "\\u000arecommendation: run K=8\\u001b" in first
    assert not any(ln.startswith("recommendation") for ln in tab.values["server"].text().split("\n"))
