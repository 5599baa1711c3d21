"""Machine tab: hardware snapshot and roofline, the llama-server binary (its capabilities), the
llama.cpp runtime, which device each engine uses, the cost probe, and the RPC workers
(workers.py)."""

from __future__ import annotations

import html
import os
from collections.abc import Iterator
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QVBoxLayout, QWidget)

from app.core.common.cancel import CancelToken
from app.core.engines.base import EngineKind
from app.core.engines.commands import Capabilities
from app.core.common.text import printable
from app.core.machine.download import DownloadProgress, progress_text
from app.core.common.errors import UserError
from app.core.engines.devices import BackendInfo, EngineChoice, format_engine_backends
from app.core.machine.hardware import format_snapshot
from app.core.machine.fit import bytes_per_token, fit_summary
from app.core.machine.modelinfo import size_text
from app.core.machine.runtime_store import Runtime
from app.core.records.cost import CostRecord
from app.core.session.cost_probe import ProbeEvent, probe_costs

from ...adapter import CoreJob
from ...common import COLORS, make_plot
from ...jobs import Jobs
from ...services.capabilities import CapabilityReader
from ...services.engines import Engines
from ...services.runtimes import Runtimes
from ...state import AppState
from .workers import WorkersBox

# the probe's curve, said in words: T(n) is the time of one decode of n tokens, T(1) of one token
VERIFY_TITLE = "Verify cost: checking n tokens at once takes T(n)/T(1) times one token's time"


class MachineTab(QWidget):
    def __init__(self, state: AppState, jobs: Jobs, capabilities: CapabilityReader, runtimes: Runtimes,
                 engines: Engines, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self.capabilities = capabilities
        self.runtimes = runtimes
        self.engines = engines
        lay = QVBoxLayout(self)
        self.hw_text = QPlainTextEdit(readOnly=True)
        self.hw_text.setToolTip("Decode at batch 1 reads every weight once per token: its ceiling is memory "
                                "bandwidth / bytes read per token (the roofline)")
        refresh = QPushButton("Detect hardware")
        refresh.setToolTip("Read the CPU, RAM and GPUs again (NVIDIA through NVML, Apple through sysctl)")
        refresh.clicked.connect(state.refresh_hardware)
        self.probe_btn = QPushButton("Can MTP pay here? Run the cost probe on the model")
        self.probe_btn.setToolTip("Runs where the sweep will run (the Sweep tab's engine). In process: one target "
                                  "decode of n tokens (n = 1..9) against one token, and one draft step. Through "
                                  "llama-server: the whole speculative step at K = 1..8 on the server's device, with "
                                  "llama.cpp's synthetic acceptance. On the model chosen in the Model tab")
        self.probe_btn.clicked.connect(self.run_probe)
        self.probe_cancel_btn = QPushButton("Cancel probe")
        self.probe_cancel_btn.setEnabled(False)
        self.probe_cancel_btn.clicked.connect(self._cancel_probe)
        self.probe_plot = make_plot(VERIFY_TITLE, "tokens verified in one pass (n)", "times one token's time",
                                    legend=False,
                                    tip="How much longer one decode of n tokens takes than one of a single "
                                        "token. Flat = verifying drafts is nearly free, MTP can pay; "
                                        "steep = MTP needs very high acceptance",
                                    empty="The verify cost curve appears here once the cost probe has run "
                                          "(\"Can MTP pay here?\" below)")
        self.probe_curve = self.probe_plot.plot([], [], pen=pg.mkPen(COLORS[0], width=2), symbol="o")
        self.probe_verdict = QLabel("The probe tells, before any sweep, whether verifying drafts is cheap enough "
                                    "here for MTP to pay, and from which acceptance on.")
        self.probe_verdict.setWordWrap(True)
        self.probe_job: CoreJob | None = None
        self._title = VERIFY_TITLE  # the probe plot's title, before whose curve it is
        top = QHBoxLayout()
        top.addWidget(self.hw_text, 1)
        top.addWidget(self.probe_plot, 1)
        probe_row = QHBoxLayout()
        probe_row.addWidget(self.probe_btn, 1)
        probe_row.addWidget(self.probe_cancel_btn)
        row = QHBoxLayout()
        self.server_edit = QLineEdit(state.server_bin or "")
        self.server_edit.setPlaceholderText("llama-server binary (empty: the llama.cpp runtime got "
                                            "below, then PATH, common install places, the bundled build)")
        self.server_edit.setToolTip("The llama-server used by the llama-server engine and for the exported "
                                    "command; checked for MTP support (draft-mtp in --spec-type). "
                                    "Not needed for the in-process engine")
        self.server_edit.textChanged.connect(lambda t: state.set_server_bin(t))
        browse = QPushButton("Browse…")
        browse.clicked.connect(self.browse_server)
        check = QPushButton("Check llama-server")
        check.setToolTip("Run llama-server --version and --help: build, flags, whether draft-mtp is there")
        check.clicked.connect(self.check_server)
        row.addWidget(QLabel("llama-server"))
        row.addWidget(self.server_edit, 1)
        row.addWidget(browse)
        row.addWidget(check)
        self.server_label = QLabel("")
        self.server_label.setWordWrap(True)
        rt_row = QHBoxLayout()
        self.runtime_btn = QPushButton("Get llama.cpp for this machine")
        self.runtime_btn.setToolTip("Download the upstream llama.cpp build for this hardware (CUDA, Vulkan, "
                                    "Metal or CPU), check its sha256, check that it sees the GPU and "
                                    "accepts draft-mtp, and use it for the llama-server engine")
        self.runtime_btn.clicked.connect(self.get_runtime)
        self.runtime_cancel_btn = QPushButton("Cancel")
        self.runtime_cancel_btn.setEnabled(False)
        self.runtime_cancel_btn.clicked.connect(self._cancel_runtime)
        self.runtime_label = QLabel("")
        self.runtime_label.setWordWrap(True)
        self.runtime_job: CoreJob | None = None
        rt_row.addWidget(self.runtime_btn)
        rt_row.addWidget(self.runtime_cancel_btn)
        rt_row.addWidget(self.runtime_label, 1)
        self.engines_btn = QPushButton("Which device will each engine use?")
        self.engines_btn.setToolTip("Ask the in-process llama-cpp-python for its backends and devices, and the "
                                    "llama-server binary for --list-devices: the device each engine will really "
                                    "run the model on")
        self.engines_btn.clicked.connect(self.check_engines)
        self.engines_label = QLabel("")
        self.engines_label.setWordWrap(True)
        self.engines_job: CoreJob | None = None
        lay.addWidget(refresh)
        lay.addLayout(top, 1)
        lay.addLayout(probe_row)
        lay.addWidget(self.probe_verdict)
        lay.addLayout(row)
        lay.addWidget(self.server_label)
        lay.addLayout(rt_row)
        lay.addWidget(self.engines_btn)
        lay.addWidget(self.engines_label)
        self.workers = WorkersBox(state, jobs)
        lay.addWidget(self.workers)
        state.hardware_changed.connect(lambda _hw: self.show_hardware())
        state.model_info_changed.connect(lambda _info: self.show_hardware())
        state.probe_changed.connect(self.show_probe)
        state.model_changed.connect(lambda _path: self._say_whose())
        engines.checked.connect(self.show_engines)
        engines.choice_changed.connect(self._engine_choice_changed)
        state.server_changed.connect(self._server_changed)
        QTimer.singleShot(0, self.show_hardware)
        QTimer.singleShot(0, self.show_runtime)

    def show_hardware(self) -> None:
        """The snapshot, and the roofline ceiling of the chosen model when there is one."""
        hw = self.state.hardware()
        text = format_snapshot(hw)
        info = self.state.model_info
        if info is not None:
            s = fit_summary(info, hw)
            per_tok = f"{size_text(bytes_per_token(info))} read per generated token"
            if s.ceiling_tok_s:
                text += (f"\n\nroofline for {info.path}:\n  at most {s.ceiling_tok_s:.0f} tok/s at "
                         f"{s.bandwidth_gbs:.0f} GB/s ({per_tok})")
            else:
                text += (f"\n\nroofline for {info.path}:\n  {per_tok}; no ceiling: the memory bandwidth of "
                         f"{s.target} is not known here")
        self.hw_text.setPlainText(printable(text))

    def browse_server(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose llama-server", "", "llama-server (llama-server*);;All files (*)")
        if path:
            self.server_edit.setText(path)
            self.check_server()

    def _server_changed(self) -> None:
        """The field shows the llama-server the state holds (an installed runtime clears a path
        chosen by hand; a check saves the path it checked)."""
        want = self.state.server_bin or ""
        if self.server_edit.text().strip() != want:
            self.server_edit.blockSignals(True)
            self.server_edit.setText(want)
            self.server_edit.blockSignals(False)

    def check_server(self) -> None:
        from app.core.engines.server.binary import find_server_binary  # process plumbing: only when asked

        asked = self.state.server_bin  # what is checked is what is saved, whatever is typed meanwhile
        try:
            b = find_server_binary(asked)
        except UserError as e:
            self.server_label.setText(printable(e))
            return
        self.server_label.setText(f"{b}\nchecking its version and flags…")

        def show(caps: Capabilities) -> None:
            self.server_label.setText(printable(
                f"{b}\nbuild {caps.version}; {len(caps.flags)} flags; draft-mtp "
                f"{'supported' if caps.supports_mtp else 'NOT supported: ' + str(caps.mtp_problem())}"))
            self.state.set_server_bin(asked, checked=True)

        self.capabilities.read(b, show, lambda m: self.server_label.setText(printable(m)))

    def check_engines(self) -> None:
        """Per engine, the backends and devices it has and the one it will use (the engine check asks
        them on a worker: llama-server --list-devices runs the binary)."""
        self._follow_engines_job(self.engines.check())

    def _follow_engines_job(self, job: CoreJob | None) -> None:
        if job is None or job is self.engines_job:
            return
        self.engines_job = job
        self.engines_btn.setEnabled(False)
        self.engines_label.setText("asking the engines for their devices…")
        job.failed.connect(self.engines_label.setText)
        job.finished.connect(lambda: self._engines_job_done(job))

    def _engines_job_done(self, job: CoreJob) -> None:
        if job is self.engines_job:  # not a check started since (a runtime or binary changed)
            self.engines_btn.setEnabled(True)
            self.engines_job = None

    def show_engines(self, rows: list[tuple[str, BackendInfo | None, str | None]]) -> None:
        choice = self.engines.choice
        self.engines_label.setText(printable(format_engine_backends(rows)
                                             + (f"\nsweeps use by default: {choice.reason}" if choice is not None else "")))

    def _engine_choice_changed(self, choice: EngineChoice | None) -> None:
        if choice is None:  # being asked (here, by the Sweep tab, or after a runtime or binary change)
            self._follow_engines_job(self.engines.job)

    def show_runtime(self) -> None:
        rt = self.runtimes.selected()
        self.runtime_label.setText(printable(f"llama.cpp runtime in use: {rt.name} ({rt.backend}; "
                                             f"{', '.join(rt.devices) or 'CPU only'})") if rt else
                                   "no llama.cpp runtime installed by this app")

    def get_runtime(self) -> None:
        """Install the upstream llama.cpp build for this machine (the runtimes' job)."""
        from app.core.engines.server.runtime_install import Step  # process plumbing: only when asked

        self.runtime_btn.setEnabled(False)
        self.runtime_cancel_btn.setEnabled(True)
        self.runtime_label.setText("reading the latest llama.cpp release…")
        lines: list[str] = []

        def on_event(ev: DownloadProgress | Step | Runtime) -> None:
            if isinstance(ev, DownloadProgress):
                self.runtime_label.setText("\n".join(lines[-2:] + [progress_text(ev)]))
            elif isinstance(ev, Step):
                lines.append(ev.text)
                self.runtime_label.setText("\n".join(lines[-3:]))
            else:  # the Runtime: installed and selected
                lines.append(f"installed and selected {ev.name}: {ev.server}")
                self.runtime_label.setText("\n".join(lines[-3:]))

        def failed(msg: str) -> None:  # said once, beside the button (no dialog, no status line)
            self.runtime_label.setText(printable(f"not installed: {msg}"))

        def done() -> None:
            self.runtime_btn.setEnabled(True)
            self.runtime_cancel_btn.setEnabled(False)
            if self.runtime_job is not None and self.runtime_job.cancel_token.cancelled:
                self.runtime_label.setText("cancelled; the download continues where it stopped next time")

        self.runtime_job = self.runtimes.install(self, event=on_event, failed=failed, finished=done)

    def _cancel_runtime(self) -> None:
        if self.runtime_job is not None:
            self.runtime_job.cancel()

    def run_probe(self) -> None:
        """The probe where the sweep will run: the Sweep tab's engine (through llama-server, the
        whole speculative step on the server's device)."""
        model = self.state.model
        if not model:
            self.state.show_error("choose a model first (Model tab)")
            return
        self.probe_btn.setEnabled(False)
        self.probe_cancel_btn.setEnabled(True)
        self.probe_verdict.setText("Probing…")

        def on_event(ev: ProbeEvent) -> None:
            if isinstance(ev, CostRecord):
                self.state.add_probe(ev)
            else:
                self.probe_verdict.setText(f"Probing… {ev.message}")

        def done() -> None:
            self.probe_btn.setEnabled(True)
            self.probe_cancel_btn.setEnabled(False)
            if self.probe_verdict.text().startswith("Probing"):
                assert self.probe_job is not None  # this is its finished handler
                self.probe_verdict.setText("Probe cancelled" if self.probe_job.cancel_token.cancelled else "")

        st = self.state
        settings = st.engine_settings(st.sweep_engine)

        def work(cancel: CancelToken) -> Iterator[ProbeEvent]:
            return probe_costs(settings, model, max_k=8, max_rounds=10, cancel=cancel,
                               drafter=(st.drafter or None) if settings.kind is EngineKind.SERVER else None)

        self.probe_verdict.setText("Probing " + ("through llama-server…" if st.sweep_engine == EngineKind.SERVER else
                                                 "in process…"))
        self.probe_job = self.jobs.run(work, self, event=on_event, failed=self.state.show_error, finished=done)

    def _cancel_probe(self) -> None:
        if self.probe_job is not None:
            self.probe_job.cancel()

    def show_probe(self, rec: CostRecord) -> None:
        """A probe's verify curve, and the verdict on it (the core's probe_sentence, via the state)."""
        if rec.engine == EngineKind.SERVER and rec.step_ms:  # a whole step at K (verifying K + 1) against a plain one
            plain = (rec.plain_ms or rec.t_ms[1]).median
            ns = [1] + [k + 1 for k in sorted(rec.step_ms)]
            ys = [1.0] + [rec.step_ms[k]["accept"].median / plain for k in sorted(rec.step_ms)]
            self._title = "Whole step at K (n = K + 1) / plain step, through llama-server"
        else:
            self._title = VERIFY_TITLE
            ns = sorted(rec.ratio)
            ys = [rec.ratio[n].median for n in ns]
        self.probe_curve.setData(ns, ys)
        self._say_whose()

    def _say_whose(self) -> None:
        """The probe's verdict (it says where it was measured); a probe of another model than the
        one chosen says whose curve it is, in its title and its line."""
        rec = self.state.probe_record
        if rec is None:
            return
        text, title = self.state.probe_text, self._title
        chosen = self.state.model
        if chosen and os.path.abspath(rec.model_path) != os.path.abspath(chosen):
            whose = printable(Path(rec.model_path).name, one_line=True)
            text = (f"This curve is {whose}'s, not the chosen model's ({printable(Path(chosen).name, one_line=True)}): "
                    f"press \"{self.probe_btn.text()}\" to measure it.\n" + text)
            title = f"{title} ({html.escape(whose)})"  # the title is rich text
        self.probe_plot.setTitle(title)
        self.probe_verdict.setText(text)
