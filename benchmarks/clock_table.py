"""Quick's stated budget against the measured time, and the one clock's estimate against the truth
(issue 56 item 2), on each path of "Tune for me":

- demo: the demo's calibrated model, its own heads (the adaptive sweep, in process);
- n-gram: SmolLM2-135M (a GGUF without MTP heads), llama.cpp's n-gram modes on llama-server;
- drafter: a calibrated draft-simple pair (target without heads, a small drafter) on llama-server;
- own command: the user's llama-server command line on SmolLM2 (its flags kept), the n-gram modes.

Each runs through the flow the front ends run (session.tune.tune_request with Quick, then
session.sweep.prepare and run), the clock made and fed as they make and feed it
(session.clock.flow_clock, flow_estimate), from the moment Quick's budget counts from (as
`mtp-tuner tune`: before the request is built). It prints per path the stated budget, the wall time
to the answer (the judged verdict: goal within +15 %), what stopped the sweep, the estimate before
the start, and the estimate shown at 10 %, 50 % and 90 % of the run beside the true time left.

A timing measurement: on a shared, loaded machine it still checks the budget (a budget is kept
however slow the runs are), not the estimates' accuracy on a quiet one.

    python benchmarks/clock_table.py [--paths demo,ngram,drafter,own] [--quick 120]"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import ROOT  # noqa: F401  (puts the repository first on sys.path)

from app.core.common.cancel import CancelToken
from app.core.common.units import duration
from app.core.engines.base import EngineKind, EngineSettings
from app.core.session.clock import flow_clock, flow_estimate
from app.core.session.events import AdaptiveStage, Decisions, QuietWait, RunFinished, RunStarted, SessionFinished
from app.core.session.sweep import prepare, run
from app.core.session.tune import tune_request

SMOL = Path("/root/.cache/mtp-tuner-real/SmolLM2-135M-Instruct.Q4_1.gguf")
USES = {"code": 1.0, "story": 1.0}


def request_for(path: str, quick_s: float, started: float, work: Path):
    """The Start page's request for ``path`` (what tune_request makes for that choice)."""
    if path == "demo":
        from app.core.calibrated.demo import demo_model

        return tune_request(str(demo_model()), USES, quick=True, engine=EngineKind.INPROCESS, quick_s=quick_s,
                            started=started)
    if path == "ngram":
        return tune_request(str(SMOL), USES, quick=True, ngram=True, engine=EngineKind.SERVER, quick_s=quick_s,
                            started=started)
    if path == "drafter":
        from app.core.calibrated import gguf

        target, drafter = gguf.make_pair(work / "pair", 0.3, size="demo", mtp=False)
        return tune_request(str(target), USES, quick=True, engine=EngineKind.SERVER, quick_s=quick_s,
                            started=started, drafters={"draft-simple": str(drafter)})
    if path == "own":
        from app.core.engines.server.binary import find_server_binary, load_user_command

        cmd, binary = load_user_command(f"{find_server_binary(None)} -m {SMOL} -c 4096")
        settings = cmd.settings(EngineSettings(), binary)
        return tune_request(cmd.model, USES, quick=True, ngram=True, engine=EngineKind.SERVER, settings=settings,
                            quick_s=quick_s, started=started)
    raise SystemExit(f"--paths: unknown path {path!r} (demo, ngram, drafter, own)")


def one(path: str, quick_s: float, work: Path) -> dict:
    started = time.monotonic()  # Quick's budget counts from here, as `mtp-tuner tune`'s
    prepared = prepare(request_for(path, quick_s, started, work))
    request = dataclasses.replace(prepared.request, out=work / f"{path}.jsonl")
    before = flow_estimate(request, None, [])
    clock = flow_clock(request, before)
    lock = threading.Lock()
    samples: list[tuple[float, float | None]] = []  # (time since the start, the estimate shown then)
    done = threading.Event()

    def sample() -> None:  # what a screen reads, twice a second
        while not done.is_set():
            with lock:
                samples.append((time.monotonic() - started, clock.left()))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    records, final, runs = [], None, 0
    first_run: float | None = None  # when the first measured run started (after the probe, servers, waits)
    waits: dict[int, float] = {}  # each quiet-moment wait's longest report
    try:
        for ev in run(request, CancelToken()):
            with lock:
                clock.observe(ev)
            if isinstance(ev, RunStarted) and not ev.warmup and first_run is None:
                first_run = time.monotonic() - started
            elif isinstance(ev, QuietWait):
                waits[len(records)] = max(waits.get(len(records), 0.0), ev.waited_s)
            elif isinstance(ev, AdaptiveStage):
                print(f"  {path}: adaptive {ev.stage}: {ev.message[:160]}", file=sys.stderr, flush=True)
            if isinstance(ev, RunFinished):
                records.append(ev.record)
            elif isinstance(ev, Decisions) and ev.final:
                final = ev
            elif isinstance(ev, SessionFinished):
                runs = ev.n_ok + ev.n_failed
        from app.core.verdict.judge import judge  # the answer the front ends show

        answer = judge(records, lenient_mix=True) if records else None
    finally:
        done.set()
        sampler.join()
    wall = time.monotonic() - started
    marks = {}
    times = [t for t, _ in samples]
    for frac in (0.1, 0.5, 0.9):
        i = min(len(samples) - 1, bisect.bisect_left(times, frac * wall))
        t, shown = samples[i]
        marks[frac] = (shown, wall - t)
    measured = {r.task for r in records if r.status == "ok"}
    picks = "; ".join(f"{d.task} {'decided' if d.decided else 'undecided'}" + ("" if d.task in measured or d.task == "mix"
                                                                                else " (not measured)")
                      for d in final.tasks) if final is not None else "no decisions"
    if answer is not None:
        picks += "; verdict: " + ", ".join(f"{p.scope or 'mix'} {'on' if p.mtp_on else 'off'}" for s in answer.settings
                                           for p in s.verdict.per_task)
    return {"path": path, "budget": quick_s, "wall": wall, "before": before, "marks": marks, "runs": runs,
            "planned": request.plan.total_runs if request.adaptive is None else None,
            "stopped": final.stopped if final is not None else "?", "answer": picks, "first_run": first_run,
            "waited": sum(waits.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", default="demo,ngram,drafter,own")
    ap.add_argument("--quick", type=float, default=120.0, help="Quick's budget in seconds (default 120)")
    args = ap.parse_args()
    if not SMOL.is_file() and any(p in args.paths for p in ("ngram", "own")):
        raise SystemExit(f"{SMOL}: missing (python benchmarks/real/fetch.py fetches it)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="clock-table-") as tmp:
        for path in args.paths.split(","):
            print(f"{path}: running Quick ...", file=sys.stderr, flush=True)
            rows.append(one(path, args.quick, Path(tmp)))
            r = rows[-1]
            first = "none" if r["first_run"] is None else f"{r['first_run']:.0f} s"
            print(f"  {r['wall']:.0f} s, {r['runs']} runs, stopped: {r['stopped']}; first run at {first}, "
                  f"quiet-moment waits {r['waited']:.0f} s", file=sys.stderr, flush=True)

    def est(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.0f} s"

    print("| path | stated budget | measured (to the answer) | over | runs (planned) | stopped | estimate before "
          "| at 10 %: shown / true | at 50 % | at 90 % | answer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        over = 100 * (r["wall"] / r["budget"] - 1)
        cells = [f"{est(s)} / {t:.0f} s" for s, t in (r["marks"][f] for f in (0.1, 0.5, 0.9))]
        planned = f" ({r['planned']})" if r["planned"] else " (adaptive)"
        print(f"| {r['path']} | {duration(r['budget'])} | {r['wall']:.0f} s | {over:+.0f} % | {r['runs']}{planned} | "
              f"{r['stopped']} | {est(r['before'])} | " + " | ".join(cells) + f" | {r['answer']} |")


if __name__ == "__main__":
    main()
