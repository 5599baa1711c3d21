"""Machine tab: hardware snapshot and roofline, the llama-server binary, the cost probe."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QVBoxLayout, QWidget)

from app.core.common.errors import UserError

from .adapter import CoreJob
from .common import COLORS, make_plot


class MachineTab:
    def _build_machine(self) -> QWidget:
        import pyqtgraph as pg

        w = QWidget()
        lay = QVBoxLayout(w)
        self.hw_text = QPlainTextEdit(readOnly=True)
        self.hw_text.setToolTip("Decode at batch 1 reads every weight once per token: its ceiling is memory "
                                "bandwidth / bytes read per token (the roofline)")
        refresh = QPushButton("Detect hardware")
        refresh.setToolTip("Read the CPU, RAM and GPUs again (NVIDIA through NVML, Apple through sysctl)")
        refresh.clicked.connect(self.refresh_hardware)
        self.probe_btn = QPushButton("Can MTP pay here? Run the cost probe on the model")
        self.probe_btn.setToolTip("Measures one target decode of n tokens (n = 1..9) against one token, "
                                  "and one draft step, on the model chosen in the Model tab (about a minute)")
        self.probe_btn.clicked.connect(self.run_probe)
        self.probe_cancel_btn = QPushButton("Cancel probe")
        self.probe_cancel_btn.setEnabled(False)
        self.probe_cancel_btn.clicked.connect(lambda: self.probe_job and self.probe_job.cancel())
        self.probe_plot = make_plot("Verify cost T(n)/T(1)", "tokens verified in one pass (n)", "T(n) / T(1)",
                                    legend=False,
                                    tip="How much longer one decode of n tokens takes than one of a single "
                                        "token. Flat = verifying drafts is nearly free, MTP can pay; "
                                        "steep = MTP needs very high acceptance")
        self.probe_curve = self.probe_plot.plot([], [], pen=pg.mkPen(COLORS[0], width=2), symbol="o")
        self.probe_verdict = QLabel("The probe tells, before any sweep, whether verifying drafts is cheap enough "
                                    "here for MTP to pay, and from which acceptance on.")
        self.probe_verdict.setWordWrap(True)
        self.probe_job = None
        self.caps_jobs: dict = {}  # binary -> CoreJob reading its --version/--help
        self._caps_waiting: dict = {}
        self.caps_failed: dict[str, str] = {}
        top = QHBoxLayout()
        top.addWidget(self.hw_text, 1)
        top.addWidget(self.probe_plot, 1)
        probe_row = QHBoxLayout()
        probe_row.addWidget(self.probe_btn, 1)
        probe_row.addWidget(self.probe_cancel_btn)
        row = QHBoxLayout()
        self.server_edit = QLineEdit(str(self.settings.value("server_bin", "")))
        self.server_edit.setPlaceholderText("llama-server binary (empty: PATH, common install places, "
                                            "then the bundled build)")
        self.server_edit.setToolTip("The llama-server used by the llama-server engine and for the exported "
                                    "command; checked for MTP support (draft-mtp in --spec-type). "
                                    "Not needed for the in-process engine")
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
        lay.addWidget(refresh)
        lay.addLayout(top, 1)
        lay.addLayout(probe_row)
        lay.addWidget(self.probe_verdict)
        lay.addLayout(row)
        lay.addWidget(self.server_label)
        QTimer.singleShot(0, self.show_hardware)
        return w

    def hardware(self):
        """The hardware snapshot, read once (Detect hardware reads it again)."""
        if getattr(self, "hw", None) is None:
            from app.core.machine.hardware import snapshot

            self.hw = snapshot()
        return self.hw

    def refresh_hardware(self) -> None:
        self.hw = None
        self.show_hardware()

    def show_hardware(self) -> None:
        """The snapshot, and the roofline ceiling of the chosen model when there is one."""
        from app.core.machine.hardware import format_snapshot

        text = format_snapshot(self.hardware())
        info = getattr(self, "model_info_obj", None)
        if info is not None:
            from app.core.machine.modelinfo import bytes_per_token, fit_summary, size_text

            s = fit_summary(info, self.hw)
            per_tok = f"{size_text(bytes_per_token(info))} read per generated token"
            if s.ceiling_tok_s:
                text += (f"\n\nroofline for {info.path}:\n  at most {s.ceiling_tok_s:.0f} tok/s at "
                         f"{s.bandwidth_gbs:.0f} GB/s ({per_tok})")
            else:
                text += (f"\n\nroofline for {info.path}:\n  {per_tok}; no ceiling: the memory bandwidth of "
                         f"{s.target} is not known here")
        self.hw_text.setPlainText(text)

    def browse_server(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose llama-server", "", "llama-server (llama-server*);;All files (*)")
        if path:
            self.server_edit.setText(path)
            self.check_server()

    def server_binary(self) -> str | None:
        return self.server_edit.text().strip() or None

    def check_server(self) -> None:
        from app.core.engines.server import find_server_binary

        try:
            b = find_server_binary(self.server_binary())
        except UserError as e:
            self.server_label.setText(str(e))
            return
        self.server_label.setText(f"{b}\nchecking its version and flags…")

        def show(caps) -> None:
            self.server_label.setText(f"{b}\nbuild {caps.version}; {len(caps.flags)} flags; draft-mtp "
                                      f"{'supported' if caps.supports_mtp else 'NOT supported: ' + str(caps.mtp_problem())}")
            self.settings.setValue("server_bin", self.server_edit.text().strip())
            self.update_export()

        self.read_capabilities(b, show, lambda m: self.server_label.setText(m))

    def read_capabilities(self, binary: str, done, failed=None) -> None:
        """Run ``binary --version/--help`` on a worker (a broken binary can take its whole timeout),
        then call ``done(caps)`` or ``failed(message)`` on the GUI thread."""
        from app.core.engines.server import cached_capabilities, probe_capabilities

        caps = cached_capabilities(binary)
        if caps is not None:
            done(caps)
            return
        self._caps_waiting.setdefault(binary, []).append((done, failed))
        if binary in self.caps_jobs:
            return
        self.caps_failed.pop(binary, None)  # asked again: try again
        result: dict = {}

        def factory(cancel):
            yield probe_capabilities(binary, cancel=cancel)

        def finished():
            self.caps_jobs.pop(binary)
            for ok, bad in self._caps_waiting.pop(binary, []):
                if "caps" in result:
                    ok(result["caps"])
                elif bad is not None:
                    bad(result.get("error", f"{binary}: no answer"))

        job = CoreJob(factory, self)
        job.event.connect(lambda caps: result.__setitem__("caps", caps))
        job.failed.connect(lambda m: (result.__setitem__("error", m), self.caps_failed.__setitem__(binary, m)))
        job.finished.connect(finished)
        self.caps_jobs[binary] = job
        job.start()

    def run_probe(self) -> None:
        from app.core.records.cost import CostRecord
        from app.core.measure.probe import run_probe

        model = self.model_edit.text().strip()
        if not model:
            self.show_error("choose a model first (Model tab)")
            return
        self.probe_btn.setEnabled(False)
        self.probe_cancel_btn.setEnabled(True)
        self.probe_verdict.setText("Probing…")

        def on_event(ev):
            if isinstance(ev, CostRecord):
                self.show_probe(ev)
            else:
                self.probe_verdict.setText(f"Probing… {ev.message}")

        def done():
            self.probe_btn.setEnabled(True)
            self.probe_cancel_btn.setEnabled(False)
            if self.probe_verdict.text().startswith("Probing"):
                self.probe_verdict.setText("Probe cancelled" if self.probe_job.cancel_token.cancelled else "")

        self.probe_job = CoreJob(lambda cancel: run_probe(model, max_batch=9, max_rounds=10, cancel=cancel), self)
        self.probe_job.event.connect(on_event)
        self.probe_job.failed.connect(self.show_error)
        self.probe_job.finished.connect(done)
        self.probe_job.start()

    def show_probe(self, rec) -> None:
        from app.core.analysis import breakeven

        ns = sorted(rec.ratio)
        self.probe_curve.setData(ns, [rec.ratio[n].median for n in ns])
        if rec.draft_ms is None:
            self.probe_verdict.setText("This model has no MTP heads: only the verify cost was measured.")
            return
        self.probe_costs = c = breakeven.Costs.from_probe(rec)
        bes = [(k, breakeven.break_even_alpha(k, c)) for k in range(1, max(ns))]
        pays = [(k, a) for k, a in bes if a is not None]
        if not pays:
            self.probe_verdict.setText("MTP cannot pay on this machine: verifying costs more than drafts "
                                       "can save, even at 100 % acceptance.")
        else:
            k, a = min(pays, key=lambda ka: ka[1])
            self.probe_verdict.setText(f"MTP can pay here at acceptance >= {100 * a:.0f} % for K = {k} "
                                       "(the easiest width); "
                                       + ", ".join(f"K={kk}: {100 * aa:.0f} %" for kk, aa in pays))
        if self.analysis is not None:
            self.plot_break_even()
