"""What a llama-server binary can do: its ``--version`` and ``--help``, read on a worker (a broken
binary can take its whole timeout), cached by the core. One read per binary at a time; each asker
is answered when it ends. The verdict's command asks through the state's ``capabilities_needed``
and is rebuilt when the answer comes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from PySide6.QtCore import QObject

from app.core.common.cancel import CancelToken
from app.core.engines.commands import Capabilities

from ..jobs import Jobs
from ..state import AppState

Done = Callable[[Capabilities], None]  # called with the binary's capabilities
Failed = Callable[[str], None]  # called with why they could not be read


class CapabilityReader(QObject):
    def __init__(self, state: AppState, jobs: Jobs, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self.failed: dict[str, str] = {}  # binary -> why its read failed (not asked again for the verdict)
        self._waiting: dict[str, list[tuple[Done, Failed | None]]] = {}  # binary -> its askers
        state.capabilities_needed.connect(self._for_verdict)

    def read(self, binary: str, done: Done, failed: Failed | None = None) -> None:
        """Run ``binary --version/--help`` on a worker, then call ``done(caps)`` or
        ``failed(message)`` on the GUI thread (at once when the answer is cached)."""
        from app.core.engines.server.binary import cached_capabilities, probe_capabilities  # process plumbing

        caps = cached_capabilities(binary)
        if caps is not None:
            done(caps)
            return
        self._waiting.setdefault(binary, []).append((done, failed))
        if self.reading(binary):
            return
        self.failed.pop(binary, None)  # asked again: try again
        result: dict[str, Any] = {}  # "caps": the Capabilities, or "error": why not

        def factory(cancel: CancelToken) -> Iterator[Capabilities]:
            yield probe_capabilities(binary, cancel=cancel)

        def on_failed(message: str) -> None:
            result["error"] = message
            self.failed[binary] = message

        def finished() -> None:
            for ok, bad in self._waiting.pop(binary, []):
                if "caps" in result:
                    ok(result["caps"])
                elif bad is not None:
                    bad(result.get("error", f"{binary}: no answer"))

        def answered(caps: Capabilities) -> None:
            result["caps"] = caps

        self.jobs.run(factory, self, key=("capabilities", binary),
                      event=answered, failed=on_failed, finished=finished)

    def reading(self, binary: str | None = None) -> bool:
        """Whether ``binary``'s flags (any binary's, without one) are being read."""
        if binary is not None:
            return self.jobs.get(("capabilities", binary)) is not None
        return any(self.jobs.get(("capabilities", b)) is not None for b in self._waiting)

    def pending(self) -> str | None:
        """The binary whose flags are being read for the verdict's command, or None."""
        binary = self.state.find_server()
        return binary if binary and self.reading(binary) else None

    def _for_verdict(self, binary: str) -> None:
        """The verdict's command is checked against ``binary``: read it (once; not again after it
        failed) and rebuild the verdict with the answer."""
        if binary not in self.failed:
            self.read(binary, lambda _c: self.state.rebuild_verdict(), lambda _m: self.state.rebuild_verdict())
