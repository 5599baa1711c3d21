"""Saving from a tab: the save dialog (or a given path), atomic writes, one clear error naming the file."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from app.core.common.atomic import atomic_path, write_text_atomic
from app.core.common.errors import os_reason

from .state import AppState


def save_path(parent: QWidget, title: str, default: str, filt: str, path: str | None = None) -> str | None:
    """``path`` when given (tests, scripts), else the user's choice in a save dialog (None: cancelled)."""
    if path:
        return path
    path, _ = QFileDialog.getSaveFileName(parent, title, default, filt)
    return path or None


def save(state: AppState, path: str, data: str | bytes, *, executable: bool = False) -> str | None:
    """Write atomically (bytes byte for byte: no newline translation); an error is shown once,
    naming the file. Returns the path, or None when it could not be written."""
    try:
        if isinstance(data, str):
            write_text_atomic(path, data)
        else:
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
        if executable:
            p = Path(path)
            p.chmod(p.stat().st_mode | 0o111)
    except OSError as e:
        state.show_error(f"{path}: cannot write ({os_reason(e)})")
        return None
    state.status.emit(f"saved {path}")
    return path
