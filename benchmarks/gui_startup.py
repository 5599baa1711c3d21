"""Cold start to a shown window (goal <= 2 s on this machine). Starts the app N times in a
fresh process (offscreen, fresh per-user folder, ``--exit-after-init``) and reads the time from
launch to the log's "init finished" line; prints each and the median.

    python benchmarks/gui_startup.py [--runs 5] [--app PATH_TO_FROZEN_APP]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def once(cmd: list[str]) -> float:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "MTP_TUNER_HOME": home, "QT_QPA_PLATFORM": "offscreen"}
        t0 = time.time()
        subprocess.run(cmd + ["--exit-after-init"], env=env, cwd=ROOT, check=True, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for line in (Path(home) / "log" / "mtp-tuner.log").read_text().splitlines():
            if "init finished" in line:
                stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                return stamp - t0
    raise SystemExit("no 'init finished' line in the log")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--app", help="a frozen app instead of the source tree")
    a = ap.parse_args()
    cmd = [a.app] if a.app else [sys.executable, "-c", "import sys; from app.gui.main import main; sys.exit(main())"]
    times = [once(cmd) for _ in range(a.runs)]
    print("launch -> window shown:", ", ".join(f"{t:.2f} s" for t in times))
    med = statistics.median(times)
    print(f"median {med:.2f} s; goal <= 2 s: {'PASS' if med <= 2 else 'MISS'}")


if __name__ == "__main__":
    main()
