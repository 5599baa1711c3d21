"""The Results tab and its parts: the tab (tab.py), acceptance per draft position (positions.py),
speed over temperature (temperature.py), the shareable card's dialog (card.py)."""

from .tab import ResultsTab

__all__ = ["ResultsTab"]
