"""Small services beside the AppState, each given only what it needs: llama-server capabilities
(capabilities.py), which device each engine uses (engines.py), the llama.cpp runtimes
(runtimes.py), the sweep job that the Start page and the Sweep tab both render (sweep.py). Their
workers run through the window's job registry (app/gui/jobs.py)."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject

from ..jobs import Jobs
from ..state import AppState
from .capabilities import CapabilityReader
from .engines import Engines
from .runtimes import Runtimes
from .sweep import Sweeps


@dataclass(frozen=True)
class Services:
    """The window's job registry and services; each tab is given the ones it uses."""

    jobs: Jobs
    capabilities: CapabilityReader
    runtimes: Runtimes
    engines: Engines
    sweeps: Sweeps


def make_services(state: AppState, parent: QObject | None = None) -> Services:
    jobs = Jobs(parent)
    runtimes = Runtimes(state, jobs, parent)
    return Services(jobs=jobs, capabilities=CapabilityReader(state, jobs, parent), runtimes=runtimes,
                    engines=Engines(state, jobs, runtimes, parent), sweeps=Sweeps(state, jobs, parent))
