"""K from per-position acceptance, on real text (issue 55 item 6).

On the real pair (Qwen2.5-Coder 1.5B target, its 0.5B as draft-simple drafter, greedy, the built-in
code, story and edit prompts, llama-server), this:

1. probes draft-simple's costs through llama-server (session.cost_probe.probe_costs with
   mode="draft-simple": the whole speculative step at each K at full and at no acceptance, with
   llama.cpp's synthetic acceptance, so the drafter's K steps and the target's verify are in it,
   and the plain decode step), at the sweep's context depth;
2. sweeps the baseline and draft-simple at K = 1..6 (paired, interleaved rounds: run_sweep), and
   records acceptance per draft position at K = 6 (RunRecord.accepted_per_pos);
3. predicts the speedup at K = 1..5 from K = 6's positions alone with the break-even model
   (breakeven.Costs from the probe), two ways: from runs of matches (analysis.positions.fit_runs:
   a greedy drafter's match at a text position does not depend on K, and a wide K starts more of
   its steps in hard stretches) and, beside it, K=6's per-position rates truncated
   (positions.fit); and prints both against the measured paired speedup at each K, with the
   errors (goal: within 5 %), per task.

The measured speedups are the product's: decode tok/s, the first token out (RunRecord.tok_s), as the
probe's steps are. ``--quick``: fewer prompts, repetitions and probe rounds (a look, not a verdict).

A timing measurement: run it on a quiet machine (2 threads, nothing else running).

    python benchmarks/real_k.py --quick
    python benchmarks/real_k.py --model TARGET.gguf --drafter DRAFTER.gguf --tasks code,edit
    python benchmarks/real_k.py --runs pair.jsonl   # the sweep real_models.py --out wrote; only the probe runs
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.analysis import breakeven, positions  # noqa: E402
from app.core.analysis.analysis import analyze  # noqa: E402
from app.core.common.paths import same_path  # noqa: E402
from app.core.engines.base import EngineKind, EngineSettings  # noqa: E402
from app.core.engines.server.engine import ServerEngine  # noqa: E402
from app.core.measure.busy import DISTURBED  # noqa: E402
from app.core.measure.plan import Plan, make_arms  # noqa: E402
from app.core.measure.prompts import select_prompts  # noqa: E402
from app.core.measure.runner import run_sweep  # noqa: E402
from app.core.records.cost import CostRecord  # noqa: E402
from app.core.records.reader import load_cost_records, load_records  # noqa: E402
from app.core.records.writer import ResultsWriter  # noqa: E402
from app.core.measure.cost_text import save_cost_record  # noqa: E402
from app.core.session.cost_probe import probe_costs  # noqa: E402
from app.core.session.events import RunFinished, SweepError, SweepWarning  # noqa: E402

MODE = "draft-simple"
FIT_K = 6
GOAL = 0.05


def sweep(target: str, drafter: str, tasks: list[str], per_task: int, reps: int, n_predict: int,
          threads: int, binary: str | None, out: str | None) -> list:
    arms = make_arms(range(1, FIT_K + 1), modes=(MODE,), drafters={MODE: drafter})
    plan = Plan(model=target, arms=arms, prompts=tuple(select_prompts(tasks, per_task=per_task)),
                n_predict=n_predict, reps=reps, warmup=1)
    recs = []
    with ServerEngine(binary, ctx_size=4096, threads=threads) as eng, \
            (ResultsWriter(out) if out else contextlib.nullcontext()) as writer:
        for e in run_sweep(plan, eng, writer, reruns=False):  # each run in the file as it is measured
            if isinstance(e, RunFinished):
                recs.append(e.record)
            elif isinstance(e, (SweepWarning, SweepError)):
                print(f"  sweep: {e.message}", file=sys.stderr)
    return recs


def probe(target: str, drafter: str, depth: int, threads: int, binary: str | None, rounds: int) -> CostRecord:
    settings = EngineSettings(kind=EngineKind.SERVER, ctx_size=4096, threads=threads, server_bin=binary)
    rec = None
    for ev in probe_costs(settings, target, depth=depth, max_k=FIT_K, drafter=drafter, mode=MODE,
                          min_rounds=min(5, rounds), max_rounds=rounds):
        if isinstance(ev, CostRecord):
            rec = ev
        else:
            print(f"  probe: {ev.message}", file=sys.stderr, flush=True)
    if rec is None:
        raise SystemExit("the probe gave no cost record")
    return rec


def report(recs: list, costs: breakeven.Costs, tasks: list[str], reran: bool = False) -> None:
    """Per task: K=6's acceptance per position, then K = 1..5 predicted from it against measured.
    ``reran``: the sweep measured disturbed runs again (the product's rule, real_models.py's sweep):
    the analysis leaves the disturbed ones out, as the product does."""
    # without re-runs every run counts: on a shared machine most would be "disturbed" and left out of
    # the analysis (the product's rule); this benchmark pairs its rounds itself and says how many were
    busy = sum(1 for r in recs if DISTURBED in r.flags)
    if busy:
        print(f"({busy} of {len(recs)} runs were disturbed by other programs; "
              + ("left out, as the product does: each was measured again)" if reran else "all are counted here)"))
    an = analyze(recs if reran else [dataclasses.replace(r, flags=tuple(f for f in r.flags if f != DISTURBED))
                                     for r in recs])
    errors: dict[str, list[float]] = {"runs": [], "positions": []}
    for task in tasks:
        arms = {c.arm.k: c for c in an.cells if c.task == task and c.arm.is_spec}
        wide = arms.get(FIT_K)
        counts = wide.positions if wide else None
        model = positions.fit({FIT_K: counts}) if counts else None
        runs = positions.fit_runs(counts, FIT_K) if counts else None
        if model is None or runs is None:
            print(f"\n{task}: no per-position counts at K={FIT_K}")
            continue
        print(f"\n{task}: acceptance per position at K={FIT_K} (share of steps reaching it) "
              + ", ".join(f"{100 * r:.0f}%" for r in counts.rates)
              + f"; conditional " + ", ".join(f"{100 * c:.0f}%" for c in model.conditional)
              + f" ({counts.steps} steps, {counts.runs} runs); runs of matches: a match follows a match "
              f"{100 * runs.follow:.0f}% of the time, a miss {100 * runs.after_miss:.0f}%")
        print("| K | accepted/step predicted: runs (positions) | measured | speedup predicted: runs (positions) "
              "| measured [95% CI] | error: runs (positions) |")
        print("|---|---|---|---|---|---|")
        for k in range(1, FIT_K):
            c = arms.get(k)
            if c is None or c.ratio is None or not c.ratio.estimate:
                print(f"| {k} | - | - | - | not measured | - |")
                continue
            pred, pred_pos = runs.speedup(k, costs), model.speedup(k, costs)
            err, err_pos = pred / c.ratio.estimate - 1, pred_pos / c.ratio.estimate - 1
            errors["runs"].append(err)
            errors["positions"].append(err_pos)
            ci = f" [{c.ratio.lo:.2f}, {c.ratio.hi:.2f}]" if c.ratio.lo is not None else ""
            measured_len = c.positions.mean_accepted if c.positions else None
            print(f"| {k} | {runs.expected_accepted(k):.2f} ({model.expected_accepted(k):.2f}) | "
                  f"{'-' if measured_len is None else f'{measured_len:.2f}'} | {pred:.2f}x ({pred_pos:.2f}x) | "
                  f"{c.ratio.estimate:.2f}x{ci} | {100 * err:+.1f} % ({100 * err_pos:+.1f} %) |")
        c6 = arms.get(FIT_K)
        if c6 is not None and c6.ratio is not None and c6.ratio.estimate:
            print(f"(K={FIT_K} itself, fitted: predicted {runs.speedup(FIT_K, costs):.2f}x, "
                  f"measured {c6.ratio.estimate:.2f}x)")
    for name, errs in errors.items():
        if errs:
            worst = max(map(abs, errs))
            what = ("runs of matches (positions.fit_runs: where a step starts)" if name == "runs" else
                    "K=6's positions truncated (positions.fit)")
            print(f"\n{what}: mean |error| {100 * statistics.fmean(map(abs, errs)):.1f} %, worst "
                  f"{100 * worst:.1f} % (goal <= {100 * GOAL:.0f} % on every cell): {'PASS' if worst <= GOAL else 'MISS'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="target GGUF (default: the fetched Qwen2.5-Coder 1.5B)")
    ap.add_argument("--drafter", help="drafter GGUF (default: the fetched Qwen2.5-Coder 0.5B)")
    ap.add_argument("--tasks", default="code,story,edit")
    ap.add_argument("--quick", action="store_true", help="1 prompt a task, 2 repetitions, 8 probe rounds")
    ap.add_argument("--per-task", type=int, help="prompts per task (default 3; --quick 1)")
    ap.add_argument("--reps", type=int, help="repetitions (default 4; --quick 2)")
    ap.add_argument("--probe-rounds", type=int, help="the probe's most rounds (default 25; --quick 8)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--server-bin", help="llama-server (default: the app's choice)")
    ap.add_argument("--out", help="also write the sweep's runs (as they are measured) and the probe's cost record "
                    "to this results file")
    ap.add_argument("--runs", help="take the sweep from this results file (real_models.py --out: the pair's "
                    "draft-simple K=1..6 and baseline, disturbed runs measured again) and only probe")
    ap.add_argument("--probe-in", help="with --runs: price with the probe an earlier --out saved instead of probing")
    ap.add_argument("--from", dest="source", help="print the table again from a results file --out wrote "
                    "(nothing measured)")
    a = ap.parse_args()
    if a.source:
        cost = next(c for c in reversed(load_cost_records(a.source)) if c.spec_type == MODE)
        report(load_records(a.source), breakeven.Costs.from_probe(cost), a.tasks.split(","))
        return
    if a.model is None or a.drafter is None:
        from benchmarks.real.fetch import fetch

        a.model = a.model or str(fetch("qwen-1.5b"))
        a.drafter = a.drafter or str(fetch("qwen-0.5b"))
    per_task = a.per_task or (1 if a.quick else 3)
    reps = a.reps or (2 if a.quick else 4)
    rounds = a.probe_rounds or (8 if a.quick else 25)
    tasks = a.tasks.split(",")
    t0 = time.monotonic()
    if a.runs:
        recs = [r for r in load_records(a.runs) if r.task in tasks and (r.arm_kind == "baseline" or r.spec_type == MODE)
                and same_path(r.model_path, a.model) and (r.drafter is None or same_path(r.drafter["path"], a.drafter))]
        if not any(r.k == FIT_K for r in recs):
            raise SystemExit(f"{a.runs}: no {MODE} runs at K={FIT_K} of {a.model} for {', '.join(tasks)}")
        per_task = len({(r.task, r.prompt_id) for r in recs}) // max(1, len({r.task for r in recs}))
        reps = 1 + max(r.rep for r in recs)
    else:
        recs = sweep(a.model, a.drafter, tasks, per_task, reps, a.n_predict, a.threads, a.server_bin, a.out)
    t_sweep = time.monotonic() - t0
    # the probe at the runs' depth: the prompt and half an answer, where a step of the runs sits on average
    depth = round(statistics.median(len(r.prompt_tokens) + r.n_generated / 2 for r in recs if r.status == "ok"))
    if a.probe_in:  # an earlier probe of this pair (--out wrote it)
        cost = next(c for c in reversed(load_cost_records(a.probe_in)) if c.spec_type == MODE)
    else:
        cost = probe(a.model, a.drafter, depth, a.threads, a.server_bin, rounds)
    costs = breakeven.Costs.from_probe(cost)
    if a.out and not a.probe_in:
        save_cost_record(a.out, cost)
    n_predict = max((r.n_predict for r in recs), default=a.n_predict)  # --runs: the sweep's, not the default
    print(f"{Path(a.model).name} + {Path(a.drafter).name} ({MODE}), {a.threads} threads, {n_predict} tokens, "
          f"{per_task} prompt(s) a task x {reps} reps (sweep {t_sweep:.0f} s); probe at depth {depth}, "
          f"{cost.rounds} rounds{'' if cost.stable else ' (not fully stable)'}, {cost.where()}")
    print(f"costs (ms): plain step {costs.verify(1):.2f}; whole step K: accept/reject " + ", ".join(
        f"{k}:{costs.step_accept_ms[k]:.1f}/{costs.step_reject_ms[k]:.1f}" for k in sorted(costs.step_accept_ms))
        + (f"; middle-rate check {100 * cost.mid_check['error']:+.1f} %" if cost.mid_check else ""))
    report(recs, costs, tasks, reran=bool(a.runs))
    print(f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
