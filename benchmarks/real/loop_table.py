"""The loop warning on real output (issue 55 item 7): each real subject's greedy answers to the
built-in prompts, through llama-server, and whether the repetition check (app.core.analysis.
repetition) warns per task. Generation, not timing: a busy machine gives the same table.

    python benchmarks/real/loop_table.py                      # all subjects, 96 tokens
    python benchmarks/real/loop_table.py --models smollm2 --out outputs.json
    python benchmarks/real/loop_table.py --outputs outputs.json  # the table of an earlier run

The instruct models get their chat template; Gemma 3 270M base (the test extra's GGUF) has none,
so its prompts go as plain text, as a sweep sends them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.core.analysis.repetition import distinct_share, looping_prompts, repeating_shares  # noqa: E402
from app.core.common.cancel import CancelToken  # noqa: E402
from app.core.engines.server.engine import ServerEngine  # noqa: E402
from app.core.measure.prompts import BUILTIN_TASKS, builtin_prompts  # noqa: E402
from app.core.records.arm import Arm  # noqa: E402
from app.core.records.sampler import greedy  # noqa: E402
from benchmarks.real.fetch import fetch  # noqa: E402

SUBJECTS = ("smollm2", "qwen-0.5b", "qwen-1.5b", "gemma3-base")


def model_path(name: str) -> tuple[Path, bool]:
    """The subject's GGUF and whether its prompts go raw (no chat template)."""
    if name == "gemma3-base":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from real_ngram import gemma_model  # the test extra's Gemma 3 270M, assembled once

        return gemma_model(), True
    return fetch(name), False


def generate(eng: ServerEngine, model: Path, text: str, raw: bool, n_predict: int) -> list[int]:
    g = eng.generate(str(model), Arm(), text, raw=raw, n_predict=n_predict, sampler=greedy(1), cancel=CancelToken())
    while True:
        try:
            next(g)
        except StopIteration as stop:
            return list(stop.value.tokens)


def table(outputs: dict[str, dict[str, dict[str, list[int]]]]) -> None:
    """Per model and task: the prompts whose answer loops, the task's median distinct share, warned or not."""
    tasks = [t for t in BUILTIN_TASKS if any(t in o for o in outputs.values())]
    print("| model | " + " | ".join(tasks) + " |")
    print("|---|" + "---|" * len(tasks))
    for model, by_task in outputs.items():
        cells = []
        for t in tasks:
            runs = [(t, p, toks) for p, toks in by_task.get(t, {}).items()]
            if not runs:
                cells.append("-")
                continue
            loops = looping_prompts(runs).get(t, [])
            warned = t in repeating_shares(runs)
            judged = sum(1 for _, _, toks in runs if distinct_share(toks) is not None)
            cells.append(f"{'**warned**' if warned else 'silent'} ({len(loops)}/{judged} prompts loop)")
        print(f"| {model} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(SUBJECTS))
    ap.add_argument("--tasks", default=",".join(BUILTIN_TASKS))
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the generated tokens here (JSON)")
    ap.add_argument("--outputs", nargs="+", help="only print the table of earlier --out files (merged)")
    a = ap.parse_args()
    if a.outputs:
        merged: dict[str, dict[str, dict[str, list[int]]]] = {}
        for f in a.outputs:
            for model, by_task in json.loads(Path(f).read_text()).items():
                for task, by_prompt in by_task.items():
                    merged.setdefault(model, {}).setdefault(task, {}).update(by_prompt)
        table(merged)
        return
    outputs: dict[str, dict[str, dict[str, list[int]]]] = {}
    prompts = builtin_prompts(a.tasks.split(","))
    for name in a.models.split(","):
        model, raw = model_path(name)
        with ServerEngine(None, ctx_size=2048, threads=a.threads) as eng:
            for q in prompts:
                toks = generate(eng, model, q.text, raw, a.n_predict)
                outputs.setdefault(name, {}).setdefault(q.task, {})[q.id] = toks
                print(f"{name} {q.task}/{q.id}: {len(toks)} tokens, distinct share {distinct_share(toks)}",
                      file=sys.stderr, flush=True)
                if a.out:  # after each answer: a run cut short keeps what it generated
                    Path(a.out).write_text(json.dumps(outputs))
    table(outputs)


if __name__ == "__main__":
    main()
