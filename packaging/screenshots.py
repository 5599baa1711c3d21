"""Screenshots of every tab after a demo sweep and the engines' device check (for release notes
and for looking at the layout):

    xvfb-run -a python packaging/screenshots.py OUT_DIR [--dark]
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0]])
    if "--dark" in sys.argv:  # what a dark OS theme hands the app (Xvfb has no platform theme)
        from PySide6.QtGui import QColor, QPalette

        app.setStyle("Fusion")
        pal = QPalette()
        for role, color in ((QPalette.Window, "#2b2b2b"), (QPalette.WindowText, "#e6e6e6"),
                            (QPalette.Base, "#1e1e1e"), (QPalette.AlternateBase, "#2b2b2b"),
                            (QPalette.Text, "#e6e6e6"), (QPalette.Button, "#353535"),
                            (QPalette.ButtonText, "#e6e6e6"), (QPalette.Highlight, "#2f65ca"),
                            (QPalette.HighlightedText, "#ffffff"), (QPalette.PlaceholderText, "#9a9a9a")):
            pal.setColor(role, QColor(color))
        app.setPalette(pal)
    from app.gui.main_window import MainWindow

    win = MainWindow(demo=True)
    win.quiet_errors = True
    win.resize(1280, 820)
    win.show()
    # the demo sweep as a newcomer runs it (the demo model sets K, tokens and repetitions)
    loop = QEventLoop()
    win.state.sweep_finished.connect(lambda _cancelled: loop.quit())
    QTimer.singleShot(0, win.sweep_tab.start_sweep)
    loop.exec()
    win.model_tab.search_models()
    # the Machine tab's per-engine devices (and the Sweep tab's "will measure on"): asked on a
    # worker (llama-cpp-python's device registry, llama-server --list-devices); wait for the answer
    job = win.state.check_engines()
    loop = QEventLoop()
    job.finished.connect(loop.quit)
    QTimer.singleShot(120000, loop.quit)  # a hung llama-server: the shot shows "asking…"
    loop.exec()
    for i in range(win.tabs.count()):
        win.tabs.setCurrentIndex(i)
        for _ in range(5):
            app.processEvents()
        name = win.tabs.tabText(i).lower()
        path = out / f"{i + 1}-{name}.png"
        win.grab().save(str(path))
        print(path)
    win.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
