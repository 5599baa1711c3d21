"""python -m app: the window when a display is there, else the CLI (same as mtp-tuner)."""

import sys

from app.launch import main

sys.exit(main())
