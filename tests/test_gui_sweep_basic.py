"""The Sweep tab's two levels and its failure states, offscreen: the presets and the run count and
time estimate before Start, Basic and Advanced, Start disabled for a file that is not a GGUF (the
reason in words), a model without MTP heads (the reason stays, with what still runs and where an
MTP build is), a sweep that never started (its error, never "Finished"), the previous plots kept
until the new sweep has a record, and network errors as one sentence (no network is reached: the
name lookup fails here, as offline)."""

from __future__ import annotations

import dataclasses
import shutil
import socket

import pytest

pytest.importorskip("PySide6")

from app.core.common.errors import UserError  # noqa: E402
from app.core.machine import gguf_info, runtime_release  # noqa: E402
from app.core.session.events import RunStarted  # noqa: E402
from app.core.records.arm import Arm  # noqa: E402
from conftest import make_tab  # noqa: E402
from tests.helpers import fake_costs, make_record  # noqa: E402

OFFLINE_RELEASE = "no network: cannot reach api.github.com to read the latest llama.cpp release"


def settle(qtbot, tab) -> None:
    """The estimate is coalesced on a short timer: let it fire."""
    qtbot.waitUntil(lambda: not tab.form._estimate_timer.isActive(), timeout=5000)


@pytest.fixture
def offline(monkeypatch):
    """No network: every name lookup fails as it does offline (no request leaves the machine)."""
    def no_dns(*_a, **_kw):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)


# -- presets and the estimate before Start ----------------------------------------------------------

def test_presets_set_the_runs_and_the_estimate_is_shown_before_start(sweep_tab, state, qtbot, make_model):
    tab = sweep_tab
    model = str(make_model(0.0))
    state.set_model(model)
    settle(qtbot, tab)
    # outside the demo: Normal, K 1-3, 128 tokens, 3 repetitions, two prompts of each built-in task
    assert tab.form.preset_box.currentText() == "Normal"
    plan = tab.form.plan()
    assert (tab.form.k_edit.text(), plan.n_predict, plan.reps) == ("1,2,3", 128, 3)
    assert plan.total_runs == 3 * 2 * 4 * 3 < 120
    assert tab.form.plan_label.text() == "72 runs of 128 tokens: time unknown until the first runs"
    # the tokens default agrees with its own advice
    assert "128 or more" in tab.form.npredict.toolTip() and tab.form.npredict.value() >= 128
    tab.form.apply_preset("Quick")
    settle(qtbot, tab)
    assert tab.form.plan_label.text().startswith("36 runs of 64 tokens")
    assert tab.form.budget_box.currentText() == "Quick (about 2 min)"
    tab.form.apply_preset("Thorough")
    settle(qtbot, tab)
    assert tab.form.plan_label.text().startswith("150 runs of 256 tokens")
    # a setting changed by hand: Custom
    tab.form.npredict.setValue(200)
    assert tab.form.preset_box.currentText() == "Custom"
    tab.form.npredict.setValue(256)
    assert tab.form.preset_box.currentText() == "Thorough"
    # the probe's speed for this model gives a time (the core's flow_estimate): 150 runs and 4 warmups of
    # 256 tokens at 20 tok/s, each 1.3x its decode = 43 min (decode alone, 32 min, was said before)
    state.add_probe(dataclasses.replace(fake_costs({1: 50.0, 2: 60.0}, 10.0), model_path=model))
    settle(qtbot, tab)
    assert tab.form.plan_label.text() == ("150 runs of 256 tokens: about 43 min here (at 20 tok/s, the cost probe's "
                                          "speed, with each run's overhead and the warmups)")


def test_the_last_sweeps_baseline_speed_gives_the_time_when_there_is_no_probe(sweep_tab, state, qtbot, make_model):
    tab = sweep_tab
    model = str(make_model(0.0))
    state.set_model(model)
    tab.form.apply_preset("Quick")
    other = [make_record(Arm(), run_id="o", tok_s=5.0, model_path="/another.gguf")]
    state.records = other + [make_record(Arm(), run_id=f"b{i}", tok_s=t, model_path=model)
                             for i, t in enumerate((30.0, 32.0, 34.0))]
    state.records_changed.emit()
    settle(qtbot, tab)
    # 36 runs and 4 warmups x 64 tokens at 32 tok/s, 1.3x (the median of this model's baselines; another
    # model's not counted)
    assert tab.form.plan_label.text() == ("36 runs of 64 tokens: about 2 min here (at 32 tok/s, the last sweep's "
                                          "baseline speed, with each run's overhead and the warmups)")
    # the last sweep's runs ended 30 s apart (server starts, prompts, waits between them): 40 runs x 30 s
    state.records = [make_record(Arm(), run_id=f"w{i}", tok_s=32.0, model_path=model, sweep_id="last",
                                 timestamp_utc=f"2026-12-07T10:00:{10 + 30 * i:02d}.000+00:00") for i in range(2)]
    state.records_changed.emit()
    settle(qtbot, tab)
    assert tab.form.plan_label.text() == ("36 runs of 64 tokens: about 20 min here (each run as long as the last "
                                          "sweep's here, server starts and waits included)")


def test_the_demo_model_gets_the_quick_preset_and_is_named(sweep_tab, state, qtbot):
    from app.core.calibrated.demo import DEMO_KS, DEMO_REPS, DEMO_TOKENS

    from app.gui.tabs.sweep.basic import PRESETS

    quick = PRESETS["Quick"]
    assert (quick.ks, quick.tokens, quick.reps, quick.per_task) == (DEMO_KS, DEMO_TOKENS, DEMO_REPS, 1)
    state.use_demo_model()
    settle(qtbot, sweep_tab)
    assert sweep_tab.form.preset_box.currentText() == "Quick"
    assert sweep_tab.form.plan_label.text().startswith("36 runs of 64 tokens")
    assert "the demo model: synthetic" in sweep_tab.form.model_label.full_text()
    assert sweep_tab.form.model_label.toolTip() == state.model


def test_basic_and_advanced(sweep_tab, qtbot):
    tab = sweep_tab
    tab.show()
    # no model yet: Start disabled, and the line says where to choose one
    assert not tab.start_btn.isEnabled() and tab.form.model_note.text().startswith("no model chosen: choose one")
    assert tab.start_btn.isVisible() and tab.form.preset_box.isVisible() and tab.form.plan_label.isVisible()
    assert not tab.form.advanced_area.isVisible() and not tab.form.k_edit.isVisible()
    tab.form.advanced_btn.click()
    assert tab.form.advanced_area.isVisible() and tab.form.k_edit.isVisible() and tab.form.engine_box.isVisible()
    assert list(tab.form.advanced_groups) == ["Modes and drafter", "Draft widths", "Runs", "Sampler and thinking",
                                         "Context", "Engine and threads"]
    # plain labels, the jargon in the tooltips
    assert "--spec-draft-n-max" in tab.form.k_edit.toolTip() and "--spec-draft-p-min" in tab.form.pmin_edit.toolTip()
    tab.form.advanced_btn.click()
    assert not tab.form.advanced_area.isVisible()
    # Custom opens Advanced (the settings it is made of)
    tab.form.preset_box.setCurrentText("Custom")
    tab.form.preset_box.activated.emit(tab.form.preset_box.currentIndex())
    assert tab.form.advanced_area.isVisible() and tab.form.advanced_btn.isChecked()
    # opened, it does not make the window wider than a 1280 px screen
    assert tab.minimumSizeHint().width() < 1000


def test_a_long_model_path_does_not_widen_the_tab(sweep_tab, state, qtbot, tmp_path):
    p = tmp_path / ("a" * 150) / ("a_very_long_model_file_name_" * 8 + ".gguf")
    p.parent.mkdir()
    p.write_bytes(b"hello")
    sweep_tab.show()
    state.set_model(str(p))
    assert not sweep_tab.form.model_note.isHidden() and sweep_tab.form.model_label.toolTip() == str(p)
    assert sweep_tab.minimumSizeHint().width() < 700


# -- Start disabled for a file that is not a GGUF ---------------------------------------------------

def test_a_file_that_is_not_a_gguf_disables_start_with_the_reason_in_words(sweep_tab, state, tmp_path, make_model):
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"hello, this is text")
    state.set_model(str(bad))
    tab = sweep_tab
    assert not tab.start_btn.isEnabled()
    note = tab.form.model_note.text()
    assert not tab.form.model_note.isHidden()
    assert note == 'notes.gguf: not a GGUF file: it starts with the text "hell" instead of "GGUF"'
    assert tab.form.model_note.toolTip() == f'{bad}: not a GGUF file: it starts with the text "hell" instead of "GGUF"'
    assert "b'" not in note and tab.form.model_note.toolTip() in tab.start_btn.toolTip()
    state.set_model(str(make_model(0.0)))
    assert tab.start_btn.isEnabled() and tab.form.model_note.isHidden()


@pytest.mark.parametrize("head, words", [
    (b"<!DOCTYPE html><html>", "a web page (HTML)"),
    (bytes([0, 1, 2, 3, 4]), 'the bytes 00 01 02 03 instead of "GGUF"'),
    (b"PK\x03\x04rest", "a zip archive"),
])
def test_the_gguf_readers_reason_is_words_not_a_bytes_repr(tmp_path, head, words):
    p = tmp_path / "x.gguf"
    p.write_bytes(head)
    with pytest.raises(UserError) as e:
        gguf_info.read_header(p)
    assert words in str(e.value) and "b'" not in str(e.value) and "\\x" not in str(e.value)


def test_a_model_that_stops_being_a_gguf_is_refused_at_start(sweep_tab, state, tmp_path, make_model):
    p = tmp_path / "m.gguf"
    shutil.copy(make_model(0.0), p)
    state.set_model(str(p))
    assert sweep_tab.start_btn.isEnabled()
    p.write_bytes(b"gone")  # replaced after it was chosen
    sweep_tab.start_btn.click()
    assert sweep_tab.sweeps.job is None and "not a GGUF file" in state.errors[-1]
    assert not sweep_tab.start_btn.isEnabled() and "not a GGUF file" in sweep_tab.form.model_note.text()


# -- a model without MTP heads ------------------------------------------------------------------------

def test_a_model_without_mtp_heads_keeps_its_reason_and_what_still_runs(sweep_tab, state, tmp_path, make_model):
    tab = sweep_tab
    plain = tmp_path / "Qwen3.6-27B-Q4_K_M.gguf"  # named like a catalog model that has an -MTP- build
    shutil.copy(make_model(0.0, mtp=False), plain)
    state.set_model(str(plain))
    note = tab.form.model_note.text()
    assert not tab.start_btn.isEnabled() and not tab.form.model_note.isHidden()  # draft-mtp alone cannot run
    assert note.startswith("Qwen3.6-27B-Q4_K_M.gguf has no MTP heads")
    assert "n-gram modes" in note and "any GGUF" in note and "unsloth/Qwen3.6-27B-MTP-GGUF" in note
    # an n-gram mode ticked: Start is enabled, the reason stays (its draft-mtp arms are skipped)
    tab.form.modes.set_spec_types({"draft-mtp", "ngram-mod"})
    tab.form.modes.set_modes(["draft-mtp", "ngram-mod"])
    assert tab.start_btn.isEnabled() and not tab.form.model_note.isHidden()
    assert "draft-mtp arms are skipped" in tab.form.model_note.text()
    state.show_error("a dialog that comes and goes")  # the reason is not only a dialog
    assert "has no MTP heads" in tab.form.model_note.text()
    # a model without a catalog twin: the catalog's -MTP- builds are named in general
    other = tmp_path / "mystery.gguf"
    shutil.copy(make_model(0.0, mtp=False), other)
    state.set_model(str(other))
    assert "the catalog's -MTP- repos" in tab.form.model_note.text()
    # a model with heads: no note
    state.set_model(str(make_model(0.0)))
    assert tab.form.model_note.isHidden()


# -- a sweep that never started -----------------------------------------------------------------------

def test_a_sweep_that_never_started_says_its_error_never_finished(sweep_tab, state, qtbot, make_model, monkeypatch):
    from app.core.session import sweep as session_mod

    def no_engine(settings):
        raise UserError("llama-server: cannot start (port in use)")

    monkeypatch.setattr(session_mod, "make_engine", no_engine)
    state.set_model(str(make_model(0.0)))
    sweep_tab.form.k_edit.setText("1")
    statuses: list[str] = []
    state.status.connect(statuses.append)
    with qtbot.waitSignal(state.sweep_finished, timeout=30000):
        sweep_tab.start_btn.click()
    assert statuses[-1] == "The sweep did not start: llama-server: cannot start (port in use)"
    assert not any(s.startswith("Finished") or "results in" in s for s in statuses), statuses
    assert sweep_tab.start_btn.isEnabled() and state.records == []


def _small_demo(tab, state, tasks=("code",)):
    state.use_demo_model()
    tab.form.k_edit.setText("1")
    tab.form.npredict.setValue(16)
    tab.form.reps.setValue(1)
    for t, cb in tab.form.task_boxes.items():
        cb.setChecked(t in tasks)


def test_the_previous_plots_stay_until_the_new_sweep_has_a_record(sweep_tab, state, qtbot, monkeypatch):
    tab = sweep_tab
    _small_demo(tab, state, ("code",))
    with qtbot.waitSignal(state.sweep_finished, timeout=120000):
        tab.start_btn.click()
    first_path, first_records = state.results_path, list(state.records)
    assert first_records and list(tab.plots.series) == ["code"]
    points = tab.plots.speedup_items["code"][0].getData()[0]
    assert len(points) == 1  # K=1 for code

    # a sweep that fails before its first run: the plots and the shown sweep stay as they were
    from app.core.session import sweep as session_mod

    real = session_mod.make_engine
    monkeypatch.setattr(session_mod, "make_engine", lambda s: (_ for _ in ()).throw(UserError("no engine")))
    with qtbot.waitSignal(state.sweep_finished, timeout=30000):
        tab.start_btn.click()
    assert list(tab.plots.series) == ["code"] and len(tab.plots.speedup_items["code"][0].getData()[0]) == 1
    assert state.results_path == first_path and state.records == first_records

    # a sweep of another task: the old plots until its first record, then its own
    monkeypatch.setattr(session_mod, "make_engine", real)
    for t, cb in tab.form.task_boxes.items():
        cb.setChecked(t == "story")
    seen_at_start = []
    shown = tab.handlers[RunStarted]
    tab.handlers[RunStarted] = lambda ev: (seen_at_start.append(list(tab.plots.series)), shown(ev))
    with qtbot.waitSignal(state.sweep_finished, timeout=120000):
        tab.start_btn.click()
    assert seen_at_start and seen_at_start[0] == ["code"]  # the warmup started: still the old plots
    assert list(tab.plots.series) == ["story"] and state.results_path != first_path


# -- network errors: one plain sentence, once ---------------------------------------------------------

def test_offline_the_llama_cpp_release_is_one_sentence(offline, monkeypatch):
    monkeypatch.delenv(runtime_release.RELEASES_URL_ENV, raising=False)
    with pytest.raises(UserError) as e:
        runtime_release.fetch_release()
    assert str(e.value) == OFFLINE_RELEASE


def test_refused_and_offline_hub_requests_are_one_sentence(offline):
    from app.core.machine import hub

    with pytest.raises(hub.HubError) as e:
        hub.HubClient("https://huggingface.co").search("qwen3.6")
    assert str(e.value) == "no network: cannot reach huggingface.co to search for 'qwen3.6'"


def test_offline_get_llama_cpp_says_it_once_beside_the_button(state, qtbot, offline, monkeypatch):
    from app.gui.tabs.machine import MachineTab

    monkeypatch.delenv(runtime_release.RELEASES_URL_ENV, raising=False)
    tab = make_tab(MachineTab, state)
    qtbot.addWidget(tab)
    statuses: list[str] = []
    state.status.connect(statuses.append)
    tab.runtime_btn.click()
    qtbot.waitUntil(lambda: tab.runtime_btn.isEnabled(), timeout=60000)
    assert tab.runtime_label.text() == f"not installed: {OFFLINE_RELEASE}"
    assert state.errors == [] and not any("cannot reach" in s for s in statuses)  # no dialog, no status echo
    assert "ConnectError" not in tab.runtime_label.text() and "Errno" not in tab.runtime_label.text()


def test_offline_hub_search_is_one_sentence_and_the_catalog_shows(state, qtbot, offline, monkeypatch):
    from app.gui.tabs.model import ModelTab

    monkeypatch.setenv("HF_ENDPOINT", "https://huggingface.co")
    tab = make_tab(ModelTab, state)
    qtbot.addWidget(tab)
    tab.search_edit.setText("qwen3.6")
    tab.search_models()
    qtbot.waitUntil(lambda: tab.search_btn.isEnabled(), timeout=30000)
    assert tab.download_label.text() == "no network: cannot reach huggingface.co to search for 'qwen3.6'"
    assert state.errors == [] and tab.repos.rowCount() > 0  # the catalog's entries still listed
