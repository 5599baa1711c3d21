"""T(n)/T(1) for n = 1..9 and the draft-step cost on the bench-size model, with spreads."""

from __future__ import annotations

import argparse

from _common import bench_model, threads

from app.core.records.cost import CostRecord

from app.core.measure.cost_text import format_probe
from app.core.measure.probe import run_probe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--p", type=float, default=0.0)
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--max-rounds", type=int, default=20)
    a = ap.parse_args()
    for ev in run_probe(str(bench_model(a.p)), depth=a.depth, max_batch=9, threads=threads(),
                        max_rounds=a.max_rounds):
        if isinstance(ev, CostRecord):
            print(format_probe(ev))
            if ev.catchup_ms:
                print("MTP catch-up of n rows (ms): " + ", ".join(
                    f"{n}: {s.median:.2f}" for n, s in sorted(ev.catchup_ms.items())))


if __name__ == "__main__":
    main()
