"""mtp-tuner watch URL: attach to a running llama-server, count its speculative decoding over a
window (from /metrics; no prompt is read), predict the speedup of off and every draft width for
that traffic, and say which to run. The watch record is appended to a results file.

The window is kept whatever ends it: --duration (no read runs past it by more than a second,
however slowly the server answers), Ctrl-C or SIGTERM (the same), or a failure in interpreting it
(one warning line; the record is saved without a prediction). Outside text (the model path and
build the server reports, its mode, its errors) is shown on one line each (``shown``)."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path

from app.cli.common import EXIT_FAILED, EXIT_OK, Progress, err, on_signal, warn
from app.cli.options import add_json, duration, number
from app.core.common.atomic import check_writable
from app.core.common.errors import UserError
from app.core.common.text import shown
from app.core.watch.client import Client, read_api_key
from app.core.watch.watcher import Summary, Update, Watcher, check_costs, default_record_path, mode_of, save

LONG = 1000  # the app's own sentences with outside text inside: one line each, bounded

NAME = "watch"
HELP = ("watch your running llama-server (its /metrics) and say which draft width your real traffic wants; "
        "reads no prompt, changes nothing")


def setup_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8080 (started with --metrics)")
    p.add_argument("--duration", type=duration, default=60.0, help="how long to watch: 90s, 10m, 1h (default 60s)")
    p.add_argument("--interval", type=number(0.1), default=None,
                   help="seconds between readings (default 5, or the duration when shorter)")
    p.add_argument("--costs", metavar="RESULTS", help="results file with the cost probe of this model and device "
                   "(default: the newest matching probe in the results folder)")
    p.add_argument("--api-key-file", metavar="F", help="file holding the server's API key (else LLAMA_API_KEY)")
    p.add_argument("--command", metavar="CMD", help="your llama-server command, to show it with --metrics added "
                   "when the server lacks it")
    p.add_argument("--out", metavar="RESULTS", help="results file to append the watch record to "
                   "(default: watch-MODEL.jsonl in the results folder)")
    add_json(p)


def _line(u: Update, t: float) -> str:
    c = u.counts
    rates = " / ".join(f"{r:.2f}" for r in c.rates) or "-"
    return (f"watch {t:4.0f} s: at least {c.requests} requests, {c.generated} tokens, {c.draft_steps} draft steps, "
            f"acceptance by position {rates}")


def run(args: argparse.Namespace) -> int:
    if args.interval is None:
        args.interval = min(5.0, args.duration)
    if args.interval > args.duration:
        raise UserError(f"--interval ({args.interval:g} s) is longer than --duration ({args.duration:g} s)")
    key = read_api_key(args.api_key_file)
    check_costs(args.costs)  # before the watch: a typo must not cost the window
    if args.out:
        check_writable(Path(args.out))
    w = Watcher(Client(args.url, key), command=args.command)
    prog = Progress()
    # SIGTERM ends the window as Ctrl-C does (KeyboardInterrupt), and the window is kept
    with on_signal(signal.SIGTERM, signal.default_int_handler):
        updates = w.watch(args.duration, args.interval)
        first = next(updates)  # the attach: an error or Ctrl-C here leaves nothing to keep
        assert w.server is not None
        out = Path(args.out) if args.out else check_writable(default_record_path(w.server))
        k = f", K={first.server_k}" if first.server_k else ""
        prog.line(f"watching {w.client.url} (model {shown(w.server.model_path or '?')}, build "
                  f"{shown(w.server.build or '?')}, {shown(mode_of(first.spec_types))}{k}) for {args.duration:g} s; "
                  "Ctrl-C ends the window early", final=True)
        try:
            for u in updates:
                if u.note:
                    prog.line(f"watch: {shown(u.note, LONG)}", final=True)
                prog.line(_line(u, u.counts.seconds))
        except KeyboardInterrupt:
            prog.line("watch: ended early", final=True)
    prog.line("", final=False)
    with on_signal(signal.SIGTERM, signal.SIG_IGN):  # a second SIGTERM does not cut the save short
        s = w.summary(costs=args.costs)  # never raises for its interpretation: s.warning says
        try:
            save(s.record, out)
            saved = None
        except UserError as e:
            saved = shown(e, LONG)
    if s.warning:
        warn(s.warning)
    if args.json:
        print(json.dumps(s.to_json(), indent=2))
    else:
        print(format_summary(s))
        if not saved:
            print(f"\nwatch record appended to {shown(out, LONG)}")
    if saved:
        err(f"the watch above could not be saved: {saved}")
        return EXIT_FAILED
    return EXIT_OK


def format_summary(s: Summary) -> str:
    c = s.counts
    lines = [f"over the window ({c.seconds:.0f} s"
             + (f", after {c.restarts} restart(s) or reset(s): counted since the last" if c.restarts else "") + "):"]
    for note in s.notes:
        lines.append(f"  note: {shown(note, LONG)}")
    speed = f", {c.decode_tok_s:.1f} tok/s decoding" if c.decode_tok_s else ""
    share = f" ({c.accepted / c.draft_tokens:.0%})" if c.draft_tokens else ""
    mode = shown(mode_of(s.spec_types))
    lines += [f"  requests        at least {c.requests} (seen finishing in /slots; /metrics counts none)",
              f"  generated       {c.generated} tokens{speed}",
              f"  draft steps     {c.draft_steps}",
              f"  drafted         {c.draft_tokens}, accepted {c.accepted}{share}",
              f"  by position     {' / '.join(map(str, c.accepted_per_pos)) or '-'}"
              + (f"  (share of steps {' / '.join(f'{r:.2f}' for r in c.rates)})" if c.rates else ""),
              f"  server          {mode}" + (f", K={s.server_k}" if s.server_k else "")]
    if s.predictions:
        lines += ["", f"predicted speedup over plain decoding ({shown(s.costs_line, LONG)}):",
                  f"  {'K':>4} {'speedup':>8}  {'interval':<14}"]
        for p in s.predictions:
            name = "off" if p.k == 0 else str(p.k)
            iv = "" if p.k == 0 else f"[{p.lo:.2f}, {p.hi:.2f}]"
            tag = "  extrapolated (past the server's K)" if p.extrapolated else ("  <- runs now" if p.k == s.server_k else "")
            lines.append(f"  {name:>4} {p.speedup:>7.2f}x  {iv:<14}{tag}")
    lines += ["", f"recommendation: {shown(s.recommendation.reason, LONG)}"]
    return "\n".join(lines)
