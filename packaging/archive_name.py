"""The release archive's file name: named here once, for the build scripts (build_linux.sh,
build_macos.sh, build_windows.ps1), the release workflow (.github/workflows/release.yml, whose matrix
spells each name out, checked against this) and the README's Install section
(tests/test_release_workflow.py keeps the three equal).

    python packaging/archive_name.py            the name for this machine, e.g. mtp-tuner-0.1.0-linux-x64.tar.gz
    python packaging/archive_name.py --version  the version alone (pyproject.toml's)
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (system, machine) -> the name's tail after "mtp-tuner-<version>-"
TAILS = {
    ("windows", "x64"): "windows-x64.zip",
    ("macos", "arm64"): "macos-arm64.dmg",
    ("linux", "x64"): "linux-x64.tar.gz",
}


def version() -> str:
    for line in (ROOT / "pyproject.toml").read_text(encoding="utf-8").splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise SystemExit("pyproject.toml: no version line")


def system() -> str:
    if sys.platform == "win32":
        return "windows"
    if sys.platform == "darwin":
        return "macos"
    return "linux"


def machine() -> str:
    m = platform.machine().lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64"}.get(m, m)


def archive_name(system_: str, machine_: str, version_: str) -> str:
    tail = TAILS.get((system_, machine_))
    if tail is None:  # not a released platform (e.g. Linux arm64): same pattern, the host's packer
        ext = {"windows": "zip", "macos": "dmg"}.get(system_, "tar.gz")
        tail = f"{system_}-{machine_}.{ext}"
    return f"mtp-tuner-{version_}-{tail}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--version"]:
        print(version())
    else:
        print(archive_name(system(), machine(), version()))
