"""The command line assembled: one sub-command per module of ``COMMANDS``, in the order --help
lists them. Each module declares its name, its one-line help and its options
(``setup_arguments``), and does the work (``run``); what they share is in app.cli.options."""

from __future__ import annotations

import argparse
from typing import Protocol

from app.cli import (bench, card, compare, hw, inspect_model, make_model, models, probe, recommend, rpc, rpc_worker,
                     runtime, selftest, tune, watch)
from app.cli.options import Parser


class Command(Protocol):
    """What a command module has (a module is the implementation, as asv's ``Command`` classes)."""

    NAME: str
    HELP: str

    def setup_arguments(self, p: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


COMMANDS: tuple[Command, ...] = (make_model, tune, bench, probe, recommend, compare, card, hw, inspect_model, models,
                                 runtime, rpc_worker, rpc, watch, selftest)
BY_NAME: dict[str, Command] = {c.NAME: c for c in COMMANDS}


class Version(argparse.Action):
    """``--version``: the app's version, each engine's llama.cpp build and where its binary lives
    (app.core.engines.versions), then exit."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version, the llama.cpp build of each engine (llama-cpp-python's and "
                              "llama-server's) and where each binary lives, then exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from app.core.common.text import printable
        from app.core.engines.versions import version_lines  # reads llama-server --version: only when asked

        print("\n".join(printable(line, one_line=True) for line in version_lines()))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="mtp-tuner", description="Does MTP speculative decoding pay off on this machine? "
               "Measure baseline vs MTP in llama.cpp and get the llama-server command.")
    p.add_argument("--version", action=Version)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        command.setup_arguments(sub.add_parser(command.NAME, help=command.HELP))
    return p
