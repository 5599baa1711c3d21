"""The Machine tab and its parts: the tab (tab.py: hardware, llama-server, runtime, devices, the
cost probe) and its RPC workers (workers.py)."""

from .tab import VERIFY_TITLE, MachineTab

__all__ = ["MachineTab", "VERIFY_TITLE"]
