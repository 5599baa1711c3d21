"""Export tab: the recommended llama-server command for the user's shell, copy, save as script or
preset INI, and a confirmation run of that exact configuration on a real llama-server."""

from __future__ import annotations

import contextlib
import statistics

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton,
                               QVBoxLayout, QWidget)

from app.core.common.errors import UserError

from .adapter import CoreJob

SCRIPT = {"bash": ("sh", "Shell script (*.sh)"),
          "powershell": ("ps1", "PowerShell script (*.ps1)"),
          "cmd": ("cmd", "Command script (*.cmd)")}


class ExportTab:
    def _build_export(self) -> QWidget:
        w = QWidget()
        lay = QVBoxLayout(w)
        self.verdict_label = QLabel("Run a sweep (or open one on the Results tab) to get a recommendation.")
        self.verdict_label.setWordWrap(True)
        self.shell_box = QComboBox()
        self.shell_box.addItems(["bash", "powershell", "cmd"])
        self.shell_box.setToolTip("Quoting and line continuation for this shell")
        self.shell_box.currentTextChanged.connect(lambda _: self.update_export())
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
                 "Run this exact configuration once on a real llama-server (one prompt, after a warmup) and "
                 "show its tok/s next to the sweep's")):
            b = QPushButton(label)
            b.setToolTip(tip)
            b.clicked.connect(slot)
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
        self.current_export = self.current_pick = None
        self.export_problem: str | None = None  # why the command cannot be written for this shell
        self.confirm_job = None
        return w

    def update_export(self) -> None:
        if self.analysis is None or not self.records:  # (a sweep just started: nothing to export yet)
            return
        from app.core.analysis.recommend import parse_mix, recommend
        from app.core.verdict.report import export_command

        try:
            mix = parse_mix(self.mix_edit.text().strip() or None, self.analysis.tasks)
        except UserError as e:
            self.verdict_label.setText(f"Task mix: {e}")
            return
        pick, per_task = recommend(self.analysis, mix)
        from app.core.engines.server import cached_capabilities, find_server_binary

        caps = binary = None
        try:
            binary = find_server_binary(self.server_binary())
            caps = cached_capabilities(binary)
        except UserError:
            pass
        self.current_pick = (pick, per_task, mix)
        self.verdict_label.setText(pick.reason + "\n" + "\n".join(p.reason for p in per_task))
        try:
            exp = export_command(pick, self.records[-1].model_path, caps, binary, shell=self.shell_box.currentText())
        except UserError as e:  # e.g. a line break in the model path, which cmd cannot carry
            self.current_export, self.export_problem = None, str(e)
            self.command.setPlainText("")
            self.checked_label.setText(str(e))
            return
        self.current_export, self.export_problem = exp, None
        self.command.setPlainText(exp.command)
        if binary and caps is None and binary not in self.caps_failed:
            # the flags are checked on a worker; the command is redrawn when the answer comes
            self.checked_label.setText(f"Checking the flags against {binary}…")
            self.read_capabilities(binary, lambda _caps: self.update_export(), lambda _m: self.update_export())
            return
        note = f" ({self.caps_failed[binary]})" if binary in self.caps_failed else ""
        self.checked_label.setText(f"Flags checked against: {exp.checked_against}{note}"
                                   + (f"; left out (not accepted by it): {', '.join(exp.skipped_flags)}"
                                      if exp.skipped_flags else ""))

    def copy_command(self) -> None:
        if self.current_export is None:
            self.show_error(self.export_problem or "no recommendation yet: run a sweep or open one")
            return
        # the export's own text: the text box may show a carriage return in a quoted path as a line break
        QGuiApplication.clipboard().setText(self.current_export.command)
        self.statusBar().showMessage("command copied")

    def _write(self, title: str, default: str, filt: str, text: str | bytes, path: str | None,
               executable: bool = False) -> str | None:
        if self.current_export is None:
            self.show_error(self.export_problem or "no recommendation yet: run a sweep or open one")
            return None
        path = self.save_path(title, default, filt, path)
        if not path or isinstance(text, str):
            return self.save_text(path, text, executable=executable) if path else None
        # a script is written byte for byte (no newline translation: a .cmd keeps CRLF, a quoted
        # line break stays what it is)
        from pathlib import Path

        from app.core.common.atomic import atomic_path

        try:
            with atomic_path(path) as tmp:
                tmp.write_bytes(text)
            if executable:
                Path(path).chmod(Path(path).stat().st_mode | 0o111)
        except OSError as e:
            self.show_error(f"{path}: cannot write ({e.strerror or e})")
            return None
        self.statusBar().showMessage(f"saved {path}")
        return path

    def save_script(self, path: str | None = None) -> str | None:
        """The command as a script for its shell (see render_script: a .cmd that is not all ASCII
        switches the console to UTF-8 and back, a .ps1 that is not all ASCII gets a BOM)."""
        from app.core.engines.commands import render_script

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
        from app.core.measure.plan import Arm, Plan, known_prompts
        from app.core.measure.runner import RunFailed, RunFinished, SweepError, run_sweep
        from app.core.engines.base import EngineKind, EngineSettings
        from app.core.engines.factory import make_engine

        if self.current_pick is None:
            self.show_error("no recommendation yet: run a sweep or open one")
            return
        pick, _, mix = self.current_pick
        arm = Arm(pick.arm.k, pick.arm.p_min or 0.0) if pick.arm else Arm()
        task = max(mix, key=mix.get)
        swept = [r for r in self.records if r.status == "ok" and r.task == task and r.k == arm.k
                 and (arm.k is None or (r.p_min or 0.0) == arm.p_min)]
        if not swept:
            self.show_error(f"the sweep has no finished {arm.label} run on {task}")
            return
        pid = swept[0].prompt_id
        try:
            model = self.records[-1].model_path
            prompt = [q for q in known_prompts(model, self.user_prompt_file()).values() if q.id == pid]
            if not prompt:
                raise UserError(f"prompt {pid!r} of the sweep is no longer in the suites")
            plan = Plan(model=model, arms=(arm,), prompts=tuple(prompt), engine="server",
                        n_predict=swept[0].n_predict, reps=1, warmup=1)
            engine = make_engine(EngineSettings(kind=EngineKind.SERVER, server_bin=self.server_binary()))
        except UserError as e:
            self.show_error(str(e))
            return
        sweep_tok_s = statistics.median(r.tok_s for r in swept if r.prompt_id == pid and r.tok_s)
        self.confirm_btn.setEnabled(False)
        self.confirm_label.setText(f"starting llama-server for {arm.label} on {task}/{pid}…")
        got = []

        def on_event(ev):
            if isinstance(ev, RunFinished):
                got.append(ev.record)
            elif isinstance(ev, RunFailed):
                self.confirm_label.setText(f"the llama-server run failed: {ev.record.error}")
            elif isinstance(ev, SweepError):
                self.show_error(ev.message)

        def done():
            self.confirm_btn.setEnabled(True)
            self.confirm_job = None
            if got and got[0].tok_s:
                r = got[0]
                acc = f", acceptance {100 * r.acceptance:.1f} %" if r.acceptance is not None else ""
                self.confirm_label.setText(
                    f"llama-server ({r.llama_build}), {arm.label} on {task}/{pid}: {r.tok_s:.1f} tok/s{acc}; "
                    f"the sweep ({swept[0].engine}) measured {sweep_tok_s:.1f} tok/s (median)")
            elif self.confirm_label.text().startswith("starting"):
                self.confirm_label.setText("confirmation run did not finish")
            self.confirm_finished.emit()

        def confirm(cancel):
            with contextlib.closing(engine):  # the caller owns the engine
                yield from run_sweep(plan, engine, None, cancel)

        self.confirm_job = CoreJob(confirm, self)
        self.confirm_job.event.connect(on_event)
        self.confirm_job.failed.connect(self.show_error)
        self.confirm_job.finished.connect(done)
        self.confirm_job.start()
