"""Analysis and recommendation on synthetic records with known answers, and the CLI verdict."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
import sys

import pytest

from app.core.analysis.analysis import analyze, first_divergence
from app.core.records.arm import Arm
from app.core.common.errors import UserError
from app.core.analysis.recommend import parse_mix, recommend
from app.core.records.writer import ResultsWriter
from conftest import ROOT
from tests.helpers import make_record


def rec(task, k, rep, prompt, tok_s, *, acc=None, out=(1, 2, 3, 4), ts=0.0, n=4, gaps=None):
    times = tuple(gaps) if gaps else (0.0, 0.1, 0.2, 0.3)
    return make_record(
        run_id=f"{task}{k}{rep}{prompt}", sweep_id="s", engine="inprocess", arm_kind="baseline" if k is None else "mtp",
        k=k, p_min=None if k is None else 0.0, task=task, prompt_id=prompt, rep=rep, n_predict=n, n_generated=len(out),
        tok_s=tok_s, tok_s_engine=None, draft_n=10 * k if k else None, draft_accepted=round(acc * 10 * k) if k else None,
        acceptance=acc if k else None, mtp_engaged=True if k else None, output_sha256="x", output_tokens=tuple(out),
        prompt_n=3, prompt_tokens=(1, 2, 3), prompt_tok_s=None, llama_build="b", token_times=times,
        timestamp_utc=f"2026-01-01T00:{int(ts // 60):02d}:{ts % 60:06.3f}+00:00")


def sweep(speedups: dict, noise=0.01, reps=6, seed=0):
    rng = random.Random(seed)
    out = []
    t = 0.0
    for rep in range(reps):
        for task, (k, s) in speedups.items():
            base = 40 * math.exp(rng.gauss(0, noise))
            out.append(rec(task, None, rep, "p", base, ts=t))
            out.append(rec(task, k, rep, "p", 40 * s * math.exp(rng.gauss(0, noise)), acc=0.7, ts=t + 1))
            t += 2
    return out


def test_per_task_and_mix_picks():
    a = analyze(sweep({"code": (2, 1.5), "story": (2, 0.9), "tongue-twister": (2, 1.0)}, noise=0.01))
    mix_pick, per_task = recommend(a, parse_mix("code=0.6,story=0.2,tongue-twister=0.2", a.tasks))
    by = {p.scope: p for p in per_task}
    assert by["code"].mtp_on and by["code"].arm == Arm(2, 0.0) and "turn MTP on" in by["code"].reason
    assert not by["story"].mtp_on and "slower" in by["story"].reason
    assert mix_pick.mtp_on and mix_pick.ratio.lo > 1.0
    assert "95% CI" in mix_pick.reason


def test_leave_mtp_off_when_nothing_is_reliably_faster():
    a = analyze(sweep({"code": (3, 1.0), "story": (3, 1.0)}, noise=0.08, reps=4))
    mix_pick, per_task = recommend(a, parse_mix(None, a.tasks))
    assert not mix_pick.mtp_on and "leave MTP off" in mix_pick.reason
    assert all(not p.mtp_on for p in per_task)


def test_findings_too_few_reps_and_output_divergence():
    recs = sweep({"code": (2, 1.2)}, reps=1)
    bad = rec("code", 2, 5, "q", 50.0, acc=0.5, out=(1, 2, 9, 4))
    recs += [rec("code", None, 5, "q", 40.0), bad]
    a = analyze(recs)
    codes = {f.code for f in a.findings}
    assert {"too_few_reps", "output_differs"} <= codes
    div = [e for e in a.equivalence if not e.equal]
    assert len(div) == 1 and div[0].first_divergence == 2 and div[0].prompt_id == "q"
    assert first_divergence([1, 2], [1, 2, 3]) == 2 and first_divergence([1], [1]) is None


def test_bimodal_baseline_and_far_pairs_are_flagged():
    rng = random.Random(3)
    recs = []
    for rep in range(4):
        gaps = [0.0]
        for _ in range(30):
            gaps.append(gaps[-1] + (0.019 if rng.random() < 0.6 else 0.026) + rng.gauss(0, 0.0003))
        recs.append(rec("code", None, rep, "p", 45.0, gaps=gaps, ts=rep * 400.0))
        recs.append(rec("code", 2, rep, "p", 60.0, acc=0.8, ts=rep * 400.0 + 200))
    codes = {f.code for f in analyze(recs).findings}
    assert "bimodal_baseline" in codes and "far_pairs" in codes


def test_alpha_and_mean_length_from_acceptance():
    a = analyze(sweep({"code": (1, 1.2)}))
    c = a.cell("code", Arm(1, 0.0))
    assert c.acceptance == pytest.approx(0.7) and c.alpha == pytest.approx(0.7)
    assert c.mean_accepted_len == pytest.approx(1.7)


def test_mix_parsing():
    assert parse_mix("code=3,story=1", ("code", "story")) == {"code": 0.75, "story": 0.25}
    with pytest.raises(UserError, match="no measurements for task 'poetry'"):
        parse_mix("poetry=1", ("code",))
    with pytest.raises(UserError, match="task=weight"):
        parse_mix("code", ("code",))


def test_recommend_cli_prints_verdict_and_command(tmp_path):
    out = tmp_path / "r.jsonl"
    with ResultsWriter(out) as w:
        for r in sweep({"code": (2, 1.5), "story": (2, 0.8)}):
            w.append(r)
    report = tmp_path / "rep.md"
    r = subprocess.run([sys.executable, "-m", "app", "recommend", str(out), "--mix", "code=1",
                        "--shell", "powershell", "--report", str(report), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["recommendation"]["mtp"] is True and j["recommendation"]["k"] == 2
    assert j["command"].startswith("& ") and "--spec-type draft-mtp" in j["command"]
    assert "--parallel 1" in j["command"] or "-np 1" in j["command"]
    text = report.read_text()
    assert "# MTP Tuner report" in text and "turn MTP on" in text and "```ini" in text
    r = subprocess.run([sys.executable, "-m", "app", "recommend", str(tmp_path / "none.jsonl")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "results file not found" in r.stderr and "Traceback" not in r.stderr


def test_confounders_from_engine_logs_reach_the_findings():
    from app.core.engines.base import confounder_flags

    log = ["load_tensors: offloaded 40/65 layers to GPU", "ggml_metal_init: found device: Apple M4 Max"]
    assert confounder_flags(log, n_slots=4, cache_types=("q8_0", None)) == (
        "multiple_slots", "partial_offload", "metal_quant_kv")
    assert confounder_flags(["load_tensors: offloaded 65/65 layers to GPU"], n_slots=1) == ()
    assert confounder_flags(["load_tensors: offloaded 0/65 layers to GPU"]) == ()  # CPU only: no confounder
    import dataclasses

    recs = [dataclasses.replace(r, flags=("multiple_slots", "partial_offload", "metal_quant_kv"))
            for r in sweep({"code": (2, 1.2)})]
    codes = {f.code for f in analyze(recs).findings}
    assert {"multiple_slots", "partial_offload", "metal_quant_kv"} <= codes


def test_compare_two_sweeps_says_what_changed_and_which_verdicts_flipped(tmp_path):
    """Before and after a llama.cpp update: the build is named as the change, and code's verdict
    flips from slower to faster."""
    import dataclasses

    from app.core.analysis.compare import compare, format_changes, setting_changes

    before = sweep({"code": (2, 0.8), "story": (2, 0.8)}, seed=1)
    after = [dataclasses.replace(r, llama_build="b2") for r in sweep({"code": (2, 1.4), "story": (2, 0.8)}, seed=2)]
    assert setting_changes(before, before) == []
    assert "only the measurements differ" in format_changes([])
    assert setting_changes(before, after) == [("llama.cpp build", "b", "b2")]
    other = [dataclasses.replace(r, n_predict=128, host={"os": "Linux", "cpu_count": 16}) for r in before]
    assert [c[0] for c in setting_changes(before, other)] == ["tokens per run", "machine"]
    rows = {(c.task, c.arm.label): c for c in compare(analyze(before), analyze(after))}
    assert rows[("code", "K=2")].verdict_changed and not rows[("story", "K=2")].verdict_changed
    assert rows[("code", "K=2")].b.ratio.estimate > 1.3
    paths = _results_files(tmp_path, ("a.jsonl", before), ("b.jsonl", after))
    r = subprocess.run([sys.executable, "-m", "app", "compare", *paths, "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["changes"] == [{"what": "llama.cpp build", "a": "b", "b": "b2"}]
    assert d["builds"] == {"a": "b", "b": "b2", "changed": True}
    code = next(c for c in d["cells"] if c["task"] == "code" and c["arm"] == "K=2")
    assert code["verdict_changed"] and code["speedup_b"] > 1.3
    r = subprocess.run([sys.executable, "-m", "app", "compare", *paths], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert "llama.cpp build: b -> b2" in r.stdout and "(changed)" in r.stdout
    assert "llama.cpp builds: A b; B b2 (changed)\n" in r.stdout  # both builds named on one line
    r = subprocess.run([sys.executable, "-m", "app", "compare", paths[0], str(tmp_path / "none.jsonl")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "none.jsonl: results file not found" in r.stderr and "Traceback" not in r.stderr


def test_compare_names_both_builds_and_where_they_ran():
    """Re-tuning after a llama.cpp update (or a runtime change): the builds line names both, with the
    backend the runs ran on (schema 2), and says when they are the same."""
    import dataclasses

    from app.core.analysis.compare import builds, format_builds, setting_changes

    before = [dataclasses.replace(r, llama_build="b6000 (1111111)", backend="CPU") for r in sweep({"code": (2, 1.0)}, seed=1)]
    cuda = [dataclasses.replace(r, llama_build="b6123 (2222222)", backend="CUDA") for r in before]
    assert format_builds(builds(before, cuda)) == \
        "llama.cpp builds: A b6000 (1111111) on CPU; B b6123 (2222222) on CUDA (changed)"
    # the same tag, another runtime (CUDA -> Vulkan): the build text is the same, the line still tells them apart
    vulkan = [dataclasses.replace(r, backend="Vulkan") for r in cuda]
    assert builds(cuda, vulkan) == {"a": "b6123 (2222222) on CUDA", "b": "b6123 (2222222) on Vulkan", "changed": True}
    assert setting_changes(cuda, vulkan) == [("backend", "CUDA", "Vulkan")]
    # schema 1 records (no backend): the build alone; the same build says so
    old = [dataclasses.replace(r, backend=None) for r in before]
    assert format_builds(builds(old, old)) == "llama.cpp builds: A b6000 (1111111); B b6000 (1111111) (the same)"


def test_compare_old_schema_file_against_a_new_one_of_the_same_build(tmp_path):
    """bench --again, then compare: the old file (schema 1, no backend) against the new one (schema 2,
    on CUDA) of the same build is the same build, and the backend is no set-up change."""
    import dataclasses

    from app.core.analysis.compare import builds, format_builds, format_changes, setting_changes

    old = [dataclasses.replace(r, llama_build="b6123", backend=None) for r in sweep({"code": (2, 1.0)}, seed=1)]
    new = [dataclasses.replace(r, backend="CUDA") for r in old]
    assert builds(old, new) == {"a": "b6123", "b": "b6123 on CUDA", "changed": False}
    assert format_builds(builds(old, new)) == "llama.cpp builds: A b6123; B b6123 on CUDA (the same)"
    assert setting_changes(old, new) == [] and setting_changes(new, old) == []
    assert "only the measurements differ" in format_changes(setting_changes(old, new))
    # another build still is a change; a file of both (old runs, then new ones) against the new
    assert builds(old, [dataclasses.replace(r, llama_build="b6200") for r in new])["changed"]
    assert builds(old + new, new) == {"a": "b6123 on CUDA", "b": "b6123 on CUDA", "changed": False}
    paths = _results_files(tmp_path, ("before.jsonl", old), ("after.jsonl", new))
    r = subprocess.run([sys.executable, "-m", "app", "compare", *paths], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "llama.cpp builds: A b6123; B b6123 on CUDA (the same)\n" in r.stdout
    assert "only the measurements differ" in r.stdout and "not recorded" not in r.stdout


def test_recommend_with_a_broken_probe_record(tmp_path):
    """The results file's own broken cost record: a warning, the verdict still comes; a broken
    file given with --probe: one clear error."""
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        for r in sweep({"code": (2, 1.5)}):
            w.append(r)
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "run_id": "c1", "record_type": "cost", "t_ms": 3}\n')
    r = subprocess.run([sys.executable, "-m", "app", "recommend", str(path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "not a valid cost-probe record" in r.stderr and "MTP" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "app", "recommend", str(path), "--probe", str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "line 13: not a valid cost-probe record" in r.stderr and "Traceback" not in r.stderr


def _results_files(folder, *named_records) -> list[str]:
    """Each (file name, records) written as a results file in ``folder``; their paths."""
    paths = []
    for name, recs in named_records:
        with ResultsWriter(folder / name) as w:
            for r in recs:
                w.append(r)
        paths.append(str(folder / name))
    return paths


def test_a_near_tie_goes_to_the_smaller_k_and_says_so():
    """K=2 at 1.66x and K=4 at 1.69x, both reliably faster: within 3 %, so the pick is K=2 (it
    drafts less), as the stopping rule decides; K=1 at 1.30x is no tie."""
    rng = random.Random(1)
    recs, t = [], 0.0
    for rep in range(6):
        base = 40 * math.exp(rng.gauss(0, 0.01))
        for k, s in ((None, 1.0), (1, 1.30), (2, 1.66), (4, 1.69)):
            t += 1
            recs.append(rec("code", k, rep, "p", base * s * math.exp(rng.gauss(0, 0.005)), acc=0.8, ts=t))
    mix_pick, [code] = recommend(analyze(recs), {"code": 1.0})
    assert code.arm == Arm(2, 0.0) and mix_pick.arm == Arm(2, 0.0)
    assert "K=4" in code.reason and "within 3 %" in code.reason and "smaller K" in code.reason
    # once K=4 is clearly faster (1.80x), it is the pick
    far = [r if r.k != 4 else dataclasses.replace(r, tok_s=r.tok_s * 1.80 / 1.69) for r in recs]
    _, [code] = recommend(analyze(far), {"code": 1.0})
    assert code.arm == Arm(4, 0.0) and "within 3 %" not in code.reason


def test_a_mix_with_no_setting_measured_on_every_task_says_why():
    """An adaptive sweep that measured code at K=3 and story at K=1 only (the mix was predicted to
    lose): the mix is left off with that reason, not "no MTP setting was measured"."""
    recs = sweep({"code": (3, 1.5), "story": (1, 0.5)}, noise=0.01)
    mix_pick, per_task = recommend(analyze(recs), {"code": 0.5, "story": 0.5})
    assert not mix_pick.mtp_on and "no one setting was measured on every task" in mix_pick.reason
    assert "no MTP setting was measured" not in mix_pick.reason
    assert [p.mtp_on for p in per_task] == [True, False]
