"""Memory per arm before it runs (issue 40 item 5): the prediction from recorded GGUF facts, and
an arm that would not fit left out of a real llama-server sweep with its reason."""

from __future__ import annotations

import dataclasses
import json

import pytest

from app.core.common.errors import UserError
from app.core.engines import dry_run
from app.core.engines.base import EngineSettings
from app.core.machine.arm_memory import LoadSettings, fit_reason, n_rs_seq, parse_size, predict
from app.core.machine.modelinfo import inspect
from app.core.measure.plan import Plan, make_arms
from app.core.measure.prompts import builtin_prompts
from app.core.records.arm import Arm
from app.core.session.memory import fit_arms, load_settings, sized
from app.core.session.request import AdaptiveOptions
from conftest import servers_mentioning
from tests.helpers import cli
from tests.test_modelinfo import qwen36_27b

MIB, GIB = 2**20, 2**30


@pytest.fixture(scope="module")
def q27(tmp_path_factory):
    """Qwen3.6-27B's header facts (64 layers, 48 DeltaNet, 16 attention x 4 KV heads x 256, one
    NextN block), as recorded in tests/test_modelinfo.py."""
    return inspect(qwen36_27b(tmp_path_factory.mktemp("q27") / "Qwen3.6-27B-MTP-Q4_K_M.gguf"))


def test_recurrent_rollback_slots_grow_with_k(q27):
    """The issue's figure: about 150 MiB of recurrent state, 750 MiB at K=4 (1 + K snapshots)."""
    base = predict(q27, None, None)
    assert base.parts["recurrent"] == 48 * (3 * (6144 + 2 * 16 * 128) + 128 * 6144) * 4
    assert base.parts["recurrent"] / MIB == pytest.approx(150, abs=1)
    k4 = predict(q27, "draft-mtp", 4)
    assert k4.parts["recurrent"] == 5 * base.parts["recurrent"]
    assert k4.parts["recurrent"] / MIB == pytest.approx(748, abs=1)
    widths = [predict(q27, "draft-mtp", k).total for k in (1, 2, 3, 4)]
    assert widths == sorted(widths) and len(set(widths)) == 4  # each K costs more than the one before


def test_parts_follow_the_settings(q27):
    ctx = 8192
    base = predict(q27, None, None, LoadSettings(ctx=ctx))
    mtp = predict(q27, "draft-mtp", 3, LoadSettings(ctx=ctx))
    # the NextN block is loaded only for draft-mtp; its context's KV is one layer, at f16 by default
    assert mtp.parts["weights"] - base.parts["weights"] == q27.mtp_bytes
    assert base.parts["mtp_kv"] == base.parts["mtp_compute"] == 0
    assert mtp.parts["mtp_kv"] == ctx * 4 * (256 + 256) * 2
    assert mtp.parts["kv"] == base.parts["kv"] == ctx * 16 * 4 * 512 * 2
    # -ctk and -ctv typed apart (q8_0: 34 bytes per 32 values); -ctk does not type the draft context
    mixed = predict(q27, "draft-mtp", 3, LoadSettings(ctx=ctx, cache_type_k="q8_0", cache_type_v="f16"))
    assert mixed.parts["kv"] == ctx * 16 * 4 * (256 * 34 / 32 + 256 * 2)
    assert mixed.parts["mtp_kv"] == mtp.parts["mtp_kv"]
    q8d = predict(q27, "draft-mtp", 3, LoadSettings(ctx=ctx, draft_cache_type_k="q8_0", draft_cache_type_v="q8_0"))
    assert q8d.parts["mtp_kv"] == ctx * 4 * 512 * 34 / 32
    # a longer context: more KV in both contexts; the compute buffers are the logits of a ubatch
    # over a 248k vocabulary either way (the layers' attention mask stays smaller)
    long = predict(q27, "draft-mtp", 3, LoadSettings(ctx=4 * ctx))
    assert long.parts["kv"] == 4 * mtp.parts["kv"] and long.parts["mtp_kv"] == 4 * mtp.parts["mtp_kv"]
    assert long.parts["compute"] == mtp.parts["compute"] > 512 * 4 * 248320


def test_which_modes_keep_snapshots(q27):
    """n_rs_seq = K for draft-mtp (also combined with an n-gram mode); none for an n-gram mode,
    nor on an architecture without in-place rollback (qwen3next: llama.cpp clamps it to 0)."""
    assert n_rs_seq(q27, "draft-mtp", 4) == n_rs_seq(q27, "draft-mtp+ngram-mod", 4) == 4
    assert n_rs_seq(q27, "ngram-mod", None) == n_rs_seq(q27, None, None) == 0
    assert predict(q27, "ngram-mod", None).total == predict(q27, None, None).total
    nxt = dataclasses.replace(q27, arch="qwen3next")
    assert predict(nxt, "draft-mtp", 4).parts["recurrent"] == predict(nxt, None, None).parts["recurrent"]


def test_offload_share(q27):
    """With every layer on the GPU all but the input embedding is there; with half the layers
    about half the weights; with none, nothing."""
    full = predict(q27, "draft-mtp", 2, gpu=True)
    assert full.on_device == full.total - q27.input_bytes
    half = predict(q27, "draft-mtp", 2, LoadSettings(n_gpu_layers="32"), gpu=True)
    assert 0.4 * full.on_device < half.on_device < 0.6 * full.on_device
    assert predict(q27, "draft-mtp", 2, LoadSettings(n_gpu_layers="0"), gpu=True).on_device == 0
    assert predict(q27, "draft-mtp", 2).on_device == 0  # no GPU


def test_sizes_and_the_sentence():
    assert parse_size("4GiB") == parse_size("4G") == parse_size("4096MiB") == 4 * GIB
    assert parse_size("512m") == 512 * MIB and parse_size("1.5GiB") == int(1.5 * GIB) and parse_size("100") == 100
    for bad in ("", "GiB", "4 GB GB", "-1G", "4X"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert fit_reason("K=4", int(5.2 * GIB), 4 * GIB) == "K=4 skipped: needs 5.2 GiB, 4.0 GiB free"
    assert fit_reason("K=1", GIB, GIB) is None


def _plan(model, ks):
    return Plan(model=str(model), arms=make_arms(ks), prompts=tuple(builtin_prompts()[:1]))


def test_fit_arms_leaves_out_what_does_not_fit(make_model):
    model = make_model(0.0)
    info = inspect(model)
    settings = EngineSettings(ctx_size=4096)
    need = {k: sized(info, Arm(k), LoadSettings(ctx=4096)).total for k in (1, 4)}  # as fit_arms sizes them
    limit = (need[1] + need[4]) // 2
    plan, _ = fit_arms(_plan(model, [1, 4]), settings, limit)
    assert [a.label for a in plan.arms] == ["baseline", "K=1"]
    assert len(plan.left_out) == 1 and plan.left_out[0].startswith("K=4 skipped: needs ")
    assert plan.left_out[0].endswith(f" free (sized by {dry_run.source()})")
    # the adaptive sweep's widths too
    _, opts = fit_arms(_plan(model, [1]), settings, limit, AdaptiveOptions(ks=(1, 2, 3, 4, 8)))
    assert opts is not None and 8 not in opts.ks and 1 in opts.ks
    # everything fits: the plan as it was
    same, _ = fit_arms(_plan(model, [1, 4]), settings, 64 * GIB)
    assert same.arms == _plan(model, [1, 4]).arms and same.left_out == ()
    # not even the baseline: nothing can run
    base = sized(info, Arm(), LoadSettings(ctx=4096)).total
    with pytest.raises(UserError, match="the model itself does not fit"):
        fit_arms(_plan(model, [1]), settings, base - 1)


def test_machine_limit_by_default(make_model, monkeypatch):
    """No limit given: the machine's (here a snapshot without a GPU and with little RAM): K=4 left
    out as with a given limit, but a model whose baseline's weights do not fit is left to llama.cpp
    (it maps them from disk; its context and buffers past the limit are refused, see
    test_hardening_round4_bounds)."""
    from app.core.machine import hardware

    model = make_model(0.0)
    info = inspect(model)
    need = {k: sized(info, Arm(k), LoadSettings(ctx=4096)).total for k in (1, 4)}  # as fit_arms sizes them
    ram = (need[1] + need[4]) // 2
    snap = hardware.HardwareSnapshot("Linux", "cpu", 2, 2, 8 * GIB, ram, (), False)
    monkeypatch.setattr(hardware, "snapshot", lambda: snap)
    plan, _ = fit_arms(_plan(model, [1, 4]), EngineSettings(ctx_size=4096), None)
    assert plan.left_out == (f"K=4 skipped: needs {need[4] / MIB:.1f} MiB, {ram / MIB:.1f} MiB of RAM available "
                             f"(sized by {dry_run.source()})",)
    base = sized(info, Arm(), LoadSettings(ctx=4096))
    weights_over = base.total - base.parts["weights"] // 2  # the rest fits, the weights do not
    monkeypatch.setattr(hardware, "snapshot", lambda: dataclasses.replace(snap, ram_available=weights_over))
    plan, _ = fit_arms(_plan(model, [1, 4]), EngineSettings(ctx_size=4096), None)
    assert [a.label for a in plan.arms] == ["baseline", "K=1", "K=4"] and plan.left_out == ()


@pytest.mark.server
def test_sweep_leaves_out_an_arm_that_would_not_fit(tmp_path, make_model, server_bin):
    """A real llama-server sweep with a memory limit between K=1's need and K=4's: K=4 is never
    started; the CLI says why, the records name it, the verdict mentions it."""
    model = make_model(0.3)
    info = inspect(model)
    need = {k: sized(info, Arm(k), LoadSettings(ctx=4096)).total for k in (1, 4)}  # as fit_arms sizes them
    limit = (need[1] + need[4]) // 2
    out, logs = tmp_path / "r.jsonl", tmp_path / "logs"
    logs.mkdir()
    r = cli("bench", "--engine", "server", "--server-bin", server_bin, "--model", str(model), "--k", "1,4",
            "--ctx-size", "4096", "--memory-limit", str(limit), "--n-predict", "8", "--reps", "1", "--warmup", "0",
            "--per-task", "1", "--tasks", "code", "--out", str(out), "--log-dir", str(logs))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning: K=4 skipped: needs " in r.stderr
    assert "warning: K=4 skipped: needs " in r.stdout and "(not measured) -> free memory" in r.stdout
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted({x["k"] or 0 for x in recs}) == [0, 1]
    assert all(x["host"]["left_out"][0].startswith("K=4 skipped") for x in recs)
    started = sorted(p.name for p in logs.iterdir())
    assert started and not any("k4" in n for n in started), started  # never started to fail
    assert servers_mentioning(str(model)) == []
    # the verdict on the results file says so too (a finding of the analysis)
    rec = cli("recommend", str(out))
    assert rec.returncode == 0 and "K=4 skipped: needs " in rec.stdout, rec.stdout + rec.stderr


def test_the_users_own_flags_size_the_arms():
    """The user's llama-server flags (the issue's command) over the engine settings: -c, -ngl,
    -ctk/-ctv, -ctkd/-ctvd and -ub, spelled either way, "--flag=value" too."""
    argv = ["-m", "M.gguf", "-ngl", "99", "--n-cpu-moe", "24", "-c", "131072", "-fa", "on", "-np", "1",
            "-ctk", "q8_0", "--cache-type-v=q8_0", "-ctkd", "q4_0", "-ub", "256"]
    s = load_settings(EngineSettings(ctx_size=4096, n_gpu_layers="all"), argv)
    assert (s.ctx, s.n_gpu_layers, s.cache_type_k, s.cache_type_v) == (131072, "99", "q8_0", "q8_0")
    assert (s.draft_cache_type_k, s.draft_cache_type_v, s.n_ubatch) == ("q4_0", "f16", 256)
    plain = load_settings(EngineSettings(ctx_size=4096), ["-ctk", "q9_9", "-c"])  # unknown type, no value
    assert (plain.ctx, plain.cache_type_k, plain.n_gpu_layers) == (4096, "f16", None)
