"""python -m app: the window when a display is there, else the CLI (same as mtp-tuner)."""

import sys

from app.cli import main

sys.exit(main())
