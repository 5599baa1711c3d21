"""mtp-tuner recommend: the verdict per task, the pick for the task mix, and the llama-server
command (text, --json, and a Markdown --report), all from app.core.verdict.build_verdict."""

from __future__ import annotations

import argparse
import json
import sys

from app.cli.common import EXIT_OK, load_sweep, warn
from app.core.analysis.settings import setting_label, split_by_setting
from app.core.common.errors import EngineError, UserError
from app.core.records.reader import load_cost_records
from app.core.records.writer import check_writable
from app.core.verdict import ExportOptions, build_verdict, markdown_report, verdict_dict, verdict_text, write_report


def llama_server(explicit: str | None):
    """(capabilities, binary) of the llama-server to check the flags against: the one asked for
    (an error when it cannot be used), else the one found, else (None, None)."""
    # the server module only when recommend runs (it is the heaviest of the engines to import)
    from app.core.engines.server.binary import find_server_binary, probe_capabilities

    if explicit:
        binary = find_server_binary(explicit)
        return probe_capabilities(binary), binary
    try:
        binary = find_server_binary(None)
        return probe_capabilities(binary), binary
    except EngineError:
        return None, None


def run(args: argparse.Namespace) -> int:
    if args.report:
        check_writable(args.report, "report")  # before the work, not after it
    records, _sweep = load_sweep(args.results, args.sweep, args.model)
    caps, binary = llama_server(args.server_bin)
    try:
        costs = load_cost_records(args.probe or args.results)
    except UserError as e:
        if args.probe:  # the probe file asked for is unusable: say so and stop
            raise
        warn(f"{e}; the break-even curves use the runs' own costs")
        costs = []
    options = ExportOptions(shell=args.shell, ctx_size=args.ctx_size, n_gpu_layers=args.ngl, flash_attn=args.fa,
                            cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v)
    # one verdict per setting (sampler, thinking, depth) the sweep measured: runs pair only within one
    verdicts = [(setting_label(runs, records), build_verdict(runs, cost_records=costs, mix=args.mix, caps=caps,
                                                             binary=binary, options=options))
                for runs in split_by_setting(records).values()]
    for _, v in verdicts:
        if v.export is None:
            raise UserError(v.export_problem or "the command cannot be written")
    if args.report:
        path = write_report(args.report, "\n".join((f"## {label}\n\n" if label else "") + markdown_report(v)
                                                    for label, v in verdicts))
        print(f"report: {path}", file=sys.stderr)
    if args.json:
        out = verdict_dict(verdicts[0][1]) if len(verdicts) == 1 else {
            "settings": [{"setting": label, **verdict_dict(v, label)} for label, v in verdicts]}
        print(json.dumps(out, indent=2))
    else:
        print("\n\n".join((f"== {label} ==\n" if label else "") + verdict_text(v) for label, v in verdicts))
    return EXIT_OK
