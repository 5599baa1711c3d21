"""Real models, a hand A/B beside every verdict (issue 55 item 2): for each real subject and task,
the product's own sweep beside an independent A/B that uses no project measuring code.

- The product: run_sweep through ServerEngine (its clock, pairing and analysis), per task and arm
  the paired speedup with its 95 % interval and the pooled acceptance.
- By hand: llama-server started here with plain flags (-m, -md, --spec-type, --spec-draft-n-max),
  the same built-in prompts sent to /v1/chat/completions (greedy), and llama-server's own
  ``timings`` read: decode tok/s (predicted_per_second) and the whole answer's (predicted tokens
  over prompt and decode time, the drafter's prompt processing inside). Paired rounds: each round
  sends every prompt to the baseline and the arm back to back, the order alternating by round;
  the speedup is the median of the rounds' ratios.

Subjects (benchmarks/real/fetch.py fetches them): the Qwen2.5-Coder 1.5B target with its 0.5B
drafter (draft-simple, K=1..6); the 1.5B and SmolLM2-135M with ngram-simple, ngram-mod and (the
1.5B) draft-simple+ngram-mod. ``--quick`` runs a subset (the pair at K=2 and 4, one prompt per task,
2 rounds) in under 10 minutes on 2 cores.

A timing measurement: run it on a quiet machine (2 threads, nothing else running).

    python benchmarks/real_models.py --quick
    python benchmarks/real_models.py --subjects smollm2 --tasks code,story --quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.analysis.analysis import analyze  # noqa: E402
from app.core.engines.server.binary import find_server_binary, group_kwargs, kill_group  # noqa: E402
from app.core.engines.server.engine import ServerEngine  # noqa: E402
from app.core.measure.plan import Plan, make_arms  # noqa: E402
from app.core.measure.prompts import select_prompts  # noqa: E402
from app.core.measure.runner import run_sweep  # noqa: E402
from app.core.records.arm import Arm  # noqa: E402
from app.core.records.writer import ResultsWriter  # noqa: E402
from app.core.session.events import RunFinished, SweepError, SweepWarning  # noqa: E402
from benchmarks.real.fetch import fetch  # noqa: E402

TASKS = ("code", "story", "edit", "tongue-twister")
AGREE_SPEEDUP, AGREE_ACCEPTANCE = 0.05, 0.01  # the bar: within 5 %, acceptance within 1 point


def subjects(quick: bool, which: list[str]) -> list[tuple[str, str, list[Arm]]]:
    """(name, target GGUF, arms without the baseline) of each subject asked for."""
    out = []
    if "pair" in which or "qwen-1.5b" in which:
        target, drafter = str(fetch("qwen-1.5b")), str(fetch("qwen-0.5b"))
        if "pair" in which:
            ks = (2, 4) if quick else range(1, 7)
            out.append(("1.5B+0.5B", target, [a for a in make_arms(ks, modes=("draft-simple",),
                                                                     drafters={"draft-simple": drafter})
                                              if a.is_spec]))
        if "qwen-1.5b" in which:
            modes = ("ngram-mod",) if quick else ("ngram-simple", "ngram-mod", "draft-simple+ngram-mod")
            out.append(("1.5B n-gram", target, [a for a in make_arms((4,), modes=modes, drafters={
                m: drafter for m in modes if m.startswith("draft-simple")})
                                                if a.is_spec]))
    if "smollm2" in which:
        modes = ("ngram-mod",) if quick else ("ngram-simple", "ngram-mod")
        out.append(("SmolLM2", str(fetch("smollm2")), [a for a in make_arms((), modes=modes) if a.is_spec]))
    return out


# -- the product ------------------------------------------------------------------------------

def product(model: str, arms: list[Arm], task: str, per_task: int, rounds: int, n_predict: int,
            threads: int, binary: str, writer: ResultsWriter | None = None,
            ) -> dict[Arm, tuple[float | None, float | None, float | None, float | None]]:
    """{arm: (speedup, lo, hi, acceptance)} of the product's sweep on one task (each run also to
    ``writer``, as it is measured: benchmarks/real_k.py --runs reads the pair's)."""
    plan = Plan(model=model, arms=(Arm(), *arms), prompts=tuple(select_prompts([task], per_task=per_task)),
                n_predict=n_predict, reps=rounds, warmup=1)
    recs = []
    with ServerEngine(binary, ctx_size=4096, threads=threads) as eng:
        for e in run_sweep(plan, eng, writer):
            if isinstance(e, RunFinished):
                recs.append(e.record)
            elif isinstance(e, (SweepWarning, SweepError)):
                print(f"  product: {e.message}", file=sys.stderr)
    a = analyze(recs)
    out = {}
    for arm in arms:
        c = a.cell(task, arm)
        r = c.ratio if c else None
        out[arm] = (r.estimate if r else None, r.lo if r else None, r.hi if r else None, c.acceptance if c else None)
    return out


# -- by hand: plain llama-server, its own timings -----------------------------------------------

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flags(arm: Arm) -> list[str]:
    if arm.is_baseline:
        return []
    out = ["--spec-type", arm.mode.replace("+", ",")]
    if arm.drafter:
        out += ["-md", arm.drafter]
    if arm.k:
        out += ["--spec-draft-n-max", str(arm.k)]
    return out


@contextlib.contextmanager
def plain_server(binary: str, model: str, arm: Arm, threads: int):
    port = _port()
    cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-c", "4096",
           "--parallel", "1", *flags(arm)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            **group_kwargs())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited ({proc.returncode}): {' '.join(cmd)}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            if time.monotonic() > deadline:
                raise SystemExit(f"llama-server not ready: {' '.join(cmd)}")
            time.sleep(0.2)
        yield url
    finally:
        kill_group(proc)
        proc.wait(20)


def ask(url: str, text: str, n_predict: int) -> dict:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": n_predict, "temperature": 0.0,
            "cache_prompt": False}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["timings"]


def whole(t: dict) -> float:
    return t["predicted_n"] / ((t["prompt_ms"] + t["predicted_ms"]) / 1000.0)


def by_hand(binary: str, model: str, arm: Arm, task: str, per_task: int, rounds: int, n_predict: int,
            threads: int) -> tuple[float, float, float | None]:
    """(decode speedup, whole-answer speedup, acceptance): medians of the paired rounds' ratios."""
    prompts = [q.text for q in select_prompts([task], per_task=per_task)]
    dec, wh, drafted, accepted = [], [], 0, 0
    with plain_server(binary, model, Arm(), threads) as base, plain_server(binary, model, arm, threads) as spec:
        for text in prompts:  # warm both
            ask(base, text, 8), ask(spec, text, 8)
        for r in range(rounds):
            for text in prompts:
                if r % 2:
                    s = ask(spec, text, n_predict)
                    b = ask(base, text, n_predict)
                else:
                    b = ask(base, text, n_predict)
                    s = ask(spec, text, n_predict)
                dec.append(s["predicted_per_second"] / b["predicted_per_second"])
                wh.append(whole(s) / whole(b))
                drafted += s.get("draft_n", 0)
                accepted += s.get("draft_n_accepted", 0)
    return statistics.median(dec), statistics.median(wh), (accepted / drafted if drafted else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a subset in under 10 minutes")
    ap.add_argument("--subjects", default="pair,qwen-1.5b,smollm2", help="pair, qwen-1.5b, smollm2")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--rounds", type=int, help="repetitions and A/B rounds (default 5; --quick 2)")
    ap.add_argument("--per-task", type=int, help="prompts per task (default 2; --quick 1)")
    ap.add_argument("--server-bin", help="llama-server (default: the app's choice)")
    ap.add_argument("--out", help="also write the product's runs to this results file (real_k.py --runs reads it)")
    a = ap.parse_args()
    rounds = a.rounds or (2 if a.quick else 5)
    per_task = a.per_task or (1 if a.quick else 2)
    binary = find_server_binary(a.server_bin)
    with (ResultsWriter(a.out) if a.out else contextlib.nullcontext()) as writer:
        compare(a, binary, rounds, per_task, writer)


def compare(a: argparse.Namespace, binary: str, rounds: int, per_task: int, writer: ResultsWriter | None) -> None:
    """The table per subject and task: the product's sweep, then the hand A/B of each arm."""
    for name, model, arms in subjects(a.quick, a.subjects.split(",")):
        for task in a.tasks.split(","):
            t0 = time.monotonic()
            mine = product(model, arms, task, per_task, rounds, a.n_predict, a.threads, binary, writer)
            print(f"\n{name}, {task} ({per_task} prompt(s), {rounds} rounds, {a.n_predict} tokens, "
                  f"{a.threads} threads)")
            print("| arm | product | acceptance | by hand (decode) | by hand (whole answer) | acceptance | agree |")
            print("|---|---|---|---|---|---|---|")
            for arm in arms:
                est, lo, hi, acc = mine[arm]
                dec, wh, hacc = by_hand(binary, model, arm, task, per_task, rounds, a.n_predict, a.threads)
                agree = (est is not None and abs(est / dec - 1) <= AGREE_SPEEDUP
                         and (acc is None) == (hacc is None)
                         and (acc is None or hacc is None or abs(acc - hacc) <= AGREE_ACCEPTANCE))
                pct = (lambda x: "-" if x is None else f"{100 * x:.0f} %")
                ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
                print(f"| {arm.label} | {'-' if est is None else f'{est:.2f}x'}{ci} | {pct(acc)} | {dec:.2f}x | "
                      f"{wh:.2f}x | {pct(hacc)} | {'yes' if agree else 'NO'} |", flush=True)
            print(f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
