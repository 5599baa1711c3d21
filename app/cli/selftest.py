"""mtp-tuner selftest: check a llama.cpp build's MTP against calibrated models."""

from __future__ import annotations

import argparse

from app.cli.common import EXIT_FAILED, EXIT_OK
from app.cli.options import whole
from app.core.common.errors import UserError
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.server.binary import find_server_binary, probe_capabilities
from app.core.measure.selftest import format_check, run_selftest
from app.core.session.selftest_timing import format_timing, timing_check

NAME = "selftest"
HELP = "check a llama.cpp build's MTP against calibrated models"


def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server-bin", help="llama-server binary to check")
    p.add_argument("--n-predict", type=whole(1), default=64)
    p.add_argument("--no-timing", action="store_true",
                   help="skip the timing check (the baseline against the cost probe's plain step; a few minutes)")


def run(args: argparse.Namespace) -> int:
    binary = find_server_binary(args.server_bin)
    caps = probe_capabilities(binary)
    print(f"llama-server {binary}\nbuild {caps.version}; draft-mtp "
          f"{'supported' if caps.supports_mtp else 'NOT supported'}")
    if not caps.supports_mtp:
        raise UserError(f"{binary}: {caps.mtp_problem()}")
    n = bad = 0
    for check in run_selftest(EngineSettings(kind=EngineKind.SERVER, server_bin=binary),
                              n_predict=args.n_predict):
        n += 1
        bad += not check.ok
        print(format_check(check), flush=True)
    if not args.no_timing:  # the baseline against the probe's plain step, by the verdict's own rule
        timing = timing_check(EngineSettings(kind=EngineKind.SERVER, server_bin=binary))
        n += 1
        bad += not timing.ok
        print(format_timing(timing), flush=True)
    print(f"\n{n - bad} passed, {bad} failed")
    return EXIT_OK if bad == 0 and n else EXIT_FAILED
