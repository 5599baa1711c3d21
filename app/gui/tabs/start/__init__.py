"""The Start page ("Tune for me") and its parts: the page (tab.py), what the model is used for
(uses.py), the request it asks the session for (plan.py)."""

from .tab import StartTab

__all__ = ["StartTab"]
