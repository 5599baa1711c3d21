"""One resource-path helper for the three ways the app runs: from source, from an installed wheel,
and frozen by PyInstaller (sys._MEIPASS)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from app.core.common import resources
from conftest import ROOT


def _has_suites(d) -> bool:
    return all((d / "prompts" / f"{t}.json").is_file() for t in ("story", "code", "tongue-twister")) and \
        (d / "catalog.json").is_file() and (d / "bandwidth.json").is_file() and (d / "icons" / "mtp-tuner.png").is_file()


def test_from_source():
    assert resources.resources_dir() == ROOT / "resources" and _has_suites(resources.resources_dir())


def test_frozen_app_reads_them_beside_the_executable(tmp_path, monkeypatch):
    (tmp_path / "resources").mkdir()
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert resources.resources_dir() == tmp_path / "resources"
    assert resources.resource("prompts", "code.json") == tmp_path / "resources" / "prompts" / "code.json"


def test_installed_wheel_carries_them_and_finds_them(tmp_path):
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    whl = next(out.glob("mtp_tuner-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    assert _has_suites(site / "app" / "resources")
    r = subprocess.run([sys.executable, "-c", "import app.core.common.resources as r, app.core.measure.prompts as p; "
                        "print(r.resources_dir()); print(len(p.builtin_prompts()))"],
                       cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": ""}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    where, n = r.stdout.split()
    assert where == str(site / "app" / "resources") and int(n) >= 21
