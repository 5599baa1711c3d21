"""The pre-flight: what a sweep reads and checks before its first run.

``read_model`` reads the model once (its header, its summary, its size) and refuses a file that
cannot run as a model; a session reads it once and hands it to every ``run_sweep`` it starts (an
adaptive sweep runs one per step), so the header is not read again per step. ``preflight`` then
settles the plan against the model and the engine: the speculative arms that cannot run are
dropped (one error per cause), a model without a chat template is prompted raw, and thinking
settings the prompts cannot switch are measured once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from app.core.common.errors import MtpUnavailable, UserError
from app.core.common.spec_modes import MTP, is_combined, parts
from app.core.engines.base import Engine
from app.core.engines.chat_template import supports_thinking, thinking_label
from app.core.machine import gguf_info, modelinfo
from app.core.measure.plan import Plan
from app.core.records.arm import Arm


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What a sweep reads of its model file, once per session."""

    path: str
    header: gguf_info.GGUFHeader  # the first part's
    info: modelinfo.ModelInfo
    size: int  # bytes, every split part that exists


def read_model(model: str) -> ModelFacts:
    """Read ``model`` once. A file that is missing or broken raises ModelFileError; a drafter file
    (a Gemma 4 assistant, an MTP-only head...) given as the model raises one clear UserError
    (llama.cpp would fail every run, e.g. "Gemma4Assistant requires ctx_other to be set")."""
    hdr = gguf_info.check_gguf_file(model)
    info = modelinfo.inspect(model, header=hdr)
    if info.drafter_kind:
        raise UserError(f"{model}: a {info.drafter_kind} drafter, not a model to run: give its target model as the "
                        "model and this file as its drafter (--drafter / the Model tab's Drafter)")
    size = sum(p.stat().st_size for p in gguf_info.split_parts(model) if p.exists())
    return ModelFacts(model, hdr, info, size)


@dataclasses.dataclass(frozen=True)
class Preflight:
    """The plan as it will run, and what the pre-flight has to say about it."""

    plan: Plan  # only the arms that can run (none left: UserError, Plan's own check); raw and thinking settled
    errors: tuple[str, ...]  # one per cause of dropped arms
    warnings: tuple[str, ...]  # the plan was changed to fit the model (raw prompts, one thinking setting)
    drafters: dict[str, dict[str, Any]]  # the drafters by path, as records keep them


def preflight(plan: Plan, engine: Engine, model: ModelFacts | None = None) -> Preflight:
    """Check ``plan`` against its model (``model``: read once by the session; read here when
    None) and ``engine`` before anything starts. A speculative arm that cannot run is dropped
    with one error per cause (the baseline still runs): draft-mtp on a model without MTP heads, a
    mode the engine cannot run, a drafter that does not pair with the model (missing, another
    vocabulary, the wrong width, not a drafter)."""
    facts = model if model is not None else read_model(plan.model)
    arms = _Arms(plan.model, engine, facts.header)
    runnable = tuple(a for a in plan.arms if not a.is_spec or arms.problem_of(a) is None)
    if runnable != plan.arms:
        plan = dataclasses.replace(plan, arms=runnable)
    warnings = []
    meta = facts.header.metadata
    if not plan.raw and not meta.get("tokenizer.chat_template"):
        plan = dataclasses.replace(plan, raw=True)
        warnings.append(f"{plan.model}: the model has no chat template; prompts are sent as plain text (as with --raw)")
    asked = [t for t in plan.thinking if t is not None]
    if asked and (plan.raw or not supports_thinking(meta.get("tokenizer.chat_template"))):
        plan = dataclasses.replace(plan, thinking=(None,))  # nothing to switch: one setting, not the same runs twice
        warnings.append(f"thinking {'/'.join(map(thinking_label, asked))}: no thinking switch (enable_thinking) "
                        f"in {'raw prompts' if plan.raw else 'the chat template'}; measured as it is")
    return Preflight(plan, tuple(arms.errors), tuple(warnings), arms.drafters)


class _Arms:
    """Why each speculative arm cannot run (None: it can), worked out once per cause."""

    def __init__(self, model: str, engine: Engine, header: gguf_info.GGUFHeader) -> None:
        self.model, self.engine, self.header = model, engine, header
        self.errors: list[str] = []
        self.drafters: dict[str, dict[str, Any]] = {}
        self.problems: dict[tuple[str, str | None, str | None], str | None] = {}

    def problem_of(self, arm: Arm) -> str | None:
        key = (arm.mode, arm.drafter, arm.draft_sampling)
        if key in self.problems:
            return self.problems[key]
        if arm.probabilistic:  # the mode first (one error for it), then this engine's draft sampling
            problem = self.problem_of(dataclasses.replace(arm, draft_sampling=None))
            if problem is None and (problem := self.engine.mode_problem(arm)):
                problem = f"probabilistic draft sampling arms skipped: {problem}"
                self.errors.append(problem)
            self.problems[key] = problem
            return problem
        problem = self._mode_problem(arm)
        self.problems[key] = problem
        if problem:
            self.errors.append(problem)
        return problem

    def _mode_problem(self, arm: Arm) -> str | None:
        problem = self.engine.mode_problem(arm)
        if arm.own_heads:  # the model's own heads
            if problem is None:
                problem = self.header.mtp_problem()
            if problem is None:
                try:
                    self.engine.check_mtp()
                except MtpUnavailable as e:
                    problem = str(e)
            return problem and f"MTP unavailable, MTP arms skipped: {problem}"
        if problem is None and is_combined(arm.mode) and MTP in parts(arm.mode) and not arm.drafter:
            problem = self.header.mtp_problem()  # llama-server would exit at start without the heads
        if problem is not None:
            return f"{arm.mode} arms skipped: {problem}"
        if arm.drafter:
            from app.core.machine import drafter as drafter_mod  # deferred: only sweeps with a drafter read it

            try:
                paired = drafter_mod.check_pair(self.model, arm.drafter, arm.mode)
                assert paired is not None  # a drafter was given: a summary of it, or an error
                self.drafters[arm.drafter] = paired.record()
            except UserError as e:
                return f"{arm.mode} arms skipped: {e}"
        return None
