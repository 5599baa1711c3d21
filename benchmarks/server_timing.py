"""The app's own tok/s (token arrival times) against llama-server's predicted_per_second,
on the bench-size calibrated model. Goal: agreement within 2 %."""

from __future__ import annotations

import argparse

from _common import bench_model, run_one, threads

from app.core.engines.server.engine import ServerEngine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--p", type=float, default=0.3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=128)
    a = ap.parse_args()
    model = bench_model(a.p)
    eng = ServerEngine(ctx_size=2048, threads=threads())
    print(f"model {model.name}, llama-server {eng.build}, n_predict {a.n_predict}")
    print(f"{'arm':<9} {'rep':>3} {'app tok/s':>10} {'server tok/s':>13} {'diff':>7}")
    worst = 0.0
    try:
        for k in (None, 2, 3):
            run_one(eng, model, k, "hello world", 16)  # warmup
        for rep in range(a.reps):
            for k in (None, 2, 3):
                g = run_one(eng, model, k, "hello world", a.n_predict)
                d = g.decode_tok_s / g.engine_tok_s - 1
                worst = max(worst, abs(d))
                print(f"{'baseline' if k is None else f'K={k}':<9} {rep:>3} {g.decode_tok_s:>10.2f} "
                      f"{g.engine_tok_s:>13.2f} {100 * d:>+6.2f}%")
    finally:
        eng.close()
    print(f"largest difference: {100 * worst:.2f} % (goal <= 2 %): {'PASS' if worst <= 0.02 else 'MISS'}")


if __name__ == "__main__":
    main()
