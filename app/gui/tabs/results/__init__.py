"""The Results tab and its parts: the tab (tab.py), its past sweeps (past.py, listed as history.py
describes them), the verdict banner (banner.py), the Advanced section (advanced.py), acceptance per
draft position (positions.py), speed over temperature (temperature.py), the shareable card's
dialog and its per-task interval plot (card.py)."""

from .tab import ResultsTab

__all__ = ["ResultsTab"]
