"""The sweep runner: a plain generator of typed events (app.core.measure.events), with cooperative
cancel.

``run_sweep(plan, engine, writer, cancel)`` yields events; front ends (CLI, the GUI's Qt adapter,
tests) just iterate. Arms are interleaved; warmup runs are not recorded; each finished run is
appended to the results file before the next begins; a run whose engine died is recorded as
failed, the engine restarted and the sweep continued. The caller owns the engine and closes it.

A sweep is a ``Sweep`` whose phases are its methods, its state on ``self`` (in the way of
pyperf's WorkerTask): ``start`` (the pre-flight: app.core.measure.preflight), ``prepare`` (the
engine readied for the arms, the host the records name, the order of the runs), then for each
run ``warm``, ``measure`` and ``after`` (a disturbed run measured again: app.core.measure.reruns),
and ``run``, the loop that calls them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator

from app.core.common.cancel import CancelToken
from app.core.common.spec_modes import mode_or_guess
from app.core.common.errors import Cancelled, EngineError, EngineStartError, MtpUnavailable
from app.core.common.paths import results_dir
from app.core.engines.base import Engine, Generation, Progress
from app.core.measure import busy as busy_mod
from app.core.measure.depth import at_depth
from app.core.measure.divergence import Divergences
from app.core.measure.events import (Event, RunFailed, RunFinished, RunStarted, SweepError, SweepFinished,
                                     SweepStarted, SweepWarning, TokenProgress)
from app.core.measure.host import host_of
from app.core.measure.plan import Plan, RunSpec
from app.core.measure.preflight import ModelFacts, preflight, read_model
from app.core.measure.quiet import EXPIRED, MODE_SHIFT, QuietGate
from app.core.measure.reruns import Reruns
from app.core.records.arm import Arm, takes_k
from app.core.records.check import MAX_TEXT
from app.core.records.schema import SCHEMA_VERSION, RunRecord, new_id, tokens_sha256, utc_now
from app.core.records.shape import SweepShape
from app.core.records.writer import ResultsWriter

if TYPE_CHECKING:
    from app.core.machine.hardware import HardwareSnapshot

MAX_ARM_FAILURES = 3
WARMUP_TOKENS = 32


def run_sweep(plan: Plan, engine: Engine, writer: ResultsWriter | None = None,
              cancel: CancelToken | None = None, arm_major: bool = False,
              sweep_id: str | None = None, hardware: HardwareSnapshot | None = None,
              monitor: busy_mod.Monitor | None = None, model: ModelFacts | None = None,
              gate: QuietGate | None = None,
              only: Callable[[RunSpec], bool] | None = None, reruns: bool = True,
              link: dict[str, Any] | None = None) -> Generator[Event, None, None]:
    """``hardware``: the machine's hardware snapshot (app.core.machine.hardware), taken now when
    None. Its GPUs, and the layers the memory fit puts on the first, go into every record's
    host: the analysis holds where the runs really ran against them. ``model``: the model as
    the session read it once (preflight.read_model; read now when None): a session that runs
    several sweeps on one model (an adaptive sweep's steps) reads its header once.

    ``monitor`` (default busy.make_monitor()) measures what other programs take during each run
    (other_cpu, other_gpu; other_cpu_peak: the busiest second). A run over busy.BUSY_SHARE, over
    the run or over its busiest second, is recorded with the flag "disturbed" and
    re-run later in the sweep with a baseline beside it (a disturbed baseline: with the speculative
    runs that pair with it), up to busy.MAX_RERUN_SHARE of the sweep's runs; past that, disturbed
    runs are kept, marked, and not repeated (one warning says so; the verdict leaves them out and
    is withheld when too many are).

    ``gate`` (app.core.measure.quiet; None: none) makes each run wait for a quiet moment and the
    sweep hold while its baseline anchor drifts; a gate whose deadline passes ends the sweep there
    (a warning says so); once its allowance of waiting is spent, disturbed runs are no longer run
    again (the machine stays busy). ``reruns`` False: none is (an adaptive sweep's pilot, whose
    runs count drafts, not time). ``only``: the runs to measure of the plan's (a resumed sweep's missing
    ones; None: all). ``link``: the RPC workers and their round trips at the sweep's start
    (records.rpc.rpc_field, timed by the session before any server held them), as every record
    keeps them; None: no workers."""
    yield from Sweep(plan, engine, writer, cancel, arm_major, sweep_id, hardware, monitor, model, gate, only,
                     reruns, link).run()


class Sweep:
    """One sweep: its phases as methods, what they share on self."""

    def __init__(self, plan: Plan, engine: Engine, writer: ResultsWriter | None, cancel: CancelToken | None,
                 arm_major: bool, sweep_id: str | None, hardware: HardwareSnapshot | None,
                 monitor: busy_mod.Monitor | None, model: ModelFacts | None, gate: QuietGate | None = None,
                 only: Callable[[RunSpec], bool] | None = None, reruns: bool = True,
                 link: dict[str, Any] | None = None) -> None:
        self.plan, self.engine, self.writer, self.arm_major = plan, engine, writer, arm_major
        self.link = link
        self.rerun = reruns
        self.gate, self.only = gate, only
        self.hardware, self.model = hardware, model
        self.cancel = cancel or CancelToken()
        self.monitor = monitor if monitor is not None else busy_mod.make_monitor()
        self.sweep_id = sweep_id or new_id()
        self.results_path = str(writer.path) if writer else None
        self.n_ok = self.n_failed = 0
        self.errors: list[str] = []
        self.drafters: dict[str, dict[str, Any]] = {}
        self.host: dict[str, Any] = {}
        self.runs: list[RunSpec] = []  # in order; a disturbed run is queued again further on
        self.total = 0
        self.reruns = Reruns([], arm_major)
        self.warmed: set[Arm] = set()
        self.dead: dict[Arm, str] = {}  # arms that cannot run (on), and why
        self.fails: dict[Arm, int] = {}  # failed runs of each arm in a row
        self.warned_not_engaged: set[Arm] = set()
        self.deep: dict[tuple[str, int], str] = {}  # each prompt's text at each depth
        self.divergences = Divergences()  # greedy runs that leave the baseline's tokens, looked at

    def run(self) -> Generator[Event, None, None]:
        """The loop: the pre-flight, then every run in turn; SweepFinished last."""
        try:
            yield from self.start()
            yield from self.prepare()
            at = 0
            while at < len(self.runs):
                spec = self.runs[at]
                at += 1
                self.cancel.check()
                if spec.arm in self.dead:
                    continue
                if not (yield from self.warm(spec)):
                    continue
                if self.gate is not None and (yield from self.gate.wait(self.cancel)) == EXPIRED:
                    yield SweepWarning("the time budget is spent while waiting for a quiet moment: the sweep "
                                       "stops here and answers from what it measured")
                    break
                if not (yield from self.measure(spec, at)):
                    yield SweepWarning("the time budget is spent while the baseline was drifting: the sweep "
                                       "stops here and answers from what it measured")
                    break
            yield SweepFinished(self.sweep_id, self.n_ok, self.n_failed, False, self.results_path, tuple(self.errors))
        except Cancelled:
            yield SweepFinished(self.sweep_id, self.n_ok, self.n_failed, True, self.results_path, tuple(self.errors))
        finally:
            close = getattr(self.monitor, "close", None)
            if close is not None:  # its sampling thread (a run that failed to start left it sampling)
                close()

    def start(self) -> Generator[Event, None, None]:
        """The pre-flight: the plan as it will run, announced with what the pre-flight changed and
        which arms cannot run (a plan left with no arm at all is refused: Plan's own check)."""
        if self.model is None or self.model.path != self.plan.model:
            self.model = read_model(self.plan.model)
        pre = preflight(self.plan, self.engine, self.model)
        self.plan, self.drafters = pre.plan, pre.drafters
        total = self.plan.total_runs if self.only is None else sum(map(self.only, self.plan.runs()))
        yield SweepStarted(self.sweep_id, self.plan, total, self.results_path)
        for msg in pre.warnings:
            yield SweepWarning(msg)
        for msg in pre.errors:
            self.errors.append(msg)
            yield SweepError(msg)

    def prepare(self) -> Generator[Event, None, None]:
        """The host the records name, the engine readied for the arms, the runs in their order."""
        plan, arms = self.plan, self.plan.arms
        assert self.model is not None  # start read it
        self.host = host_of(plan, self.engine, self.model.info, self.hardware)
        self.engine.prepare(SweepShape.of(arms, plan.thinking, plan.depths))  # the arms it will run
        limit = self.engine.ready_limit(plan.model, len(arms))
        if limit is not None and limit < len(arms) and not self.arm_major:
            self.arm_major = True
            rpc = self.engine.settings.rpc  # llama-server over RPC workers: a pool of one
            why = ("over RPC workers one llama-server runs at a time (a worker serves one client)" if rpc
                   else f"only {limit} of {len(arms)} configurations fit in memory at once")
            tail = "" if rpc else " (the in-process engine avoids this)"
            yield SweepWarning(f"{why}: arms run one after another instead of interleaved, so drift between "
                               f"them is not averaged out{tail}")
        self.runs = plan.runs(arm_major=self.arm_major)
        if self.only is not None:
            self.runs = [dataclasses.replace(s, index=i) for i, s in enumerate(r for r in self.runs if self.only(r))]
        self.total = len(self.runs)
        self.reruns = Reruns(self.runs, self.arm_major)
        self.monitor.start()  # a first sample: the first short run is measured with the time before it

    def warm(self, spec: RunSpec) -> Generator[Event, None, bool]:
        """The arm's warmup runs (not recorded), the first time it runs; False when it cannot run."""
        arm, plan = spec.arm, self.plan
        if arm in self.warmed or not plan.warmup:
            return True
        if arm.mode and mode_or_guess(arm.mode).fresh_server:  # every run of it starts a server of its
            return True  # own, warmed by the engine (a warmup's server would be thrown away unused)
        try:
            for w in range(plan.warmup):
                yield RunStarted(spec.index, self.total, arm, plan.prompts[0].id, plan.prompts[0].task, w, warmup=True)
                yield from self._generate(spec, plan.prompts[0].text, min(plan.n_predict, WARMUP_TOKENS))
        except (EngineError, MtpUnavailable) as e:
            yield self._stop_arm(arm, f"{arm.label}: cannot run ({e})")
            return False
        self.warmed.add(arm)
        return True

    def measure(self, spec: RunSpec, at: int) -> Generator[Event, None, bool]:
        """One measured run (``at``: where the queue goes on after it), recorded and written (as
        failed when the engine failed it), then looked at (``after``). False when the gate's
        deadline passed while the anchor drifted: the sweep stops."""
        arm = spec.arm
        yield RunStarted(spec.index, self.total, arm, spec.prompt.id, spec.prompt.task, spec.rep)
        try:
            self.monitor.start()
            t0 = time.monotonic()
            result = yield from self._generate(spec, self._text_at(spec), self.plan.n_predict)
            busy = self.monitor.stop()
        except (EngineStartError, MtpUnavailable) as e:
            yield self._stop_arm(arm, f"{arm.label}: cannot run ({e})")
            return True
        except EngineError as e:
            yield from self._failed(spec, e)
            return True
        self.fails[arm] = 0
        rec = self._record(spec, result, busy=busy)
        key = (spec.prompt.task, spec.prompt.id, spec.sampler, spec.thinking, spec.depth)  # prompt and setting
        rec = self.divergences.look(key, arm, rec, self.engine, self.plan.model, spec.sampler, self.cancel)
        if rec.divergence is not None:  # read through the baseline's server, which may have taken the arm's place
            self.warmed.discard(arm)
        yield from self._write(rec)
        self.n_ok += 1
        yield RunFinished(rec)
        yield from self.after(spec, rec, busy, at)
        if self.gate is None:
            return True
        self.gate.saw(busy, time.monotonic() - t0)
        if not arm.is_baseline or busy.disturbed or not rec.tok_s:
            return True
        was = key in self.gate.shifted
        outcome = yield from self.gate.anchor(key, rec.tok_s, lambda: self._remeasure(spec), self.cancel)
        if key in self.gate.shifted and not was:
            yield SweepWarning(f"the baseline on {spec.prompt.task}/{spec.prompt.id} stayed at "
                               f"{self.gate.shifted[key]:.1f} tok/s, off the {self.gate.home[key]:.1f} it started at, "
                               f"past the hold: the machine changed speed; runs from here are marked "
                               f"{MODE_SHIFT} until it is back")
        return outcome != EXPIRED

    def _remeasure(self, spec: RunSpec) -> float | None:
        """The anchor measured again: ``spec`` (a baseline run) generated, not recorded; its tok/s."""
        gen = self._generate(spec, self._text_at(spec), self.plan.n_predict)
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            result: Generation = stop.value
            return result.decode_tok_s
        except EngineError:
            return None

    def after(self, spec: RunSpec, rec: RunRecord, busy: busy_mod.Busy, at: int) -> Iterator[SweepWarning]:
        """A disturbed run queued again (within the re-run limit); an arm that did not draft said once."""
        arm = spec.arm
        if busy.disturbed and self.rerun and not (self.gate is not None and self.gate.spent):
            if self.reruns.requeue(spec, self.runs, at):
                self.total = len(self.runs)
                yield SweepWarning(f"{arm.label} on {spec.prompt.task}/{spec.prompt.id} was disturbed "
                                   f"({busy.text()}): measured again later ({self.reruns.used} of "
                                   f"{self.reruns.limit} re-runs)")
            elif not self.reruns.warned:
                self.reruns.warned = True
                yield SweepWarning(f"{arm.label} on {spec.prompt.task}/{spec.prompt.id} was disturbed "
                                   f"({busy.text()}); the re-run limit ({self.reruns.limit} runs) is reached, so "
                                   "disturbed runs are kept, marked and left out of the verdict, not "
                                   "measured again; close other programs")
        if "mtp_not_engaged" in rec.flags and arm not in self.warned_not_engaged:
            self.warned_not_engaged.add(arm)
            what = "MTP" if arm.is_mtp else arm.mode
            yield SweepWarning(f"{arm.label}: {what} did not engage (no drafted tokens reported); "
                               f"this arm measured plain decoding")

    def _failed(self, spec: RunSpec, e: EngineError) -> Generator[Event, None, None]:
        """A run the engine failed: recorded as failed; the arm stops after MAX_ARM_FAILURES in a row."""
        arm = spec.arm
        rec = self._record(spec, None, error=str(e))
        yield from self._write(rec)
        self.n_failed += 1
        self.fails[arm] = self.fails.get(arm, 0) + 1
        self.warmed.discard(arm)
        yield RunFailed(rec)
        if self.fails[arm] >= MAX_ARM_FAILURES:
            yield self._stop_arm(arm, f"{arm.label}: stopped after {self.fails[arm]} failed runs (last: {e})")
        else:
            yield SweepWarning(f"{arm.label}: run failed ({e}); the engine is restarted "
                               f"and the sweep goes on")

    def _stop_arm(self, arm: Arm, msg: str) -> SweepError:
        self.dead[arm] = msg
        self.errors.append(msg)
        return SweepError(msg, arm)

    def _generate(self, spec: RunSpec, text: str, n_predict: int) -> Generator[Event, None, Generation]:
        plan = self.plan
        gen = self.engine.generate(plan.model, spec.arm, text, raw=plan.raw, n_predict=n_predict,
                                   sampler=spec.sampler, cancel=self.cancel, ignore_eos=plan.ignore_eos,
                                   thinking=spec.thinking)
        return (yield from _drain(gen, spec.index, plan.n_predict))

    def _text_at(self, spec: RunSpec) -> str:
        """The prompt after spec.depth tokens of neutral context."""
        key = (spec.prompt.text, spec.depth)
        if key not in self.deep:
            self.deep[key] = at_depth(spec.prompt.text, spec.depth,
                                      lambda t: self.engine.count_tokens(self.plan.model, t))
        return self.deep[key]

    def _record(self, spec: RunSpec, g: Generation | None, error: str | None = None,
                busy: busy_mod.Busy | None = None) -> RunRecord:
        assert self.model is not None  # start read it
        rec = _record(self.plan, spec, self.engine, self.sweep_id, g, self.model.size, self.host, self.drafters,
                      error=error, busy=busy, link=self.link)
        if self.gate is not None and self.gate.shift:  # measured after the machine changed speed
            rec = dataclasses.replace(rec, flags=(*rec.flags, MODE_SHIFT))
        return rec

    def _write(self, rec: RunRecord) -> Iterator[SweepWarning]:
        """Append ``rec`` to the results file; what the writer had to say about the file (e.g. a cut
        line from a crash, ended)."""
        if self.writer:
            self.writer.append(rec)
            for note in self.writer.take_notes():
                yield SweepWarning(note)


def _drain(gen: Generator[Progress, None, Generation], index: int,
           n_predict: int) -> Generator[TokenProgress, None, Generation]:
    """Forward an engine generator's progress as events; return its Generation."""
    while True:
        try:
            p = next(gen)
        except StopIteration as stop:
            result: Generation = stop.value
            return result
        yield TokenProgress(index, p.n_tokens, n_predict, p.elapsed_s)


def _record(plan: Plan, spec: RunSpec, engine: Engine, sweep_id: str, g: Generation | None,
            model_size: int, host: dict[str, Any], drafters: dict[str, dict[str, Any]] | None = None,
            error: str | None = None, busy: busy_mod.Busy | None = None,
            link: dict[str, Any] | None = None) -> RunRecord:
    """The run record of ``spec``: its result ``g`` (None: it failed with ``error``), what the
    engine said of its drafting and placement, and what others took of the machine meanwhile."""
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
        draft_sampling=arm.draft_sampling, min_gain=plan.sequential,
        accepted_per_pos=g.accepted_per_pos if g else (), draft_steps=g.draft_steps if g else None,
        thinking=g.thinking if g else spec.thinking, depth=spec.depth, reasoning_n=g.reasoning_n if g else None,
        other_cpu=_share(busy.cpu), other_gpu=_share(busy.gpu), other_cpu_peak=_share(busy.cpu_peak),
        other_top={"name": busy.top, "cpu": _share(busy.top_cpu)} if busy.top else None,
        server_args=engine.settings.user_args, rpc=link, threads=engine.threads)


def _share(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def default_results_path(model: str | os.PathLike[str]) -> Path:
    """A new results file for a sweep of ``model`` in the results folder, reserved (created empty)."""
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
