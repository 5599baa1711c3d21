"""Tune for me on any GGUF (issue 55, item 5): a model without MTP heads is said in one line, then
what can pay there is measured: the n-gram modes, a drafter found by llama.cpp's pairing rule in
the models folder or the model's own folder (or the user's --drafter, refused in one line naming
the difference when it cannot pair), and their combination; the answer's command carries -md and
--spec-type draft-simple where the pair pays. The same core flow (session.tune_arms) for `tune` and
the Start page. Calibrated GGUFs: a target without MTP heads and a shallower drafter of its
vocabulary (matching_drafters takes only a drafter smaller than the target)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest

from test_cli import assert_clean_error, cli

NGRAM_AND_PAIR = {"ngram-mod", "ngram-simple", "draft-simple", "draft-simple+ngram-mod"}  # Thorough
QUICK_NGRAM_AND_PAIR = {"ngram-mod", "ngram-simple", "draft-simple"}  # Quick: the drafter at K=2, no combination


def _no_heads_pair(folder: Path, ff: int = 64) -> tuple[Path, Path]:
    """A calibrated target without MTP heads and a drafter of its vocabulary with a feed-forward
    width of ``ff`` (the target's 256): llama.cpp's rule pairs them, and the drafter is the smaller."""
    from app.core.calibrated import gguf as G
    from app.core.calibrated.design import SHAPES

    target, drafter = G.make_no_heads_pair(folder)
    if ff == 64:
        return target, drafter
    drafter.unlink()
    return target, G.make_drafter(folder / f"drafter-ff{ff}.gguf", target, 0.0,
                                  shape=dataclasses.replace(SHAPES["tiny"], n_ff=ff))


def _models_folder() -> Path:
    from app.core.common.paths import models_dir

    d = models_dir()
    d.mkdir(parents=True, exist_ok=True)
    return d


def _tune_args(*argv: str):
    from app.cli.parser import build_parser

    return build_parser().parse_args(["tune", *argv])


# -- the plan: not "no arms" -------------------------------------------------------------------------
def test_tune_on_a_model_without_heads_plans_the_ngram_modes_and_the_drafter_found_beside_it(tmp_path, capsys):
    """The user's report: `tune --model <no MTP heads>` planned draft-mtp arms, probed for minutes,
    then "error: the plan has no arms". Now the request is the n-gram modes, draft-simple with the
    drafter in the model's own folder, and their combination, on llama-server; said first."""
    from app.cli import tune
    from app.core.engines.base import EngineKind

    target, drafter = _no_heads_pair(tmp_path / "mine")
    r = tune.request_of(_tune_args("--model", str(target), "--for", "code,story", "--thorough"), 0.0,
                        check=lambda _b: pytest.fail("no device check: the n-gram modes and drafters need llama-server"))
    err = capsys.readouterr().err
    assert "target-nomtp.gguf has no MTP heads, so MTP cannot run on it" in err
    assert f"drafter {drafter.name}" in err and "pairs by llama.cpp's pairing rule" in err
    spec = [a for a in r.plan.arms if a.is_spec]
    assert {a.mode for a in spec} == NGRAM_AND_PAIR
    assert r.adaptive is None and r.until_decided and r.plan.engine is EngineKind.SERVER
    assert {a.drafter for a in spec if a.k is not None} == {str(drafter)}  # draft-simple and the combination
    assert sorted(a.k for a in spec if a.mode == "draft-simple") == [1, 2, 3, 4]
    assert "ngram-mod, ngram-simple, draft-simple at K=1-4, draft-simple+ngram-mod at K=1-4" in err


def test_quick_on_a_model_without_heads_measures_the_drafter_at_one_width_without_the_combination(tmp_path, capsys):
    """Quick's 2 minutes: on the real 1.5B Qwen on 2 cores one round of the whole set (ngram-mod,
    ngram-simple, draft-simple and its combination at K=1-4: 11 settings with the baseline) outlasts
    the budget, so Quick ended with most settings unmeasured. Quick measures the n-gram modes and
    the drafter at K=2, says so and names what Thorough adds."""
    from app.cli import tune

    target, drafter = _no_heads_pair(tmp_path / "mine")
    r = tune.request_of(_tune_args("--model", str(target), "--for", "code,story"), 0.0)
    err = capsys.readouterr().err
    spec = [a for a in r.plan.arms if a.is_spec]
    assert {a.mode for a in spec} == QUICK_NGRAM_AND_PAIR and len(spec) == 3
    assert [a.k for a in spec if a.mode == "draft-simple"] == [2] and r.budget_s is not None
    # one prompt a task, so that the first round (every setting on every task) fits the budget
    assert sorted(p.task for p in r.plan.prompts) == ["code", "story"]
    assert ("measuring what can pay without them: ngram-mod, ngram-simple, draft-simple at K=2 (Quick; --thorough: "
            "ngram-mod, ngram-simple, draft-simple at K=1-4, draft-simple+ngram-mod at K=1-4)") in err


def test_the_drafter_is_found_in_the_models_folder_and_the_smallest_that_pairs_is_picked(tmp_path):
    from app.core.session.tune import tune_request
    from app.core.session.tune_arms import tune_arms

    target, _ = _no_heads_pair(tmp_path / "elsewhere", ff=128)
    os.remove(tmp_path / "elsewhere" / "drafter-ff128.gguf")  # none beside the model
    assert tune_arms(str(target)).pick.path is None  # nothing pairs yet: said, n-gram only
    assert "no drafter: no GGUF in the models folder" in tune_arms(str(target)).lines()[1]
    models = _models_folder()
    _, big = _no_heads_pair(models / "a", ff=128)
    _, small = _no_heads_pair(models / "b", ff=64)
    (models / "a" / "target-nomtp.gguf").unlink()
    (models / "b" / "target-nomtp.gguf").unlink()
    (models / "unrelated.gguf").write_bytes(b"not a model")  # an unreadable file is passed over
    arms = tune_arms(str(target))
    assert arms.pick is not None and arms.pick.path == str(small) and not arms.pick.given
    assert set(arms.pick.found) == {str(small), str(big)}
    why = arms.lines()[1]
    assert why.startswith(f"drafter {small.name} (") and "2 GGUFs pair" in why and "the smallest that pairs" in why
    assert big.name in why  # the other one is named
    req = tune_request(str(target), {"code": 1.0}, quick=True, arms=arms)
    assert {a.drafter for a in req.plan.arms if a.k is not None} == {str(small)}


def test_a_drafter_that_cannot_pair_is_refused_in_one_line_naming_the_difference(tmp_path, smollm2):
    """llama.cpp's own rule (check_pair): SmolLM2's 49152 tokens against the target's 935. Before, a
    bare FILE went to draft-mtp and the line spoke of MTP drafters, not of the vocabulary."""
    target, drafter = _no_heads_pair(tmp_path / "mine")
    r = cli("tune", "--model", str(target), "--drafter", str(smollm2), "--for", "code")
    assert_clean_error(r, "49152 tokens in the drafter, 935 in the target (llama.cpp allows a difference of at most 128)")
    assert str(smollm2) in r.stderr and "draft-mtp" not in r.stderr
    # the user's drafter that pairs: used in its own mode (draft-simple), said as theirs
    from app.cli import tune

    req = tune.request_of(_tune_args("--model", str(target), "--drafter", str(drafter), "--for", "code",
                                     "--thorough"), 0.0)
    assert {a.mode for a in req.plan.arms if a.is_spec} == NGRAM_AND_PAIR
    assert {a.drafter for a in req.plan.arms if a.k is not None} == {str(drafter)}


@pytest.mark.server
def test_tune_on_a_model_without_heads_measures_the_ngram_modes_and_the_found_drafter(server_bin, tmp_path):
    """A real tune on llama-server: every planned mode ran, draft-simple with the drafter found in
    the model's folder (its record names it), and the answer is per task (no "no arms")."""
    from app.core.records.reader import load_records

    target, drafter = _no_heads_pair(tmp_path / "mine")
    out = tmp_path / "tune.jsonl"
    r = cli("tune", "--model", str(target), "--server-bin", server_bin, "--for", "code", "--quick", "--json",
            "--out", str(out), timeout=600)
    assert r.returncode in (0, 1), r.stderr  # 1: no answer (a busy machine's runs are withheld)
    assert "Traceback" not in r.stderr and "no arms" not in r.stderr and "has no MTP heads" in r.stderr
    runs = load_records(out)
    ran = {r.spec_type or "none" for r in runs if r.status == "ok"}
    assert ran == {"none", *QUICK_NGRAM_AND_PAIR}  # Quick's settings
    paired = [x for x in runs if x.spec_type and "draft-simple" in x.spec_type]
    assert paired and {x.drafter["path"] for x in paired} == {os.path.abspath(drafter)}
    assert all(x.draft_n for x in paired if x.status == "ok")  # the drafter drafted
    d = json.loads(r.stdout)
    assert d["verdict"] is not None and {t["task"] for t in d["verdict"]["per_task"]} == {"code"}


def _pair_sweep(path: Path, target: str, drafter: str) -> None:
    """Recorded runs of the pair: draft-simple K=2 pays on code (1.5x), nothing pays on story."""
    import random

    from app.core.records.writer import ResultsWriter
    from tests.helpers import make_record

    rng = random.Random(3)
    sampling = {"temperature": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0, "seed": 42}
    arms = ((None, None, 1.0, 1.0), ("draft-simple", 2, 1.5, 0.6), ("ngram-mod", None, 1.02, 0.98))
    out, t = [], 0
    for rep in range(6):
        for task in ("code", "story"):
            for mode, k, code, story in arms:
                speed = code if task == "code" else story
                out.append(make_record(
                    run_id=f"r{task}{mode}{rep}", sweep_id="pair", engine="server", task=task, prompt_id=task,
                    rep=rep, arm_kind="baseline" if mode is None else "spec", k=k, spec_type=mode,
                    p_min=0.0 if k else None, draft_n=None if mode is None else 10,
                    draft_accepted=None if mode is None else 8, acceptance=None if mode is None else 0.8,
                    mtp_engaged=None if mode is None else True,
                    drafter={"path": drafter, "sha256": "0" * 64, "arch": "qwen2", "size": 1} if k else None,
                    tok_s=40 * speed * math.exp(rng.gauss(0, 0.01)), sampling=dict(sampling), model_path=target,
                    timestamp_utc=f"2026-01-01T00:{t // 60:02d}:{t % 60:02d}+00:00"))
                t += 1
    with ResultsWriter(path) as w:
        for r in out:
            w.append(r)


def test_the_answer_carries_md_and_draft_simple_where_the_pair_pays_and_leaves_it_off_elsewhere(tmp_path, capsys):
    from app.core.records.reader import load_records
    from tests.helpers import tune_answer

    path = tmp_path / "pair.jsonl"
    _pair_sweep(path, "/models/target.gguf", "/models/drafter.gguf")
    rc = tune_answer(path, load_records(path), "/models/target.gguf", {"code": 1.0, "story": 1.0}, None)
    d = json.loads(capsys.readouterr().out)
    per = {t["task"]: t for t in d["verdict"]["per_task"]}
    assert rc == 0 and set(per) == {"code", "story"}
    code, story = per["code"]["command"], per["story"]["command"]
    # -md's long form, as this llama-server's --help lists it: "--spec-draft-model, -md, --model-draft FNAME"
    assert "--spec-draft-model /models/drafter.gguf" in code and "--spec-type draft-simple" in code
    assert "--spec-draft-n-max 2" in code
    assert story and "--spec-draft-model" not in story and "--spec-type" not in story  # leave it off: plain


# -- the window: the Start page and the Model tab's Find ---------------------------------------------
def test_the_start_page_shows_the_drafter_it_picked_and_why_and_tunes_with_it(window, qtbot, tmp_path):
    pytest.importorskip("PySide6")
    target, drafter = _no_heads_pair(tmp_path / "mine")
    page = window.start_tab
    page.choose_model(str(target))
    qtbot.waitUntil(lambda: page.plan.arms is not None, timeout=30000)
    text = page.plan.text()
    assert page.plan.isVisibleTo(page) and "no MTP heads" in page.model_label.text()
    page.thorough.setChecked(True)
    text = page.plan.text()
    assert "ngram-mod, ngram-simple, draft-simple at K=1-4, draft-simple+ngram-mod at K=1-4" in text
    assert "Quick" not in text
    assert f"The drafter:</b> {drafter.name} (" in text and "the one GGUF here that pairs by llama.cpp" in text
    assert page.tune_btn.isEnabled() and not page.why_not.text()  # no box to tick: it measures what can pay
    req = page.request()
    assert {a.mode for a in req.plan.arms if a.is_spec} == NGRAM_AND_PAIR
    page.quick.setChecked(True)  # Quick measures fewer, and the label says which and what Thorough adds
    assert page.plan.text().startswith("<b>What Tune for me measures here:</b> ngram-mod, ngram-simple, "
                                       "draft-simple at K=2 <i>(Quick; Thorough measures ngram-mod, ngram-simple")
    assert {a.mode for a in page.request().plan.arms if a.is_spec} == QUICK_NGRAM_AND_PAIR
    assert {a.drafter for a in req.plan.arms if a.k is not None} == {str(drafter)}
    # a model with heads: nothing of it is shown
    from app.core.calibrated.demo import demo_model

    page.choose_model(str(demo_model()))
    assert not page.plan.isVisibleTo(page) and page.request().adaptive is not None


def test_the_model_tabs_find_finds_a_drafter_in_the_models_own_folder(window, qtbot, tmp_path):
    """The report: Find said "no other GGUF" with the drafter beside the target (the library lists
    only the models folder, the Hugging Face cache and the user's folders)."""
    target, drafter = _no_heads_pair(tmp_path / "mine")
    window.state.set_model(str(target))
    row = window.model_tab.drafter_row
    qtbot.waitUntil(lambda: row.find_job is None and row.suggestions.count() > 1, timeout=30000)
    assert row.suggestions.itemText(0) == "1 drafter(s) found"
    assert row.suggestions.itemData(1) == str(drafter)
