"""The window's part of the three decisions (app.core.analysis.decide): the Sweep tab's "least gain
worth having" (δ, the CLI's --min-gain) goes into the adaptive sweep's request, and a sweep that
stopped once decided is judged on its anytime intervals, labelled so on the Results banner."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("PySide6")

from helpers import clear_sweep_file  # noqa: E402


def test_the_least_gain_worth_having_goes_into_the_adaptive_request(sweep_tab, state):
    state.use_demo_model()
    form = sweep_tab.form
    assert not form.min_gain.isEnabled() and form.min_gain.value() == 3.0  # a plain sweep runs its reps
    form.mode_box.setCurrentText("adaptive")
    assert form.min_gain.isEnabled()
    form.min_gain.setValue(2.0)
    request = form.request()
    assert request.adaptive is not None and request.min_gain == pytest.approx(0.02)


def test_a_sequential_sweep_is_judged_on_its_anytime_intervals(state, tmp_path):
    from app.gui.story import answers

    recs = clear_sweep_file(tmp_path / "clear.jsonl")
    state.set_results(recs, tmp_path / "clear.jsonl")  # an opened file: the fixed-sample intervals
    plain = {a.scope: a for a in answers(state.verdict)}
    assert not plain["code"].pick.ratio.anytime and "anytime" not in plain["code"].line
    adaptive = [dataclasses.replace(r, min_gain=0.03) for r in recs]  # an adaptive sweep's records say so
    state.set_results(adaptive, tmp_path / "clear.jsonl")
    seq = {a.scope: a for a in answers(state.verdict)}
    code = seq["code"]
    assert code.pick.ratio.anytime and code.line.startswith("Code: turn MTP on, K=2 -> 1.51x faster (anytime 1.47-1.54")
    assert code.line.endswith(", pays, sure)")
    assert code.pick.ratio.lo < plain["code"].pick.ratio.lo  # wider: it holds at every look
    assert "anytime 95 % interval" in code.pick.reason
    state.set_results(recs, tmp_path / "clear.jsonl")  # a file opened after it: plain again
    assert not state.verdict.per_task[0].ratio.anytime


def test_a_pick_on_two_runs_of_its_own_is_not_sure():
    """The quiet demo's "K=2, 1.29x, sure" on 2 runs, K=3 beside it on many: the smaller K is the
    pick (within 3 %), but a neighbour's runs do not make it sure."""
    from app.core.analysis.analysis import analyze
    from app.core.analysis.recommend import recommend
    from app.gui.words import FEW_PAIRS, verdict_line
    from tests.helpers import make_record
    from tests.test_decide import BASE_TOK, K2, K3, sweep

    recs = sweep("code", {K3: [b * 1.30 * (1 + 0.004 * (-1) ** i) for i, b in enumerate(BASE_TOK)]}, BASE_TOK)
    for rep in (0, 1):  # K=2 twice, right after each of the first two repetitions' runs
        recs.append(make_record(K2, run_id=f"k2{rep}", task="code", prompt_id="code-p", rep=rep,
                                tok_s=BASE_TOK[rep] * 1.29 * (1 + 0.0005 * rep),
                                timestamp_utc=f"2026-01-01T00:00:{2 * rep + 2:02d}.5Z"))
    _, [code] = recommend(analyze(recs), {"code": 1.0})
    assert code.arm == K2 and code.ratio.n_pairs == 2 and code.ratio.lo > 1.0  # its own interval clears 1
    assert not code.sure
    line, _color = verdict_line(code, "Code")
    assert line.endswith(f"({code.ratio.lo:.2f}-{code.ratio.hi:.2f}, {FEW_PAIRS})") and "sure)" not in line

