"""The check of a model before a sweep starts, read from its header (not the weights): can it be
swept at all (a GGUF the engines run, not a drafter), does it carry MTP heads, its demo prompts (the
demo model), and a catalog build with MTP heads for one that has none. The Sweep tab's form shows
it (Start disabled, the reason beside it); the sweep service refuses a model that fails it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from app.core.common.errors import UserError
from app.core.records.prompt import Prompt


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    """What is known of the model before Start: ``problem`` (it cannot be swept at all: Start is
    disabled, this is why), ``no_mtp`` (why draft-mtp cannot run on its own heads; the n-gram modes
    still can), its demo prompts (a demo model), and a catalog repo with MTP heads that looks like
    the same model."""

    path: str
    problem: str | None = None
    no_mtp: str | None = None
    demo: tuple[Prompt, ...] = ()
    mtp_build: str | None = None


def check_model(path: str) -> ModelCheck:
    """Read the model's header (not the weights) once: is it a GGUF the sweep can run, and does it
    carry MTP heads."""
    if not path:
        return ModelCheck(path, problem="no model chosen: choose one on the Model tab (or the demo model)")
    from app.core.machine import gguf_info, modelinfo  # the GGUF reader: when a model is chosen

    try:
        hdr = gguf_info.check_gguf_file(path)
        kind = modelinfo.inspect(path, header=hdr).drafter_kind
    except UserError as e:
        return ModelCheck(path, problem=str(e))
    if kind:
        return ModelCheck(path, problem=f"{path}: a {kind} drafter, not a model to run: choose its target model "
                                        "on the Model tab and this file as its drafter")
    demo: tuple[Prompt, ...] = ()
    if hdr.metadata.get("synthetic.demo_prompts"):
        from app.core.calibrated.demo import demo_prompts  # numpy: a demo model only

        demo = tuple(demo_prompts(path) or ())
    why = hdr.mtp_problem()
    no_mtp = None
    if why is not None:
        why = why.removeprefix(f"{hdr.path}: ").removeprefix(f"{path}: ")
        no_mtp = why
    return ModelCheck(path, no_mtp=no_mtp, demo=demo, mtp_build=mtp_build_for(path) if no_mtp else None)


def mtp_build_for(path: str) -> str | None:
    """A catalog repo with MTP heads (an -MTP- build) whose name matches this file's, else None."""
    from app.core.machine.hub import load_catalog  # the catalog: read when a model lacks MTP heads

    try:
        catalog = load_catalog()
    except UserError:
        return None
    stem = re.sub(r"[-_.]mtp\b", "", Path(path).name.lower())
    for e in catalog:
        name = e.repo.split("/", 1)[-1]
        if "-mtp-" not in name.lower() + "-":
            continue
        core = re.sub(r"-(mtp|gguf)\b", "", name.lower())
        if core and core in stem:
            return e.repo
    return None
