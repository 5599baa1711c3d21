"""The Sweep tab and its parts: the tab (tab.py), its form (form.py: the basic level, basic.py; the
Advanced level's layout, advanced.py), the speculative modes and drafter (modes.py), the thinking
switch and context depth (context.py), the sampler (sampler.py), the live plots (plots.py,
liveplot.py), the busy machine (busy.py), the decisions so far (decisions.py)."""

from .tab import SweepTab

__all__ = ["SweepTab"]
