"""The Sweep tab's speculative modes and drafter: the mode list is the chosen
llama-server's, a mode only llama-server runs moves the sweep there and says so, a bad drafter is
one line before anything starts, a Run again plan shows its modes, and the plots draw one series
per task and mode."""

from __future__ import annotations

import datetime as _dt

import pytest

pytest.importorskip("PySide6")


from app.core.measure.plan import Plan, make_arms  # noqa: E402
from app.core.records.arm import Arm  # noqa: E402
from app.core.records.prompt import Prompt  # noqa: E402
from app.core.records.schema import SCHEMA_VERSION, RunRecord  # noqa: E402
from conftest import make_tab  # noqa: E402
from tests.helpers import make_record  # noqa: E402

HELP = """usage: llama-server [options]
-m,    --model FNAME                    model path
--spec-type none,draft-simple,draft-mtp,ngram-simple,ngram-mod   speculative decoding type
--spec-draft-n-max N                    draft width
--spec-draft-model FNAME                drafter model
"""




@pytest.fixture
def tab(sweep_tab):
    return sweep_tab


def fake_server(path, help_text: str = HELP):
    """A llama-server that answers --version and --help (nothing else is asked of it here)."""
    (path.parent / f"{path.name}.help").write_text(help_text)
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "version: 1 (abc)"; '
                    f'else cat "{path}.help"; fi\n')
    path.chmod(0o755)
    return str(path)


def tick(tab, *modes):
    for m, act in tab.form.modes.actions.items():
        act.setChecked(m in modes)


def test_the_mode_list_is_the_llama_servers_spec_types(tab, state, qtbot, tmp_path):
    state.set_server_bin(fake_server(tmp_path / "llama-server"), checked=True)  # asked on a worker
    qtbot.waitUntil(lambda: len(tab.form.modes.listed_modes()) > 1, timeout=30000)
    assert tab.form.modes.listed_modes() == ["draft-simple", "draft-mtp", "ngram-simple", "ngram-mod"]
    assert tab.form.modes.modes() == ["draft-mtp"]  # draft-mtp alone, ticked, until the user ticks others
    tips = {m: a.toolTip() for m, a in tab.form.modes.actions.items()}
    assert "no drafter" in tips["ngram-mod"] and "--spec-type ngram-mod" in tips["ngram-mod"]
    assert "needs a Drafter" in tips["draft-simple"] and "-md FILE" in tips["draft-simple"]
    assert "MTP heads" in tips["draft-mtp"]
    # another binary without ngram-mod: its list, and a ticked mode it lacks stays, marked
    tick(tab, "draft-mtp", "ngram-mod")
    older = fake_server(tmp_path / "old-server", HELP.replace(",ngram-mod", ""))
    state.set_server_bin(older, checked=True)
    qtbot.waitUntil(lambda: "old-server" in tab.form.modes.button.toolTip(), timeout=30000)
    assert tab.form.modes.listed_modes() == ["draft-simple", "draft-mtp", "ngram-simple", "ngram-mod"]
    assert tab.form.modes.modes() == ["draft-mtp", "ngram-mod"] and tab.form.modes.button.text() == "draft-mtp, ngram-mod"
    assert tab.form.modes.actions["ngram-mod"].toolTip().endswith("(not listed by this llama-server)")
    # no llama-server at all: draft-mtp only
    tick(tab, "draft-mtp")
    state.set_server_bin(str(tmp_path / "nowhere"), checked=True)
    assert tab.form.modes.listed_modes() == ["draft-mtp"] and "no llama-server found" in tab.form.modes.button.toolTip()


def test_ngram_mod_with_in_process_runs_the_sweep_on_llama_server_and_says_so(tab, state, monkeypatch, qtbot,
                                                                               make_model):
    from app.core.common.errors import UserError
    from app.core.engines.base import EngineKind
    from app.core.session import sweep as session_mod

    asked = []

    def no_engine(settings):  # which engine the sweep's session asks for; none is made
        asked.append(settings.kind)
        raise UserError("no engine in this test")

    monkeypatch.setattr(session_mod, "make_engine", no_engine)
    state.set_model(str(make_model(0.0)))  # a real GGUF with MTP heads: Start is enabled
    tab.form.modes.set_spec_types({"draft-mtp", "ngram-mod"})
    assert tab.form.engine_box.currentText() == "in-process" and tab.form.modes.note.text() == ""
    tick(tab, "draft-mtp", "ngram-mod")
    assert tab.form.engine_box.currentText() == "llama-server"
    assert tab.form.modes.note.text() == ("ngram-mod runs only in llama-server: this sweep runs on llama-server (the "
                                     "baseline too, so that each pair compares like with like)")
    plan = tab.form.plan()
    assert plan.engine == "server" and plan.arms[0] == Arm() and Arm(mode="ngram-mod") in plan.arms
    assert {a.k for a in plan.arms if a.is_mtp} == {1, 2, 3}  # the Normal preset's widths
    tab.start_btn.click()
    qtbot.waitUntil(lambda: tab.sweeps.job is None, timeout=10000)
    assert asked == [EngineKind.SERVER] and state.last_error == "no engine in this test"
    # the user picks in-process again: the sweep still cannot run there
    tab.form.engine_box.setCurrentIndex(0)
    tab.form.engine_box.activated.emit(0)
    assert tab.form.engine_box.currentText() == "llama-server" and "ngram-mod runs only" in tab.form.modes.note.text()
    # ngram-mod unticked: back to in-process, no note
    tick(tab, "draft-mtp")
    assert tab.form.engine_box.currentText() == "in-process" and tab.form.modes.note.text() == ""
    assert tab.form.plan().engine == "inprocess"
    # adaptive: draft-mtp on the model's own heads only, said, the modes greyed
    tick(tab, "draft-mtp", "ngram-mod")
    tab.form.mode_box.setCurrentText("adaptive")
    assert not tab.form.modes.button.isEnabled() and not tab.form.modes.drafter_edit.isEnabled()
    assert tab.form.modes.note.text().startswith("adaptive sweeps draft-mtp on the model's own MTP heads only")
    assert tab.form.engine_box.currentText() == "in-process"
    plan = tab.form.plan()
    assert plan.engine == "inprocess" and all(a.is_baseline or (a.is_mtp and not a.drafter) for a in plan.arms)
    tab.form.mode_box.setCurrentText("exhaustive")
    assert tab.form.engine_box.currentText() == "llama-server" and "ngram-mod runs only" in tab.form.modes.note.text()


def test_a_drafter_goes_to_the_draft_mode_and_its_sweep_to_llama_server(tab, state, make_model):
    state.set_model(str(make_model(0.0)))
    tab.form.modes.set_spec_types({"draft-mtp", "draft-simple"})
    tab.form.modes.drafter_edit.setText("/d.gguf")  # draft-mtp alone: a Gemma 4 assistant
    assert tab.form.modes.drafters() == {"draft-mtp": "/d.gguf"} and tab.form.engine_box.currentText() == "llama-server"
    assert tab.form.modes.note.text().startswith("draft-mtp with a drafter runs only in llama-server")
    tick(tab, "draft-mtp", "draft-simple")  # the draft model's: draft-mtp keeps the model's own heads
    assert tab.form.modes.drafters() == {"draft-simple": "/d.gguf"}
    assert tab.form.modes.note.text().startswith("draft-simple runs only in llama-server")
    tab.form.modes.clear_btn.click()
    assert tab.form.modes.drafter() is None
    errors = []
    state.error.connect(errors.append)
    tab.start_sweep()
    assert errors == ["draft-simple needs a drafter model: choose one in Drafter"] and tab.sweeps.job is None


@pytest.mark.parametrize("content", [None, b"not a model"])
def test_a_bad_drafter_is_one_line_and_starts_nothing(tab, state, qtbot, tmp_path, monkeypatch, content):
    from app.core.session import sweep as session_mod

    state.use_demo_model()
    drafter = tmp_path / "drafter.gguf"
    if content is not None:
        drafter.write_bytes(content)
    engines, started, errors = [], [], []
    monkeypatch.setattr(session_mod, "make_engine", lambda settings: engines.append(settings))
    state.sweep_started.connect(started.append)
    state.error.connect(errors.append)
    tab.form.modes.drafter_edit.setText(str(drafter))
    tab.start_sweep()
    assert len(errors) == 1 and "\n" not in errors[0] and str(drafter) in errors[0], errors
    assert not engines and not started and tab.sweeps.job is None and tab.start_btn.isEnabled()
    assert state.records == [] and tab.sweeps.results_path is None


def test_run_again_shows_the_plans_modes_and_drafter(tab, state, monkeypatch):
    started = []
    monkeypatch.setattr(tab, "start_sweep", started.append)
    tab.form.modes.set_spec_types({"draft-mtp", "ngram-mod"})
    tick(tab, "draft-mtp", "ngram-mod")  # the engine box switched by the modes, then a plan of draft-mtp alone
    plan = Plan(model="/m.gguf", arms=make_arms([2]), prompts=(Prompt("c1", "code", "x"),), engine="server")
    state.sweep_requested.emit(plan)
    assert tab.form.modes.modes() == ["draft-mtp"] and tab.form.engine_box.currentText() == "llama-server"  # as it runs
    prompts = (Prompt("c1", "code", "x"),)
    plan = Plan(model="/m.gguf", arms=make_arms([1, 2], modes=("draft-mtp", "ngram-mod")), prompts=prompts,
                engine="server")
    state.sweep_requested.emit(plan)
    assert started[-1] == plan and tab.form.modes.modes() == ["draft-mtp", "ngram-mod"]
    assert tab.form.k_edit.text() == "1,2" and tab.form.engine_box.currentText() == "llama-server"
    assert tab.form.modes.drafter() is None and "ngram-mod runs only" in tab.form.modes.note.text()
    plan = Plan(model="/m.gguf", arms=make_arms([3], modes=("draft-simple",), drafters={"draft-simple": "/d.gguf"}),
                prompts=prompts, engine="server")
    state.sweep_requested.emit(plan)
    assert tab.form.modes.modes() == ["draft-simple"] and tab.form.modes.drafter() == "/d.gguf" and tab.form.k_edit.text() == "3"
    assert "draft-simple" in tab.form.modes.listed_modes()  # not listed by any llama-server here: added


# -- the plots: one series per task and mode ---------------------------------------------------------
T0 = _dt.datetime(2025, 1, 1, tzinfo=_dt.timezone.utc)


def record(i: int, task: str, arm: Arm, prompt: str, rep: int, tok_s: float, drafted=(0, 0)) -> RunRecord:
    """A finished run as a results file holds it (draft-mtp: arm "mtp"; another mode: "spec")."""
    return make_record(arm, run_id=f"r{i}", sweep_id="s", task=task, prompt_id=prompt, rep=rep, n_predict=64,
                       tok_s=tok_s, tok_s_engine=None, draft_n=drafted[0] if arm.is_spec else None,
                       draft_accepted=drafted[1] if arm.is_spec else None, acceptance=None, mtp_engaged=None,
                       output_sha256=None, prompt_n=3, prompt_tokens=(1, 2, 3), prompt_tok_s=None, llama_build="b",
                       token_times=(0.0, 0.1, 0.2, 0.3), timestamp_utc=(T0 + _dt.timedelta(seconds=i)).isoformat())


def two_mode_records() -> list[RunRecord]:
    """draft-mtp K=1..3 and ngram-mod on code and story: acceptance 10*k % + task, ngram-mod 50 %."""
    arms = [Arm(), Arm(1), Arm(2), Arm(3), Arm(mode="ngram-mod")]
    recs = []
    for rep in range(3):
        for task, base in (("code", 40.0), ("story", 30.0)):
            for arm in arms:
                acc = 50 if arm.mode == "ngram-mod" else 10 * (arm.k or 0) + (20 if task == "code" else 0)
                speed = base * (1.0 if arm.is_baseline else 1 + acc / 200) + rep
                recs.append(record(len(recs), task, arm, f"{task}1", rep, speed, (100, acc)))
    return recs


def test_the_plots_draw_one_series_per_task_and_mode(tab):
    from app.core.analysis.analysis import analyze

    analysis = analyze(two_mode_records())
    plots = tab.plots
    plots.show_analysis(analysis)
    assert set(plots.acc_items) == {"code", "story", "code, ngram-mod", "story, ngram-mod"}
    xs, ys = plots.acc_items["code"].getData()
    assert list(xs) == [1, 2, 3] and [round(y) for y in ys] == [30, 40, 50]
    xs, ys = plots.acc_items["story, ngram-mod"].getData()
    assert [round(x) for x in xs] == [4] and [round(y) for y in ys] == [50]  # its own column, right of K=3
    assert xs[0] != plots.acc_items["code, ngram-mod"].getData()[0][0]  # the tasks side by side in it
    assert plots.acc_items["code, ngram-mod"].opts["pen"] is None  # a point, not a line
    for key, (pts, bars) in plots.speedup_items.items():
        px, py = pts.getData()
        assert len(px) == (1 if "ngram" in key else 3) and all(y > 1.0 for y in py)
        assert [round(x) for x in px] == ([4] if "ngram" in key else [1, 2, 3])
        assert len(bars.opts["top"]) == len(px)
    for p in (plots.acc_plot, plots.speedup_plot):  # colour = task, symbol = mode: each named once
        legend = p.getPlotItem().legend
        assert [label.text for _, label in legend.items] == ["code", "story", "draft-mtp", "ngram-mod"]
        modes = [sample.item.opts["symbol"] for sample, _ in legend.items[2:]]
        assert modes == [plots.acc_items["code"].opts["symbol"], plots.acc_items["code, ngram-mod"].opts["symbol"]]
        assert modes[0] != modes[1] and p.getViewBox().viewRange()[0] == [0.5, 4.5]  # K=1..3 and the column
    ticks = plots.acc_plot.getAxis("bottom")._tickLevels[0]
    assert ticks == [(1, "1"), (2, "2"), (3, "3"), (4, "ngram-mod")]
    # a sweep of draft-mtp alone: the task names, K's ticks, as before modes
    plots.prepare(["code"], make_arms([1, 2]))
    assert set(plots.acc_items) == {"code"} and plots.acc_plot.getAxis("bottom")._tickLevels is None
    assert [label.text for _, label in plots.acc_plot.getPlotItem().legend.items] == ["code"]


def test_the_live_plots_fill_each_modes_series_as_runs_come(tab):
    from app.core.analysis.analysis import analyze

    recs = two_mode_records()
    plots = tab.plots
    plots.prepare(["code", "story"], make_arms([1, 2, 3], modes=("draft-mtp", "ngram-mod")))
    assert set(plots.acc_items) == {"code", "story", "code, ngram-mod", "story, ngram-mod"}
    first = [r for r in recs if r.rep == 0 and r.task == "code"]  # one repetition of code so far
    plots.set_analysis(analyze(first))
    plots.repaint(force=True)
    assert [round(x) for x in plots.acc_items["code, ngram-mod"].getData()[0]] == [4]
    assert list(plots.acc_items["code"].getData()[0]) == [1, 2, 3]
    assert len(plots.acc_items["story"].getData()[0] or []) == 0


def test_the_drafter_field_follows_the_model_tabs_drafter(state, qtbot):
    from app.gui.tabs.sweep import SweepTab

    state.set_drafter("/a.gguf")
    tab = make_tab(SweepTab, state)  # made after the pick: prefilled
    qtbot.addWidget(tab)
    assert tab.form.modes.drafter() == "/a.gguf" and tab.form.engine_box.currentText() == "llama-server"
    assert tab.form.modes.note.text().startswith("draft-mtp with a drafter runs only in llama-server")
    state.set_drafter("/b.gguf")
    assert tab.form.modes.drafter() == "/b.gguf"
    state.set_drafter("")
    assert tab.form.modes.drafter() is None and tab.form.engine_box.currentText() == "in-process"


def test_the_combined_modes_are_listed_where_the_server_has_their_parts(tab, state, qtbot, tmp_path):
    """Issue 40: draft-mtp+ngram-mod and the other offered combinations sit under the single modes,
    each where the llama-server lists every part; ticked, it is one arm, with its tip."""
    state.set_server_bin(fake_server(tmp_path / "llama-server"), checked=True)
    qtbot.waitUntil(lambda: len(tab.form.modes.listed_modes()) > 1, timeout=30000)
    assert tab.form.modes.combined_modes() == ["draft-mtp+ngram-mod", "draft-mtp+ngram-simple",
                                               "draft-simple+ngram-mod", "draft-simple+ngram-simple",
                                               "ngram-simple+ngram-mod"]
    assert "--spec-type draft-mtp,ngram-mod" in tab.form.modes.actions["draft-mtp+ngram-mod"].toolTip()
    tick(tab, "draft-mtp", "draft-mtp+ngram-mod")
    assert tab.form.modes.chosen() == (["draft-mtp", "draft-mtp+ngram-mod"], {})
    assert tab.form.modes.server_only() == ["draft-mtp+ngram-mod"]
    # a server without ngram-mod offers no combination with it; a ticked one stays, marked
    state.set_server_bin(fake_server(tmp_path / "old-server", HELP.replace(",ngram-mod", "")), checked=True)
    qtbot.waitUntil(lambda: "old-server" in tab.form.modes.button.toolTip(), timeout=30000)
    assert tab.form.modes.combined_modes() == ["draft-mtp+ngram-mod", "draft-mtp+ngram-simple",
                                               "draft-simple+ngram-simple"]
    assert tab.form.modes.actions["draft-mtp+ngram-mod"].toolTip().endswith("(not listed by this llama-server)")
