"""mtp-tuner-gui: open the window (``--demo`` preloads the tiny calibrated model)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    demo = "--demo" in argv
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("MTP Tuner")
    app.setOrganizationName("mtp-tuner")
    from .main_window import MainWindow

    win = MainWindow(demo=demo)
    win.show()
    return app.exec()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
