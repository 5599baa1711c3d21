"""The main window: Machine -> Model -> Prompts -> Sweep -> Results -> Export, over the same core as
the CLI. Each tab is a mixin in its own module; this class wires them and owns errors and closing."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, Signal
from PySide6.QtGui import QAction, QDesktopServices, QKeySequence
from PySide6.QtCore import QUrl
from PySide6.QtWidgets import QMainWindow, QMessageBox, QTabWidget

from .export_tab import ExportTab
from .machine_tab import MachineTab
from .model_tab import ModelTab
from .prompts_tab import PromptsTab
from .results_tab import ResultsTab
from .sweep_tab import SweepTab


class MainWindow(QMainWindow, MachineTab, ModelTab, PromptsTab, SweepTab, ResultsTab, ExportTab):
    sweep_finished = Signal()
    download_finished = Signal()
    confirm_finished = Signal()

    def __init__(self, demo: bool = False):
        super().__init__()
        self.setWindowTitle("MTP Tuner")
        self.settings = QSettings("mtp-tuner", "mtp-tuner")
        self.job = None
        self.records: list = []
        self.analysis = None
        self.probe_costs = None
        self.results_path: Path | None = None
        self._arms: list = []
        self._tasks: list[str] = []
        self._t0 = 0.0
        self._done = self._total = 0
        self.quiet_errors = False
        self.last_error: str | None = None
        self.tabs = QTabWidget()
        self.setCentralWidget(self.tabs)
        # order matters where tabs read each other's widgets: the model tab before the machine
        # tab's first hardware refresh, prompts before the sweep's task boxes
        pages = {"Model": self._build_model(), "Machine": self._build_machine(), "Prompts": self._build_prompts(),
                 "Sweep": self._build_sweep(), "Results": self._build_results(), "Export": self._build_export()}
        for name in ("Machine", "Model", "Prompts", "Sweep", "Results", "Export"):
            self.tabs.addTab(pages[name], name)
        self._build_menus()
        geo = self.settings.value("geometry")
        if geo is not None:
            self.restoreGeometry(geo)
        else:
            self.resize(1200, 780)
        last = self.settings.value("last_model", "")
        if demo:
            self.use_demo_model()
        elif last:
            self.model_edit.setText(str(last))
            self.inspect_model()
        self.refresh_library()
        self.statusBar().showMessage("Ready")

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        for text, slot, key in (("Open results…", self.browse_results, QKeySequence.Open),
                                ("Quit", self.close, QKeySequence.Quit)):
            a = QAction(text, self)
            a.setShortcut(key)
            a.triggered.connect(slot)
            m.addAction(a)
        h = self.menuBar().addMenu("&Help")
        self.open_log_action = QAction("Open log folder", self)
        self.open_log_action.setToolTip("The app's log: what to attach to a bug report")
        self.open_log_action.triggered.connect(self.open_log_folder)
        h.addAction(self.open_log_action)
        about = QAction("About MTP Tuner", self)
        about.triggered.connect(self.about)
        h.addAction(about)

    def open_log_folder(self) -> bool:
        from app.core.common.paths import log_dir

        d = log_dir()
        d.mkdir(parents=True, exist_ok=True)
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(d)))

    def about(self) -> None:
        from app.core.common.logs import log_path, startup_line

        QMessageBox.about(self, "About MTP Tuner",
                          "MTP Tuner measures whether MTP speculative decoding in llama.cpp pays off on this "
                          f"machine.\n\n{startup_line()}\n\nLog: {log_path()}")

    def save_path(self, title: str, default: str, filt: str, path: str | None = None) -> str | None:
        """``path`` when given (tests, scripts), else the user's choice in a save dialog (None: cancelled)."""
        if path:
            return path
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getSaveFileName(self, title, default, filt)
        return path or None

    def save_text(self, path: str, text: str, *, executable: bool = False) -> str | None:
        """Write atomically; an error is shown once, naming the file."""
        from app.core.common.atomic import write_text_atomic

        try:
            write_text_atomic(path, text)
            if executable:
                p = Path(path)
                p.chmod(p.stat().st_mode | 0o111)
        except OSError as e:
            self.show_error(f"{path}: cannot write ({e.strerror or e})")
            return None
        self.statusBar().showMessage(f"saved {path}")
        return path

    def show_error(self, message: str) -> None:
        import logging

        logging.getLogger("mtp_tuner").warning("shown to the user: %s", message)
        self.last_error = message
        self.statusBar().showMessage(message)
        if not self.quiet_errors:
            QMessageBox.warning(self, "MTP Tuner", message)

    def jobs(self) -> list:
        return [j for j in (self.job, self.probe_job, self.search_job, self.files_job, self.download_job,
                            self.confirm_job, *self.caps_jobs.values()) if j is not None]

    def changeEvent(self, event) -> None:  # noqa: N802
        from PySide6.QtCore import QEvent

        if event.type() in (QEvent.ApplicationPaletteChange, QEvent.PaletteChange):
            from .common import restyle_plots

            restyle_plots()  # the OS (or the user) switched between light and dark
        super().changeEvent(event)

    def closeEvent(self, event) -> None:  # noqa: N802
        self.settings.setValue("geometry", self.saveGeometry())
        running = [j for j in self.jobs() if j.is_running()]
        for job in running:
            job.cancel()
        for job in running:
            job.wait(15000)
        super().closeEvent(event)
