"""The llama.cpp runtimes this app installs: the selected one, and "Get llama.cpp for this
machine" (read the upstream release, pick the build for this hardware, download, validate and
select it, on a worker). An installed runtime replaces a llama-server chosen by hand."""

from __future__ import annotations

from collections.abc import Iterator

from PySide6.QtCore import QObject, Signal

from app.core.common.cancel import CancelToken
from app.core.machine import runtime_store

from ..adapter import CoreJob
from ..jobs import Handlers, Jobs, handler_list
from ..state import AppState


class Runtimes(QObject):
    changed = Signal()  # a llama.cpp runtime was installed (and selected)

    def __init__(self, state: AppState, jobs: Jobs, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self.changing = False  # inside one install's change, which emits several signals

    def selected(self) -> runtime_store.Runtime | None:
        """The selected llama.cpp runtime, else None."""
        return runtime_store.selected()

    def install(self, parent: QObject | None = None, *, event: Handlers = None, failed: Handlers = None,
                finished: Handlers = None) -> CoreJob:
        """Install the build for this machine on a worker. Events: lines of text, DownloadProgress,
        then the Runtime (``changed`` fires, the state's llama-server changes, before ``event``'s
        handlers see it)."""
        hw = self.state.hardware()

        def factory(cancel: CancelToken) -> Iterator[object]:
            from app.core.engines.server.runtime_install import install_for_machine  # process plumbing: when asked

            yield from install_for_machine(hw, cancel=cancel)  # on the worker: it runs ldconfig, downloads

        return self.jobs.run(factory, parent if parent is not None else self,
                             event=[self._installed, *handler_list(event)], failed=failed, finished=finished)

    def _installed(self, ev: object) -> None:
        if not isinstance(ev, runtime_store.Runtime):
            return
        state = self.state
        if state.server_bin:  # asked for this machine's build: it replaces one chosen by hand
            state.status.emit(f"llama-server: now the installed {ev.name}, not {state.server_bin}")
            state.server_bin = None
            state.settings.setValue("server_bin", "")
        self.changed.emit()  # asks the engines again (once: not for the server change too)
        self.changing = True
        try:
            state.server_changed.emit()
        finally:
            self.changing = False
        state.rebuild_verdict()
