"""A finding of the analysis: a warning or confounder, with what to do about it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Finding:
    """A warning or confounder, with what to do about it."""

    code: str
    message: str
    fix: str
