"""mtp-tuner-gui: open the window.

``--demo`` preloads the tiny calibrated model; ``--smoke-test`` (used on the frozen app) opens the
window, runs the demo sweep on the in-process engine and exits 0 when it produced results;
``--exit-after-init`` closes the window as soon as it is shown (cold-start measurement).
"""

from __future__ import annotations

import logging
import os
import sys

from app.core.common.logs import enable_fault_log, setup_logging, startup_line
from app.core.common.resources import resource
from app.core.machine.display import has_display

SMOKE_TIMEOUT_MS = 300_000


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    log_file = setup_logging()
    enable_fault_log()
    log = logging.getLogger("mtp_tuner")
    smoke = "--smoke-test" in argv
    demo = "--demo" in argv or smoke
    if smoke and not has_display():
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    # Qt and the window load only now, after the log and the fault handler are on (a crash while
    # loading them lands in the log), and after QT_QPA_PLATFORM is settled
    from PySide6 import __version__ as pyside_version
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from .common import follow_os_palette
    from .crash import CrashHandler
    from .main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("MTP Tuner")
    app.setOrganizationName("mtp-tuner")
    _set_icon(app)
    log.info(startup_line(pyside_version))
    crash = CrashHandler(log_file).install()
    follow_os_palette(app)
    try:
        win = MainWindow(demo=demo)
    except Exception:  # noqa: BLE001 - no window: never an exit without a word
        crash.fatal(*sys.exc_info())
        crash.uninstall()
        log.info("exit: the window could not be built")
        return 1
    win.show()
    QTimer.singleShot(0, lambda: log.info("init finished: window shown"))
    if "--exit-after-init" in argv:  # for measuring the cold start (benchmarks/gui_startup.py)
        QTimer.singleShot(0, win.close)
    if smoke:
        _smoke(app, win, log)
    try:
        return app.exec()
    finally:
        crash.uninstall()
        log.info("exit")


def _set_icon(app) -> None:
    from PySide6.QtGui import QIcon  # Qt: see main

    p = resource("icons", "mtp-tuner.png")
    if p.is_file():
        app.setWindowIcon(QIcon(str(p)))


def _smoke(app, win, log) -> None:
    """Small demo sweep; exit code 0 only when every arm produced results and the export is there."""
    from PySide6.QtCore import QTimer  # Qt: see main

    win.quiet_errors = True
    sweep, table = win.sweep_tab, win.results_tab.table
    sweep.k_edit.setText("1,2")
    sweep.npredict.setValue(16)
    sweep.reps.setValue(1)
    sweep.per_task.setValue(1)

    def finished():
        ok = [r for r in win.state.records if r.status == "ok"]
        good = bool(ok) and table.rowCount() > 0 and "--parallel 1" in win.export_tab.command.toPlainText()
        if good:
            log.info("smoke test passed: %d runs, %d result rows, command exported", len(ok), table.rowCount())
        else:
            log.error("smoke test FAILED: %d ok runs, %d rows, error %s", len(ok), table.rowCount(),
                      win.state.last_error)
        win.close()
        app.exit(0 if good else 1)

    def timeout():
        log.error("smoke test FAILED: no result within %d s", SMOKE_TIMEOUT_MS // 1000)
        win.close()
        app.exit(2)

    win.state.sweep_finished.connect(lambda _cancelled: finished())
    QTimer.singleShot(0, sweep.start_sweep)
    QTimer.singleShot(SMOKE_TIMEOUT_MS, timeout)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
