"""mtp-tuner hw: this machine (CPU, RAM, GPUs, memory bandwidth)."""

from __future__ import annotations

import argparse
import json

from app.cli.common import EXIT_OK
from app.core.machine.hardware import format_snapshot, snapshot


def run(args: argparse.Namespace) -> int:
    h = snapshot()
    print(json.dumps(h.to_dict(), indent=2) if args.json else format_snapshot(h))
    return EXIT_OK
