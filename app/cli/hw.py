"""mtp-tuner hw: this machine (CPU, RAM, GPUs, memory bandwidth), and per engine (in-process;
llama-server when one is found) the backends and devices it has and the one it will really use."""

from __future__ import annotations

import argparse
import json

from app.cli.common import EXIT_OK
from app.cli.options import add_json
from app.core.engines.devices import engine_backends, engine_backends_dict, format_engine_backends
from app.core.machine.hardware import format_snapshot, snapshot

NAME = "hw"
HELP = "this machine: CPU, RAM, GPUs, memory bandwidth"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    add_json(p)


def run(args: argparse.Namespace) -> int:
    h = snapshot()
    rows = engine_backends()
    if args.json:
        print(json.dumps(h.to_dict() | {"engines": engine_backends_dict(rows)}, indent=2))
    else:
        print(format_snapshot(h) + "\n\n" + format_engine_backends(rows))
    return EXIT_OK
