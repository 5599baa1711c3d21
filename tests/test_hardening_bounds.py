"""Bounds on what comes from outside and could run on: a model's chat template (a program: its
render is counted in steps and sizes, on both engines) and a prompt file (its size and prompt
count, checked in linear time); and bench's --mix without --adaptive said to matter only for
recommend. The bounds are counts and sizes; the timeouts only turn a hang into a failure."""

from __future__ import annotations

import json

import pytest

from app.core.common.errors import UserError
from app.core.calibrated import design as calibrated, gguf as calibrated_gguf
from app.core.engines import chat_template as CT
from app.core.measure import prompts as P
from app.core.records.prompt import Prompt
from conftest import bench_or_fail, servers_mentioning
from tests.helpers import clean_error, cli

HANG_S = 120  # a render or a check that has not ended by then never will (10^10 steps)
REFUSED = "its chat template did not finish rendering within"

NESTED_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ 'x' }}"
RUNAWAY = {  # each would take hours, or fill the memory, without the bounds
    "nested loops": NESTED_LOOP,
    "one long range": "{% for i in range(10000000000) %}{% endfor %}",
    "a recursive loop": "{% for x in 'abcdefghij' recursive %}{% if loop.depth < 10 %}{{ loop('abcdefghij') }}"
                        "{% endif %}{% endfor %}",
    "a macro in a loop": "{% macro f() %}{% for i in range(10000) %}{% endfor %}{% endmacro %}"
                         "{% for i in range(100000) %}{{ f() }}{% endfor %}",
    "a repeated string": "{{ 'x' * 100000000 }}",
    "a string doubled": "{% set ns = namespace(s='abcd') %}{% for i in range(25) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s|length }}",
    "a list doubled": "{% set ns = namespace(s=[1, 2, 3, 4]) %}{% for i in range(25) %}{% set ns.s = ns.s + ns.s %}"
                      "{% endfor %}{{ ns.s|length }}",
    "a filter's width": "{{ 'x'|center(100000000) }}",
    "a huge number": "{{ (7 ** 10000000) % 10 }}",
    "a huge constant": "{{ 7 ** 1000000000 }}",  # Jinja folds constants as it compiles: bounded there too
    "a long output": "{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}",
}


def _tokens(text: str) -> list[int]:
    return list(range(len(text)))


@pytest.mark.timeout(HANG_S)
@pytest.mark.parametrize("case", RUNAWAY)
def test_a_runaway_template_is_refused_in_process(case):
    template = RUNAWAY[case]
    chat = CT.ModelTemplate(template, CT.jinja_render(template, "", ""), _tokens)
    with pytest.raises(UserError, match=REFUSED):
        chat.prompt("x" * 1000, None)


@pytest.mark.timeout(HANG_S)
def test_the_bound_is_a_count_and_ordinary_templates_render_as_before():
    """The bound is 2,000,000 steps (an iteration one, a call 20): a render just within it
    finishes, one just past it is refused. Within the bounds nothing changes: loops over the
    messages, loop.last, filters, macros, string formatting and tojson render as jinja renders them."""
    loops = "{% for i in range(N) %}{% for j in range(1000) %}{% endfor %}{% endfor %}done"
    within, past = (CT.jinja_render(loops.replace("N", n), "", "") for n in ("1900", "2000"))
    assert CT.render_user(within, "x", None) == "done"  # 1,900 + 1,900,000 iterations + 1,901 calls
    with pytest.raises(UserError, match=f"{REFUSED} 2,000,000 steps"):
        CT.ModelTemplate(loops, past, _tokens).prompt("x", None)
    template = ("{% macro turn(m) %}<{{ m.role|upper }}>{{ m.content|trim }}{% endmacro %}"
                "{% for m in messages %}{{ turn(m) }}{% if not loop.last %}|{% endif %}{% endfor %}"
                "{{ '%s-%d' % ('n', messages|length) }}{{ {'a': 1}|tojson }}{{ (2 ** 100)|string|length }}"
                "{% for x in [3, 1, 2]|sort if x > 1 %}{{ x }}{% endfor %}{{ bos_token }}")
    render = CT.jinja_render(template, "<s>", "</s>")
    msgs = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]
    assert render(msgs, True, None) == '<USER>hi|<ASSISTANT>yon-2{"a": 1}3123<s>'
    assert CT.render_user(CT.jinja_render(calibrated.THINKING_TEMPLATE, "", ""), "hello", False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.fixture(scope="module")
def loop_model(tmp_path_factory):
    return calibrated_gguf.make_model(tmp_path_factory.mktemp("loop") / "loop.gguf", chat_template=NESTED_LOOP)




SMALL_SWEEP = ("--k", "1", "--reps", "1", "--warmup", "0", "--n-predict", "4", "--tasks", "code", "--per-task", "1")


@pytest.mark.timeout(2 * HANG_S)
def test_bench_refuses_a_runaway_template_in_process(loop_model, tmp_path):
    r = bench_or_fail("--model", str(loop_model), *SMALL_SWEEP, "--engine", "inprocess",
                       "--out", str(tmp_path / "runs.jsonl"), model=loop_model)
    clean_error(r, f"error: {loop_model}: {REFUSED} 2,000,000 steps")
    assert r.stderr.count("error:") == 1, r.stderr
    assert not (tmp_path / "runs.jsonl").exists()  # no run was measured


@pytest.mark.timeout(2 * HANG_S)
def test_bench_refuses_a_runaway_template_on_llama_server(server_bin, loop_model, tmp_path):
    """llama-server renders a template in C++, without bounds, as soon as it starts: the engine
    renders the template here first and starts no server for a template past the bounds."""
    r = bench_or_fail("--model", str(loop_model), *SMALL_SWEEP, "--engine", "server", "--server-bin", server_bin,
                       "--out", str(tmp_path / "runs.jsonl"), model=loop_model)
    clean_error(r, f"error: {loop_model}: {REFUSED} 2,000,000 steps")
    assert r.stderr.count("error:") == 1, r.stderr
    assert not servers_mentioning(str(loop_model))


# -- prompt files ---------------------------------------------------------------------------------

def _write_jsonl(path, n: int, dup_at: int | None = None):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{0 if i == dup_at else i}", "task": "code", "text": "x"}) + "\n")
    return path


@pytest.mark.timeout(HANG_S)
def test_a_million_prompts_are_refused_at_once(make_model, tmp_path):
    big = _write_jsonl(tmp_path / "big.jsonl", 1_000_000)
    r = cli("bench", "--model", str(make_model(0.0)), "--prompts", str(big), "--replace-prompts",
            "--out", str(tmp_path / "runs.jsonl"), timeout=HANG_S)
    clean_error(r, f"error: {big}: more than 100,000 prompts; the limit is 100,000 per file")
    listed = tmp_path / "big.json"  # the same as one JSON list
    listed.write_text(json.dumps([{"id": f"p{i}", "task": "code", "text": "x"} for i in range(100_001)]))
    with pytest.raises(UserError, match="more than 100,000 prompts"):
        P.load_prompt_file(listed)


@pytest.mark.timeout(HANG_S)
def test_prompt_files_at_the_limits(tmp_path):
    """50,000 prompts with one duplicate id: that id is named; 100,000 prompts load; a file over
    the size limit is refused before it is read."""
    with pytest.raises(UserError, match=r"duplicate prompt ids: p0$"):
        P.load_prompt_file(_write_jsonl(tmp_path / "dup.jsonl", 50_000, dup_at=49_999))
    assert len(P.load_prompt_file(_write_jsonl(tmp_path / "full.jsonl", 100_000))) == 100_000
    huge = tmp_path / "huge.jsonl"
    with open(huge, "wb") as f:
        f.truncate((256 << 20) + 1)  # sparse: nothing written, a size past the limit
    with pytest.raises(UserError, match=r"huge\.jsonl: 268,435,457 bytes, more than the 256 MiB a prompt file may have$"):
        P.load_prompt_file(huge)
    with pytest.raises(UserError, match="duplicate prompt ids: p7$"):
        P.save_prompt_file(tmp_path / "saved.json", [Prompt(f"p{i}", "code", "x") for i in [*range(49_999), 7]])


# -- bench --mix ----------------------------------------------------------------------------------

def test_bench_mix_without_adaptive_is_named(make_model, tmp_path):
    """--mix weighs the tasks for --adaptive's pick; a plain sweep says it does not use it (and a
    bad --mix is refused either way)."""
    r = cli("bench", "--model", str(make_model(0.0)), *SMALL_SWEEP, "--mix", "code=1",
            "--out", str(tmp_path / "runs.jsonl"))
    assert r.returncode == 0, r.stderr
    assert "note: --mix weighs the tasks only for --adaptive's pick" in r.stderr
    assert "recommend" in r.stderr.split("note: --mix", 1)[1].splitlines()[0]
    clean_error(cli("bench", "--model", str(make_model(0.0)), *SMALL_SWEEP, "--mix", "code=lots"),
                "--mix: 'lots' is not a number")
