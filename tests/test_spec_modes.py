"""The one mode table (app.core.common.spec_modes): every --spec-type has its row, and the arms,
the llama-server argv, both engines' mode checks, the drafter checks, the Sweep tab's note and the
engine choice all read it, so that a new mode is one row."""

from __future__ import annotations

import dataclasses

import pytest

from app.core.common import spec_modes
from app.core.common.errors import UserError
from app.core.common.spec_modes import (DRAFTER_MODES, MODES, NEEDS_DRAFTER, SPEC_TYPES, SpecMode, mode,
                                        mode_or_guess, needs_server, server_only)
from app.core.engines.commands import Capabilities, ServerConfig, build_server_argv, parse_help
from app.core.engines.inprocess import InProcessEngine
from app.core.engines.server.engine import ServerEngine
from app.core.measure.plan import make_arms
from app.core.records.arm import Arm

LLAMA_CPP_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
                   "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
HELP = """
-m,    --model FNAME                    model path to load
-np,   --parallel N                     number of server slots (default: -1, -1 = auto)
-c,    --ctx-size N                     size of the prompt context (default: 0)
--spec-type <list>                      comma-separated list of types (default: none)
-md,   --spec-draft-model FNAME         draft model
--spec-draft-n-max N                    number of tokens to draft (default: 3)
--spec-draft-p-min P                    minimum speculative decoding probability (default: 0.00)
"""


def caps(*types: str) -> Capabilities:
    return Capabilities(flags=parse_help(HELP), spec_types=frozenset(types))


def test_every_spec_type_has_one_row_in_llama_cpps_order():
    assert SPEC_TYPES == LLAMA_CPP_TYPES == tuple(MODES)
    for name, row in MODES.items():
        assert isinstance(row, SpecMode) and row.name == name and mode(name) is row and row.tip
        assert dataclasses.is_dataclass(row) and row.__dataclass_params__.frozen
        assert not (row.needs_drafter and not row.drafter_kinds), name  # who needs one names its kinds
        assert not (row.fresh_server and row.takes_k), name
    assert mode("draft-nothing") is None


def test_the_rows_say_what_the_app_knew_by_name_before():
    assert NEEDS_DRAFTER == {"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"}
    assert DRAFTER_MODES == {"gemma4-assistant": ("draft-mtp",), "mtp-head": ("draft-mtp",),
                             "eagle3": ("draft-eagle3",), "dflash": ("draft-dflash",),
                             "dspark": ("draft-dspark", "draft-dflash"), "model": ("draft-simple",)}
    assert {m for m, r in MODES.items() if r.takes_k} == {m for m in SPEC_TYPES if m.startswith("draft-")}
    assert {m for m, r in MODES.items() if r.fresh_server} == {m for m in SPEC_TYPES if m.startswith("ngram-")}
    assert {m for m, r in MODES.items() if r.in_process} == {"none", "draft-mtp"}


def test_needs_server_and_server_only():
    assert not needs_server("none", None) and not needs_server("draft-mtp", None)
    assert needs_server("draft-mtp", "a.gguf") and needs_server("ngram-mod", None)
    assert needs_server("draft-simple", "d.gguf") and needs_server("draft-newer", None)
    pairs = [("ngram-mod", None), ("draft-mtp", None), ("draft-mtp", "a.gguf"), ("draft-simple", "d.gguf"),
             ("ngram-mod", None), ("none", None)]
    assert server_only(pairs) == ["draft-mtp with a drafter", "draft-simple", "ngram-mod"]
    assert server_only([("draft-mtp", None), ("none", None)]) == []


@pytest.mark.parametrize("name", LLAMA_CPP_TYPES[1:])
def test_arms_commands_and_engines_agree_with_the_table(name):
    row = MODES[name]
    drafter = "d.gguf" if row.needs_drafter else None
    arm = Arm(2, mode=name, drafter=drafter) if row.takes_k else Arm(mode=name)
    assert arm.needs_server == needs_server(name, drafter) == (not row.in_process or bool(drafter))
    assert arm.own_heads == (row.in_process and not drafter)
    if not row.takes_k:
        with pytest.raises(ValueError):
            Arm(2, mode=name)
    # llama-server's argv: a draft width only where the mode takes K
    argv = build_server_argv("ls", ServerConfig("m.gguf", spec_k=arm.k, spec_type=name, drafter=drafter),
                             caps(name))
    assert argv[argv.index("--spec-type") + 1] == name
    assert ("--spec-draft-n-max" in argv) == row.takes_k
    # the in-process engine runs exactly the rows that run in process, on the model's own heads
    assert (InProcessEngine().mode_problem(arm) is None) == (not arm.needs_server)
    # the plan asks for a drafter exactly where the row needs one
    if row.needs_drafter:
        with pytest.raises(UserError, match="needs a drafter"):
            make_arms([1], modes=[name])
    # the Sweep tab's tip is the row's
    assert spec_modes.mode_or_guess(name).tip == row.tip


def _server_reuse(arm: Arm) -> str:
    """Which server ServerEngine.generate asks for: a fresh one or one from its pool."""
    eng = ServerEngine.__new__(ServerEngine)

    class Asked(Exception):
        pass

    def ask(what):
        def f(*_):
            raise Asked(what)
        return f

    eng.config_for, eng.fresh_server, eng.server = (lambda m, a: (m, a)), ask("fresh"), ask("pool")
    with pytest.raises(Asked) as e:
        next(eng.generate("m.gguf", arm, "hi", raw=True, n_predict=4, sampler=None, cancel=None))
    return str(e.value)


def test_the_server_engine_starts_a_fresh_server_where_the_row_says():
    assert _server_reuse(Arm(mode="ngram-mod")) == "fresh"
    assert _server_reuse(Arm(2)) == "pool" and _server_reuse(Arm()) == "pool"


def test_a_new_ngram_mode_is_one_row(monkeypatch):
    """A mode named unlike llama.cpp's families proves the table is read, not the name."""
    monkeypatch.setitem(MODES, "lookup-tree", SpecMode("lookup-tree", fresh_server=True, tip="a tree"))
    arms = make_arms([1, 2], modes=["draft-mtp", "lookup-tree"])
    assert Arm(mode="lookup-tree") in arms and [a.label for a in arms][-1] == "lookup-tree"
    with pytest.raises(ValueError):
        Arm(1, mode="lookup-tree")  # takes no K
    argv = build_server_argv("ls", ServerConfig("m.gguf", spec_type="lookup-tree"), caps("lookup-tree"))
    assert argv[argv.index("--spec-type") + 1] == "lookup-tree" and "--spec-draft-n-max" not in argv
    assert caps("lookup-tree").mode_problem("lookup-tree") is None
    assert Arm(mode="lookup-tree").needs_server and InProcessEngine().mode_problem(Arm(mode="lookup-tree"))
    assert server_only((a.mode, a.drafter) for a in arms) == ["lookup-tree"]
    assert _server_reuse(Arm(mode="lookup-tree")) == "fresh"
    assert mode_or_guess("lookup-tree").tip == "a tree"


def test_a_new_draft_mode_is_one_row(monkeypatch):
    monkeypatch.setitem(MODES, "tree-draft", SpecMode("tree-draft", takes_k=True, needs_drafter=True,
                                                      drafter_kinds=("model",), tip="t"))
    with pytest.raises(UserError, match="needs a drafter"):
        make_arms([1], modes=["tree-draft"])
    arms = make_arms([3], modes=["tree-draft"], drafters={"tree-draft": "d.gguf"})
    assert arms[1] == Arm(3, mode="tree-draft", drafter="d.gguf") and arms[1].label == "tree-draft K=3"
    argv = build_server_argv("ls", ServerConfig("m.gguf", spec_k=3, spec_type="tree-draft", drafter="d.gguf"),
                             caps("tree-draft"))
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3" and "--spec-draft-model" in argv
    assert _server_reuse(arms[1]) == "pool"


def test_a_name_only_a_newer_llama_cpp_lists_is_guessed_from_its_family():
    assert mode_or_guess("draft-newer").takes_k and not mode_or_guess("draft-newer").needs_drafter
    assert mode_or_guess("ngram-newer").fresh_server and not mode_or_guess("ngram-newer").takes_k
    assert Arm(2, mode="draft-newer").label == "draft-newer K=2" and Arm(mode="ngram-newer").label == "ngram-newer"
    assert "drafts K tokens" in mode_or_guess("draft-newer").tip and mode_or_guess("ngram-newer").tip.endswith("no K")
