"""Start the frozen app with --smoke-test (offscreen, a fresh per-user folder): it opens the main
window, runs the tiny calibrated-model demo sweep on the in-process engine and exits. Passes when
the exit code is 0 and the log has the startup, "init finished" and "smoke test passed" lines.

    python packaging/smoke_test.py [PATH_TO_FROZEN_APP]   (default: packaging/dist/mtp-tuner/mtp-tuner)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600


def default_app() -> Path:
    dist = ROOT / "packaging" / "dist"
    if sys.platform == "win32":
        return dist / "mtp-tuner" / "mtp-tuner.exe"
    if sys.platform == "darwin":
        return dist / "MTP Tuner.app" / "Contents" / "MacOS" / "MTP Tuner"
    return dist / "mtp-tuner" / "mtp-tuner"


def main() -> int:
    app = (Path(sys.argv[1]) if len(sys.argv) > 1 else default_app()).resolve()
    if not app.is_file():
        print(f"smoke test: {app}: no frozen app there (build it first)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mtp-tuner-smoke-") as home:
        # its own folders and settings (QSettings reads XDG_CONFIG_HOME on Linux): a setting left by
        # the machine's user (a declared task mix, a last model) must not change what it runs
        env = {**os.environ, "MTP_TUNER_HOME": home, "QT_QPA_PLATFORM": "offscreen",
               "XDG_CONFIG_HOME": str(Path(home) / "config")}
        env.pop("PYTHONPATH", None)  # the frozen app must stand on its own
        log = Path(home) / "log" / "mtp-tuner.log"
        t0 = time.monotonic()
        proc = subprocess.Popen([str(app), "--smoke-test"], env=env, cwd=home, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        init_s = None
        while proc.poll() is None and time.monotonic() - t0 < TIMEOUT_S:
            if init_s is None and log.is_file() and "init finished" in log.read_text(errors="replace"):
                init_s = time.monotonic() - t0
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
            print(f"smoke test FAILED: still running after {TIMEOUT_S} s", file=sys.stderr)
            return 1
        total_s = time.monotonic() - t0
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        text = log.read_text(errors="replace") if log.is_file() else ""
        if init_s is None and "init finished" in text:
            init_s = total_s
        problems = []
        if proc.returncode != 0:
            problems.append(f"exit code {proc.returncode}")
        for needle in ("start: mtp-tuner", "(frozen)", "init finished", "smoke test passed"):
            if needle not in text:
                problems.append(f"no {needle!r} line in the log")
        print(text.strip())
        if problems:
            print(out[-4000:], file=sys.stderr)
            print("smoke test FAILED: " + "; ".join(problems), file=sys.stderr)
            return 1
        print(f"smoke test passed: {app}\n  time to 'init finished': {init_s:.2f} s; whole demo sweep and exit: "
              f"{total_s:.2f} s")
        return 0


if __name__ == "__main__":
    sys.exit(main())
