"""Thinking on/off and context depth: a calibrated model whose chat
template has an ``enable_thinking`` switch renders differently with thinking on and off, in the
in-process Jinja template and through llama-server's /apply-template; reasoning tokens are counted
apart where the template marks them; neutral context puts a prompt at a depth; the export keeps
the choice with the flags the binary lists."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import re
from pathlib import Path

import pytest

from conftest import bare_server, make_tab, post_json
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QWidget

from app.cli import main as cli_main
from app.core.analysis.recommend import Pick
from app.core.analysis.settings import setting_label, split_by_setting
from app.core.common.errors import UserError
from app.core.calibrated import design as calibrated, gguf as calibrated_gguf
from app.core.engines import chat_template as CT
from app.core.engines.commands import Capabilities, jinja_off_by_default, thinking_args
from app.core.engines.inprocess import InProcessEngine
from app.core.engines.llama_backend import llama
from app.core.engines.server.engine import ServerEngine
from app.core.machine.gguf_info import read_header
from app.core.measure import depth as D
from app.core.measure.plan import Plan, make_arms
from app.core.measure.probe import run_probe
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished, SweepError, SweepWarning
from app.core.records.arm import Arm
from app.core.records.cost import CostRecord, Spread
from app.core.records.prompt import Prompt
from app.core.records.schema import RunRecord
from app.core.verdict.verdict import PROBE, build_verdict, choose_costs
from app.core.verdict.export import ExportOptions, export_for
from app.gui.services import make_services
from app.gui.state import AppState
from app.gui.tabs.sweep.context import ContextChooser
from app.gui.tabs.sweep import tab as sweep_mod
from tests.helpers import make_record

OPEN = "<|im_start|>assistant\n<think>\n"  # thinking on (and the template's default)
CLOSED = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # thinking off: an empty block, closed


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory) -> Path:
    return calibrated_gguf.make_model(tmp_path_factory.mktemp("think") / "think.gguf",
                                      chat_template=calibrated.THINKING_TEMPLATE)


# -- the template's switch -----------------------------------------------------------------------
def test_thinking_model_carries_the_switch(thinking_model):
    t = read_header(thinking_model).metadata["tokenizer.chat_template"]
    assert t == calibrated.THINKING_TEMPLATE and CT.supports_thinking(t)
    assert not CT.supports_thinking(calibrated.CHAT_TEMPLATE) and not CT.supports_thinking(None)


def test_inprocess_template_renders_the_switch(thinking_model):
    r = CT.jinja_render(read_header(thinking_model).metadata["tokenizer.chat_template"], "", "")
    on, off, default = (CT.render_user(r, "hello", t) for t in (True, False, None))
    assert on.endswith(OPEN) and default == on
    assert off.endswith(CLOSED) and off != on
    assert on.startswith("<|im_start|>user\nhello<|im_end|>\n")


@pytest.mark.server
def test_server_template_renders_the_switch(server_bin, thinking_model, tmp_path):
    """/apply-template honours chat_template_kwargs (server-common.cpp: the request's kwargs over
    the command line's; enable_thinking overrides the server's default): the same text as the
    in-process Jinja render, for on, off and the default."""
    r_in = CT.jinja_render(calibrated.THINKING_TEMPLATE, "", "")
    with bare_server(server_bin, ["-m", thinking_model, "-np", "1", "-c", "512", "-t", "1"],
                     tmp_path / "server.log") as url:
        r = CT.server_render(lambda path, body: post_json(url, path, body))
        for t in (True, False, None):
            assert CT.render_user(r, "hello", t) == CT.render_user(r_in, "hello", t), t
        assert post_json(url, "/apply-template", CT.apply_template_body("hi", False))["prompt"].endswith(CLOSED)
        assert CT.reasoning_markers(r) == CT.ReasoningMarkers("<think>", "</think>")


# -- reasoning markers and counts ----------------------------------------------------------------
def test_markers_come_from_the_template():
    r = CT.jinja_render(calibrated.THINKING_TEMPLATE, "", "")
    m = CT.reasoning_markers(r)
    assert m == CT.ReasoningMarkers("<think>", "</think>")
    assert m.open_at_end(CT.render_user(r, "x", True)) and not m.open_at_end(CT.render_user(r, "x", False))
    # another model's markers, found the same way (nothing assumes <think>)
    other = calibrated.THINKING_TEMPLATE.replace("<think>", "<|begin_of_thought|>").replace(
        "</think>", "<|end_of_thought|>")
    assert CT.reasoning_markers(CT.jinja_render(other, "", "")) == CT.ReasoningMarkers(
        "<|begin_of_thought|>", "<|end_of_thought|>")
    # from the generation prompt alone, when the template drops reasoning from past turns
    no_history = calibrated.THINKING_TEMPLATE.replace("message.reasoning_content is defined", "false")
    assert CT.reasoning_markers(CT.jinja_render(no_history, "", "")) == m
    assert CT.reasoning_markers(CT.jinja_render(calibrated.CHAT_TEMPLATE, "", "")) is None


def test_reasoning_tokens_counted_apart():
    start, end = (7, 8), (9,)
    # the model opens the block itself: marker tokens count as reasoning
    assert CT.split_reasoning([1, 7, 8, 2, 3, 9, 4, 5], start, end, False) == (5, 3)
    # the prompt opened it (thinking on): reasoning from the first token to the end marker
    assert CT.split_reasoning([2, 3, 9, 4], start, end, True) == (3, 1)
    # never closed: all reasoning; no markers: all answer; an unfinished start marker is answer
    assert CT.split_reasoning([2, 3, 4], start, end, True) == (3, 0)
    assert CT.split_reasoning([2, 3, 4], start, end, False) == (0, 3)
    assert CT.split_reasoning([2, 7, 4], start, end, False) == (0, 3)
    assert CT.split_reasoning([7, 8, 9, 7, 8, 1, 9, 6], start, end, False) == (7, 1)


def test_parse_thinking():
    assert [CT.parse_thinking(x) for x in ("on", "OFF", "default", None, True)] == [True, False, None, None, True]
    with pytest.raises(UserError, match="--thinking"):
        CT.parse_thinking("maybe")
    assert CT.apply_template_body("x", None) == {"messages": [{"role": "user", "content": "x"}]}
    assert CT.apply_template_body("x", True)["chat_template_kwargs"] == {"enable_thinking": True}


# -- export keeps the choice ---------------------------------------------------------------------
def test_thinking_flags_only_as_the_binary_lists_them():
    def caps(*flags: str, help_text: str = "") -> Capabilities:
        return Capabilities(flags=frozenset(flags), help_text=help_text)

    current = caps("--reasoning", "-rea", "--chat-template-kwargs", "--reasoning-budget", "--jinja",
                   help_text="--jinja, --no-jinja   whether to use jinja (default: enabled)\n")
    assert thinking_args(False, current) == ["--reasoning", "off"]
    assert thinking_args(None, current) == thinking_args(True, current) == []  # the binary's own default
    old = caps("--chat-template-kwargs", "--jinja", help_text="--jinja    use jinja template (default: disabled)\n")
    assert jinja_off_by_default(old) and not jinja_off_by_default(current)
    assert thinking_args(False, old) == ["--jinja", "--chat-template-kwargs", '{"enable_thinking":false}']
    assert thinking_args(False, caps("--reasoning-budget")) == ["--reasoning-budget", "0"]
    assert thinking_args(False, caps("--model")) == []


def test_export_adds_the_thinking_flags():
    pick = Pick("all", Arm(2, 0.0), None, "faster")
    off = export_for(pick, "m.gguf", None, None, ExportOptions(thinking=False))
    assert off.argv[-2:] == ("--reasoning", "off") and "reasoning = off" in off.preset
    assert "--reasoning" not in export_for(pick, "m.gguf", None, None, ExportOptions()).argv


# -- context depth -------------------------------------------------------------------------------
def _chars(text: str) -> int:
    return len(text)


def test_neutral_sentences_vary_and_stay_neutral():
    s = D.neutral_sentences(500)
    assert len(set(s)) == 500 and s == D.neutral_sentences(500) and s[:10] == D.neutral_sentences(10)
    assert len({x.split()[1] for x in s}) > 5  # not one sentence repeated with small changes
    text = " ".join(s)
    assert not re.search(r"[0-9?{}();=]", text)  # no numbers (task markers), questions or code


@pytest.mark.parametrize("depth", [1, 100, 2048])
def test_context_reaches_the_depth_with_whole_sentences(depth):
    ctx = D.neutral_context(depth, _chars)
    n = next(n for n in range(1, 10_000) if D.neutral_text(n) == ctx)
    assert _chars(ctx + D.SEPARATOR) >= depth
    assert n == 1 or _chars(D.neutral_text(n - 1) + D.SEPARATOR) < depth  # one sentence less is short
    text = D.at_depth("Write a haiku. Task 1", depth, _chars)
    assert text == ctx + D.SEPARATOR + "Write a haiku. Task 1"


def test_context_size_grows_to_the_depth():
    assert D.ctx_for(4096, (0,), 128) == 4096 and D.ctx_for(0, (16384,), 128) == 0
    assert D.ctx_for(4096, (0, 4096), 128) == 4096 + D.PROMPT_ROOM + 128
    assert D.ctx_for(65536, (4096,), 128) == 65536


def test_depth_zero_and_parsing():
    assert D.at_depth("p", 0, _chars) == "p"
    assert D.parse_depths("0, 4k,4096,16K") == (0, 4096, 16384)
    for bad in ("-1", "x", ""):
        with pytest.raises(UserError, match="--depth"):
            D.parse_depths(bad, "--depth")
        with pytest.raises(UserError, match="^Context depth "):  # as the window names it
            D.parse_depths(bad, "Context depth")


# -- the Sweep tab's fields ----------------------------------------------------------------------
def test_context_chooser_fields(qtbot):
    holder = QWidget()
    qtbot.addWidget(holder)
    c = ContextChooser(holder)
    assert c.thinking() == (None,) and c.depths() == (0,) and c.ctx_needed(4096, 128) == 4096
    c.show((True, False), (0, 4096))
    assert c.thinking() == (True, False) and c.depths() == (0, 4096)
    assert c.ctx_needed(4096, 128) == 4096 + 512 + 128 and c.ctx_needed(0, 128) == 0
    c.depth_edit.setText("4k,lots")
    with pytest.raises(UserError, match="Context depth"):
        c.depths()


# -- the verdict at a depth, with the thinking setting the runs measured ------------------------
def _cost(depth: int, t1: float) -> CostRecord:
    sp = lambda x: Spread(x, x, x, 5)  # noqa: E731
    t = {n: t1 * (1 + 0.1 * (n - 1)) for n in range(1, 6)}
    return CostRecord(1, "cost", f"c{depth}-{t1}", "inprocess", "b", "/m.gguf", 1, depth, 5, 2,
                      {n: sp(v) for n, v in t.items()}, {n: sp(v / t[1]) for n, v in t.items()},
                      sp(t1 / 4), {n: sp(t1 / 4) for n in t}, sp(100.0), 5, True, "", {})


def _records(depth: int, thinking: bool | None) -> list[RunRecord]:
    out = []
    for rep in range(3):
        for k in (None, 2):
            n = 64
            times = tuple(i * (0.01 if k is None else 0.007) for i in range(n))
            out.append(make_record(
                run_id=f"{k}-{rep}", sweep_id="s", engine="inprocess",
                arm_kind="baseline" if k is None else "mtp", k=k, p_min=None if k is None else 0.0,
                rep=rep, n_predict=n, n_generated=n, tok_s=None, tok_s_engine=None,
                draft_n=40 if k else None, draft_accepted=30 if k else None, acceptance=0.75 if k else None,
                mtp_engaged=True if k else None, output_sha256="x", output_tokens=tuple(range(n)),
                prompt_n=depth + 20, prompt_tokens=(), prompt_tok_s=None, llama_build="b", token_times=times,
                timestamp_utc=f"2026-01-01T00:00:{rep:02d}+00:00",
                spec_type=None if k is None else "draft-mtp", thinking=thinking, depth=depth))
    return out


def test_verdict_prices_with_the_probe_at_the_runs_depth():
    costs = [_cost(64, 10.0), _cost(2048, 20.0), _cost(64, 11.0), _cost(16384, 40.0)]
    deep, source = choose_costs(_records(2048, None), costs, "/m.gguf")
    assert source == PROBE and deep.t_ms[1] == 20.0
    shallow, _ = choose_costs(_records(0, None), costs, "/m.gguf")
    assert shallow.t_ms[1] == 11.0  # depth 0: the default probe depth, the latest of equals


def test_verdict_export_keeps_the_runs_thinking_setting():
    off = build_verdict(_records(0, False))
    assert off.export is not None and off.export.argv[-2:] == ("--reasoning", "off")
    assert "--reasoning" not in build_verdict(_records(0, None)).export.argv


def test_probe_at_depth_reports_it(make_model):
    recs = [ev for ev in run_probe(str(make_model(0.0)), depth=2048, max_batch=3, min_rounds=1, max_rounds=1)
            if isinstance(ev, CostRecord)]
    assert len(recs) == 1 and recs[0].depth == 2048 and recs[0].draft_ms is not None
    build = recs[0].llama_build  # a probe prices runs of its own build only
    shallow = dataclasses.replace(_cost(64, 1.0), model_path=recs[0].model_path, llama_build=build)  # a later probe, not as deep
    runs = [dataclasses.replace(r, llama_build=build) for r in _records(2048, None)]
    costs, source = choose_costs(runs, recs + [shallow], recs[0].model_path)
    # priced by the deep probe's whole steps, against its plain step in the same loop
    assert source == PROBE and costs.whole_steps and costs.t_ms[1] == recs[0].plain_ms.median


def test_model_template_sends_the_switch_only_where_there_is_one():
    def tok(text: str) -> list[int]:
        return [ord(c) for c in text]

    t = CT.ModelTemplate(calibrated.THINKING_TEMPLATE, CT.jinja_render(calibrated.THINKING_TEMPLATE, "", ""), tok)
    assert t.switch and t.sent(False) is False and t.prompt("x", False).endswith(CLOSED)
    on = t.prompt("x", True)
    assert t.reasoning_n(on, tok("abc</think>\n\nanswer")) == len("abc</think>")
    assert t.reasoning_n(t.prompt("x", False), tok("answer")) == 0
    plain = CT.ModelTemplate(calibrated.CHAT_TEMPLATE, CT.jinja_render(calibrated.CHAT_TEMPLATE, "", ""), tok)
    assert not plain.switch and plain.sent(False) is None and plain.prompt("x", False) == plain.prompt("x", None)
    assert plain.reasoning_n(plain.prompt("x", None), tok("abc")) is None


def test_settings_split_and_label():
    recs = _records(0, False) + _records(2048, False) + _records(0, True)
    groups = split_by_setting(recs)
    assert [len(v) for v in groups.values()] == [6, 6, 6]
    assert [setting_label(v, recs) for v in groups.values()] == [
        "thinking off, depth 0", "thinking off, depth 2048", "thinking on, depth 0"]
    assert setting_label(_records(0, None)) == ""
    hot = [dataclasses.replace(r, sampling={"temperature": 0.7, "top_k": 20, "seed": 1}) for r in _records(0, None)]
    assert setting_label(hot, hot + _records(0, None)) == "temperature 0.7, top-k 20"


def test_recommend_gives_a_verdict_per_setting(tmp_path, capsys):
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in _records(0, False) + _records(2048, False)))
    assert cli_main(["recommend", str(path)]) == 0
    out = capsys.readouterr().out
    assert "== depth 0 ==" in out and "== depth 2048 ==" in out and out.count("--reasoning off") >= 2
    assert cli_main(["recommend", str(path), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert [s["setting"] for s in js["settings"]] == ["depth 0", "depth 2048"]
# -- end to end: the runner, both engines ---------------------------------------------------------
PROMPT = Prompt("hello", "code", "hello world")


def _run(engine, model: Path, *, thinking=(None,), depths=(0,), n_predict=24) -> list[RunRecord]:
    plan = Plan(model=str(model), arms=make_arms([2]), prompts=(PROMPT,), engine=engine.name,
                n_predict=n_predict, reps=1, warmup=0, thinking=thinking, depths=depths)
    events = list(run_sweep(plan, engine))
    assert not [e for e in events if isinstance(e, SweepError)], events
    return [e.record for e in events if isinstance(e, RunFinished)]


def _check_thinking_runs(recs: list[RunRecord], engine) -> None:
    assert {(r.arm_kind, r.thinking) for r in recs} == {(a, t) for a in ("baseline", "mtp") for t in (True, False)}
    for r in recs:
        prompt = _detok(engine, r.prompt_tokens)
        assert prompt.endswith(OPEN if r.thinking else CLOSED), (engine.name, r.thinking, prompt[-40:])
        # thinking on: the generation prompt opened a block never closed, all reasoning; off: none
        assert r.reasoning_n == (r.n_generated if r.thinking else 0)
    on = [r for r in recs if r.thinking]
    off = [r for r in recs if r.thinking is False]
    assert all(len(a.prompt_tokens) != len(b.prompt_tokens) for a in on for b in off)


def _detok(engine, tokens) -> str:
    if engine.name == "server":
        srv = next(iter(engine._pool.values()))
        return srv.request_json("POST", "/detokenize", {"tokens": list(tokens)})["content"]
    m = engine._m
    L, _ = llama()
    buf = ctypes.create_string_buffer(1 << 16)
    n = L.llama_detokenize(m.vocab, (L.llama_token * len(tokens))(*tokens), len(tokens), buf, len(buf), False, True)
    return buf.raw[:n].decode()


def test_inprocess_thinking_on_and_off(thinking_model):
    with InProcessEngine(ctx_size=1024) as eng:
        _check_thinking_runs(_run(eng, thinking_model, thinking=(True, False)), eng)


@pytest.mark.server
def test_server_thinking_on_and_off(server_bin, thinking_model):
    with ServerEngine(server_bin, ctx_size=1024) as eng:
        _check_thinking_runs(_run(eng, thinking_model, thinking=(True, False)), eng)


def test_no_switch_is_one_setting_with_a_warning(make_model):
    with InProcessEngine(ctx_size=1024) as eng:
        plan = Plan(model=str(make_model(0.0)), arms=make_arms([2]), prompts=(PROMPT,), engine="inprocess",
                    n_predict=8, reps=1, warmup=0, thinking=(True, False))
        events = list(run_sweep(plan, eng))
    recs = [e.record for e in events if isinstance(e, RunFinished)]
    assert len(recs) == 2 and all(r.thinking is None and r.reasoning_n is None for r in recs)
    assert any(isinstance(e, SweepWarning) and "no thinking switch" in e.message for e in events)


def _check_depth_runs(recs: list[RunRecord]) -> None:
    by_depth = {d: [r for r in recs if r.depth == d] for d in (0, 2048)}
    assert all(len(v) == 2 for v in by_depth.values())
    assert all(r.prompt_n < 64 for r in by_depth[0])
    assert all(r.prompt_n >= 2048 and r.prompt_n < 2048 + 128 for r in by_depth[2048])
    # the task prompt is the same at both depths: the generation still follows it
    assert {r.output_tokens for r in recs} == {by_depth[0][0].output_tokens}


def test_inprocess_depth(make_model):
    with InProcessEngine(ctx_size=4096) as eng:
        _check_depth_runs(_run(eng, make_model(0.0), depths=(0, 2048)))


@pytest.mark.server
def test_server_depth(server_bin, make_model):
    with ServerEngine(server_bin, ctx_size=4096) as eng:
        _check_depth_runs(_run(eng, make_model(0.0), depths=(0, 2048)))


def test_plan_axes_and_again():
    plan = Plan(model="m", arms=make_arms([1]), prompts=(PROMPT,), reps=1, thinking=(True, False, True),
                depths=(0, 4096))
    assert plan.thinking == (True, False) and plan.total_runs == 2 * 2 * 2
    assert {(s.thinking, s.depth) for s in plan.runs()} == {(t, d) for t in (True, False) for d in (0, 4096)}
    with pytest.raises(UserError, match="context depth must not be negative, got -1"):
        Plan(model="m", arms=make_arms([1]), prompts=(PROMPT,), depths=(-1,))



def test_bench_thinking_and_depth_flags(thinking_model, tmp_path, capsys):
    out = tmp_path / "runs.jsonl"
    assert cli_main(["bench", "--model", str(thinking_model), "--thinking", "on,off", "--depth", "0,600",
                     "--ctx-size", "512", "--k", "2", "--tasks", "code", "--per-task", "1", "--reps", "1",
                     "--warmup", "0", "--n-predict", "8", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for label in ("thinking on, depth 0", "thinking off, depth 600"):
        assert f"== {label} ==" in text
    recs = [RunRecord.from_dict(json.loads(line)) for line in out.read_text().splitlines()]
    assert {(r.thinking, r.depth) for r in recs} == {(t, d) for t in (True, False) for d in (0, 600)}
    assert all(r.prompt_n >= 600 for r in recs if r.depth == 600)  # the context grew past --ctx-size 512
    assert cli_main(["bench", "--model", str(thinking_model), "--thinking", "maybe"]) != 0
    assert "--thinking must be one of on, off, default" in capsys.readouterr().err
    # the same sweep again: its own thinking and depth settings
    again = tmp_path / "again.jsonl"
    assert cli_main(["bench", "--again", str(out), "--out", str(again), "--warmup", "0"]) == 0
    recs2 = [RunRecord.from_dict(json.loads(line)) for line in again.read_text().splitlines()]
    assert sorted((r.thinking, r.depth, r.arm_kind) for r in recs2) == sorted((r.thinking, r.depth, r.arm_kind) for r in recs)
    assert cli_main(["bench", "--again", str(out), "--depth", "4096"]) != 0
    assert "--depth do not combine" in capsys.readouterr().err


def test_sweep_tab_plans_thinking_and_depth(qtbot, tmp_path, monkeypatch, make_model):
    state = AppState(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    services = make_services(state)
    tab = make_tab(sweep_mod.SweepTab, state, services)
    qtbot.addWidget(tab)
    state.set_model(str(make_model(0.0)))  # a real GGUF: Start is enabled
    tab.form.context.thinking_box.setCurrentText("off")
    tab.form.context.depth_edit.setText("0,4k")
    plan = tab.form.plan()
    assert plan.thinking == (False,) and plan.depths == (0, 4096)
    asked = []

    def no_engine(settings):
        asked.append(settings.ctx_size)
        raise UserError("no engine in this test")

    from app.core.session import sweep as session_mod

    monkeypatch.setattr(session_mod, "make_engine", no_engine)
    tab.start_btn.click()
    qtbot.waitUntil(lambda: tab.sweeps.job is None, timeout=10000)
    assert asked == [4096 + D.PROMPT_ROOM + plan.n_predict]  # the context grown to the deepest depth
    started = []
    monkeypatch.setattr(tab, "start_sweep", started.append)
    state.sweep_requested.emit(dataclasses.replace(plan, thinking=(True, False), depths=(2048,)))
    assert tab.form.context.thinking() == (True, False) and tab.form.context.depths() == (2048,)
    services.jobs.cancel_all(10000)
