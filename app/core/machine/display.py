"""Whether a window can open here (used by both front ends, so it lives below them)."""

from __future__ import annotations

import os
import sys


def has_display() -> bool:
    """A window can open: always on Windows/macOS; elsewhere when X11 or Wayland is there."""
    if sys.platform in ("win32", "darwin"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
