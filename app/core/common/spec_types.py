"""The old name of app.core.common.spec_modes, kept only while app/cli/bench.py still imports
NEEDS_DRAFTER from here; remove it once nothing does."""

from app.core.common.spec_modes import DRAFTER_MODES, NEEDS_DRAFTER, SPEC_TYPES

__all__ = ["DRAFTER_MODES", "NEEDS_DRAFTER", "SPEC_TYPES"]
