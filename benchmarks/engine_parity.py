"""In-process vs llama-server tok/s on the bench-size calibrated model at a fixed p,
baseline and MTP K=1..4; medians of interleaved repetitions (engine order alternates).
Goal: ratio >= 0.97 in every row."""

from __future__ import annotations

import argparse

from _common import bench_model, med, run_one, threads

from app.core.engines.inprocess import InProcessEngine
from app.core.engines.server.engine import ServerEngine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--p", type=float, default=0.2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=128)
    a = ap.parse_args()
    model = bench_model(a.p)
    arms = [None, 1, 2, 3, 4]
    ip = InProcessEngine(ctx_size=2048, threads=threads(), max_k=4)
    sv = ServerEngine(ctx_size=2048, threads=threads())
    res = {k: {"ip": [], "sv": [], "ratio": [], "counts": set()} for k in arms}
    try:
        for k in arms:  # warm both engines for every configuration
            run_one(ip, model, k, "hello world", 16)
            run_one(sv, model, k, "hello world", 16)
        for rep in range(a.reps):
            for k in arms:
                order = (ip, sv) if (rep + (k or 0)) % 2 == 0 else (sv, ip)
                got = {}
                for eng in order:
                    g = run_one(eng, model, k, "hello world", a.n_predict)
                    got[eng.name] = g
                gi, gs = got["inprocess"], got["server"]
                assert gi.tokens == gs.tokens, "engines disagree on tokens"
                res[k]["ip"].append(gi.decode_tok_s)
                res[k]["sv"].append(gs.decode_tok_s)
                res[k]["ratio"].append(gi.decode_tok_s / gs.decode_tok_s)
                res[k]["counts"].add(((gi.draft_n, gi.draft_accepted), (gs.draft_n, gs.draft_accepted)))
    finally:
        ip.close()
        sv.close()
    print(f"model {model.name} (p={a.p}), {a.reps} interleaved reps, n_predict {a.n_predict}, {threads()} threads")
    print(f"{'arm':<9} {'in-process':>11} {'server':>8} {'ratio':>6}  drafted/accepted (in-process | server)")
    ok = True
    for k in arms:
        r = res[k]
        ratio = med(r["ratio"])
        ok &= ratio >= 0.97
        counts = "; ".join(f"{a_}|{b_}" for a_, b_ in sorted(r["counts"], key=str))
        print(f"{'baseline' if k is None else f'K={k}':<9} {med(r['ip']):>11.2f} {med(r['sv']):>8.2f} "
              f"{ratio:>6.3f}  {counts}")
    print("goal: every ratio >= 0.97:", "PASS" if ok else "MISS")


if __name__ == "__main__":
    main()
