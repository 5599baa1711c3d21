"""The Sweep tab and its parts: the tab (tab.py), the speculative modes and drafter (modes.py), the
thinking switch and context depth (context.py), the sampler (sampler.py), the live plots (plots.py,
liveplot.py)."""

from .tab import SweepTab

__all__ = ["SweepTab"]
