from __future__ import annotations

import json

import pytest

from app.core.common.errors import UserError
from app.core.measure.prompts import BUILTIN_TASKS, builtin_prompts, load_prompt_file, prompts_for, select_prompts
from app.core.records.prompt import Prompt


def test_builtin_suites_have_six_or_more_prompts_in_english_and_japanese():
    prompts = builtin_prompts()
    for task in BUILTIN_TASKS:
        ps = [p for p in prompts if p.task == task]
        assert len(ps) >= 6
        assert {p.lang for p in ps} >= {"en", "ja"}
    assert len({p.id for p in prompts}) == len(prompts)


def test_user_file_json_and_jsonl_add_or_replace(tmp_path):
    j = tmp_path / "p.json"
    j.write_text(json.dumps([{"id": "mine", "task": "code", "text": "write a haiku in C"},
                             {"id": "code-en-date", "task": "code", "text": "replaced"}]))
    sel = select_prompts(["code"], j)
    by_id = {p.id: p for p in sel}
    assert by_id["mine"].text == "write a haiku in C"
    assert by_id["code-en-date"].text == "replaced"
    assert len(sel) == len(builtin_prompts(["code"])) + 1
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"id": "a", "task": "chat", "text": "hi"}\n\n{"id": "b", "task": "chat", "text": "yo"}\n')
    assert [p.id for p in select_prompts(None, jl, replace=True)] == ["a", "b"]
    assert [p.id for p in select_prompts(["chat"], jl)] == ["a", "b"]


@pytest.mark.parametrize("content, match", [
    ("", "empty"),
    ("[{]", "not valid JSON"),
    ('{"id": "a", "task": "x"}', "missing text"),
    ('[{"id": "a", "task": "x", "text": "t"}, {"id": "a", "task": "x", "text": "u"}]', "duplicate"),
    ("[1]", "must be an object"),
])
def test_bad_prompt_files(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(UserError, match=match) as ei:
        load_prompt_file(f)
    assert str(f) in str(ei.value)


def test_unknown_task_and_missing_file(tmp_path):
    with pytest.raises(UserError, match="unknown task 'poetry'"):
        select_prompts(["poetry"])
    with pytest.raises(UserError, match="not found"):
        select_prompts(None, tmp_path / "nope.json")


def test_prompts_for_tasks_are_the_demos_own_for_its_tasks_and_the_suites_for_the_rest(tmp_path):
    """The one rule the Start page and the Sweep tab both plan with."""
    demo = [Prompt("demo-code", "code", "def f(", "en"), Prompt("demo-story", "story", "Once", "en")]
    user = tmp_path / "p.json"
    user.write_text(json.dumps([{"id": "mine", "task": "sql", "text": "SELECT"}]))
    got = prompts_for(["code", "tongue-twister", "sql"], demo, user, per_task=1)
    assert [p.id for p in got] == ["demo-code", builtin_prompts(["tongue-twister"])[0].id, "mine"]
    assert prompts_for(["story"], demo) == [demo[1]]  # the demo's own task: its prompt alone
    assert [p.task for p in prompts_for(["code"], (), per_task=2)] == ["code", "code"]  # no demo: the suite's
