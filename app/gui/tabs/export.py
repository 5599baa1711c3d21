"""Export tab: the llama-server command for one task's pick or for the user's mix (chosen here;
the mix edited with one slider per task), for the user's shell, from the AppState's verdict; the
sampler flags only when ticked (with a note when they make the server greedy); copy, save as
script or preset INI, and a confirmation run of that exact configuration on a real llama-server,
interpreted, which belongs to its sweep. A model without MTP heads gets its reason and next step."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QMessageBox,
                               QPlainTextEdit, QPushButton, QSlider, QSpinBox, QVBoxLayout, QWidget)

from app.core.analysis.advice import say
from app.core.analysis.answer import MAX_TOKENS
from app.core.common.errors import UserError
from app.core.common.text import printable
from app.core.engines.base import EngineKind
from app.core.engines.render import render_script
from app.core.records.schema import RunRecord
from app.core.session.events import RunFailed, RunFinished, SweepError
from app.core.session.events import dispatch
from app.core.session.request import SweepRequest
from app.core.verdict.export import Export
from app.core.verdict.verdict import Command, Verdict
from app.core.verdict.workers import worker_lines

from ..adapter import CoreJob
from ..files import save, save_path
from ..jobs import Jobs
from ..services.capabilities import CapabilityReader
from ..state import AppState
from ..story import where_line
from ..words import WINDOW_WORDS, advanced_field, gpu_warning_words, measured_ngram

SCRIPT = {"bash": ("sh", "Shell script (*.sh)"),
          "powershell": ("ps1", "PowerShell script (*.ps1)"),
          "cmd": ("cmd", "Command script (*.cmd)")}
NO_PICK = "no recommendation yet: run a sweep or open one"


MY_MIX = "my mix"
MTP_BUILD_NEXT = ("For MTP itself, get a build of this model that keeps its MTP heads: the catalog's -MTP- GGUFs on "
                  "the Model tab.")
NO_HEADS_NEXT = ("Next step: the n-gram modes (ngram-mod and the other ngram-* modes) need no MTP heads and work "
                 "on any GGUF: tick them in " + advanced_field("Modes and drafter", "Speculative modes") + ". "
                 + MTP_BUILD_NEXT)


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
        self.no_heads_label = QLabel("")
        self.no_heads_label.setWordWrap(True)
        self.no_heads_label.setVisible(False)
        self.scope_box = QComboBox()
        self.scope_box.setToolTip("Whose command: one task's pick (its own MTP setting), or your mix of tasks")
        self.scope_box.currentIndexChanged.connect(lambda _i: self._scope_changed())
        # the mix, edited here: one slider per task of the sweep (its weight), shown for "my mix"
        self.mix_box = QGroupBox("My mix: how much of each task you run")
        self.mix_rows = QFormLayout(self.mix_box)
        self.mix_box.setVisible(False)
        self.sliders: dict[str, QSlider] = {}
        self.shell_box = QComboBox()
        self.shell_box.addItems(["bash", "powershell", "cmd"])
        self.shell_box.setCurrentText(state.shell)
        self.shell_box.setToolTip("Quoting and line continuation for this shell")
        self.shell_box.currentTextChanged.connect(state.set_shell)
        # the user's answer length: the verdict says what the pick gains at it, beside 128 tokens
        self.answer_box = QSpinBox()
        self.answer_box.setRange(0, MAX_TOKENS)
        self.answer_box.setSingleStep(128)
        self.answer_box.setSpecialValueText("not set")
        self.answer_box.setSuffix(" tokens")
        self.answer_box.setValue(state.answer_length or 0)
        self.answer_box.setToolTip("Your answers' usual length: the verdict says what the pick gains on an answer this "
                                   "long, beside 128 tokens (each request's first and last steps priced by the cost "
                                   "probe; as recommend --answer-length)")
        self.answer_box.valueChanged.connect(lambda n: state.set_answer_length(n or None))
        self.command = QPlainTextEdit(readOnly=True)
        self.command.setMaximumHeight(130)
        self.command.setToolTip("The llama-server command for the recommendation: only flags your llama-server "
                                "accepts (read from its --help), always -np 1 (MTP drafts for one sequence)")
        self.sampler_box = QCheckBox("also set the sampler I measured")
        self.sampler_box.setToolTip("Off: the command sets only the speculative decoding flags, and your server "
                                    "keeps its own sampling. On: it also writes the sweep's --temp, --top-k, "
                                    "--top-p, --min-p, --repeat-penalty and --seed")
        self.sampler_box.toggled.connect(lambda _on: self.render_command())
        self.sampler_note = QLabel("")
        self.sampler_note.setWordWrap(True)
        self.checked_label = QLabel("")
        self.checked_label.setWordWrap(True)
        buttons = QHBoxLayout()
        self.command_buttons: list[QPushButton] = []  # each acts on the command shown: disabled while none is
        for label, slot, tip in (
                ("Copy command", self.copy_command, "Copy to the clipboard"),
                ("Save as script…", self.save_script, "A script that starts llama-server this way"),
                ("Save preset INI…", self.save_preset,
                 "The same flags as a llama-server preset file (--models-preset)"),
                ("Confirm with llama-server", self.confirm_with_server,
                 "Time this exact configuration against the plain command on a real llama-server (the task's "
                 "prompts, at least 3 pairs, after a warmup), with the Sweep tab's context size, GPU layers and "
                 "threads, and show its speedup with its interval next to the sweep's")):
            b = QPushButton(label)
            b.setToolTip(tip)
            b.setEnabled(False)  # until a command is shown
            b.clicked.connect(lambda _=False, s=slot: s())
            buttons.addWidget(b)
            self.command_buttons.append(b)
            if label.startswith("Confirm"):
                self.confirm_btn = b
        self.confirm_label = QLabel("")
        self.confirm_label.setWordWrap(True)
        scope_row = QHBoxLayout()
        scope_row.addWidget(QLabel("Command for"))
        scope_row.addWidget(self.scope_box, 1)
        scope_row.addWidget(QLabel("Shell"))
        scope_row.addWidget(self.shell_box)
        scope_row.addWidget(QLabel("Answer length"))
        scope_row.addWidget(self.answer_box)
        lay.addWidget(self.verdict_label)
        lay.addWidget(self.no_heads_label)
        lay.addLayout(scope_row)
        lay.addWidget(self.mix_box)
        lay.addWidget(self.command)
        lay.addWidget(self.sampler_box)
        lay.addWidget(self.sampler_note)
        lay.addWidget(self.checked_label)
        lay.addLayout(buttons)
        lay.addWidget(self.confirm_label)
        lay.addStretch(1)
        self.confirm_job: CoreJob | None = None
        self.confirm_run: SweepRequest | None = None  # the last confirm request started
        self.confirm_sweep: object = None  # the sweep the confirm line belongs to
        self.accepted_warning: str | None = None  # the CPU warning the user said "use it anyway" to
        self._sweep: object = None  # the sweep whose tasks the selector lists
        self._filling = False
        self._slid: str | None = None  # the mix the sliders last set
        state.verdict_changed.connect(self.show_verdict)
        state.records_changed.connect(self._records_changed)
        state.model_changed.connect(lambda _path: self._records_changed())
        state.own_command.changed.connect(self._records_changed)
        state.command_requested.connect(self.request_command)
        state.model_info_changed.connect(lambda _info: self._show_no_heads())

    # -- which command ------------------------------------------------------------------------
    def _sweep_key(self) -> object:
        recs = self.state.records
        return (str(self.state.results_path), recs[0].sweep_id if recs else None)

    def scope(self) -> str:
        """The task whose command is shown, or "" for the user's mix."""
        text = self.scope_box.currentText()
        return "" if text in ("", MY_MIX) else text

    def default_scope(self, v: Verdict) -> str:
        """The user's declared use (settings key declared_use: a task or "mix") when the sweep has
        it; else the mix when one was set, else the first task where MTP pays, else the mix."""
        declared = str(self.state.settings.value("declared_use", "") or "").strip()
        if declared in v.tasks:
            return declared
        if declared == "mix" or self.state.task_mix:
            return ""
        return next((p.scope for p in v.per_task if p.mtp_on), "")

    def select(self, task: str) -> None:
        """Show the command for ``task`` ("" or "mix": the user's mix)."""
        i = self.scope_box.findText(MY_MIX if task in ("", "mix") else task)
        if i >= 0:
            self.scope_box.setCurrentIndex(i)

    def request_command(self, task: str) -> None:
        """The state asked for one task's command (a verdict's button): select it (the window shows this tab)."""
        if self.state.verdict is not None:
            self.show_verdict(self.state.verdict)
        self.select(task)

    def _confirm_key(self) -> object:
        """What a confirm result belongs to: the sweep, the model, the setting and task (or mix)
        whose command it timed, and whether the user's own command was in it (not the shell)."""
        return (self._sweep_key(), self.state.model, self.state.setting_index, self.scope(),
                self.state.own_command.command is not None)

    def _records_changed(self) -> None:
        if self.confirm_sweep is not None and self.confirm_sweep != self._confirm_key():
            self.confirm_label.setText("")  # the confirm result belongs to what it confirmed
            self.confirm_sweep = None

    def _fill(self, v: Verdict) -> None:
        """The selector's entries (the sweep's tasks and my mix) and the mix sliders, for a new sweep
        or new tasks; the selection kept where it still exists, else the default."""
        key, tasks = self._sweep_key(), list(v.tasks)
        items = tasks + [MY_MIX]
        same = key == self._sweep and [self.scope_box.itemText(i) for i in range(self.scope_box.count())] == items
        self._filling = True
        try:
            if not same:
                keep = self.scope_box.currentText() if key == self._sweep else None
                self.scope_box.clear()
                self.scope_box.addItems(items)
                self.scope_box.setCurrentText(keep if keep is not None and keep in items else (self.default_scope(v) or MY_MIX))
                self._sweep = key
            if list(self.sliders) != tasks:
                while self.mix_rows.rowCount():
                    self.mix_rows.removeRow(0)
                self.sliders = {}
                for t in tasks:
                    sl = QSlider(Qt.Orientation.Horizontal)
                    sl.setRange(0, 10)
                    sl.setToolTip(f"the weight of {t} in your mix (0: left out)")
                    sl.valueChanged.connect(lambda _v: self._mix_changed())
                    self.mix_rows.addRow(t, sl)
                    self.sliders[t] = sl
            if self.state.mix_error is None and self.state.task_mix != self._slid:  # not while the user slides
                for t, sl in self.sliders.items():
                    sl.setValue(round(10 * v.mix.get(t, 0.0) / max(v.mix.values(), default=1.0)))
        finally:
            self._filling = False

    def _mix_changed(self) -> None:
        if self._filling:
            return
        self._slid = ",".join(f"{t}={sl.value()}" for t, sl in self.sliders.items())
        self.state.set_task_mix(self._slid)

    def _scope_changed(self) -> None:
        if not self._filling:
            self.render_command()

    def _show_no_heads(self) -> None:
        info = self.state.model_info
        missing = info is not None and not info.has_mtp
        self.no_heads_label.setVisible(missing)
        if info is not None and missing:
            why = info.mtp_note or "its GGUF has no MTP layers"
            self.no_heads_label.setText(printable(f"\u26a0 This model has no MTP heads ({why}): MTP cannot run on "
                                                  "it.\n" + (MTP_BUILD_NEXT if measured_ngram(self.state.verdict)
                                                              else NO_HEADS_NEXT)))

    # -- the verdict and its command ------------------------------------------------------------
    @property
    def shown(self) -> Command | None:
        """The Command shown (the selected task's or the mix's, with or without the sampler), or None."""
        v = self.state.verdict
        if v is None or (self.state.mix_error is not None and not self.scope()):
            return None
        try:
            return v.command(self.scope(), with_sampler=self.sampler_box.isChecked())
        except UserError:  # a task of another sweep, until the selector is filled again
            return None

    @property
    def current_export(self) -> Export | None:
        c = self.shown
        return c.export if c is not None else None

    @property
    def export_problem(self) -> str | None:
        c = self.shown
        if c is not None:
            return c.problem
        v = self.state.verdict
        return self.state.mix_error or (v.export_problem if v is not None else None)

    def show_verdict(self, v: Verdict | None) -> None:
        self._show_no_heads()
        if v is None:  # (a sweep just started: nothing to export yet)
            return
        self._fill(v)
        self.render_command()

    def render_command(self) -> None:
        """The selected scope's verdict line first, then every other line, the command and its notes."""
        v = self.state.verdict
        self._records_changed()  # another task, setting or model: a confirm line of another goes
        if v is None:
            return
        scope = self.scope()
        self.mix_box.setVisible(not scope)
        c = self.shown
        mark = f"\u26a0 {gpu_warning_words(v)}\n\n" if v.gpu_warning else ""
        if v.is_provisional(scope):  # the command is shown, with its label
            mark += f"\u26a0 Provisional command: {v.provisional_why}.\n\n"
        if c is None:
            head = f"Task mix: {self.state.mix_error}" if self.state.mix_error else ""
        else:
            head = c.pick.reason
        others = [p.reason for p in v.per_task if p.scope != scope] + ([v.pick.reason] if scope else [])
        where = self.state.setting_labels[self.state.setting_index] if self.state.setting_labels else ""
        where = where_line(self.state.where, v, where)  # a sweep of placements: the banner's line, and this command's
        self.verdict_label.setText(printable(mark + (where + "\n\n" if where else "") + head + "\n\nThe others:\n"
                                             + "\n".join(others)))
        note = c.sampler_note if c is not None and self.sampler_box.isChecked() else None
        self.sampler_note.setText(f"\u26a0 {note}" if note else "")
        exp = c.export if c is not None else None
        self._enable_buttons(exp is not None)
        if exp is None:  # a withheld verdict, or e.g. a line break in the model path, which cmd cannot carry
            why = (c.problem if c is not None else self.state.mix_error) or NO_PICK
            self.command.setPlainText("")
            self.command.setPlaceholderText(f"No command: {why}")
            self.checked_label.setText(why)
            return
        # then how to start each worker, as comments of the command's shell
        mark = "REM " if exp.shell == "cmd" else "# "  # the key's line: a comment of its shell, as the workers'
        self.command.setPlainText("\n".join([*([mark + exp.secret_note] if exp.secret_note else []), exp.command,
                                             *worker_lines(exp.workers, "", exp.shell)]))
        pending = self.capabilities.pending()
        if pending:  # the flags are checked on a worker; the verdict is rebuilt when the answer comes
            self.checked_label.setText(f"Checking the flags against {pending}…")
            return
        binary = self.state.find_server()
        failed = self.capabilities.failed
        note = f" ({failed[binary]})" if binary in failed else ""
        self.checked_label.setText(f"Flags checked against: {exp.checked_against}{note}"
                                   + (f"; left out (not accepted by it): {', '.join(exp.skipped_flags)}"
                                      if exp.skipped_flags else "")
                                   + (f"\n\u26a0 The command: {say(exp.binary_note, WINDOW_WORDS)}" if exp.binary_note else ""))

    def _enable_buttons(self, on: bool) -> None:
        """Copy, Save and Confirm act on the command shown: enabled only while one is (Confirm
        also waits for its own run to end)."""
        for b in self.command_buttons:
            b.setEnabled(on and (b is not self.confirm_btn or self.confirm_job is None))

    def use_anyway(self) -> bool:
        """When the verdict was measured on the CPU though the machine has a GPU: ask once (per
        warning) for an explicit "use it anyway" before the command is copied or saved."""
        v = self.state.verdict
        if v is None or not v.gpu_warning or self.accepted_warning == v.gpu_warning:
            return True
        if not self.ask_use_anyway(v.gpu_warning):
            self.state.status.emit("not exported: the verdict was measured on the CPU, not your GPU")
            return False
        self.accepted_warning = v.gpu_warning
        return True

    def ask_use_anyway(self, warning: str) -> bool:
        box = QMessageBox(QMessageBox.Icon.Warning, "Measured on CPU, not your GPU",
                          f"{warning}\n\nThis command is tuned for the CPU. Use it anyway?", parent=self)
        anyway = box.addButton("Use it anyway", QMessageBox.ButtonRole.AcceptRole)
        box.setDefaultButton(box.addButton(QMessageBox.StandardButton.Cancel))
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
        self.state.status.emit("command copied")

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
        return self._write("Save script", f"llama-server-mtp.{ext}", filt, render_script(list(exp.argv), exp.shell, env_secrets=True),
                           path, executable=exp.shell == "bash")

    def save_preset(self, path: str | None = None) -> str | None:
        text = self.current_export.preset if self.current_export else ""
        return self._write("Save preset", "llama-server-mtp.ini", "INI (*.ini)", text, path)

    def confirm_with_server(self) -> None:
        """The shown pick against the plain command on a real llama-server (the core's confirm run),
        its progress as it goes and then what it timed, in the core's words; the result belongs to
        this sweep and goes when another is shown."""
        from app.core.session.confirm import ConfirmProgress, confirm_headline, confirm_request, confirm_text
        from app.core.session.sweep import run

        if self.current_export is None:  # nothing shown, nothing to confirm (e.g. a withheld verdict)
            self.state.show_error(self.export_problem or NO_PICK)
            return
        try:
            # the core's one confirm request (recommend --confirm's): strict modes, the Machine tab's workers only
            c, request = confirm_request(self.state.verdict, self.state.engine_settings(EngineKind.SERVER),
                                         self.state.user_prompt_file(), self.scope() or None)
        except UserError as e:
            self.state.show_error(str(e))
            return
        self.confirm_run = request  # the request it runs (strict modes: tests read it)
        self.confirm_btn.setEnabled(False)
        self.confirm_sweep = self._confirm_key()
        progress = ConfirmProgress(c)
        self.confirm_label.setText(f"llama-server: starting, {c.arm.label} on {c.prompts_said} "
                                   f"({progress.total} runs)…")
        got: list[RunRecord] = []
        handlers = {RunFinished: lambda ev: got.append(ev.record), RunFailed: lambda ev: got.append(ev.record),
                    SweepError: lambda ev: self.state.show_error(ev.message)}
        sweep = self.confirm_sweep

        def event(ev: object) -> None:
            dispatch(ev, handlers)
            line = progress.see(ev)
            if line is not None and sweep == self._confirm_key():  # still what it confirms
                self.confirm_label.setText(printable(line))

        def done() -> None:
            self.confirm_job = None
            self.confirm_btn.setEnabled(self.current_export is not None)
            if sweep == self._confirm_key():  # still what it confirmed
                self.confirm_label.setText(printable(confirm_headline(c, got) + "\n" + confirm_text(c, got)))
            self.confirm_finished.emit()

        self.confirm_job = self.jobs.run(lambda cancel: run(request, cancel), self,
                                         event=event, failed=self.state.show_error,
                                         finished=done)
