"""mtp-tuner-gui: open the window.

``--demo`` preloads the tiny calibrated model; ``--smoke-test`` (used on the frozen app) opens the
window, runs the demo sweep on the in-process engine and exits 0 when it produced results;
``--exit-after-init`` closes the window as soon as it is shown (cold-start measurement).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from app.core.common.logs import enable_fault_log, setup_logging, startup_line
from app.core.common.resources import resource
from app.core.machine.display import has_display

if TYPE_CHECKING:  # Qt loads in main, after the log (see there)
    from PySide6.QtGui import QGuiApplication

    from .main_window import MainWindow

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
    problem = xcb_problem(os.environ, sys.platform)
    if problem:  # Qt would abort while loading its X11 plugin, naming only one library
        log.error("no window: %s", problem.splitlines()[0])
        print(problem, file=sys.stderr)
        return 1
    # Qt and the window load only now, after the log and the fault handler are on (a crash while
    # loading them lands in the log), and after QT_QPA_PLATFORM is settled
    from PySide6 import __version__ as pyside_version
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from .collector import MainThreadCollector
    from .common import follow_os_palette
    from .crash import CrashHandler
    from .main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0]])
    assert isinstance(app, QApplication)  # the one made here, or a test's (pytest-qt makes a QApplication)
    app.setApplicationName("MTP Tuner")
    app.setOrganizationName("mtp-tuner")
    _set_icon(app)
    log.info(startup_line(pyside_version))
    crash = CrashHandler(log_file).install()
    collector = MainThreadCollector().install()  # Python's collector on this thread only (see there)
    follow_os_palette(app)
    try:
        win = MainWindow(demo=demo)
    except Exception as e:  # noqa: BLE001 - no window: never an exit without a word
        crash.fatal(type(e), e, e.__traceback__)
        crash.uninstall()
        collector.uninstall()
        log.info("exit: the window could not be built")
        return 1
    crash.say = win.state.show_error  # the user's problems in words from now on, not as crashes
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
        collector.uninstall()
        log.info("exit")


# what Qt's X11 platform plugin (xcb) loads besides libxcb itself: the library's file, its
# Debian/Ubuntu package, its Fedora package
XCB_LIBS = (("libxcb-icccm.so.4", "libxcb-icccm4", "xcb-util-wm"),
            ("libxcb-image.so.0", "libxcb-image0", "xcb-util-image"),
            ("libxcb-keysyms.so.1", "libxcb-keysyms1", "xcb-util-keysyms"),
            ("libxcb-render-util.so.0", "libxcb-render-util0", "xcb-util-renderutil"),
            ("libxcb-xinerama.so.0", "libxcb-xinerama0", "libxcb"),
            ("libxcb-xkb.so.1", "libxcb-xkb1", "libxcb"),
            ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0", "libxkbcommon-x11"),
            ("libxcb-cursor.so.0", "libxcb-cursor0", "xcb-util-cursor"))


def _bundled_dirs() -> list[Path]:
    """Where the app carries its own libraries: PySide6's Qt/lib (its folder, found without loading Qt),
    and PyInstaller's folder in the frozen app."""
    dirs = [Path(getattr(sys, "_MEIPASS"))] if hasattr(sys, "_MEIPASS") else []
    for root in sys.path:
        qt = Path(root or ".") / "PySide6" / "Qt"
        if qt.is_dir():
            dirs += [qt / "lib", qt / "plugins" / "platforms"]
            break
    return dirs


def can_load(soname: str) -> bool:
    """Whether the dynamic loader finds ``soname`` (the system's, or a copy the app carries)."""
    try:
        ctypes.CDLL(soname)
        return True
    except OSError:
        return any((d / soname).is_file() for d in _bundled_dirs())


def xcb_plugin_error() -> str | None:
    """Why Qt's X11 platform plugin cannot be loaded (the dynamic loader's words), or None when it
    can (or is not there to try)."""
    plugin = next((d / "libqxcb.so" for d in _bundled_dirs() if (d / "libqxcb.so").is_file()), None)
    if plugin is None:
        return None
    try:
        ctypes.CDLL(str(plugin))
    except OSError as e:
        return str(e)
    return None


def xcb_problem(env: Mapping[str, str], platform: str, plugin_error: Callable[[], str | None] | None = None,
                loads: Callable[[str], bool] | None = None) -> str | None:
    """On Linux, when Qt will use its X11 plugin (QT_QPA_PLATFORM unset or "xcb", an X display, not
    a Wayland session) and that plugin cannot be loaded: the system libraries it needs that are
    missing, and how to install them on Debian/Ubuntu and Fedora. None otherwise (Qt goes on)."""
    if not platform.startswith("linux"):
        return None
    chosen = env.get("QT_QPA_PLATFORM", "").strip()
    if chosen and not chosen.startswith("xcb"):
        return None
    if not chosen and (not env.get("DISPLAY") or (env.get("WAYLAND_DISPLAY")
                                                  and env.get("XDG_SESSION_TYPE") == "wayland")):
        return None
    error = (plugin_error or xcb_plugin_error)()
    if error is None:
        return None
    loads = loads or can_load
    missing = [(deb, rpm) for soname, deb, rpm in XCB_LIBS if not loads(soname)]
    if not missing:  # another library: the loader's own words
        return f"mtp-tuner: the window cannot open: Qt's X11 platform plugin (xcb) does not load: {error}"
    debs = " ".join(deb for deb, _ in missing)
    rpms = " ".join(dict.fromkeys(rpm for _, rpm in missing))
    return (f"mtp-tuner: the window cannot open: Qt's X11 platform plugin (xcb) needs system libraries that "
            f"are not installed here: {', '.join(deb for deb, _ in missing)}.\n"
            f"Install them, then start the app again:\n"
            f"  Debian/Ubuntu:  sudo apt install {debs}\n"
            f"  Fedora:         sudo dnf install {rpms}\n"
            "The command line works without them (mtp-tuner --help).")


def _set_icon(app: QGuiApplication) -> None:
    from PySide6.QtGui import QIcon  # Qt: see main

    p = resource("icons", "mtp-tuner.png")
    if p.is_file():
        app.setWindowIcon(QIcon(str(p)))


def _smoke(app: QGuiApplication, win: MainWindow, log: logging.Logger) -> None:
    """Small demo sweep; exit code 0 only when every arm produced results and the export is there."""
    from PySide6.QtCore import QTimer  # Qt: see main

    win.quiet_errors = True
    sweep, table = win.sweep_tab, win.results_tab.table
    sweep.form.k_edit.setText("1,2")
    sweep.form.npredict.setValue(16)
    sweep.form.reps.setValue(1)
    sweep.form.per_task.setValue(1)

    def finished() -> None:
        ok = [r for r in win.state.records if r.status == "ok"]
        good = bool(ok) and table.rowCount() > 0 and "--parallel 1" in win.export_tab.command.toPlainText()
        if good:
            log.info("smoke test passed: %d runs, %d result rows, command exported", len(ok), table.rowCount())
        else:
            log.error("smoke test FAILED: %d ok runs, %d rows, error %s", len(ok), table.rowCount(),
                      win.state.last_error)
        win.close()
        app.exit(0 if good else 1)

    def timeout() -> None:
        log.error("smoke test FAILED: no result within %d s", SMOKE_TIMEOUT_MS // 1000)
        win.close()
        app.exit(2)

    win.state.sweep_finished.connect(lambda _cancelled: finished())
    QTimer.singleShot(0, sweep.start_sweep)
    QTimer.singleShot(SMOKE_TIMEOUT_MS, timeout)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
