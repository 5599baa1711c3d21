"""Which device each engine will use, and the engine that runs on this machine's GPU: each engine
is asked for its backends and devices (llama-cpp-python's registry; llama-server --list-devices)
on a worker (the core's tune flow's ask_engines), then the core's choose_engine picks (engine_choice). Asked again when the
llama-server, the runtime or the hardware changes, once it was asked."""

from __future__ import annotations

from collections.abc import Iterator

from PySide6.QtCore import QObject, Signal

from app.core.common.cancel import CancelToken
from app.core.engines.devices import EngineChoice, engine_choice, host_gpu_names
from app.core.session.tune import BackendRow, ask_engines

from ..adapter import CoreJob
from ..jobs import Jobs
from ..state import AppState
from .runtimes import Runtimes


class Engines(QObject):
    checked = Signal(object)  # engine_backends rows: per engine, its BackendInfo (or why none)
    choice_changed = Signal(object)  # EngineChoice, or None while the engines are being asked

    def __init__(self, state: AppState, jobs: Jobs, runtimes: Runtimes, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self.runtimes = runtimes
        self.rows: list[BackendRow] | None = None  # the last engine_backends answer
        self.choice: EngineChoice | None = None  # the engine that runs on this machine's GPU, if any
        self.job: CoreJob | None = None
        self._again = False
        for sig in (state.server_changed, runtimes.changed, state.hardware_changed):
            sig.connect(self._changed)

    def check(self) -> CoreJob:
        """Ask the engines (started here; a check asked while one runs is that one).
        ``checked`` carries the rows, ``choice_changed`` the choice (None when asked: being checked)."""
        if self.job is not None:
            return self.job
        server_bin = self.state.server_bin

        def factory(cancel: CancelToken) -> Iterator[tuple[list[BackendRow], str | None]]:
            answer = ask_engines(server_bin)  # the core's device check, as `mtp-tuner tune`'s
            cancel.check()
            yield answer

        self.job = self.jobs.run(factory, self, event=self._answer, failed=self._failed, finished=self._finished)
        self.choice = None
        self.choice_changed.emit(None)
        return self.job

    def _answer(self, answer: tuple[list[BackendRow], str | None]) -> None:
        """The factory's one event: the engines' rows and the installed runtime in use (or None)."""
        rows, runtime = answer
        self.rows = rows
        self.choice = engine_choice(host_gpu_names(self.state.hardware()), rows, runtime)
        self.checked.emit(rows)
        self.choice_changed.emit(self.choice)

    def _failed(self, msg: str) -> None:
        self.rows = None
        self.choice = None
        self.state.show_error(f"could not ask the engines for their devices: {msg}")

    def _finished(self) -> None:
        self.job = None
        if self._again:  # the binary, runtime or hardware changed while it ran
            self._again = False
            self.check()

    def _changed(self) -> None:
        """A llama-server, runtime or hardware change: ask the engines again if they were asked."""
        if self.runtimes.changing:
            return
        if self.job is not None:
            self._again = True
        elif self.rows is not None:
            self.check()
