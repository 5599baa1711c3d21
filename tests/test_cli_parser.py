"""The command line assembled from its command modules: each module of app.cli that declares
options is a command of the parser, once, in the order --help lists them; shared options keep
their plain values."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import app.cli
from app.cli.parser import BY_NAME, COMMANDS, build_parser
from app.core.engines.base import EngineKind


def _subcommands(p: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))


def test_every_command_module_is_assembled_once():
    """A module with setup_arguments and run left out of COMMANDS would be a command nobody can call."""
    declaring = set()
    for info in pkgutil.iter_modules(app.cli.__path__):
        module = importlib.import_module(f"app.cli.{info.name}")
        if hasattr(module, "setup_arguments"):
            assert all(hasattr(module, name) for name in ("NAME", "HELP", "run")), info.name
            declaring.add(module.__name__)
    assert {c.__name__ for c in COMMANDS} == declaring
    assert len(BY_NAME) == len(COMMANDS)


def test_the_parser_lists_the_commands_in_their_order_with_their_help():
    listed = _subcommands(build_parser())._choices_actions
    assert [(a.dest, a.help) for a in listed] == [(c.NAME, c.HELP) for c in COMMANDS]


def test_each_command_parses_to_its_own_module():
    parser = build_parser()
    args = parser.parse_args(["inspect", "m.gguf", "--json"])
    assert args.cmd == "inspect" and BY_NAME[args.cmd].__name__ == "app.cli.inspect_model" and args.json
    args = parser.parse_args(["models", "download", "org/repo", "f.gguf", "--stall-timeout", "5"])
    assert (args.models_cmd, args.stall_timeout, args.revision, args.json) == ("download", 5.0, "main", False)


def test_engine_option_keeps_the_plain_name():
    """--engine is the plain name (what results files record), equal to its EngineKind."""
    parser = build_parser()
    probe = parser.parse_args(["probe", "--model", "m.gguf"])
    assert type(probe.engine) is str and probe.engine == EngineKind.INPROCESS
    assert parser.parse_args(["bench", "--demo"]).engine is None
    assert parser.parse_args(["bench", "--demo", "--engine", "server"]).engine == EngineKind.SERVER
