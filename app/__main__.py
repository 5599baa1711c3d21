"""python -m app: the headless CLI (the desktop window arrives with the GUI issue)."""

import sys

from app.cli import main

sys.exit(main())
