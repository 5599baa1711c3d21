"""``mtp-tuner`` and ``python -m app``: the window when started with no arguments on a machine with
a display, else the CLI. Sits above both front ends, which never import each other."""

from __future__ import annotations

import sys
from typing import Sequence

from app.core.machine.display import has_display


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args and has_display():
        from app.gui.main import main as gui_main  # Qt loads only when the window is wanted

        return gui_main([])
    from app.cli import main as cli_main

    return cli_main(args)
