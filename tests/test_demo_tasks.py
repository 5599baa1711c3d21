"""The per-task calibrated model (the demo's): each task's prompts lead into their own region of
the token cycle, with its own share of wrong drafts, and both engines still match the exact
simulator there, for every task, K and variant. No timings here: benchmarks/demo_story.py measures
the demo's speedups."""

from __future__ import annotations

import pytest

from app.core.calibrated import design as C, demo as calibrated_demo, gguf as calibrated_gguf
from app.core.engines.inprocess import InProcessEngine
from app.core.measure.plan import Plan, make_arms
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished

TASK_P = {"code": 0.05, "tongue-twister": 0.4, "story": 0.9}


@pytest.fixture(scope="module")
def task_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("task-models")
    return {v: calibrated_gguf.make_model(d / f"tasks-{v}.gguf", 0.0, v, "tiny", 0, task_p=TASK_P) for v in C.VARIANTS}


def test_regions_have_their_own_share_of_wrong_drafts_and_markers():
    t, alias, bad = C.design_tables(0.0, "embedding", 0, TASK_P)
    cyc = C.cycle_token_ids()
    assert sorted(t.next_token[cyc].tolist()) == sorted(cyc.tolist())  # still one cycle over all of them
    for i, (task, p) in enumerate(TASK_P.items()):
        start = int(t.next_token[C.task_marker(i)])  # where a prompt ending in the marker goes
        arc = t.chain(C.task_marker(i), 257)
        assert arc[0] == start
        share = sum(bad[x] for x in arc) / len(arc)
        assert share == pytest.approx(p, abs=0.01), task
    assert t.task_p == TASK_P and 0.4 < t.p_reject < 0.5
    again, _, bad2 = C.design_tables(0.0, "embedding", 0, TASK_P)
    assert (again.next_token == t.next_token).all() and (bad2 == bad).all()  # deterministic


def test_the_model_carries_its_demo_prompts_and_passes_text_through(task_models):
    from app.core.machine.gguf_info import read_header

    path = task_models["embedding"]
    prompts = calibrated_demo.demo_prompts(path)
    assert [p.task for p in prompts] == list(TASK_P)
    assert all(p.text.endswith(f" {i + 1}") for i, p in enumerate(prompts))
    assert read_header(path).metadata["tokenizer.chat_template"] == C.CONTENT_TEMPLATE
    assert C.load_tables(path).task_p == TASK_P
    assert calibrated_demo.demo_prompts(calibrated_gguf.make_model(path.parent / "plain.gguf", 0.3)) is None


@pytest.mark.parametrize("variant", C.VARIANTS)
def test_inprocess_counts_equal_the_simulator_in_every_task_region(task_models, variant):
    path = task_models[variant]
    tables = C.load_tables(path)
    plan = Plan(model=str(path), arms=make_arms([1, 2, 3]), prompts=tuple(calibrated_demo.demo_prompts(path)),
                engine="inprocess", n_predict=64, reps=1, warmup=0)
    with InProcessEngine(ctx_size=1024) as eng:
        recs = [e.record for e in run_sweep(plan, eng) if isinstance(e, RunFinished)]
    assert len(recs) == 12
    acc = {}
    for r in recs:
        assert r.prompt_tokens[-1] == C.task_marker(list(TASK_P).index(r.task))  # chat template kept it last
        sim = C.simulate(tables, r.prompt_tokens, r.k or 0, 64)
        assert r.output_tokens == sim.tokens, (r.task, r.k)
        if r.k:
            assert (r.draft_n, r.draft_accepted) == (sim.draft_n, sim.draft_accepted), (r.task, r.k)
            acc[(r.task, r.k)] = sim.acceptance
    if variant == "embedding":  # the tasks differ as designed: code > tongue-twister > story at every K
        for k in (1, 2, 3):
            assert acc[("code", k)] > acc[("tongue-twister", k)] > acc[("story", k)]
        assert acc[("code", 1)] > 0.9 and acc[("story", 1)] < 0.2


@pytest.mark.server
@pytest.mark.parametrize("variant", C.VARIANTS)
def test_llama_server_counts_equal_the_simulator_in_every_task_region(task_models, variant, server_bin):
    from app.core.engines.server.engine import ServerEngine

    path = task_models[variant]
    tables = C.load_tables(path)
    plan = Plan(model=str(path), arms=make_arms([1, 3]), prompts=tuple(calibrated_demo.demo_prompts(path)),
                engine="server", n_predict=64, reps=1, warmup=0)
    with ServerEngine(server_bin, ctx_size=1024) as eng:
        recs = [e.record for e in run_sweep(plan, eng) if isinstance(e, RunFinished)]
    assert len(recs) == 9
    for r in recs:
        assert r.prompt_tokens[-1] == C.task_marker(list(TASK_P).index(r.task))
        sim = C.simulate(tables, r.prompt_tokens, r.k or 0, 64)
        assert r.output_tokens == sim.tokens, (r.task, r.k)
        if r.k:
            assert (r.draft_n, r.draft_accepted) == (sim.draft_n, sim.draft_accepted), (r.task, r.k)


def test_demo_model_size_follows_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv(calibrated_demo.DEMO_SIZE_ENV, "tiny")
    path = calibrated_demo.demo_model()
    assert "calibrated-tiny-" in path.name and path.stat().st_size < 20 * 2**20
    assert C.load_tables(path).task_p == calibrated_demo.DEMO_TASK_P
    monkeypatch.setenv(calibrated_demo.DEMO_SIZE_ENV, "huge")
    with pytest.raises(Exception, match="demo size must be one of"):
        calibrated_demo.demo_model()


def test_the_windows_demo_sweep_is_the_clis_and_tasks_differ(window, qtbot):
    sweep, table = window.sweep_tab, window.results_tab.table
    assert (sweep.form.k_edit.text(), sweep.form.npredict.value(), sweep.form.reps.value()) == (
        calibrated_demo.DEMO_KS, calibrated_demo.DEMO_TOKENS, calibrated_demo.DEMO_REPS)
    assert {t for t, cb in sweep.form.task_boxes.items() if cb.isChecked()} == set(calibrated_demo.DEMO_TASK_P)
    with qtbot.waitSignal(window.state.sweep_finished, timeout=180000):
        sweep.start_btn.click()
    assert {r.prompt_id for r in window.state.records} == {f"demo-{t}" for t in calibrated_demo.DEMO_TASK_P}
    # the alpha column (acceptance per drafted token, two decimals): finer than the rounded percentage
    alpha = _col(table, "alpha")
    rows = {(table.item(r, 0).text(), table.item(r, 1).text()): table.item(r, alpha).text()
            for r in range(table.rowCount())}
    for k in (1, 2, 3):
        acc = [float(rows[(t, f"K={k}")]) for t in ("code", "tongue-twister", "story")]
        assert acc[0] > acc[1] > acc[2], (k, acc)


def _col(table, header):
    return [table.horizontalHeaderItem(c).text().strip() for c in range(table.columnCount())].index(header)
