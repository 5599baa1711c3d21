"""The frozen app's entry point: the window (``--smoke-test`` and ``--demo`` pass through)."""

import sys

from app.gui.main import main

if __name__ == "__main__":
    sys.exit(main())
