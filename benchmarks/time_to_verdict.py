"""Time to a decided verdict: the adaptive sweep (stop when decided) against the exhaustive grid.

On a per-task calibrated model (3 tasks: code pays, tongue-twister near break-even, story loses),
the adaptive sweep runs until every task is decided (app.core.analysis.decide) or its budget ends;
the exhaustive grid runs K 1-6 with 5 repetitions. Reported: wall time and generated tokens of
each, each task's decision, and whether the adaptive pick is within 3 % of the grid's best (the
grid's own estimates; "off" counts as 1.00x).
Targets: decided within 10,000 generated tokens, at most a quarter of the grid's tokens, every
pick within 3 %.

    python benchmarks/time_to_verdict.py                       # bench size (about 0.9 GB model)
    python benchmarks/time_to_verdict.py --size tiny --n-predict 64   # a quick look
    python benchmarks/time_to_verdict.py --hog-at 20 --hog-for 30   # a CPU hog on every core, 20-50 s in
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

from _common import threads

from app.core.analysis.analysis import analyze
from app.core.analysis.decide import describe
from app.core.calibrated.demo import demo_prompts
from app.core.calibrated.gguf import make_model
from app.core.common.paths import cache_dir
from app.core.engines.inprocess import InProcessEngine
from app.core.measure.plan import Plan, make_arms, parse_int_list
from app.core.analysis.disturbed import disturbance
from app.core.measure.runner import run_sweep
from app.core.records.reader import load_cost_records, load_records
from app.core.records.writer import ResultsWriter
from app.core.records.arm import Arm
from app.core.measure.busy import BUSY_SHARE, DISTURBED
from app.core.session.adaptive import MIX, adaptive_sweep
from app.core.session.events import AdaptiveStage, Decisions, RunFinished, SweepWarning

TASK_P = {"code": 0.05, "tongue-twister": 0.4, "story": 0.9}


def task_model(size: str):
    tag = "-".join(f"{t}{p:g}" for t, p in TASK_P.items())
    path = cache_dir() / "models" / f"calibrated-{size}-embedding-{tag}.gguf"
    if not path.exists():
        make_model(path, 0.0, "embedding", size, 0, task_p=TASK_P)
    return path


class Hog:
    """A busy loop on every core, from ``at`` seconds for ``length`` seconds (None: to the end).
    The loops are detached (a shell starts them and exits), so they are other programs to the busy
    monitor, as a browser or a build would be, not children of this one."""

    def __init__(self, at: float | None, length: float | None = None):
        self.at, self.length, self.pids, self.started_at, self.stopped_at = at, length, [], None, None
        self.timers = [threading.Timer(at, self.start)] if at is not None else []
        if at is not None and length is not None:
            self.timers.append(threading.Timer(at + length, self.stop))

    def start(self) -> None:
        self.started_at = time.monotonic()
        n = os.cpu_count() or 1
        cmd = " ".join([f'"{sys.executable}" -c "while True: pass" >/dev/null 2>&1 & echo $!;'] * n)
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30, check=True).stdout
        self.pids = [int(x) for x in out.split()]

    def stop(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.pids and self.stopped_at is None:
            self.stopped_at = time.monotonic()
        self.pids = []

    def __enter__(self):
        for t in self.timers:
            t.start()
        return self

    def __exit__(self, *exc):
        for t in self.timers:
            t.cancel()
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="bench", choices=("tiny", "demo", "bench"))
    ap.add_argument("--k", default="1-6", help="draft widths of both sweeps")
    ap.add_argument("--grid-reps", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--budget", type=float, default=None, help="the adaptive sweep's budget in seconds")
    ap.add_argument("--budget-tokens", type=int, default=None)
    ap.add_argument("--max-reps", type=int, default=12, help="the adaptive sweep's repetitions per arm at most")
    ap.add_argument("--hog-at", type=float, default=None, help="start a CPU hog this many seconds into the adaptive sweep")
    ap.add_argument("--hog-for", type=float, default=None, help="stop the hog after this many seconds (default: at the end)")
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--out", default=None, help="write the adaptive sweep's runs and its probe to this JSONL")
    ap.add_argument("--probe-in", default=None, help="price with the latest cost probe in this results file "
                                                     "(an earlier --out) instead of probing again")
    ap.add_argument("--grid-only", action="store_true", help="run only the grid (with --grid-out: for later runs)")
    ap.add_argument("--grid-out", default=None, help="save the grid's runs to this JSONL (for a later --grid-in)")
    ap.add_argument("--grid-in", default=None,
                    help="the grid's runs from an earlier quiet run's --grid-out, instead of running it again "
                         "(e.g. a hog run against the quiet machine's values)")
    a = ap.parse_args()
    model = str(task_model(a.size))
    prompts = tuple(demo_prompts(model) or ())
    ks = parse_int_list(a.k, "--k")

    def engine():
        return InProcessEngine(ctx_size=2048, threads=threads(), max_k=max(ks))

    base = Plan(model=model, arms=(Arm(),), prompts=prompts, engine="inprocess", n_predict=a.n_predict,
                reps=a.grid_reps, warmup=1, raw=True)
    print(f"model {model} ({a.size}), tasks {', '.join(p.task for p in prompts)}, K {a.k}, "
          f"{a.n_predict} tokens a run, {threads()} threads")
    grid = dataclasses.replace(base, arms=make_arms(ks, [0.0]))

    def run_grid() -> list:
        with engine() as eng, (ResultsWriter(a.grid_out) if a.grid_out else contextlib.nullcontext()) as w:
            return [e.record for e in run_sweep(grid, eng, w) if isinstance(e, RunFinished)]

    if a.grid_only:
        t0 = time.monotonic()
        recs = run_grid()
        an = analyze(recs)
        print(f"grid: {len(recs)} runs, {sum(r.n_generated or 0 for r in recs)} tokens, {time.monotonic() - t0:.0f} s")
        for c in an.cells:
            if c.arm.is_spec and c.ratio and c.ratio.estimate:
                print(f"  {c.task} {c.arm.label}: {c.ratio.estimate:.2f}x [{c.ratio.lo:.2f}, {c.ratio.hi:.2f}]")
        return
    # adaptive, until decided
    final: Decisions | None = None
    t0 = time.monotonic()
    records = []
    cost = load_cost_records(a.probe_in)[-1] if a.probe_in else None
    with engine() as eng, Hog(a.hog_at, a.hog_for) as hog, \
            (ResultsWriter(a.out) if a.out else contextlib.nullcontext()) as out:
        for ev in adaptive_sweep(base, eng, ks=ks, max_reps=a.max_reps, budget_s=a.budget,
                                 budget_tokens=a.budget_tokens, cost=cost, writer=out):
            if isinstance(ev, AdaptiveStage):
                print(f"  adaptive {ev.stage}: {ev.message}")
            elif isinstance(ev, RunFinished) and ev.record.rep < 10_000:
                records.append(ev.record)
            elif isinstance(ev, SweepWarning):
                print(f"  warning: {ev.message}")
            elif isinstance(ev, Decisions):
                final = ev
                if not ev.final:
                    print(f"  {ev.runs} runs, {ev.tokens} tokens, {ev.elapsed_s:.0f} s: "
                          + "; ".join(describe(d) for d in ev.tasks))
        hog_note = (f", CPU hog from {hog.started_at - t0:.0f} s"
                    + (f" to {hog.stopped_at - t0:.0f} s" if hog.stopped_at else " to the end") if hog.started_at else "")
    t_ad = time.monotonic() - t0
    assert final is not None
    busy = disturbance(records)
    by_peak = sum(1 for r in records if DISTURBED in r.flags and (r.other_cpu or 0.0) <= BUSY_SHARE)
    print(f"adaptive: stopped ({final.stopped}) after {final.runs} runs, {final.tokens} tokens, {t_ad:.0f} s{hog_note}; "
          + (busy.sentence() + (" (verdict withheld)" if busy.withheld else "") if busy else "no run disturbed")
          + (f"; {by_peak} of them marked by their busiest second only (under {100 * BUSY_SHARE:.0f} % over the run)"
             if by_peak else ""))
    for r in records:
        if DISTURBED in r.flags:
            print(f"    disturbed: {r.task} {r.measured_arm.label} rep {r.rep}: {r.tok_s:.1f} tok/s, others "
                  f"{100 * (r.other_cpu or 0):.0f} % over the run, "
                  + (f"{100 * r.other_cpu_peak:.0f} % in its busiest second" if r.other_cpu_peak is not None else "-"))
    for d in final.tasks:
        print("  " + describe(d, final=True))
    an_ad = analyze(records)
    tasks = [p.task for p in prompts]

    def mix_cells(an, arm):
        """The equal mix's ratio of ``arm`` (the adaptive sweep's default mix), or None."""
        from app.core.analysis.stats import combine_ratios

        parts = [(1.0, c.ratio) for t in dict.fromkeys(tasks) if (c := an.cell(t, arm)) and c.ratio]
        return combine_ratios(parts) if len(parts) == len(set(tasks)) else None

    for d in final.tasks:  # every interval the adaptive sweep ended with
        if d.task == MIX:
            r = d.ratio
            print(f"  {MIX}: " + (f"{d.pick.label if d.pick else 'off'} {r.estimate:.2f}x [{r.lo:.2f}, {r.hi:.2f}]"
                                  if r and r.estimate and r.lo and r.hi else "-"))
            continue
        cells = [c for c in an_ad.cells if c.task == d.task and c.arm.is_spec and c.ratio and c.ratio.lo]
        print(f"  {d.task}: " + ", ".join(f"{c.arm.label} {c.ratio.estimate:.2f}x [{c.ratio.lo:.2f}, {c.ratio.hi:.2f}]"
                                           for c in cells))
    if a.skip_grid:
        return
    # the exhaustive grid
    t0 = time.monotonic()
    if a.grid_in:
        recs = [r for r in load_records(a.grid_in) if r.status == "ok"]
        t_grid = float("nan")
        print(f"grid: the runs of {a.grid_in} (an earlier run's --grid-out)")
    else:
        recs = run_grid()
        t_grid = time.monotonic() - t0
    tok_grid = sum(r.n_generated or 0 for r in recs)
    an = analyze(recs)
    print(f"grid: {len(recs)} runs, {tok_grid} tokens, {t_grid:.0f} s")
    rows = []
    for d in final.tasks:
        if d.task == MIX:  # the grid's equal mix: the weighted ratio of each arm over the tasks
            est = {arm: r.estimate for arm in grid.arms if arm.is_spec and (r := mix_cells(an, arm)) and r.estimate}
        else:
            est = {arm: c.ratio.estimate for arm in grid.arms if arm.is_spec and (c := an.cell(d.task, arm))
                   and c.ratio and c.ratio.estimate}
        best = max(est, key=lambda arm: est[arm]) if est else None
        best_v = max(1.0, est[best]) if best else 1.0
        best_label = best.label if best and est[best] > 1.0 else "off"
        mine = d.pick if d.pick is not None else None
        mine_v = est.get(mine, float("nan")) if mine is not None else 1.0
        within = mine_v >= 0.97 * best_v
        # every interval the adaptive sweep ended with, against the grid's (quiet) estimate of that arm
        checks = []
        for arm, g in est.items():
            if d.task == MIX:
                r = mix_cells(an_ad, arm)
            else:
                c = an_ad.cell(d.task, arm)
                r = c.ratio if c is not None else None
            if r is not None and r.lo is not None and r.hi is not None:
                checks.append(f"{arm.label} [{r.lo:.2f}, {r.hi:.2f}] {'covers' if r.lo <= g <= r.hi else 'MISSES'} {g:.2f}")
        covers = "; ".join(checks) or "-"
        rows.append((d.task, "decided" if d.decided else "undecided", mine.label if mine else "off",
                     f"{mine_v:.2f}x", best_label, f"{best_v:.2f}x", "yes" if within else "NO", covers))
    print()
    print(f"| task | adaptive | adaptive pick | its grid speedup | grid best | grid speedup | within 3 % | adaptive intervals vs grid |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    print("| sweep | runs | generated tokens | wall time |")
    print("|---|---|---|---|")
    print(f"| adaptive (until decided{hog_note}) | {final.runs} | {final.tokens} | {t_ad:.0f} s |")
    print(f"| grid K {a.k} x {a.grid_reps} reps | {len(recs)} | {tok_grid} | {t_grid:.0f} s |")
    share = final.tokens / tok_grid if tok_grid else float("nan")
    print()
    print(f"decided: {'yes' if final.decided else 'NO (' + final.stopped + ')'}; tokens {final.tokens} "
          f"(target <= 10,000: {'PASS' if final.tokens <= 10_000 else 'MISS'}); share of the grid's tokens "
          f"{100 * share:.0f} % (target <= 25 %: {'PASS' if share <= 0.25 else 'MISS'}); picks within 3 %: "
          f"{'PASS' if all(r[6] == 'yes' for r in rows) else 'MISS'}")


if __name__ == "__main__":
    main()
