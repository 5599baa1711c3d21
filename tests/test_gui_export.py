"""The Export tab: the command for one task or for the user's mix (edited here with sliders), the
user's declared use as default, no sampler flags until ticked, a verdict's button (the state's
command_requested) selecting its task, the confirm result kept with its sweep, and a model without
MTP heads told its next step."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from conftest import make_tab  # noqa: E402
from tests.helpers import clear_sweep_file  # noqa: E402
from app.core.verdict.export import SAMPLER_FLAGS  # noqa: E402


def _argv(tab) -> list[str]:
    return list(tab.current_export.argv)


@pytest.fixture
def export(state, qtbot):
    from app.gui.tabs.export import ExportTab

    tab = make_tab(ExportTab, state)
    qtbot.addWidget(tab)
    return tab


@pytest.fixture
def clear(state, tmp_path):
    path = tmp_path / "clear.jsonl"
    return clear_sweep_file(path), path


def test_the_default_is_the_first_task_where_mtp_pays_with_its_flags_and_no_sampler(state, export, clear):
    state.set_results(*clear)
    assert [export.scope_box.itemText(i) for i in range(export.scope_box.count())] == ["code", "story", "my mix"]
    assert export.scope_box.currentText() == "code"
    argv = _argv(export)
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp" and argv[argv.index("--spec-draft-n-max") + 1] == "2"
    assert export.command.toPlainText() == export.current_export.command
    assert not set(argv) & set(SAMPLER_FLAGS) and export.sampler_note.text() == ""
    assert export.verdict_label.text().startswith("code: turn MTP on with K=2")
    # ticked: the sampler the sweep measured, with the note that it makes the server greedy
    export.sampler_box.setChecked(True)
    argv = _argv(export)
    assert argv[argv.index("--temp") + 1] == "0" and "--seed" in argv and "--spec-type" in argv
    assert "greedy" in export.sampler_note.text()
    export.sampler_box.setChecked(False)
    assert not set(_argv(export)) & set(SAMPLER_FLAGS) and export.sampler_note.text() == ""
    # story's own command: leave it off
    export.select("story")
    assert "--spec-type" not in _argv(export) and export.verdict_label.text().startswith("story: leave MTP off")


@pytest.mark.parametrize("declared, want", [("story", "story"), ("mix", "my mix"), ("poetry", "code")])
def test_the_declared_use_is_the_default(state, export, clear, declared, want):
    state.settings.setValue("declared_use", declared)
    state.set_results(*clear)
    assert export.scope_box.currentText() == want
    assert export.mix_box.isVisible() == (want == "my mix") or not export.isVisible()


def test_the_mix_sliders_set_the_mix_and_the_command_follows(state, export, clear):
    state.set_results(*clear)
    export.select("mix")
    assert state.verdict.mix == {"code": 0.5, "story": 0.5}
    assert {t: s.value() for t, s in export.sliders.items()} == {"code": 10, "story": 10}
    assert "--spec-type" not in _argv(export)  # the equal mix: story's loss outweighs code's gain
    export.sliders["story"].setValue(0)
    assert state.task_mix == "code=10,story=0" and state.verdict.mix == {"code": 1.0}
    assert export.sliders["code"].value() == 10 and export.sliders["story"].value() == 0  # not reset while sliding
    argv = _argv(export)
    assert argv[argv.index("--spec-draft-n-max") + 1] == "2"
    export.sliders["code"].setValue(0)  # nothing weighed: no command, and the reason
    assert export.current_export is None and "add up to zero" in export.verdict_label.text()


def test_command_requested_selects_the_task(state, export, clear):
    state.set_results(*clear)
    state.command_requested.emit("story")
    assert export.scope_box.currentText() == "story"
    state.command_requested.emit("")
    assert export.scope_box.currentText() == "my mix"
    state.command_requested.emit("code")
    assert "--spec-type" in _argv(export)


def test_the_window_shows_export_for_a_verdicts_button(window, clear):
    window.state.set_results(*clear)
    window.tabs.setCurrentIndex(0)
    window.state.command_requested.emit("code")
    assert window.tabs.currentWidget() is window.export_tab
    assert window.export_tab.scope_box.currentText() == "code"


def test_the_confirm_result_belongs_to_its_sweep(state, export, clear, tmp_path, monkeypatch):
    """The confirm run's line (here from recorded llama-server runs of the pick and the plain
    command) stays while its sweep is shown (a new verdict of it, another shell) and goes when
    another sweep is shown."""
    import dataclasses

    from app.core.records.arm import Arm

    import app.core.session.confirm as C
    import app.core.session.sweep as S
    from app.core.session.events import RunFinished
    from app.core.records.prompt import Prompt

    records, path = clear
    state.set_results(records, path)
    fast = next(r for r in records if r.task == "code" and r.k == 2)
    pair = [r for r in records if r.task == "code" and r.measured_arm in (fast.measured_arm, Arm())]

    def fake_run(request, cancel):  # llama-server answering at the sweep's speed
        for r in pair:  # the plain command's run and the pick's, as llama-server answered them
            yield RunFinished(dataclasses.replace(r, engine="server", llama_build="b9999"))

    confirm_code(export, monkeypatch, fake_run,
                 lambda: "llama-server" in export.confirm_label.text() and "starting" not in export.confirm_label.text())
    text = export.confirm_label.text()
    measured = state.verdict.command("code").pick.ratio.estimate
    assert text.startswith("llama-server timed K=2 on the code prompt code: "), text  # what it timed
    assert f"the sweep measured {measured:.2f}x" in text and "confirms" not in text, text
    state.set_shell("powershell")  # the same sweep: the line stays
    assert export.confirm_label.text() == text
    other = tmp_path / "other.jsonl"
    state.set_results(clear_sweep_file(other, sweep_id="other"), other)
    assert export.confirm_label.text() == ""


def test_confirm_shows_its_progress_then_what_it_timed(state, export, clear, monkeypatch):
    """Confirm showed "starting…" until the end, then "confirms 1.29x faster" for one run of the
    pick. Now the label follows the run ("llama-server: 3 of 6 runs", the core's ConfirmProgress)
    and ends with what was timed, in the core's words (confirm_headline) and nothing else. The
    runs are the clear sweep's recorded code runs of the plain command and K=2, in llama-server's
    place."""
    import dataclasses

    import app.core.session.confirm as C
    import app.core.session.sweep as S
    from app.core.measure.events import RunStarted, SweepStarted
    from app.core.records.arm import Arm
    from app.core.records.prompt import Prompt
    from app.core.session.events import EngineReady, RunFinished

    records, path = clear
    state.set_results(records, path)
    k2 = next(r for r in records if r.task == "code" and r.k == 2).measured_arm
    runs = [dataclasses.replace(r, engine="server", llama_build="b9999") for r in records
            if r.task == "code" and r.measured_arm in (Arm(), k2) and r.rep < 3]  # as many as it plans
    assert len(runs) == 6

    def replay(request, cancel):
        yield EngineReady("server", "b9999", None, False)
        yield SweepStarted("s", request.plan, len(runs), None)
        for i, r in enumerate(runs):
            yield RunStarted(i, len(runs), r.measured_arm, r.prompt_id, r.task, r.rep)
            yield RunFinished(r)

    shown: list[str] = []
    set_text = export.confirm_label.setText
    export.confirm_label.setText = lambda t: (shown.append(t), set_text(t))  # each line the label showed
    confirm_code(export, monkeypatch, replay, lambda: bool(shown) and shown[-1].startswith("llama-server timed"))
    c = C.confirm_plan(state.verdict, None, "code")
    assert shown[0] == f"llama-server: starting, K=2 on the code prompt code ({c.plan.total_runs} runs)…", shown
    assert "llama-server: 3 of 6 runs" in shown and "llama-server: 6 of 6 runs" in shown, shown
    head = shown[-1].split("\n")[0]
    assert head == C.confirm_headline(c, runs), head  # the core's words, as they are
    assert head.startswith("llama-server timed K=2 on the code prompt code: ") and "95 % CI" in head, head
    assert "confirms" not in shown[-1] and "with these flags" not in shown[-1], shown[-1]


def test_a_model_without_mtp_heads_gets_its_reason_and_next_step(state, export, make_model):
    from app.core.machine.modelinfo import inspect

    state.set_model_info(inspect(str(make_model(0.0, mtp=False))))
    assert not export.no_heads_label.isHidden()
    text = export.no_heads_label.text()
    assert "no MTP heads" in text and "n-gram" in text and "any GGUF" in text and "-MTP-" in text
    state.set_model_info(inspect(str(make_model(0.0))))
    assert export.no_heads_label.isHidden()


def confirm_code(export, monkeypatch, run, done) -> None:
    """Export's Confirm of the code pick, the session's ``run`` made up (llama-server's runs as
    recorded), the window's events processed until ``done()`` (at most 100 times)."""
    import app.core.session.confirm as C
    import app.core.session.sweep as S
    from PySide6.QtCore import QCoreApplication

    from app.core.records.prompt import Prompt

    monkeypatch.setattr(S, "prepare", lambda req: type("P", (), {"request": req})())
    monkeypatch.setattr(S, "run", run)
    monkeypatch.setattr(C, "known_prompts", lambda model, f: {"code": Prompt("code", "code", "x")})
    export.select("code")
    export.confirm_with_server()
    assert export.confirm_job is None or export.confirm_job.wait(10000)
    for _ in range(100):
        QCoreApplication.processEvents()
        if done():
            break
