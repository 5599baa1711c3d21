"""The window's smaller points, offscreen: advice in the window's words (no CLI flags), advice
that follows what was measured (no "measure the n-gram modes" after an n-gram sweep), a calm
colour when the machine is quiet now, the Sweep tab following the Start page's choices, labels
for alpha, len, the verify cost and the Start page's weights, and the Sweep tab at 1240x700 with
Advanced open (no sideways scrolling, plots that are not strips)."""

from __future__ import annotations

import dataclasses
import re

import pytest

pytest.importorskip("PySide6")

from helpers import clear_sweep_file, make_record  # noqa: E402

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]+")  # a CLI flag such as --reps


def test_the_cores_advice_is_said_in_the_windows_words(window, tmp_path):
    """Two repetitions: the core advises "--reps 3"; the banner and Advanced say where to set it."""
    from app.core.records.writer import ResultsWriter

    recs = [r for r in clear_sweep_file(tmp_path / "all.jsonl") if r.rep < 2]
    with ResultsWriter(tmp_path / "two.jsonl") as w:
        for r in recs:
            w.append(r)
    window.results_tab.open_results(str(tmp_path / "two.jsonl"))
    v = window.state.verdict
    assert any("--reps" in f.fix for f in v.analysis.findings)  # the core's own words (the CLI's)
    res = window.results_tab
    shown = [w for row in res.banner.rows.values() for w in row.warning_texts] + [res.findings.toPlainText()]
    assert not any(FLAG.search(t) for t in shown), shown
    assert any("3 or more repetitions: Sweep tab > Advanced settings > Runs > Repetitions" in t for t in shown)


def test_after_an_ngram_sweep_the_advice_is_not_to_measure_them(window, make_model, tmp_path):
    from app.core.machine.modelinfo import inspect
    from app.core.records.arm import Arm

    model = str(make_model(mtp=False))
    recs = [make_record(Arm() if i % 2 == 0 else Arm(mode="ngram-mod"), run_id=f"r{i}", rep=i // 2, engine="server",
                        model_path=model, tok_s=10.0 if i % 2 == 0 else 13.0 + 0.01 * i,
                        timestamp_utc=f"2026-01-01T00:00:{i:02d}Z") for i in range(12)]
    st = window.state
    st.set_model(model)
    st.set_model_info(inspect(model))
    st.set_results(recs, None)
    note = window.results_tab.banner.note.text()
    assert "no MTP heads" in note and "catalog" in note and "measure the n-gram modes" not in note
    heads = window.export_tab.no_heads_label.text()
    assert "no MTP heads" in heads and "-MTP-" in heads and "n-gram" not in heads
    # a sweep that measured none of them: the n-gram modes are still the advice
    st.set_results([dataclasses.replace(r, spec_type="draft-mtp", k=2, arm_kind="mtp") if r.arm_kind != "baseline"
                    else r for r in recs], None)
    assert "measure the n-gram modes" in window.results_tab.banner.note.text()


def test_a_quiet_machine_is_not_shown_in_bold_red(qtbot):
    from app.core.measure.busy import DISTURBED, Busy
    from app.gui.tabs.sweep.busy import BUSY_STYLE, EARLIER_STYLE, BusyIndicator

    now = [Busy(cpu=0.61, top="cc1plus", top_cpu=0.6, cores=2)]

    class Fixed:
        def start(self):
            pass

        def poll(self):
            return now[0]

    w = BusyIndicator(monitor=Fixed())
    qtbot.addWidget(w)
    w.show()
    w.poll()
    w.run_done(make_record(flags=(DISTURBED,)))
    assert w.styleSheet() == BUSY_STYLE  # busy now
    now[0] = Busy(cpu=0.01, cores=2)
    w.poll()
    assert "CPU 1 %" in w.text() and "1 of 1 runs disturbed" in w.text()
    assert w.styleSheet() == EARLIER_STYLE and "bold" not in w.styleSheet()
    w.reset()
    assert w.styleSheet() == ""


def test_the_sweep_tab_follows_the_start_pages_choices(window):
    from app.core.session.sweep import prepare

    page, form = window.start_tab, window.sweep_tab.form
    page.use_boxes["story"][0].setChecked(False)
    page.use_boxes["tongue-twister"][0].setChecked(True)
    page.use_boxes["tongue-twister"][1].setValue(3)
    page.thorough.setChecked(True)
    form.mode_box.setCurrentText("exhaustive")
    window.state.set_task_mix(page.uses.mix_text())  # as Tune for me does
    prepared = prepare(page.request())
    window.services.sweeps.started.emit(prepared)  # the Start page's sweep begins
    ticked = {t for t, cb in form.task_boxes.items() if cb.isChecked()}
    assert ticked == {"code", "tongue-twister"}
    assert form.mode_box.currentText() == "adaptive" and form.budget_box.currentText() == "Thorough (until decided)"
    assert form.mix_edit.text() == "code=1,tongue-twister=3"


def test_alpha_len_the_verify_cost_and_the_weights_are_labelled(window):
    from app.gui.tabs.machine import VERIFY_TITLE

    legend = window.results_tab.advanced.table_legend.text()
    assert "alpha: the chance that each drafted token is accepted" in legend and "len: drafted tokens" in legend
    assert window.machine_tab.probe_plot.getPlotItem().titleLabel.text == VERIFY_TITLE
    assert "T(n)/T(1) times one token's time" in VERIFY_TITLE
    for _cb, weight in window.start_tab.use_boxes.values():
        assert weight.prefix() == "weight "


def test_the_sweep_tab_at_1240x700_with_advanced_open(window, qtbot):
    from PySide6.QtCore import QCoreApplication

    from app.gui.tabs.sweep.tab import PLOT_MIN_H

    win = window
    win.resize(1240, 700)
    win.show()
    win.tabs.setCurrentWidget(win.sweep_tab)
    win.sweep_tab.form.show_advanced(True)
    for _ in range(5):
        QCoreApplication.processEvents()
    assert (win.width(), win.height()) == (1240, 700)  # it did not grow
    area = win.sweep_tab.form.advanced_area
    assert area.isVisible() and area.horizontalScrollBar().maximum() == 0  # no sideways scrolling
    assert all(p.height() >= PLOT_MIN_H for p in win.sweep_tab.plots.widgets)


PLACE = re.compile(r"Sweep tab > Advanced settings > ([^>]+?) > ([^>]+)")  # the group, then the field and on


def test_every_warning_names_the_control_to_use_by_its_place(window):
    """Tune for me's warnings (the core's advice in the window's words, the Export and Sweep tabs'
    next steps) sent the user to "Sweep tab, Advanced settings, Runs": no field, or none at all
    (warmup has no field in the window). Each now names its place, tab > section > group > field,
    and each place named is a field of that group in the window, or a button that exists."""
    from PySide6.QtWidgets import QFormLayout, QLabel, QPushButton

    from app.core.analysis.advice import Advice, Setting, say
    from app.gui.tabs.export import NO_HEADS_NEXT
    from app.gui.words import WINDOW_WORDS

    said = [say(Advice((Setting(k, "3"),)), WINDOW_WORDS) for k in WINDOW_WORDS] + [NO_HEADS_NEXT]
    groups = window.sweep_tab.form.advanced_groups
    places = 0
    for text in said:
        assert "Sweep tab, Advanced" not in text and "on the Sweep tab" not in text, text
        if "Advanced settings" in text:  # the whole path, to a field
            found = PLACE.findall(text)
            assert found, text
            for group, field in found:
                form = groups[group].layout()
                assert isinstance(form, QFormLayout), group
                labels = [w.text() for i in range(form.rowCount())
                          if (item := form.itemAt(i, QFormLayout.ItemRole.LabelRole)) is not None
                          and isinstance(w := item.widget(), QLabel)]
                assert any(field == f or field.startswith((f + ":", f + ")", f + " ", f + ",", f + ".")) for f in labels), \
                    (text, group, labels)
                places += 1
    assert places >= 8
    buttons = {b.text() for b in window.findChildren(QPushButton)}
    for key, button in (("runtime", "Get llama.cpp for this machine"), ("resume", "Finish when quiet"),
                        ("warmup", "Start sweep")):
        assert button in WINDOW_WORDS[key] and button in buttons, (key, buttons)
