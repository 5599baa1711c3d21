"""Engine fidelity (issue 37): on one calibrated model, threads and context, interleaved rounds of

- ``llama-bench`` tg (the bundled binary, ``-p 0 -n N``),
- both engines' baselines (in process and through llama-server),
- the in-process probe's plain step (the whole-step probe's: the engine's own decode loop),
- K = 1..3 in both engines,

printed as tok/s medians with their 10-90 % spread, and the ratios that must hold: the two
baselines within 3 % of each other and of llama-bench tg, and the K = 1..3 speedups of the two
engines within 3 % of each other. ``--sizes demo,bench`` runs each model size in turn. Each cell
of a round runs the two engines ABBA (two timed runs each, pooled; cell_abba): since the
thirteenth session, when one run each had left the K = 3 line at 1.043 on medians of tok/s that
agreed within 1 %. llama-bench runs on either side of the baselines' cell (pooled), for the same
reason.

    BENCH_THREADS=2 python benchmarks/engine_parity.py --sizes demo,bench --p 0.35 --rounds 5

``--save run.json`` keeps a run's rounds; ``--pool a.json b.json`` prints the table over the rounds
of several saved runs of one model (each ratio still paired within its own round).

Measured 2026-12-03 (2 cores, ``--p 0.35 --seed 7 --rounds 8``; docs/methodology.md has the
story). With llama-cpp-python's own library the in-process baseline ran 1.084x llama-server's on
the bench model (its older llama.cpp decodes faster) and its speedups read 4-14 % low; with
llama-server's library (the default for a checked pair, engines/llama_backend.CHECKED_PAIRS) the
bench model passes every line: baselines 0.990, each within 2 % of llama-bench, K=1..3 speedups
0.972 / 0.995 / 1.002. On the demo model the baselines agree but both run 8 % below llama-bench
(sampling and the hand-over of each token, which llama-bench skips) and the in-process K=1 speedup
read 6-7 % low in five runs; not the loop's shape (llama-server's MTP step is the same three
decodes) nor its Python (0.2 ms a token at K=1). Later (``--sizes mid`` seed 11 p 0.4, 8 rounds;
``--sizes bench`` seed 13 p 0.33, 6 rounds; the in-process target on llama-server's threadpool):
baselines 1.036 / 0.952, K=1..3 0.973 0.961 0.913 / 1.016 1.047 1.033: the gaps change sign from
run to run, and llama-bench's own tok/s spreads +-13 % between rounds on this shared machine.
Later still, one thread (``BENCH_THREADS=1``; a single round spreads about as much, so it is the
machine's memory, not the threads' spinning), more rounds: ``--sizes mid --seed 11 --p 0.4
--rounds 20``: every goal line holds (baselines 1.016, each 1.005 of llama-bench, K=1..3 0.977 /
0.977 / 0.992); ``--sizes bench --seed 13 --p 0.33 --rounds 14``: baselines 1.001, 1.015 / 0.994
of llama-bench, K=1..3 1.001 / 1.012 / 0.967 (the one miss); the same with ``--rounds 30`` (eleventh
session): baselines 0.996, 0.986 / 1.002 of llama-bench, K=1..3 1.033 / 1.016 / 1.040 (two misses,
the other way). llama-server's own timing of its
runs equals the client's clock within 0.1 %: handing the tokens over costs nothing measurable.
Twelfth session (2026-12-04, a new machine, one thread): ``--sizes bench --seed 13 --p 0.33
--rounds 30``: every goal line holds (baselines 0.978, 0.981 / 1.009 of llama-bench, K=1..3 0.996 /
0.989 / 1.020); ``--sizes mid --seed 11 --p 0.4 --rounds 20``: the engines agree (baselines 1.027,
K=1..3 0.978 / 0.984 / 0.976) but both baselines read 0.949 / 0.955 of llama-bench (per-round
spread 0.85-1.07; the last session's 20 rounds read 1.005 / 1.005), so the mid model misses there.
Thirteenth session (2026-12-04, the same machine, one thread), one run a cell: ``--sizes mid`` 20
rounds: baselines 0.998, 0.993 / 0.989 of llama-bench, K=1..3 1.016 / 1.004 / 1.043 (MISS);
``--sizes bench`` 30 rounds: 1.001, 0.997 / 1.005, K=1..3 0.992 / 1.004 / 1.014 (every line holds).
ABBA cells: mid 20 rounds 1.015, 0.981 / 0.983, K=1..3 0.988 / 0.960 / 0.991 (MISS); bench 12
rounds 1.011, 1.036 / 1.010 (MISS), K=1..3 0.985 / 0.992 / 0.993. ABBA cells with llama-bench on
either side of the baselines: mid 20 rounds 0.996, 0.982 / 0.985, K=1..3 0.992 / 0.992 / 1.013
(every line holds, best-of too); bench 8 rounds during a busy spell (llama-bench 21.8 tok/s, 26.5
an hour before): 0.977, 1.023 / 1.047 (MISS), K=1..3 1.014 / 1.031 / 1.039 (two MISS).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import bench_model, run_one, threads

from app.core.engines.inprocess import InProcessEngine
from app.core.engines.server.binary import find_server_binary
from app.core.engines.server.engine import ServerEngine
from app.core.measure.whole_step import steady_steps

GOAL = 0.03
WARM_TOKENS = 16  # the untimed run before each timed one


def spread(xs: list[float]) -> str:
    """median [p10, p90] of ``xs``."""
    if not xs:
        return "-"
    s = sorted(xs)
    lo, hi = s[int(0.1 * (len(s) - 1))], s[-1 - int(0.1 * (len(s) - 1))]
    return f"{statistics.median(s):7.2f} [{lo:.2f}, {hi:.2f}]"


def llama_bench_tg(model: Path, n: int, t: int) -> float | None:
    """llama-bench's tg tok/s (the bundled binary beside llama-server), or None without one."""
    exe = Path(find_server_binary()).with_name("llama-bench")
    if not exe.exists():
        return None
    r = subprocess.run([str(exe), "-m", str(model), "-p", "0", "-n", str(n), "-t", str(t), "-r", "1", "-o", "json"],
                       capture_output=True, text=True, timeout=600)
    try:
        rows = json.loads(r.stdout)
        return float(rows[0]["avg_ts"])  # one run, as each engine's cell gets one a round
    except (ValueError, LookupError, TypeError):
        print("llama-bench failed:", r.stderr[-300:])
        return None


def loaded_libllama() -> str:
    """The libllama this process loaded (llama-cpp-python's own, or LLAMA_CPP_LIB_PATH's)."""
    import llama_cpp

    lib = getattr(llama_cpp.llama_cpp, "_lib", None)
    return str(getattr(lib, "_name", None) or "?")  # its path (the CDLL's repr holds a handle and an address)


def probe_plain_ms(eng: InProcessEngine, model: Path, steps: int = 16) -> float:
    """The whole-step probe's plain step (measure.probe._inprocess_steps' ``plain``): ms a token
    of a plain request through the engine's own decode loop."""
    g = run_one(eng, model, None, "The quick brown fox jumps over the lazy dog while the river runs past",
                1 + steps)
    tm, _ = steady_steps(g.token_times, 0, 1 + steps)  # the probe's own reading: its first step left out
    return float(tm["predicted_ms"]) / (tm["predicted_n"] - 1)


def cell_abba(a: tuple[str, Any], b: tuple[str, Any], model: Path, k: int | None, n: int) -> dict[str, list]:
    """One cell of a round: engine a, b, b, a (ABBA), two timed runs each. The load on this shared
    machine drifts over seconds; a pair of runs on either side of the other engine's pair sees
    the same drift on average, where one run each (a then b) put a whole run's drift between
    them. Each engine's set-up for the arm is warmed by a short run whenever the other engine ran
    last: the other arms ran in between, and neither engine may start its runs colder."""
    runs: dict[str, list] = {a[0]: [], b[0]: []}
    last = None
    for name, eng in (a, b, b, a):
        if name != last:
            run_one(eng, model, k, "hello world", WARM_TOKENS)
        runs[name].append(run_one(eng, model, k, "hello world", n))
        last = name
    return runs


def pooled(rates: list[float]) -> float:
    """The tok/s of runs of equal length taken together (their harmonic mean: total tokens over
    total time)."""
    return statistics.harmonic_mean(rates)


def one_size(size: str, p: float, rounds: int, n: int, seed: int = 0, save: Path | None = None) -> bool:
    """Measure one model size and print its table; with ``save``, its rounds go to that file too."""
    run = measure(size, p, rounds, n, seed)
    if save is not None:
        save.write_text(json.dumps(run, indent=1))
    return report(run)


def key(engine: str, k: int | None) -> str:
    return f"{engine} {'base' if k is None else k}"


def measure(size: str, p: float, rounds: int, n: int, seed: int = 0) -> dict[str, Any]:
    """Interleaved rounds on one calibrated model: every cell's tok/s a round (``key``), llama-bench
    tg, the probe's plain step and llama-server's own clock."""
    model = bench_model(p, size=size, seed=seed)
    t = threads()
    ip = InProcessEngine(ctx_size=2048, threads=t, max_k=3)
    sv = ServerEngine(ctx_size=2048, threads=t)
    arms = [None, 1, 2, 3]
    tok = {(e, k): [] for e in ("ip", "sv") for k in arms}
    bench: list[float] = []
    plain: list[float] = []
    own: list[float] = []  # llama-server's own timing of its baseline runs (its "predicted_per_second")
    try:
        for k in arms:  # warm both engines for every configuration
            run_one(ip, model, k, "hello world", 16)
            run_one(sv, model, k, "hello world", 16)
        t0 = time.monotonic()
        for rnd in range(rounds):
            tg = [llama_bench_tg(model, n, t)]
            for k in arms:
                a, b = (("ip", ip), ("sv", sv)) if (rnd + (k or 0)) % 2 == 0 else (("sv", sv), ("ip", ip))
                runs = cell_abba(a, b, model, k, n)
                if k is None:  # llama-bench on either side of the baselines' cell, as they are of each other
                    tg.append(llama_bench_tg(model, n, t))
                    if all(tg):
                        bench.append(pooled(tg))
                for name in ("ip", "sv"):
                    tok[(name, k)].append(pooled([g.decode_tok_s for g in runs[name]]))
                if k is None and all(g.engine_tok_s for g in runs["sv"]):
                    own.append(pooled([g.engine_tok_s for g in runs["sv"]]))
            plain.append(1000 / probe_plain_ms(ip, model))
            print(f"  round {rnd + 1}/{rounds} done ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        ip.close()
        sv.close()
    return {"model": model.name, "p": p, "n": n, "threads": t, "libllama": loaded_libllama(),
            "tok": {key(e, k): v for (e, k), v in tok.items()}, "bench": bench, "plain": plain, "own": own}


def pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Saved runs of one model (``--save``) as one: their rounds side by side, each still paired
    within its own round."""
    first = runs[0]
    if any((r["model"], r["n"], r["threads"]) != (first["model"], first["n"], first["threads"]) for r in runs):
        raise SystemExit("--pool: the runs differ in model, tokens or threads")
    out = dict(first)
    for field in ("bench", "plain", "own"):
        out[field] = [x for r in runs for x in r[field]]
    out["tok"] = {c: [x for r in runs for x in r["tok"][c]] for c in first["tok"]}
    return out


def report(run: dict[str, Any]) -> bool:
    """Print one model's table (tok/s, then the ratios paired within each round); True when every
    goal line holds."""
    arms: list[int | None] = [None, 1, 2, 3]
    tok = {(e, k): [float(x) for x in run["tok"][key(e, k)]] for e in ("ip", "sv") for k in arms}
    bench, plain, own = run["bench"], run["plain"], run["own"]
    n, rounds = run["n"], len(tok[("ip", None)])
    print(f"\n{run['model']} (p={run['p']}), {rounds} interleaved rounds, n {n}, {run['threads']} threads, "
          f"libllama {run['libllama']}")
    print(f"{'':<26} {'tok/s median [p10, p90]':>26}")
    print(f"{'llama-bench tg' + str(n):<26} {spread(bench):>26}")
    print(f"{'in-process probe plain':<26} {spread(plain):>26}")
    print(f"{'server baseline, own clock':<26} {spread(own):>26}  (its timings: no hand-over; shown, not a goal)")
    for k in arms:
        for name, label in (("ip", "in process"), ("sv", "llama-server")):
            print(f"{(label + ' ' + ('baseline' if k is None else f'K={k}')):<26} {spread(tok[(name, k)]):>26}")
    # ratios paired within each round (the two engines ran back to back), then their median: a
    # busy spell that slows one round moves both engines of that round, not the ratio
    def paired(num: list[float], den: list[float]) -> list[float]:
        return [a / b for a, b in zip(num, den)]

    base = paired(tok[("ip", None)], tok[("sv", None)])
    lines: list[tuple[str, list[float]]] = [("baselines in process / server", base)]
    if len(bench) == rounds:
        lines.append(("in-process baseline / llama-bench", paired(tok[("ip", None)], bench)))
        lines.append(("server baseline / llama-bench", paired(tok[("sv", None)], bench)))
    lines.append(("probe plain step / in-process baseline", paired(plain, tok[("ip", None)])))
    if len(own) == rounds and len(bench) == rounds:  # where the server's gap to llama-bench is: its decode or the hand-over
        lines.append(("server's own clock / llama-bench", paired(own, bench)))
    for k in arms[1:]:
        sp_ip = paired(tok[("ip", k)], tok[("ip", None)])
        sp_sv = paired(tok[("sv", k)], tok[("sv", None)])
        lines.append((f"K={k} speedup in process {statistics.median(sp_ip):.3f} / server "
                      f"{statistics.median(sp_sv):.3f}", paired(sp_ip, sp_sv)))
    ok_median = True
    print(f"  {'ratio (median of the rounds)':<58} {'median':>6}  [p10, p90]")
    for label, rs in lines:
        r = statistics.median(rs)
        within = abs(r - 1) <= GOAL
        ok_median &= within or label.startswith(("probe", "server's own"))  # shown, not goals
        s = sorted(rs)
        lo, hi = s[int(0.1 * (len(s) - 1))], s[-1 - int(0.1 * (len(s) - 1))]
        print(f"  {label:<58} {r:6.3f}  [{lo:.3f}, {hi:.3f}]  {'ok' if within else 'MISS'}")
    ok_best = best_of(tok, bench, plain, arms)
    print(f"  median of the paired rounds (the goal): {'PASS' if ok_median else 'MISS'}; best of the rounds "
          f"(shown beside it): {'PASS' if ok_best else 'MISS'}")
    return ok_median


def best_of(tok: dict[tuple[str, int | None], list[float]], bench: list[float], plain: list[float],
            arms: list[int | None]) -> bool:
    """The same ratios from each cell's fastest run over all rounds. Every run of a cell decodes
    the same tokens (greedy, a calibrated model), and on a shared machine other programs can only
    slow a run down, never speed it up: the fastest of several runs is the least disturbed one, the
    estimate timeit and pyperf's "min" use, far steadier here than a median of paired rounds whose
    pairs ran seconds apart under different load. Prints them; True when every goal line holds."""
    best = {cell: max(v) for cell, v in tok.items() if v}
    lines = [("baselines in process / server", best[("ip", None)] / best[("sv", None)])]
    if bench:
        lines += [("in-process baseline / llama-bench", best[("ip", None)] / max(bench)),
                  ("server baseline / llama-bench", best[("sv", None)] / max(bench))]
    lines.append(("probe plain step / in-process baseline", max(plain) / best[("ip", None)]))
    for k in arms[1:]:
        sp_ip, sp_sv = best[("ip", k)] / best[("ip", None)], best[("sv", k)] / best[("sv", None)]
        lines.append((f"K={k} speedup in process {sp_ip:.3f} / server {sp_sv:.3f}", sp_ip / sp_sv))
    ok = True
    print(f"  {'ratio (best of the rounds: each cell fastest run)':<58} {'ratio':>6}")
    for label, r in lines:
        within = abs(r - 1) <= GOAL
        ok &= within or label.startswith("probe")
        print(f"  {label:<58} {r:6.3f}  {'ok' if within else 'MISS'}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="demo,bench")
    ap.add_argument("--p", type=float, default=0.35)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0, help="design another calibrated model (its own file)")
    ap.add_argument("--save", type=Path, help="also write the rounds to this JSON file (one size)")
    ap.add_argument("--pool", type=Path, nargs="+", help="no measuring: the table over saved runs of one model")
    a = ap.parse_args()
    if a.pool:
        ok = report(pool([json.loads(f.read_text()) for f in a.pool]))
    else:
        ok = True
        for size in a.sizes.split(","):
            ok &= one_size(size.strip(), a.p, a.rounds, a.n_predict, a.seed, a.save)
    print(f"goal (medians of the paired rounds): baselines and K=1..3 speedups within {GOAL:.0%}:",
          "PASS" if ok else "MISS")


if __name__ == "__main__":
    main()
