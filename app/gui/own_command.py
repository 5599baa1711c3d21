"""The user's own llama-server command as the window holds it (AppState.own_command): set by the
"Start from my llama-server command" boxes (command_box.py), it makes every sweep of the window
run llama-server with its flags (``applied``: the engine settings) and the Export answer with it
(``base_argv_for``: the command for a sweep of its model)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

from PySide6.QtCore import QObject, Signal

from app.core.engines.base import EngineSettings

if TYPE_CHECKING:  # type names only
    from app.core.engines.user_command import UserCommand
    from app.core.records.schema import RunRecord


class Holder(Protocol):
    """What of the window's state a command changes (AppState; named so to import nothing of it)."""

    def set_model(self, path: str) -> None: ...

    def rebuild_verdict(self) -> None: ...


class OwnCommand(QObject):
    changed = Signal()  # set or cleared

    def __init__(self, state: Holder, parent: QObject | None = None):
        super().__init__(parent)
        self.state = state
        self.command: UserCommand | None = None
        self.binary: str | None = None  # the llama-server whose --help checked it
        self.unticked = False  # the last change was a box unticked: every box unticks

    def set(self, command: UserCommand | None, binary: str | None = None, *, unticked: bool = False) -> None:
        """Take ``command`` (None: the tuner's own flags again); its model becomes the window's.
        ``unticked``: a box's check box turned it off (the other boxes untick too)."""
        self.command = command
        self.binary = binary
        self.unticked = unticked and command is None
        if command is not None:
            self.state.set_model(command.model)
        self.changed.emit()
        self.state.rebuild_verdict()

    def applied(self, settings: EngineSettings) -> EngineSettings:
        """``settings`` with the command: llama-server with its flags (as they are without one)."""
        if self.command is None or not self.binary:
            return settings
        return self.command.settings(settings, self.binary)

    def base_argv_for(self, runs: Sequence[RunRecord]) -> tuple[str, ...] | None:
        """The command to answer a sweep of its own model with (None otherwise: the sweep's own),
        with the value of an axis (bench --axis, the Flag axes table) the runs measured in place
        of the command's own."""
        if self.command is None or not runs:
            return None
        if Path(self.command.model).resolve() != Path(runs[-1].model_path).resolve():
            return None
        from app.core.analysis.settings import flag_difference
        from app.core.common.redact import redact_args
        from app.core.engines.server.binary import cached_capabilities
        from app.core.verdict.joint import with_setting

        diff = flag_difference(runs[-1].server_args or (), [redact_args(self.command.kept)])  # as recorded
        caps = cached_capabilities(self.binary) if self.binary else None
        return with_setting(self.command.base_argv(), diff, caps)
