"""The last metre, offscreen: the Start page ("Tune for me": one click on the demo runs the adaptive
Quick sweep and lands on Results with a verdict; a model without MTP heads is said before
anything starts), the demo's banner, the Results banner's words and its "Command for this"
buttons, a cancelled or failed sweep that does not replace the last complete verdict, and the
past sweeps listed by what they are."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

from conftest import ROOT  # noqa: E402

DEMO_SWEEP = ROOT / "tests" / "data" / "demo_sweep.jsonl"


def _paying_probe(monkeypatch):
    """The adaptive sweep's cost probe answers recorded costs where K=1..3 can pay, so the verdict
    does not depend on how loaded this machine is (the runs themselves are real)."""
    from app.core.measure import probe  # the in-process probe the session's entry point runs
    from tests.helpers import fake_costs

    cost = fake_costs({1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0}, 0.5)

    def recorded_probe(model, **kw):
        yield cost

    monkeypatch.setattr(probe, "run_probe", recorded_probe)
    return cost


# -- the Start page ---------------------------------------------------------------------------------
def test_one_click_on_the_demo_runs_the_adaptive_quick_sweep_and_lands_on_the_verdict(window, qtbot, monkeypatch):
    from app.gui.tabs.start import tab as start

    _paying_probe(monkeypatch)
    monkeypatch.setattr(start, "QUICK_S", 25.0)  # a small budget: the flow, not the precision
    win, page = window, window.start_tab
    assert win.tabs.currentWidget() is page and win.tabs.tabText(0) == "Start"  # the window opens on it
    assert page.demo_radio.isChecked() and page.quick.isChecked() and page.tune_btn.isEnabled()
    starts = []
    win.state.sweep_started.connect(starts.append)
    with qtbot.waitSignal(win.state.sweep_finished, timeout=300000) as done:
        page.tune_btn.click()
        assert page.running and not page.tune_btn.isEnabled() and page.cancel_btn.isEnabled()
    assert done.args == [False]
    assert len(starts) == 1 and {p.task for p in starts[0].prompts} == {"code", "story"}  # the declared use
    # the Sweep tab ran it as an adaptive sweep (its progress says so), through the one session
    assert win.sweep_tab.progress_label.text().startswith("adaptive: ")
    assert win.services.engines.rows is not None  # the device check ran first
    recs = win.state.records
    assert recs and {r.task for r in recs} == {"code", "story"} and len({r.sweep_id for r in recs}) == 1
    assert win.tabs.currentWidget() is win.results_tab  # straight to the verdict
    v = win.state.verdict
    assert v is not None and set(win.results_tab.banner.rows) == {"", "code", "story"}
    assert win.results_tab.banner.rows["code"].line.text().count("Code: ") == 1
    assert win.results_tab.banner.demo.isVisibleTo(win.results_tab)
    assert win.results_tab.intervals.image is not None  # the per-task interval plot under the verdict
    assert not win.results_tab.advanced.is_open()  # the statistics wait in Advanced
    # the page says the answer too, and kept the declared use for Export
    assert ("Your mix" in page.answer.text()) and not page.running and page.tune_btn.isEnabled()
    assert win.settings.value("declared_use") == "mix" and win.settings.value("declared_weights") == "code=1,story=1"
    assert win.state.task_mix == "code=1,story=1"


def test_declared_use_of_one_task_is_that_task(window):
    page = window.start_tab
    code, _w = page.use_boxes["code"]
    story, _w = page.use_boxes["story"]
    story.setChecked(False)
    assert code.isChecked() and window.settings.value("declared_use") == "code"
    assert window.settings.value("declared_weights") == "code=1"
    page.use_boxes["tongue-twister"][0].setChecked(True)
    page.use_boxes["tongue-twister"][1].setValue(3)
    assert window.settings.value("declared_use") == "mix"
    assert window.settings.value("declared_weights") == "code=1,tongue-twister=3"
    code.setChecked(False)
    page.use_boxes["tongue-twister"][0].setChecked(False)
    assert not page.tune_btn.isEnabled() and "at least one use" in page.why_not.text()


def test_a_gpu_machine_with_a_cpu_only_in_process_build_tunes_on_llama_server_as_tune_does(window):
    """The Start page's engine is the core tune flow's (tune_engine of the device check), the same
    `mtp-tuner tune` picks on the same recorded machine (test_cli_tune)."""
    from app.core.engines.base import EngineKind
    from test_cli_tune import _gpu_machine_with_a_cpu_only_in_process_build

    page = window.start_tab
    assert page.request().plan.engine is EngineKind.INPROCESS  # no answer yet: in process
    window.services.engines.choice = _gpu_machine_with_a_cpu_only_in_process_build()
    r = page.request()
    assert r.plan.engine is EngineKind.SERVER and r.engine.kind is EngineKind.SERVER


def test_a_model_without_mtp_heads_is_said_before_start_with_the_next_steps(window, qtbot, make_model):
    page = window.start_tab
    plain = make_model(0.0, mtp=False)
    page.choose_model(str(plain))
    assert window.state.model == str(plain) and page.disk_radio.isChecked()
    text = page.model_label.text()
    assert "has no MTP heads" in text and "n-gram modes" in text and "catalog" in text
    assert not page.demo_banner.isVisibleTo(page)
    # what it measures instead (any GGUF), said before anything starts; no drafter pairs here
    qtbot.waitUntil(lambda: page.plan.arms is not None, timeout=30000)
    assert "ngram-mod, ngram-simple" in page.plan.text() and "No drafter:</b> no GGUF in the models folder" in page.plan.text()
    assert page.tune_btn.isEnabled()
    req = page.request()
    assert req.adaptive is None and req.until_decided and {a.mode for a in req.plan.arms if a.is_spec} == \
        {"ngram-mod", "ngram-simple"}
    # Results says it too, with the next step
    note = window.results_tab.banner.note
    assert not note.isHidden() and "no MTP heads" in note.text() and "n-gram" in note.text()
    # the catalog's MTP builds: one click to the Model tab's catalog
    page.catalog_requested.emit()
    assert window.tabs.currentWidget() is window.model_tab and window.model_tab.repos.rowCount() > 0


def test_the_demo_carries_its_banner_and_a_real_model_does_not(window, make_model):
    page = window.start_tab
    assert page.demo_banner.isVisibleTo(page)
    assert "synthetic demo model: drafts are wrong on purpose, per task" in page.demo_banner.text()
    page.choose_model(str(make_model(0.0)))
    assert not page.demo_banner.isVisibleTo(page) and "has MTP heads" in page.model_label.text()
    page.demo_radio.setChecked(True)
    assert page.demo_banner.isVisibleTo(page) and page.demo_radio.isChecked()


def test_a_file_that_is_not_a_gguf_disables_the_button_with_the_reason(window, tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"hello, not a model")
    page = window.start_tab
    page.choose_model(str(bad))
    assert not page.tune_btn.isEnabled() and "GGUF" in page.why_not.text() and str(bad) in page.why_not.text()
    assert "GGUF" in page.model_label.text()


# -- the Results banner -----------------------------------------------------------------------------
def _ratio(est, lo, hi):
    import math

    from app.core.analysis.stats import Ratio

    return Ratio(6, est, lo, hi, math.log(est), 0.05 if lo is not None else None)


def test_the_banner_words_come_from_the_cores_picks():
    from app.core.analysis.recommend import Pick
    from app.core.records.arm import Arm
    from app.gui.words import verdict_line

    on = Pick("code", Arm(2, 0.0), _ratio(1.34, 1.20, 1.49), "code: turn MTP on with K=2: ...")
    assert verdict_line(on, "Code")[0] == "Code: turn MTP on, K=2 -> 1.34x faster (1.20-1.49, pays, sure)"
    slower = Pick("story", None, _ratio(0.65, 0.60, 0.70), "story: leave MTP off: every MTP setting is slower")
    assert verdict_line(slower, "Stories")[0] == "Stories: leave it off (0.65x, 0.60-0.70: slower)"
    noise = Pick("story", None, _ratio(1.02, 0.95, 1.10), "story: leave MTP off: ...within noise")
    assert verdict_line(noise, "Stories")[0] == "Stories: leave it off (1.02x, 0.95-1.10: not reliably faster)"
    none = Pick("code", None, None, "code: no MTP setting was measured on it (only the baseline ran), so nothing "
                                    "says it pays: leave MTP off until one is.")
    assert verdict_line(none, "Code")[0] == ("Code: leave it off (no MTP setting was measured on it (only the baseline "
                                             "ran), so nothing says it pays: leave MTP off until one is)")


def test_results_shows_the_answer_first_and_each_command_button_asks_export(window, qtbot):
    res = window.results_tab
    res.open_results(str(DEMO_SWEEP))
    v = window.state.verdict
    rows = res.banner.rows
    assert set(rows) == {"", "code", "story", "tongue-twister"}
    for p in v.per_task:  # the core's reason under each line
        assert rows[p.scope].reason.text() == p.reason
    assert rows[""].reason.text() == v.pick.reason and "Your mix (" in rows[""].line.text()
    # a finding that names a task sits beside that task's verdict
    assert any("code K=3" in w for w in rows["code"].warning_texts)
    assert not any("code K=3" in w for w in rows["story"].warning_texts)
    for scope in ("code", ""):
        with qtbot.waitSignal(window.state.command_requested, timeout=2000) as asked:
            rows[scope].button.click()
        assert asked.args == [scope]
        assert window.tabs.currentWidget() is window.export_tab
        window.tabs.setCurrentWidget(res)
    # the statistics are one click away, in Advanced
    assert not res.advanced.is_open() and res.table.rowCount() == 12
    res.advanced.toggle.click()
    assert res.advanced.is_open() and res.advanced.body.isVisibleTo(res)
    assert "costs" in res.be_plot.getPlotItem().titleLabel.text


# -- state hygiene ----------------------------------------------------------------------------------
def test_a_failed_or_cancelled_sweep_does_not_replace_the_last_complete_verdict(state, qtbot, tmp_path):
    """Driven through the state's signals as the Sweep tab sends them."""
    from app.core.records.reader import load_records
    from app.gui.tabs.results import ResultsTab

    tab = ResultsTab(state)
    qtbot.addWidget(tab)
    complete = load_records(DEMO_SWEEP)
    state.set_results(complete, DEMO_SWEEP)
    shown = state.verdict.pick.reason
    for cancelled in (True, False):
        partial = tmp_path / f"partial-{cancelled}.jsonl"
        kept = [dataclasses.replace(r, sweep_id="partial") for r in complete[:5]] if cancelled else []
        partial.write_text("".join(r.to_json() + "\n" for r in kept) if kept else "")
        state.set_results([], partial)  # what the Sweep tab does as a sweep starts
        state.sweep_running = True
        state.sweep_started.emit(object())
        state.sweep_running = False
        state.set_results(kept, partial)  # ... and as it ends
        state.sweep_finished.emit(cancelled)
        assert state.results_path == DEMO_SWEEP and state.verdict.pick.reason == shown
        assert tab.last_sweep_status == ("cancelled" if cancelled else "no run finished")
        assert not tab.stale_label.isHidden() and ("cancelled" if cancelled else "finished no run") in tab.stale_label.text()
        assert tab.history_box.currentData() == str(DEMO_SWEEP)  # the list names what is shown
    # the cancelled one is there for whoever opens it
    tab.open_results(str(tmp_path / "partial-True.jsonl"))
    assert state.results_path == tmp_path / "partial-True.jsonl" and len(state.records) == 5
    assert tab.stale_label.isHidden()


def test_a_cancelled_real_sweep_keeps_the_verdict_and_is_listed_as_cancelled(window, qtbot):
    win, res = window, window.results_tab
    res.open_results(str(DEMO_SWEEP))
    before = win.state.verdict.pick.reason
    sweep = win.sweep_tab
    sweep.form.k_edit.setText("2")
    sweep.form.npredict.setValue(6000)
    sweep.form.ctx_size.setValue(8192)
    sweep.form.reps.setValue(3)
    sweep.form.per_task.setValue(1)
    sweep.start_btn.click()
    qtbot.waitUntil(lambda: sweep.sweeps.done >= 1, timeout=120000)
    with qtbot.waitSignal(win.state.sweep_finished, timeout=30000):
        sweep.cancel_btn.click()
    cancelled = sweep.sweeps.results_path
    assert win.state.results_path == DEMO_SWEEP and win.state.verdict.pick.reason == before
    assert win.tabs.currentWidget() is not res or res.last_sweep_status == "cancelled"
    assert res.last_sweep_status == "cancelled" and not res.stale_label.isHidden()
    i = res.history_box.findData(str(cancelled))
    assert i >= 0 and res.history_box.itemText(i).endswith(" · cancelled")
    res.stale_btn.click()  # the user opens it: now it is shown
    assert win.state.results_path == cancelled


def test_past_sweeps_are_listed_by_what_they_are(window, tmp_path):
    from app.core.records.reader import load_records
    from app.gui.tabs.results.history import describe, file_label, set_status

    recs = load_records(DEMO_SWEEP)
    text = describe(recs)
    assert text == ("calibrated-demo-embedding-code0.05-tongue-twister0.4-story0.9.gguf · code, tongue-twister, story "
                    "· K=1,2,3 · 11-30 18:08 UTC · 36 runs")
    assert describe(recs, "cancelled").endswith(" · cancelled")
    # in the history list, with the status the window kept; File > Open names the same file
    copy = tmp_path / "elsewhere.jsonl"
    copy.write_bytes(DEMO_SWEEP.read_bytes())
    set_status(window.settings, copy, "cancelled")
    res = window.results_tab
    res.open_results(str(copy))
    assert res.history_box.currentData() == str(copy)
    assert res.history_box.currentText() == file_label(copy, "cancelled") == text + " · cancelled"
    assert "elsewhere.jsonl" not in res.history_box.currentText()  # by what it is, not its name
    assert Path(res.history_box.itemData(res.history_box.currentIndex(), 3)) == copy  # the tooltip: the file


def test_when_the_probe_says_no_width_can_pay_the_answer_is_leave_mtp_off_with_why(window, qtbot, monkeypatch):
    from app.core.measure import probe  # the in-process probe the session's entry point runs
    from tests.helpers import fake_costs

    cost = dataclasses.replace(fake_costs({1: 10.0, 2: 40.0, 3: 60.0, 4: 80.0}, 5.0),
                               model_path=window.state.model)  # this model's probe: no K can pay

    def recorded_probe(model, **kw):
        yield cost

    monkeypatch.setattr(probe, "run_probe", recorded_probe)
    page = window.start_tab
    with qtbot.waitSignal(window.state.sweep_finished, timeout=120000):
        page.tune_btn.click()
    assert not window.state.records  # the probe decided: no run
    assert "Leave MTP off" in page.answer.text() and "no draft width can pay" in page.answer.text()
    res = window.results_tab
    assert res.last_sweep_status == "complete" and window.tabs.currentWidget() is res
    assert "Leave MTP off" in res.banner.note.text() and "verifying costs more" in res.banner.note.text()
    assert "cost probe only" in res.history_box.currentText()


def test_the_catalog_choice_goes_to_the_model_tab_and_back_names_the_model(window):
    page = window.start_tab
    window.show()
    page.catalog_radio.setChecked(True)
    assert window.tabs.currentWidget() is window.model_tab and window.model_tab.repos.rowCount() > 0
    assert window.model_tab.model_sources.currentIndex() == 1  # Find and download
    assert page.catalog_radio.isChecked()
    window.tabs.setCurrentWidget(page)
    assert page.demo_radio.isChecked()  # nothing downloaded: the demo is still the model
