"""Words as data: the core's advice carries its parts (plain words, and the settings it names), the
CLI and the window each word them from the same parts, and the window never rewrites the core's
text. The CLI's sentences stay as they were."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from helpers import make_record

from app.core.analysis.advice import CLI_WORDS, REPS, SELFTEST, Advice, Setting, cli_words, say
from app.core.analysis.findings import Finding, left_out_findings, sampled_findings
from app.gui.words import WINDOW_WORDS, finding_words

ROOT = Path(__file__).resolve().parents[1]
FLAG = re.compile(r"(?<![\w-])--?[a-z][a-z-]*")


def _cli_flags() -> set[str]:
    """Every flag of every mtp-tuner command."""
    from app.cli.parser import build_parser

    out: set[str] = set()
    todo = [build_parser()]
    while todo:
        p = todo.pop()
        for a in p._actions:
            out.update(s for s in a.option_strings if s.startswith("--"))
            if isinstance(a, argparse._SubParsersAction):
                todo.extend(a.choices.values())
    return out - {"--help"}


def _advice_words() -> list[tuple[str, str]]:
    """(file, plain words) of every advice the core writes: a Finding's third argument and every
    Advice(...), without the Settings they name."""
    out = []
    for path in sorted((ROOT / "app" / "core").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        roots: list[ast.AST] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id == "Finding" and len(node.args) >= 3:
                    roots.append(node.args[2])
                elif node.func.id == "Advice":
                    roots.append(node)
        for root in roots:
            todo = [root]
            while todo:
                n = todo.pop()
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Setting":
                    continue  # a setting: each front end words it
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    out.append((path.name, n.value))
                todo.extend(ast.iter_child_nodes(n))
    return out


def test_no_advice_names_a_cli_flag_in_its_plain_words():
    words = _advice_words()
    assert len(words) > 30  # the scan found the findings (analysis, placement, provisional, ...)
    flags = _cli_flags()
    assert {"--reps", "--n-predict", "--memory-limit", "--engine"} <= flags
    named = [(f, w) for f, w in words if set(FLAG.findall(w)) & flags or "mtp-tuner " in w]
    assert not named, named  # a flag of ours is a Setting: the window says where it is instead


def test_every_setting_is_worded_by_both_front_ends_and_the_window_names_no_flag():
    assert set(WINDOW_WORDS) == set(CLI_WORDS)
    flags = _cli_flags()
    for key in CLI_WORDS:
        cli = say(Advice((Setting(key, "3"),)), CLI_WORDS)
        window = say(Advice((Setting(key, "3"),)), WINDOW_WORDS)
        assert cli and window and cli != window, key
        assert not set(FLAG.findall(window)) & flags, (key, window)


def test_the_cli_says_the_advice_as_it_did():
    """The recorded sentences the CLI printed before the advice had parts, and the window's."""
    too_few = Finding("too_few_reps", "m", Advice(("run more repetitions (", Setting(REPS, "3"), ")")))
    assert too_few.fix == "run more repetitions (--reps 3 or more)"
    assert too_few.as_dict() == {"code": "too_few_reps", "message": "m", "fix": too_few.fix}
    assert finding_words(too_few) == "m -> run more repetitions (3 or more repetitions: Sweep tab > Advanced settings > Runs > Repetitions)"
    sampled = sampled_findings([make_record(arm_kind="mtp", sampling={"temperature": 0.8})])[0]
    assert sampled.fix == ("to check this llama.cpp build's speculative output, measure at greedy too "
                           "(--temperatures 0,... or --sampler greedy)")
    assert "add temperature 0 in Sweep tab > Advanced settings > Sampler and thinking > Temperatures" in finding_words(sampled)
    left = left_out_findings([make_record(host={"left_out": ["K=4 would not fit"]})])[0]
    assert left.fix == ("free memory, use a smaller --ctx-size or a quantized KV cache, or give a larger "
                        "--memory-limit")
    assert not FLAG.search(finding_words(left).split(" -> ", 1)[1])
    assert cli_words(Advice((Setting(SELFTEST), " and update llama.cpp"))) == "run mtp-tuner selftest and update llama.cpp"
    assert cli_words("plain words") == "plain words"


def test_the_window_rewrites_no_core_text_with_regexes():
    src = (ROOT / "app" / "gui" / "words.py").read_text(encoding="utf-8")
    assert not re.search(r"^import re\b|^from re import|\bre\.sub\(", src, re.M)
