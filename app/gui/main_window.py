"""The main window: Start -> Machine -> Model -> Prompts -> Sweep -> Results -> Export, over the same
core as the CLI. It opens on Start ("Tune for me"); the Start page and the Sweep tab run their sweeps
through the one sweep service and both show it; at the end of a sweep that completes it goes to
Results, and a verdict's "Command for this" goes to Export. It builds the AppState, the job registry
and the services beside the state, and one QWidget per tab (each built with the state and the
services it uses; tabs talk through the state), shows the state's errors and status lines, and
cancels every job when it closes."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSettings, QUrl
from PySide6.QtGui import QAction, QCloseEvent, QDesktopServices, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMessageBox, QTabWidget

from app.core.common.logs import log_path, startup_line
from app.core.common.paths import log_dir
from app.core.common.text import printable

from .common import restyle_plots
from .services import make_services
from .state import AppState
from .tabs.export import ExportTab
from .tabs.machine import MachineTab
from .tabs.model import ModelTab
from .tabs.prompts import PromptsTab
from .tabs.results import ResultsTab
from .tabs.start import StartTab
from .tabs.sweep import SweepTab
from .tabs.watch import WatchTab


class MainWindow(QMainWindow):
    def __init__(self, demo: bool = False):
        super().__init__()
        self.setWindowTitle("MTP Tuner")
        self.settings = QSettings("mtp-tuner", "mtp-tuner")
        self.quiet_errors = False
        self.state = state = AppState(self.settings, self)
        state.error.connect(self._error_dialog)
        state.status.connect(lambda m: self.statusBar().showMessage(m))
        self.services = svc = make_services(state, self)
        self.jobs = svc.jobs
        self.tabs = QTabWidget()
        self.setCentralWidget(self.tabs)
        self.start_tab = StartTab(state, svc.engines, svc.sweeps, jobs=svc.jobs)
        self.machine_tab = MachineTab(state, svc.jobs, svc.capabilities, svc.runtimes, svc.engines)
        self.model_tab = ModelTab(state, svc.jobs)
        self.prompts_tab = PromptsTab(state)
        self.sweep_tab = SweepTab(state, svc.capabilities, svc.engines, svc.sweeps)
        self.results_tab = ResultsTab(state)
        self.export_tab = ExportTab(state, svc.jobs, svc.capabilities)
        for name, tab in (("Start", self.start_tab), ("Machine", self.machine_tab), ("Model", self.model_tab),
                          ("Prompts", self.prompts_tab),
                          ("Sweep", self.sweep_tab), ("Results", self.results_tab), ("Export", self.export_tab)):
            self.tabs.addTab(tab, name)
        self.tabs.addTab(WatchTab(state, svc.jobs), "Watch")  # Tune from your own use: watch the user's llama-server
        state.sweep_requested.connect(lambda _plan: self.tabs.setCurrentWidget(self.sweep_tab))
        self.start_tab.catalog_requested.connect(self.show_catalog)
        state.command_requested.connect(lambda _task: self.tabs.setCurrentWidget(self.export_tab))
        state.sweep_finished.connect(self._sweep_finished)  # after the Results tab's own handler
        self._build_menus()
        geo = self.settings.value("geometry")
        if geo is not None:
            self.restoreGeometry(geo)
        else:
            self.resize(1240, 700)  # fits a 1280x720 screen
        last = self.settings.value("last_model", "")
        if demo:
            state.use_demo_model()
        elif last:
            state.set_model(str(last))
        self.statusBar().showMessage("Ready")

    def _sweep_finished(self, cancelled: bool) -> None:
        """A sweep that completed: straight to its verdict."""
        if not cancelled and self.results_tab.last_sweep_status == "complete":
            self.tabs.setCurrentWidget(self.results_tab)

    def show_catalog(self) -> None:
        """The Model tab's catalog of MTP GGUFs (the Start page's "One from the catalog")."""
        m = self.model_tab
        self.tabs.setCurrentWidget(m)
        m.model_sources.setCurrentIndex(1)
        m.search_edit.clear()
        m.search_models()

    @property
    def last_error(self) -> str | None:
        return self.state.last_error

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        for text, slot, key in (("Open results…", self.results_tab.browse_results, QKeySequence.StandardKey.Open),
                                ("Quit", self.close, QKeySequence.StandardKey.Quit)):
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
        d = log_dir()
        d.mkdir(parents=True, exist_ok=True)
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(d)))

    def about(self) -> None:
        QMessageBox.about(self, "About MTP Tuner", self.about_text())

    def about_text(self) -> str:
        """What About says: what the app does, its version, each engine's llama.cpp build and where
        its binary lives (as `mtp-tuner --version`), the start line and the log."""
        from app.core.engines.versions import version_lines  # reads llama-server --version: only when asked

        return ("MTP Tuner measures whether MTP speculative decoding in llama.cpp pays off on this machine.\n\n"
                + "\n".join(printable(line, one_line=True) for line in version_lines(self.state.server_bin))
                + f"\n\n{startup_line()}\n\nLog: {log_path()}")

    def _error_dialog(self, message: str) -> None:
        if not self.quiet_errors:
            QMessageBox.warning(self, "MTP Tuner", message)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802
        if event.type() in (QEvent.Type.ApplicationPaletteChange, QEvent.Type.PaletteChange):
            restyle_plots()  # the OS (or the user) switched between light and dark
        super().changeEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.settings.setValue("geometry", self.saveGeometry())
        self.jobs.cancel_all(15000)  # no worker thread or child process outlives the window
        super().closeEvent(event)
