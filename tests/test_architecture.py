"""app/core stays Qt-free: no import of PySide6/pyqtgraph, and it imports with Qt unavailable."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


# -- import contracts (import-linter, configured in pyproject.toml; .ci/run runs lint-imports) --

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the app package under ``root`` (its pyproject.toml holds the contracts)."""
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_import_contracts_hold():
    r = _lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def _lint_with(tmp_path: Path, path: str, line: str) -> subprocess.CompletedProcess:
    """lint-imports on a copy of the package with ``line`` added to the file ``path``."""
    shutil.copytree(ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / path, "a", encoding="utf-8") as f:
        f.write(f"\n{line}  # added by the test\n")
    return _lint_imports(tmp_path)


# one forbidden import per contract: (file that gets it, the import, what it imports, the contract)
VIOLATIONS = [
    ("app/core/analysis/stats.py", "import PySide6", "PySide6", "app.core imports no Qt"),
    ("app/core/records/cost.py", "from app.core.measure import runner", "app.core.measure.runner", "core layers"),
    ("app/core/engines/base.py", "from app.core.analysis import stats", "app.core.analysis.stats", "core layers"),
    ("app/core/analysis/stats.py", "from app.core.verdict import report", "app.core.verdict.report", "core layers"),
    ("app/gui/common.py", "import app.cli", "app.cli", "the CLI and the GUI do not"),
    ("app/core/machine/hardware.py", "from app.core.engines import base", "app.core.engines.base", "machine knowledge"),
    ("app/core/common/paths.py", "from app.core.records import cost", "app.core.records.cost", "common plumbing"),
    ("app/core/verdict/report.py", "from app.core.session import sweep", "app.core.session.sweep", "core layers"),
    ("app/core/engines/base.py", "from app.core.calibrated import design", "app.core.calibrated.design", "core layers"),
    ("app/gui/common.py", "from app.core.engines import factory", "app.core.engines.factory", "only measure, session"),
    ("app/cli/common.py", "from app.core.records import writer", "app.core.records.writer", "only measure, session"),
    # watch sits beside verdict: above analysis, below the session, independent of verdict
    ("app/core/analysis/stats.py", "from app.core.watch import window", "app.core.watch.window", "core layers"),
    ("app/core/watch/metrics.py", "from app.core.session import sweep", "app.core.session.sweep", "core layers"),
    ("app/core/verdict/report.py", "from app.core.watch import predict", "app.core.watch.predict", "core layers"),
    ("app/core/watch/predict.py", "from app.core.engines import factory", "app.core.engines.factory",
     "only measure, session and engines make an engine"),
    ("app/core/analysis/stats.py", "from app.core.records import writer", "app.core.records.writer",
     "only measure, session, engines and watch write"),
    # the cost probes run only through the session's entry point (issue 38), even from the session
    ("app/core/session/adaptive.py", "from app.core.measure import probe", "app.core.measure.probe",
     "the cost probes are the session's"),
    ("app/core/session/sweep.py", "from app.core.measure import server_probe", "app.core.measure.server_probe",
     "the cost probes are the session's"),
    ("app/gui/common.py", "from app.core.measure import runner", "app.core.measure.runner",
     "the GUI takes a sweep's events from the session"),
]


@pytest.mark.parametrize("path, line, target, contract", VIOLATIONS,
                         ids=[f"{v[3][:18]}:{Path(v[0]).stem}" for v in VIOLATIONS])
def test_import_contracts_bite(tmp_path, path, line, target, contract):
    """Each contract fails when its rule is broken (on a copy of the package, one import added)."""
    r = _lint_with(tmp_path, path, line)
    assert r.returncode != 0, r.stdout
    out = " ".join(r.stdout.split())  # contract names wrap in the report
    source = path[:-3].replace("/", ".")
    assert f"{source} -> {target}" in out, r.stdout
    assert any(name.startswith(contract) for name in _broken(r.stdout)), r.stdout


# a cycle between siblings: (file that gets the import, the import, the package, the edge reported;
# "a|b" when either edge of the cycle may be the one named)
CYCLES = [
    ("app/gui/jobs.py", "from app.gui.tabs import export", "app.gui", ".jobs -> .tabs"),
    ("app/core/measure/plan.py", "from app.core.measure import runner", "app.core.measure",
     ".plan -> .runner|.runner -> .plan"),
    ("app/core/engines/backend_truth.py", "from app.core.engines import inprocess", "app.core.engines",
     ".backend_truth -> .inprocess|.inprocess -> .backend_truth"),
    ("app/core/analysis/stats.py", "from app.core.analysis import recommend", "app.core.analysis", "-> .recommend"),
    ("app/core/records/arm.py", "from app.core.measure import plan", "app.core", "-> .measure"),
    ("app/core/watch/metrics.py", "from app.core.watch import watcher", "app.core.watch",
     ".metrics -> .watcher|.watcher -> .metrics"),
]


@pytest.mark.parametrize("path, line, package, edge", CYCLES, ids=[Path(c[0]).stem for c in CYCLES])
def test_the_acyclic_siblings_contract_bites(tmp_path, path, line, package, edge):
    """Siblings import each other one way only: an import back up a sibling chain is a cycle."""
    r = _lint_with(tmp_path, path, line)
    assert r.returncode != 0, r.stdout
    assert "sibling modules import each other in one direction only" in _broken(r.stdout), r.stdout
    assert f"No cycles are allowed in {package}." in r.stdout, r.stdout
    assert any(e in r.stdout for e in edge.split("|")), r.stdout


def _broken(report: str) -> list[str]:
    """Names of the contracts the report lists as BROKEN (its lines wrap at 80 columns)."""
    names, buf = [], ""
    for ln in report.splitlines():
        if not ln.strip() or set(ln.strip()) <= {"-"}:
            buf = ""
            continue
        buf = f"{buf} {ln.strip()}".strip()
        if buf.endswith(" BROKEN"):
            names.append(buf[:-len(" BROKEN")])
            buf = ""
        elif buf.endswith(" KEPT"):
            buf = ""
    return names


# -- the window's AppState: data and signals, small, one statement a line --------------------

STATE_MAX_LINES = 250


def packed_lines(src: str) -> list[str]:
    """Lines of ``src`` that hold more than one statement: ``a; b``, ``if x: y``, a tuple assigned
    to a tuple (``a, b = x, y``), a chained assignment (``a = b = x``)."""
    import io
    import tokenize

    out = [f"{tok.start[0]}: ;" for tok in tokenize.generate_tokens(io.StringIO(src).readline)
           if tok.type == tokenize.OP and tok.string == ";"]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assign):
            if len(node.targets) > 1:
                out.append(f"{node.lineno}: chained assignment")
            elif isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                out.append(f"{node.lineno}: tuple packed into tuple")
        body = getattr(node, "body", None)
        if isinstance(node, ast.stmt) and isinstance(body, list) and body and body[0].lineno == node.lineno:
            out.append(f"{node.lineno}: body on the header's line")
    return out


def test_the_gui_state_is_small_with_one_statement_a_line():
    src = (ROOT / "app" / "gui" / "state.py").read_text(encoding="utf-8")
    assert len(src.splitlines()) <= STATE_MAX_LINES
    assert packed_lines(src) == []


@pytest.mark.parametrize("src", ["a = 1; b = 2\n", "a, b = 1, 2\n", "self.x, self.y = [], 0\n", "a = b = 0\n",
                                 "if a: b = 1\n", "def f(): return 1\n"])
def test_the_packed_line_check_bites(src):
    assert packed_lines(src)


def test_the_packed_line_check_lets_real_unpacking_pass():
    assert packed_lines("runs, labels = pick(records)\nx = (1, 2)\nif a:\n    b = 1\n") == []
