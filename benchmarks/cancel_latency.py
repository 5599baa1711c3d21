"""Cancel latency, live: from CancelToken.cancel() to the work having stopped.

- sweep: a llama-server sweep cancelled mid-run (a 7000-token run in flight) until the sweep's
  generator has ended and no llama-server is left. Goal: <= 2 s.
- download: a Hub download whose server stopped sending (the client sits in a read that gets no
  data) until download() has raised Cancelled. Goal: <= 1.5 s (one short read timeout, 1 s).

The tests check the behaviour (the run is cut, not finished; no request after the cancel; no
server left) by counting; the seconds are measured here."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import ROOT, bench_model, threads

from app.core.calibrated import gguf as calibrated_gguf

from app.core.machine import download, hub, hub_download
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled
from app.core.measure.plan import Arm, Plan
from app.core.records.prompt import Prompt
from app.core.measure.runner import run_sweep
from app.core.session.events import SweepFinished, TokenProgress
from app.core.engines.server.engine import ServerEngine

sys.path.insert(0, str(ROOT / "tests"))
from hubserver import FakeHub  # noqa: E402


def _children_named(fragment: str) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True) if fragment in p.name()]


def sweep_cancel(model: Path, server_bin: str | None) -> float:
    plan = Plan(model=str(model), arms=(Arm(), Arm(3)), prompts=(Prompt("hello", "code", "hello world"),),
                n_predict=7000, reps=3, warmup=0)
    cancel = CancelToken()
    started = threading.Event()
    ended: list[float] = []
    last: list = []

    def consume():
        with ServerEngine(server_bin, ctx_size=8192, threads=threads()) as eng:
            for ev in run_sweep(plan, eng, None, cancel):
                last[:] = [ev]
                if isinstance(ev, TokenProgress) and ev.n_tokens > 50:
                    started.set()
        ended.append(time.monotonic())

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    if not started.wait(300):
        raise SystemExit("no tokens arrived from llama-server")
    t0 = time.monotonic()
    cancel.cancel()
    t.join(120)
    if t.is_alive() or not ended:
        raise SystemExit("the sweep did not end within 120 s of the cancel")
    if not (isinstance(last[0], SweepFinished) and last[0].cancelled):
        raise SystemExit(f"the sweep ended without a cancelled SweepFinished: {last[0]!r}")
    if _children_named("llama-server"):
        raise SystemExit("a llama-server was left running after the cancel")
    return ended[0] - t0


def download_cancel(fake: FakeHub, repo: str, name: str, stall_after: int) -> float:
    fake.stall_after = stall_after
    cancel = CancelToken()
    ended: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        def run():
            try:
                for _ in hub_download.download(hub.HubClient(fake.url), repo, name, models_dir=d, cancel=cancel):
                    pass
            except Cancelled:
                ended.append(time.monotonic())

        seen = len(fake.requests)  # this round's requests come after these
        t = threading.Thread(target=run, daemon=True)
        t.start()
        resumed = f"bytes={stall_after}-"  # the client timed out a stalled read and asked again
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
                v == resumed for m, p, h in list(fake.requests)[seen:] if m == "GET" and name in p
                for k, v in h.items() if k.lower() == "range"):
            time.sleep(0.01)
        t0 = time.monotonic()
        cancel.cancel()
        t.join(120)
        if t.is_alive() or not ended:
            raise SystemExit("the download did not raise Cancelled within 120 s of the cancel")
        return ended[0] - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--p", type=float, default=0.0)
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny calibrated model, not the bench size")
    ap.add_argument("--server-bin", default=os.environ.get("MTP_TUNER_TEST_SERVER_BIN"))
    ap.add_argument("--skip-sweep", action="store_true", help="only the download (no llama-server needed)")
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    if a.tiny:
        model = calibrated_gguf.make_model(Path(tmp.name) / f"cal-tiny-p{a.p:g}.gguf", a.p)
    else:
        model = bench_model(a.p)
    results = {}
    if not a.skip_sweep:
        print(f"sweep cancel: {model.name}, llama-server, {threads()} threads")
        xs = []
        for i in range(a.rounds):
            xs.append(sweep_cancel(model, a.server_bin))
            print(f"  round {i + 1}: {xs[-1]:.2f} s")
        results["sweep"] = (xs, 2.0)
    fake = FakeHub()
    fake.add("bench/Blob-GGUF", {"blob-F16.gguf": os.urandom(6 * 2**20)})
    fake.start()
    try:
        print(f"download cancel: stalled server, read timeout {download.READ_TIMEOUT_S:g} s")
        xs = []
        for i in range(a.rounds):
            xs.append(download_cancel(fake, "bench/Blob-GGUF", "blob-F16.gguf", 3 * 2**20))
            print(f"  round {i + 1}: {xs[-1]:.2f} s")
        results["download"] = (xs, 1.5)
    finally:
        fake.stop()
    for what, (xs, goal) in results.items():
        worst = max(xs)
        print(f"{what}: median {statistics.median(xs):.2f} s, worst {worst:.2f} s (goal <= {goal:g} s): "
              f"{'PASS' if worst <= goal else 'MISS'}")


if __name__ == "__main__":
    main()
