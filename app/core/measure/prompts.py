"""Prompt suites by task type, and the user's own prompt files (JSON list or JSONL)."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from pathlib import Path
from typing import Iterable

from app.core.common import jsonsafe
from app.core.common.atomic import write_text_atomic
from app.core.common.errors import UserError
from app.core.common.paths import user_prompts_path
from app.core.common.reading import read_capped
from app.core.common.resources import resource
from app.core.common.text import shown
from app.core.records.prompt import Prompt

BUILTIN_TASKS = ("story", "code", "tongue-twister", "edit")
# the tasks a sweep measures when none are chosen; edit (text given in the prompt, repeated with a
# change: where n-gram drafting pays) is measured when asked for by name
DEFAULT_TASKS = ("story", "code", "tongue-twister")
# a prompt file's bounds: a sweep runs every prompt several times, so a file past them is a mistake
MAX_PROMPTS = 100_000
MAX_PROMPT_FILE_BYTES = 256 << 20  # 256 MiB


def check_prompts(prompts: list[Prompt], where: str) -> None:
    """At most MAX_PROMPTS prompts, each id once (a linear count: a large file is checked at once)."""
    if len(prompts) > MAX_PROMPTS:
        raise _too_many(where)
    dup = sorted(i for i, n in collections.Counter(q.id for q in prompts).items() if n > 1)
    if dup:
        shown = ", ".join(dup[:20]) + (f" (and {len(dup) - 20:,} more)" if len(dup) > 20 else "")
        raise UserError(f"{where}: duplicate prompt ids: {shown}")


def _too_many(where: str | Path) -> UserError:
    return UserError(f"{where}: more than {MAX_PROMPTS:,} prompts; the limit is {MAX_PROMPTS:,} per file")


def _from_obj(obj: object, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: each prompt must be an object with id, task and text")
    missing = [k for k in ("id", "task", "text") if not isinstance(obj.get(k), str) or not obj.get(k)]
    if missing:
        raise UserError(f"{where}: prompt is missing {', '.join(missing)} (strings, not empty)")
    # the id, task and language are shown in lines and tables: one escaped line each, bounded (the
    # text is the prompt itself and keeps its line breaks)
    return Prompt(shown(obj["id"], 120), shown(obj["task"], 60), str(obj["text"]), shown(str(obj.get("lang", "")), 20))


def load_prompt_file(path: str | os.PathLike[str]) -> list[Prompt]:
    p = Path(path).expanduser()
    data = read_capped(p, "prompt file", MAX_PROMPT_FILE_BYTES)  # a FIFO is refused at once, not waited on
    try:
        text = data.decode("utf-8-sig")  # a byte order mark from Windows editors is fine
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: cannot read the prompt file ({e})") from None
    if not text.strip():
        raise UserError(f"{p}: the prompt file is empty")
    prompts: list[Prompt] = []
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = jsonsafe.loads(text)
        except ValueError as e:
            raise UserError(f"{p}: not valid JSON ({e})") from None
        if len(data) > MAX_PROMPTS:
            raise _too_many(p)
        for i, obj in enumerate(data):
            prompts.append(_from_obj(obj, f"{p} item {i + 1}"))
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            if len(prompts) >= MAX_PROMPTS:
                raise _too_many(p)
            try:
                obj = jsonsafe.loads(line)
            except ValueError as e:
                raise UserError(f"{p} line {n}: not valid JSON ({e})") from None
            prompts.append(_from_obj(obj, f"{p} line {n}"))
    check_prompts(prompts, str(p))
    return prompts


def builtin_prompts(tasks: Iterable[str] = BUILTIN_TASKS) -> list[Prompt]:
    out: list[Prompt] = []
    for task in tasks:
        f = resource("prompts", f"{task}.json")
        if not f.is_file():
            raise UserError(f"unknown task {task!r}: built-in tasks are {', '.join(BUILTIN_TASKS)}")
        out.extend(load_prompt_file(f))
    return out


def select_prompts(tasks: Iterable[str] | None = None, user_file: str | os.PathLike[str] | None = None,
                   replace: bool = False, per_task: int | None = None) -> list[Prompt]:
    """Built-in prompts of ``tasks`` (None: DEFAULT_TASKS'), plus (or, with ``replace``, only) the
    user's; a user prompt with the id of a built-in one replaces it. ``per_task`` keeps the first N of each task."""
    tasks = list(tasks) if tasks else None
    user = load_prompt_file(user_file) if user_file else []
    if replace:
        if not user_file:
            raise UserError("replacing the built-in prompts needs a prompt file (--prompts)")
        base: list[Prompt] = []
    else:
        base = builtin_prompts([t for t in tasks if t in BUILTIN_TASKS] if tasks else DEFAULT_TASKS)
        unknown = [t for t in (tasks or []) if t not in BUILTIN_TASKS and t not in {q.task for q in user}]
        if unknown:
            raise UserError(f"unknown task {unknown[0]!r}: built-in tasks are {', '.join(BUILTIN_TASKS)}")
    by_id = {q.id: q for q in base}
    for q in user:
        by_id[q.id] = q
    out = [q for q in by_id.values() if tasks is None or q.task in tasks]
    if per_task:
        seen: dict[str, int] = {}
        kept = []
        for q in out:
            seen[q.task] = seen.get(q.task, 0) + 1
            if seen[q.task] <= per_task:
                kept.append(q)
        out = kept
    if not out:
        raise UserError("no prompts selected (check --tasks and --prompts)")
    return out


def prompts_for(tasks: Iterable[str] | None, demo: Iterable[Prompt] = (),
                user_file: str | os.PathLike[str] | None = None, per_task: int | None = None,
                replace: bool = False) -> list[Prompt]:
    """The prompts of a sweep over ``tasks`` (None: every built-in task), the one rule the CLI, the
    Start page and the Sweep tab use: a demo model's own prompts (``demo``: each leads into its
    task's region of the model) for the tasks it has, and for the rest the built-in suites with the
    user's prompts (``user_file``; ``replace``: only the user's), the first ``per_task`` of each."""
    own = [q for q in demo if tasks is None or q.task in tasks]
    if tasks is None:
        return own or select_prompts(None, user_file, replace, per_task)
    tasks = list(tasks)
    rest = [t for t in tasks if t not in {q.task for q in own}]
    return own + (select_prompts(rest, user_file, replace, per_task) if rest else [])


def save_prompt_file(path: str | os.PathLike[str], prompts: Iterable[Prompt]) -> Path:
    """Write prompts as a JSON list (atomically); checked as :func:`load_prompt_file` reads them."""
    prompts = list(prompts)
    p = Path(path).expanduser()
    check_prompts(prompts, str(p))
    for n, q in enumerate(prompts, 1):
        _from_obj(dataclasses.asdict(q), f"prompt {n}")
    write_text_atomic(p, json.dumps([dataclasses.asdict(q) for q in prompts], ensure_ascii=False, indent=2) + "\n")
    return p


def user_prompts() -> list[Prompt]:
    """The user's saved prompts (none when the file does not exist yet)."""
    p = user_prompts_path()
    return load_prompt_file(p) if p.is_file() else []
