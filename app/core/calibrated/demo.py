"""The demo: a per-task calibrated model in the per-user cache, its prompts and the sweep settings
that show, within a minute, MTP paying on one task and losing on another."""

from __future__ import annotations

import json
import os
from pathlib import Path

from app.core.common.errors import UserError
from app.core.common.paths import cache_dir
from app.core.calibrated.design import SIZES
from app.core.calibrated.gguf import make_model
from app.core.machine.gguf_info import read_header
from app.core.records.prompt import Prompt

# The demo: per-task shares of wrong drafts, so code pays, story loses and tongue-twisters sit
# near break-even (sized in benchmarks/demo_story.py on a 2-core CPU).
DEMO_TASK_P = {"code": 0.05, "tongue-twister": 0.4, "story": 0.9}
DEMO_KS, DEMO_TOKENS, DEMO_REPS = "1,2,3", 64, 3  # the demo sweep, one prompt per task: within a minute
DEMO_SIZE_ENV = "MTP_TUNER_DEMO_SIZE"  # "tiny" makes the demo model small (the GUI unit tests)


def demo_model(size: str | None = None) -> Path:
    """The demo's per-task calibrated model in the per-user cache (made once, deterministic)."""
    size = size or os.environ.get(DEMO_SIZE_ENV) or "demo"
    if size not in SIZES:
        raise UserError(f"{DEMO_SIZE_ENV}: the demo size must be one of {', '.join(SIZES)}, got {size!r}")
    tag = "-".join(f"{t}{p:g}" for t, p in DEMO_TASK_P.items())
    path = cache_dir() / "models" / f"calibrated-{size}-embedding-{tag}.gguf"
    if not path.exists():
        make_model(path, 0.0, "embedding", size, 0, task_p=DEMO_TASK_P)
    return path


def demo_prompts(path: str | os.PathLike[str]) -> list[Prompt] | None:
    """The demo prompts a per-task calibrated model carries (as Prompt objects), or None."""
    try:
        kv = read_header(path).metadata
    except UserError:
        return None
    raw = kv.get("synthetic.demo_prompts")
    if not raw:
        return None
    return [Prompt(d["id"], d["task"], d["text"], d.get("lang", "")) for d in json.loads(raw)]
