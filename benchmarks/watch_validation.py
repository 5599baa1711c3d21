"""watch against a measured sweep, on a real llama-server serving the calibrated model.

1. The calibrated model (``--size``, share of wrong drafts ``--p``) is served at K=3 with
   --metrics and -np 1; a separate client process sends it ``--requests`` completions (token-id
   prompts, greedy, ``--n-predict`` tokens each); watch reads the server's counters before and
   after. Its per-position counts must equal the designed ones (the simulator of the model's
   tables) exactly.
2. The costs: ``--costs FILE`` (a cost record of this model made through llama-server on this
   machine: ``mtp-tuner probe --engine server``, issue 28), else the in-process probe of the same
   model, run here, and said so (its engine is not the server's: watch itself refuses it).
3. watch's predictions for K=1..4 (K=4 extrapolated from the server's three positions).
4. The measured sweep: llama-servers at K=0 (plain), 1, 2, 3, 4, all up at once; the same
   traffic sent to each in a new random order every round (``--reps`` rounds), so drift hits all
   alike; speed = the server's own decode tok/s (timings.predicted_per_second), median per K;
   speedup = K's median over the plain one's.

Prints the per-position table (designed vs watched), predicted vs measured speedups, and whether
the pick matches (the fastest of off and K=1..4, as a sweep picks; the fastest K beside it).
Goal: counts exact; speedups within 5 %; the same pick.

    python benchmarks/watch_validation.py --size demo --n-predict 48 --requests 4 --reps 3   # a quick look
    # the final run, priced by a probe through llama-server (issue 28) of the same model file
    mtp-tuner probe --engine server --model <cache>/models/calibrated-demo-embedding-p0.3.gguf --out probe.jsonl
    BENCH_THREADS=2 python benchmarks/watch_validation.py --size demo --n-predict 96 --requests 8 --reps 5 \
        --costs probe.jsonl

Measured 2026-12-02 on the project's 2-core development machine while other work ran, BENCH_THREADS=1,
``--size demo --n-predict 96 --requests 8 --reps 4``, priced by the in-process probe: counts exact
(306 steps; 202 / 148 / 102), predicted vs measured 0.630/0.642, 0.742/0.760, 0.751/0.712,
0.766/0.791 (K=1..4; errors -1.9, -2.4, +5.4, -3.1 %), best K 4 both. With 48 tokens and 4
requests (79 steps) the errors were +14..+26 % and the best K differed: too few tokens for the speeds.
Again with a llama-server probe of the same model file (``--precision 2 --max-rounds 40``, requests
centred on its depth), ``--reps 8``, nothing else running: counts exact; predicted vs measured
0.773/0.780, 0.906/0.888, 0.867/0.881, 0.868/0.916 (errors -0.9, +2.1, -1.6, -5.3 %, the last
K=4, extrapolated); every K slower than plain, so both pick off ("MTP costs you 13 % here"); the
fastest K predicted 2, measured 4, all four within 4 % of each other.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import threads

from app.core.analysis import breakeven
from app.core.calibrated import design as C
from app.core.calibrated.gguf import make_model
from app.core.common.paths import cache_dir
from app.core.engines.server.binary import child_env, find_server_binary, group_kwargs, kill_group
from app.core.engines.server.process import free_port
from app.core.measure.probe import run_probe
from app.core.records.cost import CostRecord
from app.core.records.reader import load_cost_records
from app.core.records.schema import host_info
from app.core.watch import predict as P
from app.core.watch.client import Client
from app.core.watch.costs import mismatch
from app.core.watch.watcher import Watcher

PROMPTS = [[104, 105, 106, 107], [200, 201, 202], [300, 310, 320, 330], [150, 160]]
SERVER_K = 3
SWEEP_KS = (1, 2, 3, 4)

CLIENT = """
import json, sys, urllib.request
url, prompts, n_predict = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
for prompt in prompts:
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False}).encode()
    req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        json.load(r)
"""


def start_server(binary: str, model: Path, k: int, n_threads: int, log: Path):
    port = free_port()
    spec = ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(k)] if k else []
    out = open(log, "wb")
    proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), "-m", str(model), "-np", "1",
                             "-c", "2048", "-t", str(n_threads), "--metrics", *spec],
                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                            **group_kwargs())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"llama-server (K={k}) exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.1)
    kill_group(proc)
    sys.exit(f"llama-server (K={k}) not ready in 300 s")


def complete(url: str, prompt: list[int], n_predict: int) -> float:
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False}).encode()
    req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return float(json.load(r)["timings"]["predicted_per_second"])


def traffic(n: int) -> list[list[int]]:
    return [PROMPTS[i % len(PROMPTS)] for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="demo", choices=C.SIZES)
    ap.add_argument("--p", type=float, default=0.3, help="share of wrong drafts of the calibrated model")
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--requests", type=int, default=4, help="completions the client sends while watched")
    ap.add_argument("--reps", type=int, default=3, help="rounds of the measured sweep")
    ap.add_argument("--costs", help="results file with a cost record of this model made through llama-server")
    a = ap.parse_args()
    n_threads = threads()
    binary = find_server_binary()
    model = cache_dir() / "models" / f"calibrated-{a.size}-embedding-p{a.p:g}.gguf"
    if not model.exists():
        print(f"writing {model} ...", file=sys.stderr, flush=True)
        make_model(model, a.p, "embedding", a.size)
    logs = Path(tempfile.mkdtemp(prefix="watch-validation-"))  # the servers' logs, if one fails
    print(f"model {model.name}, {n_threads} threads, n_predict {a.n_predict}, {a.requests} watched requests, "
          f"{a.reps} sweep rounds")

    # 1. watch the server at K=3 while a separate client process sends traffic
    reqs = traffic(a.requests)
    proc, url = start_server(binary, model, SERVER_K, n_threads, logs / "watched.log")
    try:
        w = Watcher(Client(url, timeout=60))
        w.attach()
        r = subprocess.run([sys.executable, "-c", CLIENT, url, json.dumps(reqs), str(a.n_predict)],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"the client failed: {r.stderr[-2000:]}")
        w.poll()
        s = w.summary(cost_files=[])
    finally:
        kill_group(proc)
        proc.wait(10)
    tables = C.load_tables(model)
    sims = [C.simulate(tables, pr, SERVER_K, a.n_predict) for pr in reqs]
    designed = tuple(sum(x.accepted_per_pos[i] for x in sims) for i in range(SERVER_K))
    steps = sum(x.steps for x in sims)
    c = s.counts
    print("\nper-position counts (K=3, the whole window)")
    print(f"{'':10} {'steps':>7} " + " ".join(f"{'pos ' + str(i + 1):>7}" for i in range(SERVER_K)))
    print(f"{'designed':10} {steps:>7} " + " ".join(f"{x:>7}" for x in designed))
    print(f"{'watched':10} {c.draft_steps:>7} " + " ".join(f"{x:>7}" for x in c.accepted_per_pos))
    exact = c.accepted_per_pos == designed and c.draft_steps == steps
    print(f"exact: {'yes' if exact else 'NO'}")

    # 2. the costs
    if a.costs:
        recs = sorted(load_cost_records(a.costs), key=lambda x: x.timestamp_utc or "", reverse=True)
        assert s.server is not None
        fits = [x for x in recs if mismatch(x, s.server, host_info()) is None]
        if not fits:
            why = mismatch(recs[0], s.server, host_info()) if recs else "no cost record in it"
            sys.exit(f"{a.costs}: no cost record for this server ({why})")
        cost = fits[0]
        print(f"\ncosts: the probe {cost.run_id} through llama-server ({a.costs})")
    else:
        cost = None
        for ev in run_probe(str(model), depth=64, max_batch=max(SWEEP_KS) + 1, threads=n_threads, max_rounds=15):
            if isinstance(ev, CostRecord):
                cost = ev
        assert cost is not None
        print("\ncosts: the IN-PROCESS probe of this model (no --costs given; watch itself refuses an in-process "
              "probe for a server: give --costs with a server probe, issue 28)")
    costs = breakeven.Costs.from_probe(cost)
    preds = {p.k: p for p in P.predict(c, SERVER_K, costs)}

    # 3. the measured sweep: every K up at once, the same traffic in a new order every round
    servers = {}
    try:
        for k in (0, *SWEEP_KS):
            servers[k] = start_server(binary, model, k, n_threads, logs / f"sweep-k{k}.log")
        speeds: dict[int, list[float]] = {k: [] for k in servers}
        rng = random.Random(0)
        for rnd in range(a.reps):
            order = [(k, pr) for k in servers for pr in reqs]
            rng.shuffle(order)
            for k, pr in order:
                speeds[k].append(complete(servers[k][1], pr, a.n_predict))
            print(f"sweep round {rnd + 1}/{a.reps} done", file=sys.stderr, flush=True)
    finally:
        for proc, _ in servers.values():
            kill_group(proc)
            proc.wait(10)
    base = statistics.median(speeds[0])
    measured = {k: statistics.median(speeds[k]) / base for k in SWEEP_KS}

    print(f"\nspeedup over plain decoding (plain: {base:.1f} tok/s, the server's own decode speed)")
    print(f"{'K':>3} {'predicted':>10} {'interval':>15} {'measured':>9} {'error':>8}")
    errs = []
    for k in SWEEP_KS:
        p = preds[k]
        err = p.speedup / measured[k] - 1
        errs.append(abs(err))
        tag = "  extrapolated" if p.extrapolated else ""
        print(f"{k:>3} {p.speedup:>9.3f}x [{p.lo:.3f}, {p.hi:.3f}] {measured[k]:>8.3f}x {100 * err:>+7.1f}%{tag}")
    # the pick, as a sweep makes it: the fastest of off (plain decoding, 1.00x) and K=1..4
    def name(k: int) -> str:
        return "off" if k == 0 else f"K={k}"

    pick_pred = max([0, *SWEEP_KS], key=lambda k: preds[k].speedup if k else 1.0)
    pick_meas = max([0, *SWEEP_KS], key=lambda k: measured[k] if k else 1.0)
    print(f"\nthe pick (off: plain decoding, 1.00x): predicted {name(pick_pred)}, measured {name(pick_meas)}: "
          f"{'match' if pick_pred == pick_meas else 'NO MATCH'}")
    best_pred = max(SWEEP_KS, key=lambda k: preds[k].speedup)
    best_meas = max(SWEEP_KS, key=lambda k: measured[k])
    print(f"the fastest of K={SWEEP_KS[0]}..{SWEEP_KS[-1]}: predicted {best_pred} (measured {measured[best_pred]:.3f}x), "
          f"measured {best_meas} ({measured[best_meas]:.3f}x): {'match' if best_pred == best_meas else 'differ'}")
    print(f"largest error {100 * max(errs):.1f} % ({'within' if max(errs) <= 0.05 else 'OUTSIDE'} 5 %)")
    print(f"watch's recommendation with these costs: {P.recommend(list(preds.values()), c, SERVER_K).reason}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
