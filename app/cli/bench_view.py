"""bench's rendering of a session's events (also tune's): the progress line, warnings and errors,
then the summary, the final decisions and the verdict with the next command."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.common import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, Progress
from app.core.analysis.decide import describe
from app.core.analysis.fields import sweep_cells, sweep_text
from app.core.common.errors import UserError
from app.core.records.cost import CostRecord
from app.core.records.schema import RunRecord
from app.core.session.clock import FlowClock
from app.core.session.events import (AdaptiveStage, Decisions, EngineReady, Handlers, QuietWait, RunFailed,
                                     RunFinished, RunStarted, SessionFinished, SweepError, SweepStarted, SweepWarning,
                                     TokenProgress, dispatch)

if TYPE_CHECKING:  # the verdict layer (numpy) loads with the summary
    from app.core.verdict.export import ExportOptions
    from app.core.verdict.judge import Judgement


class BenchView:
    """bench's rendering of a session's events: the progress line, warnings and errors, then the
    summary. ``clock``: the flow's one clock (app.core.session.clock.flow_clock), fed every event;
    its line ("run 5 of 18, 41 s, about 50 s left") is the window's too."""

    def __init__(self, clock: FlowClock | None = None) -> None:
        self.clock = clock or FlowClock(None, None)
        self.prog = Progress()
        self.records: list[RunRecord] = []
        self.build = ""
        self.path: Path | None = None
        self.done: SessionFinished | None = None
        self.sweep_id: str | None = None
        self.last_decisions: Decisions | None = None
        self.waiting = False  # a quiet-moment wait is under way (said once in a log)
        self.handlers: Handlers = {
            EngineReady: self.ready, SweepStarted: self.started, RunStarted: self.run_started,
            TokenProgress: self.tokens, RunFinished: self.record, RunFailed: self.record,
            QuietWait: self.quiet_wait,
            SweepWarning: lambda ev: self.prog.line(f"warning: {ev.message}", final=True),
            SweepError: lambda ev: self.prog.line(f"error: {ev.message}", final=True),
            AdaptiveStage: lambda ev: self.prog.line(f"adaptive: {ev.message}", final=True),
            Decisions: self.decisions,
            SessionFinished: self.finished,
        }

    def show(self, ev: object) -> None:
        """One session event: to the clock, then to what renders it."""
        self.clock.observe(ev)
        dispatch(ev, self.handlers)

    def ready(self, ev: EngineReady) -> None:
        self.build, self.path = ev.build, ev.results_path

    def started(self, ev: SweepStarted) -> None:
        self.sweep_id = ev.sweep_id
        self.prog.line(f"sweep {ev.sweep_id}: {ev.total_runs} runs, llama.cpp {self.build}, "
                       f"results -> {self.path}", final=True)

    def quiet_wait(self, ev: QuietWait) -> None:
        """"waiting for a quiet moment: cc1plus 84 %": redrawn on a terminal, once a wait in a log."""
        self.prog.line(ev.text(), final=not self.prog.tty and not self.waiting)
        self.waiting = True

    def run_started(self, ev: RunStarted) -> None:
        self.waiting = False
        what = "warmup" if ev.warmup else self.clock.line()
        self.prog.line(f"{what}: {ev.arm.label}, {ev.task}/{ev.prompt_id} rep {ev.rep + 1}")

    def tokens(self, ev: TokenProgress) -> None:
        self.prog.line(f"{self.clock.line()}: {ev.n_tokens}/{ev.n_predict} tokens, {ev.elapsed_s:.1f} s")

    def record(self, ev: RunFinished | RunFailed) -> None:
        self.records.append(ev.record)

    def decisions(self, ev: Decisions) -> None:
        """Progress toward a decision: one line per task state (each step; the last one is shown
        with the summary)."""
        self.last_decisions = ev
        if ev.final:
            return
        self.prog.line(f"decisions after {ev.runs} runs ({ev.tokens} tokens; {self.clock.line()}): "
                       + "; ".join(describe(d) for d in ev.tasks), final=True)

    def finished(self, ev: SessionFinished) -> None:
        self.done = ev

    def report(self, as_json: bool, model: str, mix: str | None = None, server_bin: str | None = None) -> int:
        """The summary (text or JSON), ending with the verdict and the next command, and the exit code
        (a sweep that stopped once decided on its anytime intervals: its records say so, RunRecord.min_gain)."""
        done = self.done
        assert done is not None  # the session's last event
        self.prog.line("", final=False)
        path = self.path if done.written else None
        j = judged_runs(self.records, path, mix, self.sweep_id, server_bin)
        runs = list(j.runs) if j is not None else self.records  # the table: the runs the verdict judged
        answer, nxt, picks, busy = closing(j, path)
        if as_json:
            dec = self.last_decisions
            print(json.dumps({"results": str(self.path), "model": model, "llama_build": self.build,
                              "errors": list(done.errors), "cells": summary_cells(runs),
                              "verdict": answer, "next": nxt, "picks": picks,
                              # only when runs were disturbed by other programs, as recommend --json
                              **({"disturbed": busy, "withheld": busy["withheld"]} if busy else {}),
                              **({"decisions": decisions_json(dec)} if dec is not None else {})}, indent=2))
        else:
            print(summary_text(runs))
            if self.last_decisions is not None:
                print("\n" + decisions_text(self.last_decisions))
            if done.adaptive is not None:
                pick = done.adaptive.pick
                print(f"\nadaptive pick: {pick.label if pick else 'leave MTP off'} ({done.adaptive.runs} measured runs)")
            print(f"\nresults: {self.path}" if done.written else "\nno run finished, so no results file was written")
            if answer:
                print("\n" + "\n".join(answer))
            if nxt:
                what = (f"the llama-server command for {nxt.rsplit(' --for ', 1)[1]}, with its MTP flags"
                        if " --for " in nxt else "each task's llama-server command, and your mix's")
                print(f"\nnext: {nxt}\n      ({what})")
        if done.cancelled:
            return EXIT_CANCELLED
        return EXIT_OK if done.ok else EXIT_FAILED


def closing(j: Judgement | None, path: Path | None
            ) -> tuple[list[str], str | None, list[dict[str, Any]], dict[str, Any] | None]:
    """(the verdict lines, per setting of the sweep; the next command to run: `recommend` on the
    results file for the first task where MTP pays (its command, with its flags), else for all;
    each task's pick for the JSON, marked provisional or not, per setting; the disturbed runs as
    recommend --json has them, None when none was), from the session's verdict (judged_runs: as
    `recommend` judges the file; None when no run finished)."""
    from app.core.verdict.report import disturbed_dict, verdict_lines

    if j is None:
        return [], None, [], None
    lines: list[str] = []
    busy = None
    for s in j.settings:
        v = s.verdict
        lines += ([f"== {s.label} =="] if s.label else []) + verdict_lines(v, commands=False, findings=False)
        lines += [f"({v.cost_label})"] if v.cost_label else []  # the costs that priced it, as recommend says
        if v.disturbed is not None and (busy is None or v.withheld):
            busy = disturbed_dict(v)
    lines += ["", *j.joint.lines()] if j.joint is not None else []  # --axis: the best joint setting
    if path is None:
        return lines, None, j.picks(), busy
    pays = [p.scope for s in j.settings for p in s.verdict.per_task if p.mtp_on]
    target = f" --for {shlex.quote(pays[0])}" if pays else ""
    return lines, f"mtp-tuner recommend {shlex.quote(str(path))}{target}", j.picks(), busy


def judged_runs(records: list[RunRecord], path: Path | None, mix: str | None = None, sweep_id: str | None = None,
                server_bin: str | None = None, options: ExportOptions | None = None) -> Judgement | None:
    """The session's verdict through the core's one entry (verdict.judge), from what `recommend`
    reads: the sweep's runs in its results file (a resumed sweep's earlier runs too), priced by
    that file's cost records, checked against the llama-server found; the runs in memory when no
    file was written. None when no run finished."""
    from app.core.records.reader import load_records
    from app.core.records.sweeps import select_sweep
    from app.core.verdict.export import ExportOptions
    from app.core.verdict.judge import cost_records_of, find_server, judge

    costs: list[CostRecord] = []
    if path is not None:
        try:
            runs, _, _ = select_sweep(load_records(path, [], mtp_times=False), sweep_id, where=str(path))
            costs = cost_records_of(str(path))[0]
        except UserError:  # the file cannot be read back now: the runs this session holds
            runs = []
        records = runs or records
    if not any(r.status == "ok" for r in records):
        return None
    try:
        server = find_server(server_bin)
    except UserError:  # the llama-server asked for is not usable: the commands go unchecked
        server = find_server(None)
    return judge(records, cost_records=costs, mix=mix, server=server, options=options or ExportOptions(),
                 lenient_mix=True)


STOPPED = {"decided": "every task is decided", "budget": "the budget ran out", "max_reps": "the repetitions ran out",
           "cancelled": "cancelled"}


def decisions_text(ev: Decisions) -> str:
    """The final decisions, one line per task, under what stopped the sweep."""
    head = (f"decisions ({STOPPED.get(ev.stopped, ev.stopped or 'sweep over')}; {ev.runs} runs, {ev.tokens} tokens, "
            f"{ev.elapsed_s:.0f} s):")
    return "\n".join([head] + [f"  {describe(d, final=True)}" for d in ev.tasks])


def decisions_json(ev: Decisions) -> dict[str, Any]:
    """The final decisions for bench --json: what stopped the sweep, and per task its state."""
    return {"stopped": ev.stopped, "runs": ev.runs, "tokens": ev.tokens, "elapsed_s": round(ev.elapsed_s, 1),
            "tasks": [{"task": d.task, "decided": d.decided, "pick": d.pick.label if d.pick else "off",
                       "speedup": d.ratio.estimate if d.ratio else None, "lo": d.ratio.lo if d.ratio else None,
                       "hi": d.ratio.hi if d.ratio else None, "contenders": [a.label if a else "off" for a in d.contenders],
                       "tied": [a.label for a in d.tied], "decision": d.outcome or None,
                       "anytime": bool(d.ratio is not None and d.ratio.anytime), "line": describe(d, final=True)}
                      for d in ev.tasks]}


def summary_cells(records: list[RunRecord]) -> list[dict[str, Any]]:
    """bench --json's cells: the same cells as `recommend --json` (one field list, one function),
    one analysis per setting of the sweep, each cell with its setting's label when it has several."""
    return sweep_cells(records)


def summary_text(records: list[RunRecord]) -> str:
    """bench's table: the same per-cell table (one field list) and findings as `recommend`, from
    one analysis per setting of the sweep (a section per setting when it has several)."""
    return sweep_text(records)
