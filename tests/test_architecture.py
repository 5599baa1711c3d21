"""app/core stays Qt-free: no import of PySide6/pyqtgraph, and it imports with Qt unavailable."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("PySide6", "pyqtgraph", "PyQt5", "PyQt6", "shiboken6")


def test_core_source_has_no_qt_import():
    offenders = []
    for f in sorted((ROOT / "app" / "core").rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                if n.split(".")[0] in FORBIDDEN:
                    offenders.append(f"{f.relative_to(ROOT)}:{node.lineno} imports {n}")
    assert not offenders, "\n".join(offenders)


def test_core_imports_without_qt_installed():
    """Every app.core module imports while PySide6/pyqtgraph cannot be imported at all."""
    code = (
        "import sys, importlib, pkgutil\n"
        f"for m in {FORBIDDEN!r}: sys.modules[m] = None\n"
        "import app.core\n"
        "names = [m.name for m in pkgutil.walk_packages(app.core.__path__, 'app.core.')]\n"
        "for n in names: importlib.import_module(n)\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} and sys.modules[m] is not None]\n"
        "assert not bad, bad\n"
        "print(len(names))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) >= 10
