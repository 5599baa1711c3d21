"""Export tab: the recommended llama-server command for the user's shell (from the AppState's
verdict), copy, save as script or preset INI, and a confirmation run of that exact configuration
on a real llama-server, with the engine settings of the sweeps."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QMessageBox, QPlainTextEdit, QPushButton,
                               QVBoxLayout, QWidget)

from app.core.common.errors import UserError
from app.core.common.text import printable
from app.core.engines.base import EngineKind
from app.core.engines.render import render_script
from app.core.measure.runner import RunFailed, RunFinished, SweepError
from app.core.session.events import dispatch
from app.core.session.request import SweepRequest

from ..files import save, save_path
from ..jobs import Jobs
from ..services.capabilities import CapabilityReader
from ..state import AppState

SCRIPT = {"bash": ("sh", "Shell script (*.sh)"),
          "powershell": ("ps1", "PowerShell script (*.ps1)"),
          "cmd": ("cmd", "Command script (*.cmd)")}
NO_PICK = "no recommendation yet: run a sweep or open one"


class ExportTab(QWidget):
    confirm_finished = Signal()

    def __init__(self, state: AppState, jobs: Jobs, capabilities: CapabilityReader, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self.capabilities = capabilities
        lay = QVBoxLayout(self)
        self.verdict_label = QLabel("Run a sweep (or open one on the Results tab) to get a recommendation.")
        self.verdict_label.setWordWrap(True)
        self.shell_box = QComboBox()
        self.shell_box.addItems(["bash", "powershell", "cmd"])
        self.shell_box.setCurrentText(state.shell)
        self.shell_box.setToolTip("Quoting and line continuation for this shell")
        self.shell_box.currentTextChanged.connect(state.set_shell)
        self.command = QPlainTextEdit(readOnly=True)
        self.command.setMaximumHeight(130)
        self.command.setToolTip("The llama-server command for the recommendation: only flags your llama-server "
                                "accepts (read from its --help), always -np 1 (MTP drafts for one sequence)")
        self.checked_label = QLabel("")
        self.checked_label.setWordWrap(True)
        buttons = QHBoxLayout()
        for label, slot, tip in (
                ("Copy command", self.copy_command, "Copy to the clipboard"),
                ("Save as script…", self.save_script, "A script that starts llama-server this way"),
                ("Save preset INI…", self.save_preset,
                 "The same flags as a llama-server preset file (--models-preset)"),
                ("Confirm with llama-server", self.confirm_with_server,
                 "Run this exact configuration once on a real llama-server (one prompt, after a warmup), with "
                 "the Sweep tab's context size, GPU layers and threads, and show its tok/s next to the sweep's")):
            b = QPushButton(label)
            b.setToolTip(tip)
            b.clicked.connect(lambda _=False, s=slot: s())
            buttons.addWidget(b)
            if label.startswith("Confirm"):
                self.confirm_btn = b
        self.confirm_label = QLabel("")
        self.confirm_label.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(QLabel("Shell"))
        row.addWidget(self.shell_box, 1)
        lay.addWidget(self.verdict_label)
        lay.addLayout(row)
        lay.addWidget(self.command)
        lay.addWidget(self.checked_label)
        lay.addLayout(buttons)
        lay.addWidget(self.confirm_label)
        lay.addStretch(1)
        self.confirm_job = None
        self.accepted_warning: str | None = None  # the CPU warning the user said "use it anyway" to
        state.verdict_changed.connect(self.show_verdict)

    @property
    def current_export(self):
        v = self.state.verdict
        return v.export if v is not None and self.state.mix_error is None else None

    @property
    def export_problem(self) -> str | None:
        v = self.state.verdict
        return v.export_problem if v is not None else None

    def show_verdict(self, v) -> None:
        if v is None:  # (a sweep just started: nothing to export yet)
            return
        if self.state.mix_error:
            self.verdict_label.setText(f"Task mix: {self.state.mix_error}")
            return
        mark = f"\u26a0 {v.gpu_warning}\n\n" if v.gpu_warning else ""
        self.verdict_label.setText(printable(mark + v.pick.reason + "\n" + "\n".join(p.reason for p in v.per_task)))
        exp = v.export
        if exp is None:  # e.g. a line break in the model path, which cmd cannot carry
            self.command.setPlainText("")
            self.checked_label.setText(v.export_problem or "")
            return
        self.command.setPlainText(exp.command)
        pending = self.capabilities.pending()
        if pending:  # the flags are checked on a worker; the verdict is rebuilt when the answer comes
            self.checked_label.setText(f"Checking the flags against {pending}…")
            return
        binary = self.state.find_server()
        failed = self.capabilities.failed
        note = f" ({failed[binary]})" if binary in failed else ""
        self.checked_label.setText(f"Flags checked against: {exp.checked_against}{note}"
                                   + (f"; left out (not accepted by it): {', '.join(exp.skipped_flags)}"
                                      if exp.skipped_flags else ""))

    def use_anyway(self) -> bool:
        """When the verdict was measured on the CPU though the machine has a GPU: ask once (per
        warning) for an explicit "use it anyway" before the command is copied or saved."""
        v = self.state.verdict
        if v is None or not v.gpu_warning or self.accepted_warning == v.gpu_warning:
            return True
        if not self.ask_use_anyway(v.gpu_warning):
            self.state.show_status("not exported: the verdict was measured on the CPU, not your GPU")
            return False
        self.accepted_warning = v.gpu_warning
        return True

    def ask_use_anyway(self, warning: str) -> bool:
        box = QMessageBox(QMessageBox.Warning, "Measured on CPU, not your GPU",
                          f"{warning}\n\nThis command is tuned for the CPU. Use it anyway?", parent=self)
        anyway = box.addButton("Use it anyway", QMessageBox.AcceptRole)
        box.setDefaultButton(box.addButton(QMessageBox.Cancel))
        box.exec()
        return box.clickedButton() is anyway

    def copy_command(self) -> None:
        if self.current_export is None:
            self.state.show_error(self.export_problem or NO_PICK)
            return
        if not self.use_anyway():
            return
        # the export's own text: the text box may show a carriage return in a quoted path as a line break
        QGuiApplication.clipboard().setText(self.current_export.command)
        self.state.show_status("command copied")

    def _write(self, title: str, default: str, filt: str, data: str | bytes, path: str | None,
               executable: bool = False) -> str | None:
        if self.current_export is None:
            self.state.show_error(self.export_problem or NO_PICK)
            return None
        if not self.use_anyway():
            return None
        path = save_path(self, title, default, filt, path)
        return save(self.state, path, data, executable=executable) if path else None

    def save_script(self, path: str | None = None) -> str | None:
        """The command as a script for its shell, byte for byte (see render_script: a .cmd that is
        not all ASCII switches the console to UTF-8 and back, a .ps1 that is not all ASCII gets a BOM)."""
        exp = self.current_export
        if exp is None:  # _write says why there is nothing to save
            return self._write("Save script", "", "", b"", path)
        ext, filt = SCRIPT[exp.shell]
        return self._write("Save script", f"llama-server-mtp.{ext}", filt, render_script(list(exp.argv), exp.shell),
                           path, executable=exp.shell == "bash")

    def save_preset(self, path: str | None = None) -> str | None:
        text = self.current_export.preset if self.current_export else ""
        return self._write("Save preset", "llama-server-mtp.ini", "INI (*.ini)", text, path)

    def confirm_with_server(self) -> None:
        """The verdict's pick once on a real llama-server (the core's confirm run), interpreted."""
        from app.core.session.confirm import confirm_plan, confirm_text  # the session: only when asked
        from app.core.session.sweep import prepare, run

        try:
            c = confirm_plan(self.state.verdict, self.state.user_prompt_file())
            settings = self.state.engine_settings(EngineKind.SERVER)
            request = prepare(SweepRequest(c.plan, settings, keep_results=False)).request
        except UserError as e:
            self.state.show_error(str(e))
            return
        self.confirm_btn.setEnabled(False)
        self.confirm_label.setText(f"starting llama-server for {c.arm.label} on {c.task}/{c.prompt_id}…")
        got: list = []
        handlers = {RunFinished: lambda ev: got.append(ev.record), RunFailed: lambda ev: got.append(ev.record),
                    SweepError: lambda ev: self.state.show_error(ev.message)}

        def done() -> None:
            self.confirm_btn.setEnabled(True)
            self.confirm_job = None
            self.confirm_label.setText(confirm_text(c, got[0] if got else None))
            self.confirm_finished.emit()

        self.confirm_job = self.jobs.run(lambda cancel: run(request, cancel), self,
                                         event=lambda ev: dispatch(ev, handlers), failed=self.state.show_error,
                                         finished=done)
