"""Where the adaptive sweep's pairs go, on simulated sweeps: today's rounds (every undecided line
one pair of the arm decide names, its widest contender, then a look) against the schedule
(app.core.analysis.schedule: one pair to the line whose decision is nearest, then a look).

A simulated sweep is several tasks, each with its candidate arms at set true speedups; every
pair's log speedup is log(true) plus noise resampled from recorded per-pair log ratios
(tests/data/noise_pairs.json, each cell centred on its own mean: benchmarks/stopping.py), scaled
to a quiet machine's spread (3 %) or as recorded. Both schedules run the sweep's first round
(``--min-reps`` repetitions of baseline and every arm of a task), decide with the core's own rule
(app.core.analysis.decide.decide_task on the anytime intervals of app.core.analysis.anytime), and
stop when every task is decided or no arm may run another pair (``--cap`` pairs an arm: the
adaptive sweep's repetitions under a budget). The same draws feed both (an arm's k-th pair is the
same number whichever schedule asks for it). Reported per scenario, 1,000 sweeps (seeded):

- runs to the sweep's verdict (every task decided; undecided: the runs spent at the cap), and its
  time in baseline runs (an arm's run takes 1 / its true speedup);
- the runs at which each task's own verdict came, averaged over the tasks (what the window shows
  first);
- the share of tasks decided within a budget of ``--budget`` runs;
- false "pays" (a task whose arms are all at most 1.00x called pays) and false "slower" (a task
  with an arm at 1.00x or more called slower), over tasks.

    python benchmarks/scheduling.py                 # the table (docs/methodology.md)
    python benchmarks/scheduling.py --sims 200     # a quicker look
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.analysis import anytime as seq  # noqa: E402
from app.core.analysis import schedule  # noqa: E402
from app.core.analysis.decide import PAYS, SLOWER, TaskDecision, decide_task  # noqa: E402
from app.core.analysis.stats import Ratio  # noqa: E402
from app.core.records.arm import Arm  # noqa: E402
from stopping import PAIRS, QUIET_SD, residuals  # noqa: E402

import json  # noqa: E402

# (name, {task: (true speedup of K=1, of K=2)})
SCENARIOS: tuple[tuple[str, dict[str, tuple[float, ...]]], ...] = (
    ("one pays, one near 1, one slower", {"code": (1.30, 1.25), "story": (0.98, 1.00), "edit": (0.80, 0.85)}),
    ("every effect >= 10 %", {"code": (1.20, 1.10), "story": (0.85, 0.80), "edit": (1.50, 1.30)}),
    ("all at 1.00x", {"code": (1.00, 1.00), "story": (1.00, 1.00), "edit": (1.00, 1.00)}),
    ("near 1 (0.95-1.02)", {"code": (0.95, 1.02), "story": (0.97, 0.99), "edit": (1.00, 1.02)}),
    ("two close widths that pay", {"code": (1.30, 1.36), "story": (1.12, 1.20), "edit": (0.90, 0.95)}),
)
ARMS = (Arm(1, 0.0), Arm(2, 0.0))


def ratio(x: np.ndarray) -> Ratio:
    """The anytime ratio of these pairs (as decide reads a cell: the mean log speedup and its se)."""
    n = len(x)
    m = float(x.mean())
    se = float(x.std(ddof=1)) / math.sqrt(n) if n >= 2 else None
    return seq.anytime(Ratio(n, math.exp(m), None, None, m, se))


class Sweep:
    """One simulated sweep: its draws, the pairs each arm has had, the runs spent, each task's
    decision and when it came."""

    def __init__(self, truth: dict[str, tuple[float, ...]], draws: dict[str, np.ndarray], cap: int) -> None:
        self.truth, self.draws, self.cap = truth, draws, cap
        self.n = {(t, a): 0 for t in truth for a in ARMS}
        self.runs = 0
        self.time = 0.0
        self.done: dict[str, tuple[int, str]] = {}  # task -> (runs when decided, outcome)
        self.budget_runs = 0

    def pair(self, task: str, arms: Sequence[Arm]) -> None:
        """One repetition: baseline and ``arms`` on ``task``."""
        self.runs += 1 + len(arms)
        self.time += 1.0 + sum(1.0 / self.truth[task][ARMS.index(a)] for a in arms)
        for a in arms:
            self.n[(task, a)] += 1

    def ratios(self, task: str) -> dict[Arm, Ratio]:
        return {a: ratio(self.draws[task][i, :self.n[(task, a)]]) if self.n[(task, a)] else
                Ratio(0, None, None, None, None, None) for i, a in enumerate(ARMS)}

    def look(self) -> list[tuple[TaskDecision, dict[Arm, Ratio], int]]:
        """Every task's decision now (a decided one noted with the runs it took); the undecided ones."""
        out = []
        for t in self.truth:
            if t in self.done:
                continue
            rs = self.ratios(t)
            d = decide_task(t, rs)
            if d.decided:
                self.done[t] = (self.runs, d.outcome)
            else:
                out.append((d, rs, 1))
        return out

    def may(self, task: str, arm: Arm) -> bool:
        return self.n[(task, arm)] < self.cap


def run(truth: dict[str, tuple[float, ...]], draws: dict[str, np.ndarray], cap: int, min_reps: int,
        nearest: bool) -> Sweep:
    s = Sweep(truth, draws, cap)
    for _ in range(min_reps):
        for t in truth:
            s.pair(t, ARMS)
    lines = s.look()
    while lines:
        ran = False
        if nearest:
            for nxt in schedule.order(lines):
                d = next(d for d, _, _ in lines if d.task == nxt.task)
                arm = next((a for a in [nxt.arm, *d.contenders] if a is not None and s.may(d.task, a)), None)
                if arm is not None:
                    s.pair(d.task, (arm,))
                    ran = True
                    break
        else:  # today's rounds: every undecided line one pair of the arm decide names
            for d, _, _ in lines:
                arm = next((a for a in [d.needs, *d.contenders] if a is not None and s.may(d.task, a)), None)
                if arm is not None:
                    s.pair(d.task, (arm,))
                    ran = True
        if not ran:
            break
        lines = s.look()
    return s


def cell(truth: dict[str, tuple[float, ...]], noise: np.ndarray | None, sd: float, sims: int, cap: int,
         min_reps: int, budget: int, seed: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, list[float]]] = {"today": {}, "nearest": {}}
    for _ in range(sims):
        draws = {}
        for t, trues in truth.items():
            logs = np.log(np.array(trues))[:, None]
            eps = rng.normal(0.0, sd, (len(trues), cap)) if noise is None else rng.choice(noise, (len(trues), cap))
            draws[t] = logs + eps
        for name, nearest in (("today", False), ("nearest", True)):
            s = run(truth, draws, cap, min_reps, nearest)
            o = out[name]
            all_done = len(s.done) == len(truth)
            o.setdefault("runs", []).append(s.runs)
            o.setdefault("time", []).append(s.time)
            o.setdefault("decided", []).append(float(all_done))
            o.setdefault("task_runs", []).append(statistics.fmean(s.done[t][0] if t in s.done else s.runs
                                                                 for t in truth))
            o.setdefault("in_budget", []).append(sum(1 for r, _ in s.done.values() if r <= budget) / len(truth))
            for t, trues in truth.items():
                outcome = s.done.get(t, (0, ""))[1]
                if max(trues) <= 1.0:
                    o.setdefault("false_pays", []).append(float(outcome == PAYS))
                if max(trues) >= 1.0:
                    o.setdefault("false_slower", []).append(float(outcome == SLOWER))
    return {name: {k: (float(np.median(v)) if k in ("runs", "time", "task_runs") else float(np.mean(v)))
                   for k, v in o.items()} for name, o in out.items()}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--cap", type=int, default=40, help="pairs an arm may have (the adaptive sweep's under a budget)")
    ap.add_argument("--min-reps", type=int, default=2, help="the first round's repetitions")
    ap.add_argument("--budget", type=int, default=60, help="runs: the share of tasks decided within it")
    ap.add_argument("--seed", type=int, default=57)
    ap.add_argument("--noise", default="quiet,recorded", help="quiet (the recorded shape at 3 %%), recorded, normal")
    args = ap.parse_args()
    data = json.loads(PAIRS.read_text())
    rec = residuals(data["cells"])
    sd = float(rec.std())
    noises = {"normal": (f"normal, sd {QUIET_SD:.2f}", None, QUIET_SD),
              "quiet": (f"recorded shape, sd {QUIET_SD:.2f}", rec * (QUIET_SD / sd), QUIET_SD),
              "recorded": (f"recorded, sd {sd:.2f}", rec, sd)}
    print(f"{args.sims} sweeps a cell, 3 tasks x 2 arms, first round {args.min_reps} repetitions, cap {args.cap} "
          f"pairs an arm, budget {args.budget} runs; noise from {data['source']}")
    print("| noise | scenario | schedule | median runs to the verdict | median time (baseline runs) "
          "| mean runs to a task's verdict (median) | every task decided | tasks decided within the budget "
          "| false pays | false slower |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in args.noise.split(","):
        name, noise, spread = noises[key]
        for i, (scen, truth) in enumerate(SCENARIOS):
            res = cell(truth, noise, spread, args.sims, args.cap, args.min_reps, args.budget, args.seed + 100 * i)
            for sched, r in res.items():
                print(f"| {name} | {scen} | {sched} | {r['runs']:.0f} | {r['time']:.1f} | {r['task_runs']:.1f} "
                      f"| {pct(r['decided'])} | {pct(r['in_budget'])} | {pct(r.get('false_pays'))} "
                      f"| {pct(r.get('false_slower'))} |", flush=True)


if __name__ == "__main__":
    main()
