"""One way to find the bundled resources: from source, an installed wheel or a frozen app."""

from __future__ import annotations

import sys
from pathlib import Path


def resources_dir() -> Path:
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:
        return Path(frozen) / "resources"
    here = Path(__file__).resolve().parents[2]  # app/ (this file is app/core/common/resources.py)
    for cand in (here / "resources", here.parent / "resources"):
        if cand.is_dir():
            return cand
    return here.parent / "resources"


def resource(*parts: str) -> Path:
    return resources_dir().joinpath(*parts)
