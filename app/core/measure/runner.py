"""The sweep runner: a plain generator of typed events, with cooperative cancel.

``run_sweep(plan, engine, writer, cancel)`` yields events; front ends (CLI, the GUI's Qt adapter,
tests) just iterate. Arms are interleaved; warmup runs are not recorded; each finished run is
appended to the results file before the next begins; a run whose engine died is recorded as
failed, the engine restarted and the sweep continued. The caller owns the engine and closes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import math
import os
from pathlib import Path
from typing import Generator, Iterator

from app.core.machine import gguf_info
from app.core.common.cancel import CancelToken
from app.core.engines.base import Engine, Generation
from app.core.engines.chat_template import supports_thinking, thinking_label
from app.core.common.paths import results_dir
from app.core.common.errors import Cancelled, EngineError, EngineStartError, MtpUnavailable, UserError
from app.core.measure import busy as busy_mod
from app.core.measure.depth import at_depth
from app.core.measure.plan import Plan, RunSpec
from app.core.records.arm import Arm, takes_k
from app.core.records.sampler import Sampler
from app.core.records.check import MAX_TEXT
from app.core.records.schema import SCHEMA_VERSION, RunRecord, host_info, new_id, tokens_sha256, utc_now
from app.core.records.shape import SweepShape
from app.core.records.writer import ResultsWriter

MAX_ARM_FAILURES = 3
WARMUP_TOKENS = 32


# ------------------------------------------------------------------------------------------
# events


@dataclasses.dataclass(frozen=True)
class SweepStarted:
    sweep_id: str
    plan: Plan
    total_runs: int
    results_path: str | None


@dataclasses.dataclass(frozen=True)
class RunStarted:
    index: int
    total: int
    arm: Arm
    prompt_id: str
    task: str
    rep: int
    warmup: bool = False


@dataclasses.dataclass(frozen=True)
class TokenProgress:
    index: int
    n_tokens: int
    n_predict: int
    elapsed_s: float


@dataclasses.dataclass(frozen=True)
class RunFinished:
    record: RunRecord


@dataclasses.dataclass(frozen=True)
class RunFailed:
    record: RunRecord


@dataclasses.dataclass(frozen=True)
class SweepWarning:
    message: str


@dataclasses.dataclass(frozen=True)
class SweepError:
    """A problem that stops part of the sweep (e.g. an arm that cannot run); the rest goes on."""

    message: str
    arm: Arm | None = None


@dataclasses.dataclass(frozen=True)
class SweepFinished:
    sweep_id: str
    n_ok: int
    n_failed: int
    cancelled: bool
    results_path: str | None
    errors: tuple[str, ...] = ()


Event = (SweepStarted | RunStarted | TokenProgress | RunFinished | RunFailed | SweepWarning
         | SweepError | SweepFinished)


# ------------------------------------------------------------------------------------------


def preflight(plan: Plan, engine: Engine) -> tuple[list[Arm], list[str], gguf_info.GGUFHeader, dict[str, dict]]:
    """Validate the model and the speculative arms before anything starts. Returns (arms that
    can run, error messages, header, the drafters by path as records keep them).

    A model file that is missing or broken raises ModelFileError. A speculative arm that cannot
    run is dropped with one error per cause (the baseline still runs): draft-mtp on a model
    without MTP heads, a mode the engine cannot run, a drafter that does not pair with the model
    (missing, another vocabulary, the wrong width, not a drafter)."""
    hdr = gguf_info.check_gguf_file(plan.model)
    _not_a_drafter(plan.model, hdr)
    arms = list(plan.arms)
    errors: list[str] = []
    drafters: dict[str, dict] = {}
    problems: dict[tuple[str, str | None, str | None], str | None] = {}

    def problem_of(arm: Arm) -> str | None:
        key = (arm.mode, arm.drafter, arm.draft_sampling)
        if key in problems:
            return problems[key]
        if arm.probabilistic:  # the mode first (one error for it), then this engine's draft sampling
            problem = problem_of(dataclasses.replace(arm, draft_sampling=None))
            if problem is None and (problem := engine.mode_problem(arm)):
                problem = f"probabilistic draft sampling arms skipped: {problem}"
                errors.append(problem)
            problems[key] = problem
            return problem
        problem = engine.mode_problem(arm)
        if arm.own_heads:  # the model's own heads
            if problem is None:
                problem = hdr.mtp_problem()
            if problem is None:
                try:
                    engine.check_mtp()
                except MtpUnavailable as e:
                    problem = str(e)
            problem = problem and f"MTP unavailable, MTP arms skipped: {problem}"
        elif problem is not None:
            problem = f"{arm.mode} arms skipped: {problem}"
        elif arm.drafter:
            from app.core.machine import drafter as drafter_mod  # deferred: only sweeps with a drafter read it

            try:
                paired = drafter_mod.check_pair(plan.model, arm.drafter, arm.mode)
                assert paired is not None  # a drafter was given: a summary of it, or an error
                drafters[arm.drafter] = paired.record()
            except UserError as e:
                problem = f"{arm.mode} arms skipped: {e}"
        problems[key] = problem
        if problem:
            errors.append(problem)
        return problem

    arms = [a for a in arms if not a.is_spec or problem_of(a) is None]
    return arms, errors, hdr, drafters


def _not_a_drafter(model: str, hdr: gguf_info.GGUFHeader) -> None:
    """A drafter file (a Gemma 4 assistant, an MTP-only head...) given as the model: one clear error
    (llama.cpp would fail every run, e.g. "Gemma4Assistant requires ctx_other to be set")."""
    from app.core.machine import modelinfo  # deferred: the tensor walk of the model's header

    kind = modelinfo.inspect(model, header=hdr).drafter_kind
    if kind:
        raise UserError(f"{model}: a {kind} drafter, not a model to run: give its target model as the model and "
                        "this file as its drafter (--drafter / the Model tab's Drafter)")


def run_sweep(plan: Plan, engine: Engine, writer: ResultsWriter | None = None,
              cancel: CancelToken | None = None, arm_major: bool = False,
              sweep_id: str | None = None, hardware=None,
              monitor: busy_mod.Monitor | None = None) -> Generator[Event, None, None]:
    """``hardware``: the machine's hardware snapshot (app.core.machine.hardware), taken now when
    None. Its GPUs, and the layers the memory fit puts on the first, go into every record's
    host: the analysis holds where the runs really ran against them.

    ``monitor`` (default busy.make_monitor()) measures what other programs take during each run
    (other_cpu, other_gpu; other_cpu_peak: the busiest second). A run over busy.BUSY_SHARE, over
    the run or over its busiest second, is recorded with the flag "disturbed" and
    re-run later in the sweep with a baseline beside it (a disturbed baseline: with the speculative
    runs that pair with it), up to busy.MAX_RERUN_SHARE of the sweep's runs; past that, disturbed
    runs are kept, marked, and not repeated (one warning says so; the verdict leaves them out and
    is withheld when too many are)."""
    cancel = cancel or CancelToken()
    monitor = monitor if monitor is not None else busy_mod.make_monitor()
    sweep_id = sweep_id or new_id()
    n_ok = n_failed = 0
    errors: list[str] = []
    results_path = str(writer.path) if writer else None
    try:
        arms, pre_errors, hdr, drafters = preflight(plan, engine)
        if arms != list(plan.arms):
            plan = dataclasses.replace(plan, arms=tuple(arms))
        no_template = not plan.raw and not hdr.metadata.get("tokenizer.chat_template")
        if no_template:
            plan = dataclasses.replace(plan, raw=True)
        asked = [t for t in plan.thinking if t is not None]
        no_switch = bool(asked) and (plan.raw or not supports_thinking(hdr.metadata.get("tokenizer.chat_template")))
        if no_switch:  # nothing to switch: one setting, not the same runs twice
            plan = dataclasses.replace(plan, thinking=(None,))
        yield SweepStarted(sweep_id, plan, plan.total_runs if arms else 0, results_path)
        if no_template:
            yield SweepWarning(f"{plan.model}: the model has no chat template; prompts are sent as "
                               f"plain text (as with --raw)")
        if no_switch:
            yield SweepWarning(f"thinking {'/'.join(map(thinking_label, asked))}: no thinking switch (enable_thinking) "
                               f"in {'raw prompts' if plan.raw else 'the chat template'}; measured as it is")
        for msg in pre_errors:
            errors.append(msg)
            yield SweepError(msg)
        if not arms:
            return
        model_size = sum(p.stat().st_size for p in gguf_info.split_parts(plan.model) if p.exists())
        host = _host(plan, engine, hardware)
        engine.prepare(SweepShape.of(arms, plan.thinking, plan.depths))  # the arms it will run
        limit = engine.ready_limit(plan.model, len(arms))
        if limit is not None and limit < len(arms) and not arm_major:
            arm_major = True
            yield SweepWarning(
                f"only {limit} of {len(arms)} configurations fit in memory at once: arms run one "
                f"after another instead of interleaved, so drift between them is not averaged out "
                f"(the in-process engine avoids this)")
        runs = plan.runs(arm_major=arm_major)
        total = len(runs)
        reruns = _Reruns(runs, arm_major)
        monitor.start()  # a first sample: the first short run is measured with the time before it
        warmed: set[Arm] = set()
        dead: dict[Arm, str] = {}
        fails: dict[Arm, int] = {}
        warned_not_engaged: set[Arm] = set()

        def stop_arm(arm: Arm, msg: str) -> SweepError:
            dead[arm] = msg
            errors.append(msg)
            return SweepError(msg, arm)

        def generate(arm: Arm, text: str, n_predict: int, index: int, sampler: Sampler, thinking: bool | None):
            gen = engine.generate(plan.model, arm, text, raw=plan.raw, n_predict=n_predict, sampler=sampler,
                                  cancel=cancel, ignore_eos=plan.ignore_eos, thinking=thinking)
            return (yield from _drain(gen, index, plan.n_predict))

        deep: dict[tuple[str, int], str] = {}

        def text_at(spec: RunSpec) -> str:  # the prompt after spec.depth tokens of neutral context
            key = (spec.prompt.text, spec.depth)
            if key not in deep:
                deep[key] = at_depth(spec.prompt.text, spec.depth, lambda t: engine.count_tokens(plan.model, t))
            return deep[key]

        at = 0
        while at < len(runs):
            spec = runs[at]
            at += 1
            cancel.check()
            arm = spec.arm
            if arm in dead:
                continue
            if arm not in warmed and plan.warmup:
                try:
                    for w in range(plan.warmup):
                        yield RunStarted(spec.index, total, arm, plan.prompts[0].id, plan.prompts[0].task,
                                         w, warmup=True)
                        yield from generate(arm, plan.prompts[0].text, min(plan.n_predict, WARMUP_TOKENS),
                                            spec.index, spec.sampler, spec.thinking)
                    warmed.add(arm)
                except (EngineError, MtpUnavailable) as e:
                    yield stop_arm(arm, f"{arm.label}: cannot run ({e})")
                    continue
            yield RunStarted(spec.index, total, arm, spec.prompt.id, spec.prompt.task, spec.rep)
            try:
                monitor.start()
                result = yield from generate(arm, text_at(spec), plan.n_predict, spec.index, spec.sampler,
                                             spec.thinking)
                busy = monitor.stop()
            except (EngineStartError, MtpUnavailable) as e:
                yield stop_arm(arm, f"{arm.label}: cannot run ({e})")
                continue
            except EngineError as e:
                rec = _record(plan, spec, engine, sweep_id, None, model_size, host, drafters, error=str(e))
                if writer:
                    writer.append(rec)
                    yield from _notes(writer)
                n_failed += 1
                fails[arm] = fails.get(arm, 0) + 1
                warmed.discard(arm)
                yield RunFailed(rec)
                if fails[arm] >= MAX_ARM_FAILURES:
                    yield stop_arm(arm, f"{arm.label}: stopped after {fails[arm]} failed runs (last: {e})")
                else:
                    yield SweepWarning(f"{arm.label}: run failed ({e}); the engine is restarted "
                                       f"and the sweep goes on")
                continue
            fails[arm] = 0
            rec = _record(plan, spec, engine, sweep_id, result, model_size, host, drafters, busy=busy)
            if writer:
                writer.append(rec)
                yield from _notes(writer)
            n_ok += 1
            yield RunFinished(rec)
            if busy.disturbed:
                if reruns.requeue(spec, runs, at):
                    total = len(runs)
                    yield SweepWarning(f"{arm.label} on {spec.prompt.task}/{spec.prompt.id} was disturbed "
                                       f"({busy.text()}): measured again later ({reruns.used} of "
                                       f"{reruns.limit} re-runs)")
                elif not reruns.warned:
                    reruns.warned = True
                    yield SweepWarning(f"{arm.label} on {spec.prompt.task}/{spec.prompt.id} was disturbed "
                                       f"({busy.text()}); the re-run limit ({reruns.limit} runs) is reached, so "
                                       "disturbed runs are kept, marked and left out of the verdict, not "
                                       "measured again; close other programs")
            if "mtp_not_engaged" in rec.flags and arm not in warned_not_engaged:
                warned_not_engaged.add(arm)
                what = "MTP" if arm.is_mtp else arm.mode
                yield SweepWarning(f"{arm.label}: {what} did not engage (no drafted tokens reported); "
                                   f"this arm measured plain decoding")
        yield SweepFinished(sweep_id, n_ok, n_failed, False, results_path, tuple(errors))
    except Cancelled:
        yield SweepFinished(sweep_id, n_ok, n_failed, True, results_path, tuple(errors))
    finally:
        close = getattr(monitor, "close", None)
        if close is not None:  # its sampling thread (a run that failed to start left it sampling)
            close()


def _pair_key(spec: RunSpec) -> tuple:
    """What a speculative run and its baseline share: the prompt, repetition and setting."""
    return (spec.prompt.task, spec.prompt.id, spec.rep, spec.sampler, spec.thinking, spec.depth)


class _Reruns:
    """Disturbed runs measured again, within busy.MAX_RERUN_SHARE of the sweep's runs: a disturbed
    speculative run goes again with a baseline of its prompt and setting before it; a disturbed
    baseline goes again with the speculative runs still to come that would pair with it (moved,
    not repeated). The group goes one block of arms later, so a passing disturbance can pass and
    the pair is measured back to back again."""

    def __init__(self, runs: list[RunSpec], arm_major: bool) -> None:
        self.limit = max(busy_mod.MIN_RERUNS, math.ceil(busy_mod.MAX_RERUN_SHARE * len(runs)))
        self.used = 0
        self.warned = False
        self.arm_major = arm_major
        self.baseline = next((r.arm for r in runs if r.arm.is_baseline), None)
        self.gap = max(1, len({r.arm for r in runs}))

    def requeue(self, spec: RunSpec, runs: list[RunSpec], at: int) -> bool:
        """Put ``spec`` (just run, at ``at`` - 1) in ``runs`` again, later; False when the limit
        does not allow it."""
        key = _pair_key(spec)
        moved: list[RunSpec] = []
        if self.arm_major or self.baseline is None:
            new = [spec.arm]
        elif spec.arm.is_baseline:
            new = [spec.arm]
            j = at
            while j < len(runs) and runs[j].arm.is_spec and _pair_key(runs[j]) == key:
                j += 1
            moved = runs[at:j]
        else:
            new = [self.baseline, spec.arm]
        if self.used + len(new) > self.limit:
            return False
        self.used += len(new)
        del runs[at:at + len(moved)]
        n = len(runs) + len(moved)  # every spec queued so far: the new ones are numbered after them
        again = [dataclasses.replace(spec, index=n + i, arm=arm) for i, arm in enumerate(new)] + moved
        where = min(len(runs), at + self.gap)
        runs[where:where] = again
        return True


def _host(plan: Plan, engine: Engine, hardware) -> dict:
    """host_info with the GPUs of the hardware snapshot and, when there is one, how many layers
    the memory fit puts on it (``gpu_layers_fit``; "all" when the whole model fits)."""
    from app.core.machine import fit, hardware as hw_mod, modelinfo  # deferred: only when a sweep starts

    hw = hardware if hardware is not None else hw_mod.snapshot()
    gpus = [{"vendor": g.vendor, "name": g.name, "vram_total": g.vram_total, "vram_free": g.vram_free}
            for g in hw.gpus]
    host = host_info(gpus, hw.unified_memory)
    if hw.gpus:
        with contextlib.suppress(Exception):  # the fit is advice: a model it cannot read has none
            info = modelinfo.inspect(plan.model)
            g = hw.gpus[0]
            ctx = engine.ctx_size or info.context_length or 4096
            drafter = next((a.drafter for a in plan.arms if a.drafter), None)  # the first: what a sweep has
            f = fit.fit(info, g.vram_free or g.vram_total, ctx=ctx, mtp=any(a.own_heads for a in plan.arms),
                        ram_available=hw.ram_available, drafter=modelinfo.inspect(drafter) if drafter else None)
            if f.verdict == "fits" or "--n-cpu-moe" in f.flags:
                host["gpu_layers_fit"] = "all"
            elif "-ngl" in f.flags:
                host["gpu_layers_fit"] = int(f.flags[f.flags.index("-ngl") + 1])
    return host


def _notes(writer: ResultsWriter) -> Iterator[SweepWarning]:
    """What the writer had to say about the file (e.g. a cut line from a crash, ended)."""
    for note in writer.take_notes():
        yield SweepWarning(note)


def _drain(gen, index: int, n_predict: int):
    """Forward an engine generator's progress as events; return its Generation."""
    while True:
        try:
            p = next(gen)
        except StopIteration as stop:
            return stop.value
        yield TokenProgress(index, p.n_tokens, n_predict, p.elapsed_s)


def _record(plan: Plan, spec: RunSpec, engine: Engine, sweep_id: str, g: Generation | None,
            model_size: int, host: dict, drafters: dict[str, dict] | None = None,
            error: str | None = None, busy: busy_mod.Busy | None = None) -> RunRecord:
    arm = spec.arm
    flags: list[str] = []
    busy = busy or busy_mod.Busy()
    draft_n = draft_acc = None
    acceptance = None
    engaged: bool | None = None
    if g is not None:
        draft_n, draft_acc = g.draft_n, g.draft_accepted
        if arm.is_spec:
            if draft_n:
                engaged = True
                acceptance = (draft_acc or 0) / draft_n
            elif len(g.tokens) > 1:
                engaged = False
                if takes_k(arm.mode):  # an n-gram mode drafts nothing where the text never repeats: no fault
                    flags.append("mtp_not_engaged")
            if g.speculative is False:
                engaged = False
                if "mtp_not_engaged" not in flags:
                    flags.append("mtp_not_engaged")
        elif draft_n:
            flags.append("baseline_drafted")
        if len(g.tokens) < plan.n_predict:
            flags.append("short_output")
        flags.extend(f for f in g.engine_flags if f not in flags)
    if busy.disturbed:
        flags.append(busy_mod.DISTURBED)
    return RunRecord(
        schema_version=SCHEMA_VERSION, run_id=new_id(), sweep_id=sweep_id,
        status="ok" if error is None else "failed", engine=engine.kind.value, arm_kind=arm.kind, k=arm.k,
        p_min=arm.p_min if arm.is_spec and arm.k is not None else None, task=spec.prompt.task, prompt_id=spec.prompt.id,
        rep=spec.rep, n_predict=plan.n_predict, n_generated=len(g.tokens) if g else 0,
        tok_s=g.decode_tok_s if g else None, tok_s_engine=g.engine_tok_s if g else None,
        draft_n=draft_n, draft_accepted=draft_acc, acceptance=acceptance, mtp_engaged=engaged,
        output_sha256=tokens_sha256(g.tokens) if g else None,
        output_tokens=tuple(g.tokens) if g else (), prompt_n=len(g.prompt_tokens) if g else None,
        prompt_tokens=tuple(g.prompt_tokens) if g else (),
        prompt_tok_s=g.prompt_tok_s if g else None, llama_build=engine.build,
        model_path=str(Path(plan.model).resolve()), model_size=model_size,
        sampling={**spec.sampler.to_dict(), "raw": plan.raw, "ignore_eos": plan.ignore_eos},
        token_times=tuple(g.token_times) if g else (), timestamp_utc=utc_now(), host=host,
        flags=tuple(flags), error=error[:MAX_TEXT] if error else error,
        backend=g.placement.backend if g and g.placement else None,
        devices=g.placement.devices if g and g.placement else (),
        offloaded_layers=g.placement.offloaded if g and g.placement else None,
        layers_total=g.placement.layers_total if g and g.placement else None,
        spec_type=arm.mode, drafter=(drafters or {}).get(arm.drafter) if arm.drafter else None,
        draft_sampling=arm.draft_sampling,
        accepted_per_pos=g.accepted_per_pos if g else (), draft_steps=g.draft_steps if g else None,
        thinking=g.thinking if g else spec.thinking, depth=spec.depth, reasoning_n=g.reasoning_n if g else None,
        other_cpu=_share(busy.cpu), other_gpu=_share(busy.gpu), other_cpu_peak=_share(busy.cpu_peak),
        other_top={"name": busy.top, "cpu": _share(busy.top_cpu)} if busy.top else None)


def _share(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def default_results_path(model: str | os.PathLike) -> Path:
    stem = Path(model).stem
    base = results_dir() / f"{stem}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    path, n = base.with_name(base.name + ".jsonl"), 1
    with contextlib.suppress(OSError):  # unwritable: the writer says so, naming the file
        path.parent.mkdir(parents=True, exist_ok=True)
    while True:  # two sweeps in the same second, in any process, get files of their own
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return path  # reserved; ResultsWriter removes it again if no run is written
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}.jsonl")
        except OSError:
            return path


__all__ = ["run_sweep", "preflight", "Event", "SweepStarted", "RunStarted", "TokenProgress",
           "RunFinished", "RunFailed", "SweepWarning", "SweepError", "SweepFinished", "UserError"]
