"""The Start page's list of the models on this machine (the library folder's GGUFs, each marked
when it has no MTP heads), and a path shown in it (added at the top when it is not there)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox

from app.core.common.paths import models_dir
from app.core.common.text import printable


def fill_library(box: QComboBox) -> None:
    from app.core.machine import hub  # the hub module: only to list the library

    try:
        models = [m for m in hub.local_library(models_dir()) if m.problem is None]
    except Exception:  # noqa: BLE001 - a folder that does not list is an empty list here (the Model tab says why)
        models = []
    current = box.currentData()
    box.clear()
    for m in models:
        mark = "" if m.has_mtp else " (no MTP heads)"
        box.addItem(printable(Path(m.path).name, one_line=True) + mark, m.path)
        box.setItemData(box.count() - 1, printable(m.path), Qt.ItemDataRole.ToolTipRole)
    if current:
        show_in_box(box, current)


def show_in_box(box: QComboBox, path: str) -> None:
    i = box.findData(path)
    if i < 0:
        box.insertItem(0, printable(Path(path).name, one_line=True), path)
        box.setItemData(0, printable(path), Qt.ItemDataRole.ToolTipRole)
        i = 0
    box.setCurrentIndex(i)
