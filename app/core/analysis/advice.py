"""A finding's advice as data: its words, and the settings it names (``Setting``: which, and the
value to give it). The core says a setting in the CLI's words (``CLI_WORDS``: results files,
reports, JSON and the terminal); the window says it in its own (app.gui.words), from the same
parts: no front end rewrites another's text.

    Advice(("run more repetitions (", Setting(REPS, "3"), ")"))
    say(advice, CLI_WORDS)  # "run more repetitions (--reps 3 or more)"
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

# the settings advice names, each said by CLI_WORDS here and by the window's table (app.gui.words)
REPS, WARMUP, N_PREDICT, GREEDY = "reps", "warmup", "n_predict", "greedy"
GPU_LAYERS, ALL_LAYERS, SELFTEST = "gpu_layers", "all_layers", "selftest"
SERVER_ENGINE, RUNTIME, RESUME = "server_engine", "runtime", "resume"
CTX_SIZE, MEMORY_LIMIT = "ctx_size", "memory_limit"

CLI_WORDS: Mapping[str, str] = {
    REPS: "--reps {value} or more",
    WARMUP: "--warmup {value} or more",
    N_PREDICT: "use --n-predict {value} or more",
    GREEDY: "--temperatures 0,... or --sampler greedy",
    GPU_LAYERS: "raise -ngl, or use --n-cpu-moe for MoE models",
    ALL_LAYERS: "-ngl all, or at least -ngl {value}",
    SELFTEST: "run mtp-tuner selftest",
    SERVER_ENGINE: "--engine server --server-bin",
    RUNTIME: "mtp-tuner runtime install gets one",
    RESUME: "mtp-tuner bench --resume RESULTS",
    CTX_SIZE: "--ctx-size",
    MEMORY_LIMIT: "--memory-limit",
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """A setting the advice names (a key of CLI_WORDS) and the value it advises ("" for none)."""

    key: str
    value: str = ""


@dataclasses.dataclass(frozen=True)
class Advice:
    """Advice in parts: plain words, and the settings it names, in order."""

    parts: tuple[str | Setting, ...]


def say(advice: str | Advice, words: Mapping[str, str]) -> str:
    """The advice in one front end's words (``words``: each setting's wording, "{value}" where its
    value goes); plain advice as it is."""
    if isinstance(advice, str):
        return advice
    return "".join(p if isinstance(p, str) else words[p.key].format(value=p.value) for p in advice.parts)


def cli_words(advice: str | Advice) -> str:
    """The advice as the CLI (and every file the core writes) says it."""
    return say(advice, CLI_WORDS)
