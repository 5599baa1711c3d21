"""The edit task's two clocks (issue 55 item 3): the same requests read by every clock at once.

On the real pair (Qwen2.5-Coder 1.5B target, its 0.5B as draft-simple drafter, K=4 by default), the
built-in prompts of a task are sent through the product's own engine (ServerEngine: llama-server,
streamed, every token stamped as it arrives) in tightly paired rounds: each round sends every prompt
to the baseline and to the drafting arm back to back, the order alternating by round (ABBA). Each
request is read four ways:

- product decode: the product's tok/s (RunRecord.tok_s): tokens after the first over the time from
  the first token's arrival to the last's, on this side of the socket;
- server decode: llama-server's own ``predicted_per_second`` (its n_gen - 1 steps over the span
  from the first token's sampling to the last's);
- whole answer: every token over the time from the request to the last token (prompt processing,
  the drafter's own prefill included, and the first token);
- the prompt: llama-server's ``prompt_ms`` for each arm (the drafter's prefill is inside the
  drafting arm's: llama-server runs every target batch through draft-simple's context before it
  samples the first token, common_speculative_process in server-context.cpp).

The speedup of each clock is the median of the rounds' paired ratios. A timing measurement: run it
on a quiet machine (2 threads, nothing else running); on a loaded one, read the mechanism (the
prompt times, which clocks move together), not a 5 % figure.

    python benchmarks/real_clocks.py --task edit --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.common.cancel import CancelToken  # noqa: E402
from app.core.engines.base import Generation  # noqa: E402
from app.core.engines.server.engine import ServerEngine  # noqa: E402
from app.core.measure.plan import make_arms  # noqa: E402
from app.core.measure.prompts import select_prompts  # noqa: E402
from app.core.records.arm import Arm  # noqa: E402
from app.core.records.sampler import greedy  # noqa: E402
from benchmarks.real.fetch import fetch  # noqa: E402


def generate(eng: ServerEngine, model: str, arm: Arm, text: str, n_predict: int) -> Generation:
    gen = eng.generate(model, arm, text, raw=False, n_predict=n_predict, sampler=greedy(0),
                       cancel=CancelToken())
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            result: Generation = stop.value
            return result


def clocks(g: Generation) -> dict[str, Any]:
    t = g.token_times
    return {"decode": g.decode_tok_s, "server": g.engine_tok_s,
            "whole": len(t) / t[-1] if t and t[-1] > 0 else None,
            "prompt_ms": g.prompt_ms, "first_s": t[0] if t else None, "n": len(t), "prompt_n": g.prompt_n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="edit")
    ap.add_argument("--per-task", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--model", help="target GGUF (default: the fetched Qwen2.5-Coder 1.5B)")
    ap.add_argument("--drafter", help="drafter GGUF (default: the fetched Qwen2.5-Coder 0.5B); the target's own "
                    "file makes the drafter's prefill as long as the target's")
    a = ap.parse_args()
    target = a.model or str(fetch("qwen-1.5b"))
    drafter = a.drafter or str(fetch("qwen-0.5b"))
    spec = next(x for x in make_arms((a.k,), modes=("draft-simple",), drafters={"draft-simple": drafter})
                if x.is_spec)
    base = Arm()
    prompts = select_prompts([a.task], per_task=a.per_task)
    ratios: dict[str, list[float]] = {"decode": [], "server": [], "whole": []}
    prompt_ms: dict[str, list[float]] = {"base": [], "spec": []}
    t0 = time.monotonic()
    with ServerEngine(ctx_size=4096, threads=a.threads) as eng:
        for q in prompts:  # warm both servers
            generate(eng, target, base, q.text, 8), generate(eng, target, spec, q.text, 8)
        print("| round | prompt | prompt tokens | arm | tokens | product decode | server decode | whole answer "
              "| prompt ms | first token s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in range(a.rounds):
            for q in prompts:
                order = (base, spec) if r % 2 == 0 else (spec, base)
                got = {arm: clocks(generate(eng, target, arm, q.text, a.n_predict)) for arm in order}
                for arm in (base, spec):
                    c = got[arm]
                    print(f"| {r} | {q.id} | {c['prompt_n']} | {'draft-simple' if arm.is_spec else 'baseline'} | "
                          f"{c['n']} | {c['decode']:.2f} | {c['server']:.2f} | {c['whole']:.2f} | "
                          f"{c['prompt_ms']:.0f} | {c['first_s']:.3f} |", flush=True)
                for key in ratios:
                    if got[spec][key] and got[base][key]:
                        ratios[key].append(got[spec][key] / got[base][key])
                prompt_ms["base"].append(got[base]["prompt_ms"])
                prompt_ms["spec"].append(got[spec]["prompt_ms"])
    print(f"\n{a.task}, {len(prompts)} prompt(s) x {a.rounds} paired rounds, K={a.k}, {a.threads} threads, "
          f"{a.n_predict} tokens ({time.monotonic() - t0:.0f} s)")
    for key, label in (("decode", "product decode"), ("server", "llama-server predicted_per_second"),
                       ("whole", "whole answer (request to last token)")):
        v = ratios[key]
        print(f"  {label}: median {statistics.median(v):.3f}x (min {min(v):.3f}, max {max(v):.3f}, n {len(v)})")
    d = [x / y for x, y in zip(ratios["decode"], ratios["server"])]
    print(f"  product decode / server decode, per pair: median {statistics.median(d):.3f} "
          f"(min {min(d):.3f}, max {max(d):.3f})")
    print(f"  prompt_ms median: baseline {statistics.median(prompt_ms['base']):.0f}, "
          f"draft-simple {statistics.median(prompt_ms['spec']):.0f} (the drafter's prefill inside)")


if __name__ == "__main__":
    main()
