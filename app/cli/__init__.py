"""mtp-tuner: the headless front end on the same core as the app.

Exit codes: 0 all good; 1 the work ran but something failed (an arm could not run, a self-test
mismatch); 2 bad input or an OS error (a file or folder that cannot be read or written, a full
disk: one clear message, no traceback); 130 cancelled.

Layout: one module per command, each with its ``NAME`` and ``HELP``, ``setup_arguments(parser)``
(its options) and ``run(args) -> int``; ``parser`` (the commands assembled), ``options`` (the
argparse types and the options several commands share), ``common`` (exit codes, errors,
progress, loading a sweep).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Sequence

from app.cli.common import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, clean_output, err
from app.cli.options import axis_joined
from app.cli.parser import BY_NAME, build_parser
from app.core.common.errors import UserError, in_words
from app.core.common.redact import redact

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_CANCELLED"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(axis_joined(sys.argv[1:] if argv is None else argv))
    if not args.cmd:
        parser.print_help()
        return EXIT_OK
    with clean_output():  # outside text (model names, tags, prompt ids) is shown cleaned
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        rc = BY_NAME[args.cmd].run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return rc
    except BrokenPipeError:
        # the reader went away (e.g. `mtp-tuner compare --json A B | head`): no traceback; what is
        # still buffered goes nowhere, so the interpreter's own flush at exit cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except (UserError, OSError) as e:  # the user's problem (an OS error too: a file, a folder, the disk)
        err(redact(in_words(e)))
        return EXIT_USAGE
    except KeyboardInterrupt:
        err("cancelled")
        return EXIT_CANCELLED
    except Exception:  # a bug: the traceback as Python prints it (rc 1), with any secret taken out
        sys.stderr.write(redact(traceback.format_exc()))
        return EXIT_FAILED
