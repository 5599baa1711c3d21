"""A sweep plan: model, engine, arms (baseline, and each speculative mode at each K and p_min),
prompts, settings."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from app.core.common.errors import UserError
from app.core.common.text import shown as shown_text
from app.core.engines.base import EngineKind
from app.core.measure.depth import MAX_DEPTH
from app.core.measure.prompts import builtin_prompts, load_prompt_file, user_prompts
from app.core.common.spec_modes import SPEC_TYPES, canonical, combination_problem, is_combined, needs_drafter
from app.core.records.arm import (BASELINE, DRAFT_SAMPLINGS, GREEDY_DRAFT, MODE_NAME, MTP, Arm, arm_from_fields,
                                  takes_k)
from app.core.records.prompt import Prompt
from app.core.records.sampler import GREEDY, Sampler
from app.core.records.schema import RunRecord
from app.core.records.shape import SweepShape


# How a front end names the settings a plan's errors point the user to, keyed "drafter" (a
# mode's drafter file; "{mode}" in it stands for the mode), "model" (the model file) and
# "prompts" (the user's prompt file): the CLI passes its flags (app.cli.common.PLAN_NAMES);
# without a name the message says what is wrong in plain words and points nowhere.
Names = Mapping[str, str]

MAX_K = 64  # the widest draft a sweep measures
MAX_REPS = 1000  # repetitions of one sweep (a repetition index from a file is below it)
MAX_TOKENS = MAX_DEPTH  # tokens generated per run, as a context depth: what one context can hold
MAX_RUNS = 1_000_000  # runs one plan lists (repetitions x prompts x settings x arms)


def make_arms(ks: Iterable[int], p_mins: Iterable[float] = (0.0,), baseline: bool = True,
              modes: Iterable[str] = (MTP,), drafters: Mapping[str, str] | None = None,
              names: Names | None = None, draft_samplings: Iterable[str] = (GREEDY_DRAFT,)) -> tuple[Arm, ...]:
    """The baseline (``baseline``), then for each mode its arms: a draft mode (draft-*) at every
    K, p_min and draft sampling (greedy, probabilistic), with ``drafters[mode]`` as its drafter
    file when given; an n-gram mode once; a combined mode (``draft-mtp+ngram-mod``) as its draft-*
    part, else once. ``names``: how the caller names the settings its errors point to (see Names)."""
    arms: list[Arm] = [Arm()] if baseline else []
    ks = list(ks)
    p_mins = list(p_mins)
    for mode in modes:
        problem = combination_problem(mode) if is_combined(mode) and MODE_NAME.fullmatch(mode) else None
        if problem:
            raise UserError(problem)
    modes = list(dict.fromkeys(canonical(m) for m in modes))
    drafters = {canonical(m): path for m, path in (drafters or {}).items()}
    for k in ks:
        if k < 1 or k > MAX_K:
            raise UserError(f"draft width K must be between 1 and {MAX_K}, got {k}")
    for p in p_mins:
        if not 0.0 <= p <= 1.0:
            raise UserError(f"p_min must be between 0 and 1, got {p}")
    samplings = list(dict.fromkeys(draft_samplings)) or [GREEDY_DRAFT]
    for d in samplings:
        if d not in DRAFT_SAMPLINGS:
            raise UserError(f"draft sampling {d!r}: use {' or '.join(DRAFT_SAMPLINGS)}")
    for mode in modes:
        if mode == BASELINE or not MODE_NAME.fullmatch(mode):
            raise UserError(f"{mode!r} is not a speculative mode; use one of {', '.join(SPEC_TYPES[1:])} "
                            "(or another name your llama-server lists for --spec-type), or a combination like "
                            "draft-mtp+ngram-mod")
        if needs_drafter(mode) and not drafters.get(mode):
            raise UserError(f"{mode} needs a drafter model" + _give("one", "drafter", names, mode))
    for mode, path in drafters.items():
        if mode not in modes:
            raise UserError(f"a drafter was given for {mode}, which is not among the modes ({', '.join(modes)})")
        if not takes_k(mode):
            raise UserError(f"{mode} drafts from the text itself and takes no drafter model")
    for mode in modes:
        if not takes_k(mode):
            arms.append(Arm(mode=mode))
            continue
        for d in samplings:
            for p in p_mins:
                for k in ks:
                    arms.append(Arm(k, float(p), mode, drafters.get(mode), d))
    return tuple(dict.fromkeys(arms))


BASELINE_EVERY = 4


@dataclasses.dataclass(frozen=True)
class Plan:
    model: str
    arms: tuple[Arm, ...]
    prompts: tuple[Prompt, ...]
    engine: EngineKind = EngineKind.SERVER  # given as text too ("inprocess", "server")
    n_predict: int = 128
    reps: int = 3
    warmup: int = 1
    temperature: float = 0.0  # the first sampler's, for callers that set only these two
    seed: int = 42
    raw: bool = False
    ignore_eos: bool = False
    rep_start: int = 0  # first repetition index (adaptive sweeps add repetitions in rounds)
    # the sampler settings (a temperature axis has several); none given: one from temperature/seed
    samplers: tuple[Sampler, ...] = ()
    # the chat template's thinking switch (None: the template's default) and the context depths
    # (tokens of neutral context before each prompt): axes like the samplers, every combination run
    thinking: tuple[bool | None, ...] = (None,)
    depths: tuple[int, ...] = (0,)
    # arms left out before the sweep, each with its sentence (one that would not fit in memory:
    # app.core.session.memory); the run warns of them and its records name them (host "left_out")
    left_out: tuple[str, ...] = ()
    # a sequential sweep's δ of "no gain worth having" (adaptive, until decided), carried into each
    # record (RunRecord.min_gain) so that the file is judged on anytime intervals; None: a plain sweep
    sequential: float | None = None
    # the first repetition goes over the prompts twice: each prompt's baseline and one speculative
    # arm (a drafter's, where there is one) first, then its baseline again and the other arms, so a
    # budget that ends in the first round (Quick, on a slow machine) has measured every task
    spread_first: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UserError(f"temperature must not be negative, got {self.temperature}")
        if not self.samplers:
            object.__setattr__(self, "samplers", (Sampler(temperature=self.temperature, seed=self.seed,
                                                          preset=GREEDY if self.temperature <= 0 else "custom"),))
        object.__setattr__(self, "samplers", tuple(dict.fromkeys(self.samplers)))
        object.__setattr__(self, "temperature", self.samplers[0].temperature)
        object.__setattr__(self, "seed", self.samplers[0].seed)
        object.__setattr__(self, "thinking", tuple(dict.fromkeys(self.thinking)) or (None,))
        object.__setattr__(self, "depths", tuple(dict.fromkeys(int(d) for d in self.depths)) or (0,))
        object.__setattr__(self, "engine", EngineKind.parse(self.engine))
        if any(t not in (None, True, False) for t in self.thinking):
            raise UserError(f"thinking must be on, off or the template's default, got {self.thinking}")
        if min(self.depths) < 0:
            raise UserError(f"context depth must not be negative, got {min(self.depths)}")
        if not self.arms:
            raise UserError("the plan has no arms")
        cold = [s for s in self.samplers if s.temperature <= 0]
        if cold and any(a.probabilistic for a in self.arms):
            raise UserError("probabilistic draft sampling needs temperature > 0 (at temperature 0 the target "
                            "takes its argmax and the draft is verified greedily either way); measure it at "
                            "a temperature above 0 only")
        if not self.prompts:
            raise UserError("the plan has no prompts")
        if self.n_predict < 1:
            raise UserError(f"tokens per run must be at least 1, got {self.n_predict}")
        if self.reps < 1:
            raise UserError(f"repetitions must be at least 1, got {self.reps}")
        if self.warmup < 0:
            raise UserError(f"warmup runs must not be negative, got {self.warmup}")
        settings = len(self.samplers) * len(self.thinking) * len(self.depths)  # counted, not listed
        runs = self.reps * len(self.prompts) * settings * len(self.arms)
        if runs > MAX_RUNS:
            raise UserError(f"the sweep would list {runs:,} runs ({self.reps:,} repetitions of {len(self.prompts):,} "
                            f"prompts at {settings:,} settings with {len(self.arms)} arms); at most {MAX_RUNS:,}")

    @property
    def shape(self) -> SweepShape:
        """What an engine prepares for: the widest K, the thinking settings, the deepest depth."""
        return SweepShape.of(self.arms, self.thinking, self.depths)

    @property
    def total_runs(self) -> int:
        return len(self.runs())

    def settings(self) -> list[tuple[Sampler, bool | None, int]]:
        """Every (sampler, thinking, depth) the sweep measures, in order."""
        return list(itertools.product(self.samplers, self.thinking, self.depths))

    def runs(self, arm_major: bool = False) -> list["RunSpec"]:
        """Measured runs in order. Interleaved by default: for each repetition, prompt and sampler
        setting, every arm back to back (baseline, K1, K2, ...), so drift hits all arms alike and
        each speculative run has a baseline of the same prompt, sampler and seed next to it.
        ``arm_major`` puts each arm's runs together (used only when the engine cannot keep every
        arm ready)."""
        out: list[RunSpec] = []
        if arm_major:
            for arm in self.arms:
                for rep in range(self.rep_start, self.rep_start + self.reps):
                    for prompt in self.prompts:
                        for smp, think, depth in self.settings():
                            out.append(RunSpec(len(out), arm, prompt, rep, smp, think, depth))
        else:
            base = [a for a in self.arms if a.is_baseline]
            mtp = [a for a in self.arms if a.is_spec]

            def groups(arms: list[Arm]) -> list[list[Arm]]:
                """baseline again before every BASELINE_EVERY speculative arms, so that each run has
                a baseline of the same prompt measured moments before it (no arms: the baseline)"""
                return [arms[i:i + BASELINE_EVERY] for i in range(0, max(len(arms), 1), BASELINE_EVERY)]

            passes = [groups(mtp)]  # over the prompts once
            first = passes
            if self.spread_first and len(self.prompts) > 1 and len(mtp) > 1:
                lead = next((a for a in mtp if a.drafter), mtp[0])
                first = [[[lead]], groups([a for a in mtp if a != lead])]
            for rep in range(self.rep_start, self.rep_start + self.reps):
                for chunks in first if rep == self.rep_start else passes:
                    for prompt in self.prompts:
                        for smp, think, depth in self.settings():
                            for chunk in chunks:
                                for arm in base + chunk:
                                    out.append(RunSpec(len(out), arm, prompt, rep, smp, think, depth))
        return out


@dataclasses.dataclass(frozen=True)
class RunSpec:
    index: int
    arm: Arm
    prompt: Prompt
    rep: int
    sampler: Sampler = Sampler(preset=GREEDY)
    thinking: bool | None = None
    depth: int = 0


def check_drafters(plan: Plan) -> None:
    """Check each drafter of the plan against its model (missing file, another vocabulary, the
    wrong width, not a drafter): a UserError of one line, before any engine starts."""
    pairs = dict.fromkeys((a.mode, a.drafter) for a in plan.arms if a.drafter)
    if not pairs:
        return
    from app.core.machine.drafter import check_pair  # deferred: only plans with a drafter read its header

    for mode, drafter in pairs:
        check_pair(plan.model, drafter, mode)


def parse_int_list(text: str, what: str) -> list[int]:
    """``1,2,3`` or ``1-4`` (or both) -> the numbers; a range backwards or nothing at all is an
    error, not an empty list. Digits are ASCII only (int() would read "３" as 3)."""
    try:
        if not text.isascii():
            raise ValueError(text)
        out: list[int] = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise UserError(f"{what}: the range {part!r} runs backwards; did you mean {hi}-{lo}?")
                out.extend(range(lo, hi + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise UserError(f"{what}: expected numbers like 1,2,3 or 1-4, got {text!r}") from None
    if not out:
        raise UserError(f"{what}: no numbers in {text!r}")
    return out


def parse_float_list(text: str, what: str) -> list[float]:
    try:
        if not text.isascii():
            raise ValueError(text)
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what}: expected numbers like 0,0.5, got {text!r}") from None
    if not out:
        raise UserError(f"{what}: no numbers in {text!r}")
    bad = [x for x in out if not math.isfinite(x)]
    if bad:
        raise UserError(f"{what}: {bad[0]} is not a finite number")
    return out


def _give(what: str, key: str, names: Names | None, mode: str = "") -> str:
    """`` (give <what> with <the caller's name for key>)``, or nothing when it names none."""
    name = (names or {}).get(key)
    return f" (give {what} with {name.replace('{mode}', mode)})" if name else ""


def known_prompts(model: str, prompt_file: str | None = None) -> dict[str, Prompt]:
    """Every prompt a sweep of ``model`` may have used, by id: the built-in suites, the prompts a
    demo model carries, the user's saved prompts and ``prompt_file``."""
    from app.core.calibrated.demo import demo_prompts  # deferred: numpy and the GGUF writer

    pool = {q.id: q for q in builtin_prompts()}
    pool.update({q.id: q for q in demo_prompts(model) or ()})
    pool.update({q.id: q for q in user_prompts()})
    if prompt_file:
        pool.update({q.id: q for q in load_prompt_file(prompt_file)})
    return pool


def planned_counts(rec: RunRecord) -> str | None:
    """Why a record's counts cannot be planned again (``--again``, ``--resume``, "Finish when
    quiet"): a repetition, token count, context depth or draft width K beyond what a sweep
    measures; None when they can. For records.reader's ``refuse``: a results file is outside
    text, and a count from it would otherwise size the plan (a repetition of 10^9 is a list of
    billions of runs)."""
    for name, v, lo, hi in (("rep", rec.rep, 0, MAX_REPS - 1), ("n_predict", rec.n_predict, 1, MAX_TOKENS),
                            ("depth", rec.depth, 0, MAX_DEPTH), ("k", rec.k, 1, MAX_K)):
        if v is not None and not lo <= v <= hi:
            return f"{name} is {v}, beyond what a sweep plans ({lo} to {hi})"
    return None


def mixed_problem(records: Sequence[RunRecord], model: str | None = None,
                  engine: EngineKind | str | None = None) -> str | None:
    """Why one sweep's records cannot be planned again as one sweep: they name more than one model
    (unless ``model`` replaces it) or engine (unless ``engine`` is chosen); None when they can.
    The app writes one model and one engine per sweep, so a mix is a file put together by hand."""
    for what, values, given in (("models", {r.model_path for r in records}, model),
                                ("engines", {str(r.engine) for r in records}, engine)):
        if len(values) > 1 and not given:
            shown = ", ".join(sorted(shown_text(v, 80) for v in values)[:3])
            return (f"the sweep {shown_text(records[-1].sweep_id, 40)} mixes {len(values)} {what} ({shown}); "
                    "a sweep is planned again with one model on one engine: it is refused")
    return None


def plan_again(records: Sequence[RunRecord], *, model: str | None = None, prompt_file: str | None = None,
               engine: EngineKind | str | None = None, drafters: Mapping[str, str] | None = None,
               names: Names | None = None) -> Plan:
    """The plan of an earlier sweep, from its results (arms, prompts, tokens per run, repetitions,
    sampling, engine), to run it again, typically after a llama.cpp update, and compare the two.
    ``model`` replaces the sweep's model (another quant), ``drafters`` its drafter per mode (the
    file moved, or another quant of it); prompts are found by id among the
    built-in ones, the user's saved prompts and ``prompt_file``. ``names``: how the caller names
    the settings its errors point to (see Names)."""
    recs = list(records)
    if not recs:
        raise UserError("no runs to repeat in that results file")
    mixed = mixed_problem(recs, model, engine)
    if mixed:
        raise UserError(mixed)
    arms = [arm_from_fields(r.k, r.p_min, r.spec_type, (r.drafter or {}).get("path"), r.draft_sampling) for r in recs]
    arms = sorted(dict.fromkeys(arms), key=lambda a: a.is_spec)  # baseline first, then as run
    for mode, path in (drafters or {}).items():
        if not any(a.mode == mode and a.drafter for a in arms):
            raise UserError(f"a drafter was given for {mode} ({path}), but the sweep has no {mode} arm "
                            "with a drafter")
        arms = [dataclasses.replace(a, drafter=path) if a.mode == mode and a.drafter else a for a in arms]
    for mode, path in dict.fromkeys((a.mode, a.drafter) for a in arms if a.drafter):
        if not Path(path).expanduser().is_file():
            raise UserError(f"{path}: the sweep's drafter is not there any more" + _give("it", "drafter", names, mode))
    model = model or recs[-1].model_path
    if not Path(model).expanduser().is_file():
        raise UserError(f"{model}: the sweep's model is not there any more" + _give("another", "model", names))
    pool = known_prompts(model, prompt_file)
    wanted = list(dict.fromkeys((r.task, r.prompt_id) for r in recs))
    missing = [f"{task}/{pid}" for task, pid in wanted if pid not in pool or pool[pid].task != task]
    if missing:
        raise UserError(f"prompts of that sweep not found: {', '.join(missing[:5])}"
                        + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                        + (f" (your own prompts? give their file with {names['prompts']})"
                           if names and names.get("prompts") else ""))
    s = recs[-1].sampling or {}
    samplers = tuple(dict.fromkeys(Sampler.from_dict(r.sampling) for r in recs))  # each setting, as run
    return Plan(model=str(model), arms=tuple(arms), prompts=tuple(pool[pid] for _, pid in wanted),
                engine=EngineKind.parse(engine or recs[-1].engine), n_predict=max(r.n_predict for r in recs),
                reps=max(r.rep for r in recs) + 1, raw=bool(s.get("raw", False)),
                ignore_eos=bool(s.get("ignore_eos", False)), samplers=samplers,
                thinking=tuple(dict.fromkeys(r.thinking for r in recs)),
                depths=tuple(dict.fromkeys(r.depth for r in recs)))
