"""The demo tells the product's story in under a minute on a 2-core CPU.

Runs `mtp-tuner bench --demo` (the per-task calibrated model, K=1..3, as a newcomer would) in a
fresh per-user folder, then judges the results file it wrote:
- at least one task reliably faster at some K (its whole 95 % interval above 1);
- story reliably slower (whole interval below 1) at some K, and at no K reliably faster;
- measured points on both sides of S = 1 (what the break-even plot shows);
- the sweep within 60 s (model writing excluded: it happens once per machine).
Prints the table, each check and PASS/FAIL. `--shape` tries another model size
(n_embd,layers,ff) without changing the app, for sizing."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import ROOT

from app.core.calibrated import design as calibrated, demo as calibrated_demo, gguf as calibrated_gguf
from app.core.analysis.analysis import analyze
from app.core.records.reader import load_records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1, help="run the demo this many times (fresh folder each)")
    ap.add_argument("--shape", help="n_embd,layers,ff for a trial size (default: the app's demo size)")
    a = ap.parse_args()
    ok_all = True
    for rnd in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="mtp-demo-") as home:
            env = dict(os.environ, MTP_TUNER_HOME=home)
            env.pop(calibrated_demo.DEMO_SIZE_ENV, None)
            t0 = time.monotonic()
            if a.shape:
                d, n_layers, ff = (int(x) for x in a.shape.split(","))
                sh = calibrated.Shape(n_embd=d, n_trunk=n_layers, n_ff=ff, n_head=d // 128,
                                      n_head_kv=max(1, d // 512), head_dim=128, ssm_state=128,
                                      ssm_rank=d // 128, ssm_groups=max(1, d // 512), dtype="f16")
                os.environ["MTP_TUNER_HOME"] = home
                path = calibrated_demo.demo_model()
                calibrated_gguf.make_model(path, 0.0, "embedding", "demo", 0, shape=sh, task_p=calibrated_demo.DEMO_TASK_P)
            else:
                os.environ["MTP_TUNER_HOME"] = home
                path = calibrated_demo.demo_model()
            made = time.monotonic() - t0
            t0 = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "app", "bench", "--demo", "--json"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=900)
            took = time.monotonic() - t0
            if r.returncode != 0:
                print(r.stderr[-2000:])
                raise SystemExit(f"bench --demo failed ({r.returncode})")
            out = json.loads(r.stdout)
            recs = load_records(out["results"])
            size = path.stat().st_size
        an = analyze(recs)
        print(f"\nround {rnd + 1}: model {size / 2**20:.0f} MiB (written in {made:.1f} s), "
              f"sweep {took:.1f} s, {len(recs)} runs")
        print(f"{'task':<16}{'arm':<8}{'tok/s':>8}{'accept':>8}{'speedup':>9}  95% CI        verdict")
        for c in an.cells:
            rt = c.ratio
            ci = f"{rt.lo:.2f}-{rt.hi:.2f}" if rt and rt.lo is not None else ""
            print(f"{c.task:<16}{c.arm.label:<8}{c.tok_s.median:8.1f}"
                  f"{(f'{100 * c.acceptance:.1f}%' if c.acceptance is not None else '-'):>8}"
                  f"{(f'{rt.estimate:.2f}x' if rt and rt.estimate else '-'):>9}  {ci:<13} {c.verdict}")
        mtp = [c for c in an.cells if c.arm.k]
        faster = [c for c in mtp if c.verdict == "faster"]
        story = [c for c in mtp if c.task == "story"]
        checks = {
            "a task reliably faster at some K": bool(faster),
            "story reliably slower at some K": any(c.verdict == "slower" for c in story),
            "story never reliably faster": not any(c.verdict == "faster" for c in story),
            "points on both sides of S = 1": any(c.ratio and c.ratio.estimate and c.ratio.estimate > 1 for c in mtp)
            and any(c.ratio and c.ratio.estimate and c.ratio.estimate < 1 for c in mtp),
            "sweep within 60 s": took <= 60,
        }
        for name, ok in checks.items():
            print(f"  {'ok  ' if ok else 'MISS'} {name}")
        ok_all &= all(checks.values())
    print("\nPASS" if ok_all else "\nFAIL")


if __name__ == "__main__":
    main()
