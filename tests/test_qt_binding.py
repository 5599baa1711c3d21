"""The Qt binding must not drop references to None/True/False: PySide6 6.12.0 on Python 3.11 does on
every processEvents and pyqtgraph setData, and the app then dies mid-sweep with "Fatal Python error:
none_dealloc" (live plots update ~20 times a second). pyproject pins it away; this catches a
release with the same bug before users do."""

from __future__ import annotations

import gc
import sys

import pytest

pytest.importorskip("PySide6")


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None/True/False are immortal from Python 3.12")
def test_event_loop_and_plot_updates_keep_none_and_bools_alive(qtbot):
    import pyqtgraph as pg
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    pw = pg.PlotWidget()
    qtbot.addWidget(pw)
    pw.show()
    curve = pw.plot([0, 1], [1, 2])

    def step(i):
        curve.setData([0, 1, 2], [1, 2, i])
        pw.viewport().repaint()
        app.processEvents()

    for i in range(5):
        step(i)
    gc.collect()
    before = sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)
    for i in range(50):
        step(i)
    gc.collect()
    after = sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)
    # references may be gained (caches); a steady loss of hundreds means the binding leaks decrefs
    lost = [b - a for b, a in zip(before, after)]
    assert max(lost) < 20, f"the Qt binding drops references to None/True/False: {lost} over 50 updates"
