"""What the window's tabs share, and the only way they talk to each other.

Each tab (app/gui/tabs/) is built with an AppState and reads and writes only its own widgets and
this object: the chosen model, the sweep shown (records, results file, cost-probe records), the
verdict on it (built in one place, ``rebuild_verdict``, by the core's ``build_verdict``), settings
several tabs use (llama-server binary, task mix, shell, engine settings, the user's prompts), the
hardware snapshot, errors and status lines, and a registry of running jobs (all cancelled when the
window closes: no worker or child process outlives it).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QSettings, Signal

from app.core.common.errors import UserError
from app.core.common.paths import user_prompts_path
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.devices import engine_choice, host_gpu_names
from app.core.machine import runtime_store
from app.core.machine.hardware import snapshot
from app.core.measure.prompts import BUILTIN_TASKS, user_prompts

from .adapter import CoreJob

log = logging.getLogger("mtp_tuner")


class AppState(QObject):
    error = Signal(str)  # a message for the user, in plain words
    status = Signal(str)  # a status-bar line
    model_changed = Signal(str)
    drafter_changed = Signal(str)  # the separate drafter GGUF (-md) that passed its check, "" for none
    model_info_changed = Signal(object)  # ModelInfo or None
    hardware_changed = Signal(object)
    prompts_changed = Signal()
    server_changed = Signal()  # the llama-server binary was checked (or changed)
    records_changed = Signal()  # the sweep shown: records, results_path, cost_records, file_notes
    verdict_changed = Signal(object)  # Verdict or None
    probe_changed = Signal(object)  # the latest cost-probe record (CostRecord)
    demo_chosen = Signal()  # the demo model was chosen: the demo sweep's settings apply
    sweep_requested = Signal(object)  # a Plan to show in the Sweep tab and run (Run again)
    sweep_started = Signal(object)  # the Plan that started
    sweep_finished = Signal(bool)  # cancelled?
    sweep_warning = Signal(str)
    runtimes_changed = Signal()  # a llama.cpp runtime was installed (and selected)
    engines_checked = Signal(object)  # engine_backends rows: per engine, its BackendInfo (or why none)
    engine_choice_changed = Signal(object)  # EngineChoice, or None while the engines are being asked

    def __init__(self, settings: QSettings | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.settings = settings if settings is not None else QSettings("mtp-tuner", "mtp-tuner")
        self.model = self.drafter = ""
        self.model_info = None
        self._hw = None
        self._user_prompts: list | None = None
        self.server_bin: str | None = str(self.settings.value("server_bin", "")).strip() or None
        self.task_mix = str(self.settings.value("task_mix", "")).strip()
        self.shell = "bash"
        self.ctx_size = 4096  # -c for the sweep's engines (0: the model's own)
        self.n_gpu_layers: str | None = None  # -ngl text; None: each engine's default
        self.threads: int | None = None
        self.records: list = []
        self.results_path: Path | None = None
        self.cost_records: list = []  # cost-probe records that may apply to the sweep shown
        self.file_notes: list[str] = []  # problems of an opened results file
        self.probe_record = None
        self.probe_text = ""
        self.verdict = self.mix_error = self.last_error = None
        # a sweep of several settings (sampler, thinking, depth): their labels and the one judged
        self.setting_labels, self.setting_index, self.sweep_running = [], 0, False
        self.jobs: set[CoreJob] = set()
        self.caps_jobs: dict[str, CoreJob] = {}  # binary -> job reading its --version/--help
        self.caps_failed, self._caps_waiting = {}, {}
        self._analysis_of: tuple | None = None  # (records list, (its length, setting), analysis)
        self.engine_rows: list | None = None  # the last engine_backends answer
        self.engine_choice = None  # EngineChoice: the engine that runs on this machine's GPU, if any
        self.engines_job: CoreJob | None = None
        self._engines_again = False
        self._one_change = False  # inside one change that emits several of these signals
        for sig in (self.server_changed, self.runtimes_changed, self.hardware_changed):
            sig.connect(self._engines_changed)

    # -- messages --------------------------------------------------------------------------
    def show_error(self, message: str) -> None:
        log.warning("shown to the user: %s", message)
        self.last_error = message
        self.status.emit(message)
        self.error.emit(message)

    def show_status(self, message: str) -> None:
        self.status.emit(message)

    # -- jobs ------------------------------------------------------------------------------
    def track(self, job: CoreJob) -> CoreJob:
        """Register a job (it leaves the registry when it finishes); returns it."""
        self.jobs.add(job)
        job.finished.connect(lambda: self.jobs.discard(job))
        return job

    def running_jobs(self) -> list[CoreJob]:
        return [j for j in list(self.jobs) + list(self.caps_jobs.values()) if j.is_running()]

    def cancel_all(self, wait_ms: int = 15000) -> None:
        """Cancel every running job and wait for each: the window closes with no worker left."""
        running = self.running_jobs()
        for job in running:
            job.cancel()
        for job in running:
            job.wait(wait_ms)

    # -- model, hardware, prompts ----------------------------------------------------------
    def set_model(self, path: str) -> None:
        self.model = path.strip()
        self.model_changed.emit(self.model)

    def set_drafter(self, path: str) -> None:
        self.drafter = path.strip()
        self.drafter_changed.emit(self.drafter)

    def use_demo_model(self) -> None:
        from app.core.calibrated.demo import demo_model  # numpy and the GGUF writer: demo only

        self.set_model(str(demo_model()))
        self.demo_chosen.emit()

    def set_model_info(self, info) -> None:
        self.model_info = info
        self.model_info_changed.emit(info)

    def hardware(self):
        """The hardware snapshot, read once (refresh_hardware reads it again)."""
        if self._hw is None:
            self._hw = snapshot()
        return self._hw

    def set_hardware(self, hw) -> None:
        self._hw = hw
        self.hardware_changed.emit(hw)

    def refresh_hardware(self) -> None:
        self.set_hardware(snapshot())

    @property
    def user_prompts(self) -> list:
        if self._user_prompts is None:
            self.reload_prompts()
        return self._user_prompts

    def reload_prompts(self) -> None:
        """Read the user's prompts file again; tell the tabs."""
        try:
            self._user_prompts = user_prompts()
        except UserError as e:
            self._user_prompts = []
            self.show_error(f"your prompts could not be read: {e}")
        self.prompts_changed.emit()

    def prompt_tasks(self) -> list[str]:
        return list(dict.fromkeys(list(BUILTIN_TASKS) + [q.task for q in self.user_prompts]))

    def user_prompt_file(self) -> str | None:
        return str(user_prompts_path()) if self.user_prompts else None

    # -- settings --------------------------------------------------------------------------
    def set_server_bin(self, path: str | None, *, checked: bool = False) -> None:
        """The llama-server binary; ``checked``: it answered, so remember it and redo the verdict
        (its command's flags are checked against it)."""
        self.server_bin = (path or "").strip() or None
        if checked:
            self.settings.setValue("server_bin", self.server_bin or "")
            self.server_changed.emit()
            self.rebuild_verdict()

    def set_task_mix(self, text: str) -> None:
        self.task_mix = text.strip()
        self.settings.setValue("task_mix", self.task_mix)
        self.rebuild_verdict()

    def set_shell(self, shell: str) -> None:
        self.shell = shell
        self.rebuild_verdict()

    def set_engine_options(self, *, ctx_size: int, n_gpu_layers: str | None, threads: int | None) -> None:
        self.ctx_size, self.n_gpu_layers, self.threads = ctx_size, n_gpu_layers, threads

    def engine_settings(self, kind: EngineKind | str) -> EngineSettings:
        """The settings every engine of the window is made from (sweeps and the export confirm)."""
        kind = EngineKind.parse(kind)
        return EngineSettings(kind=kind, ctx_size=self.ctx_size, threads=self.threads,
                              n_gpu_layers=self.n_gpu_layers,
                              server_bin=self.server_bin if kind is EngineKind.SERVER else None)

    # -- llama-server capabilities ---------------------------------------------------------
    def find_server(self) -> str | None:
        """The llama-server binary that would be used, or None when there is none."""
        from app.core.engines.server.binary import find_server_binary  # process plumbing: only when asked

        try:
            return find_server_binary(self.server_bin)
        except UserError:
            return None

    def read_capabilities(self, binary: str, done: Callable, failed: Callable | None = None) -> None:
        """Run ``binary --version/--help`` on a worker (a broken binary can take its whole timeout),
        then call ``done(caps)`` or ``failed(message)`` on the GUI thread."""
        from app.core.engines.server.binary import cached_capabilities, probe_capabilities  # see find_server

        caps = cached_capabilities(binary)
        if caps is not None:
            done(caps)
            return
        self._caps_waiting.setdefault(binary, []).append((done, failed))
        if binary in self.caps_jobs:
            return
        self.caps_failed.pop(binary, None)  # asked again: try again
        result: dict = {}

        def factory(cancel):
            yield probe_capabilities(binary, cancel=cancel)

        def finished():
            self.caps_jobs.pop(binary)
            for ok, bad in self._caps_waiting.pop(binary, []):
                if "caps" in result:
                    ok(result["caps"])
                elif bad is not None:
                    bad(result.get("error", f"{binary}: no answer"))

        job = CoreJob(factory, self)
        job.event.connect(lambda caps: result.__setitem__("caps", caps))
        job.failed.connect(lambda m: (result.__setitem__("error", m), self.caps_failed.__setitem__(binary, m)))
        job.finished.connect(finished)
        self.caps_jobs[binary] = job
        job.start()

    # -- llama.cpp runtimes -----------------------------------------------------------------
    def selected_runtime(self):
        """The selected llama.cpp runtime (app.core.machine.runtime_store.Runtime), else None."""
        return runtime_store.selected()

    def install_runtime(self) -> CoreJob:
        """"Get llama.cpp for this machine": read the upstream release, pick the build for this
        hardware (and say why), download, validate and select it, on a worker. Events: lines of
        text, DownloadProgress, then the Runtime; ``runtimes_changed`` fires when one was installed."""
        hw = self.hardware()

        def factory(cancel):
            from app.core.engines.server.runtime_install import install_for_machine  # process plumbing: when asked

            yield from install_for_machine(hw, cancel=cancel)  # on the worker: it runs ldconfig, downloads

        job = self.track(CoreJob(factory, self))

        def on_event(ev) -> None:
            if isinstance(ev, runtime_store.Runtime):
                if self.server_bin:  # asked for this machine's build: it replaces one chosen by hand
                    self.status.emit(f"llama-server: now the installed {ev.name}, not {self.server_bin}")
                    self.server_bin = None
                    self.settings.setValue("server_bin", "")
                self.runtimes_changed.emit()  # asks the engines again (once: not for the next one too)
                self._one_change = True
                try:
                    self.server_changed.emit()
                finally:
                    self._one_change = False
                self.rebuild_verdict()

        job.event.connect(on_event)
        return job

    # -- which device each engine will use; the engine that matches the GPU ----------------
    def check_engines(self) -> CoreJob:
        """Ask each engine for its backends and devices (llama-cpp-python's registry; llama-server
        --list-devices: on a worker), then choose the engine that runs on this machine's GPU (the
        core's choose_engine). ``engines_checked`` carries the rows, ``engine_choice_changed`` the
        choice (None when asked: being checked). Started here; a check asked while one runs is that
        one."""
        if self.engines_job is not None:
            return self.engines_job
        server_bin = self.server_bin

        def factory(cancel):
            from app.core.engines.devices import engine_backends  # loads llama.cpp: only when asked
            from app.core.engines.server.binary import find_server_binary
            rows = engine_backends(server_bin)
            cancel.check()
            rt = runtime_store.selected()
            try:
                used = find_server_binary(server_bin)
            except UserError:
                used = None
            yield rows, (rt.name if rt is not None and used == str(rt.server) else None)

        def on_event(answer) -> None:
            rows, runtime = answer
            self.engine_rows = rows
            self.engine_choice = engine_choice(host_gpu_names(self.hardware()), rows, runtime)
            self.engines_checked.emit(rows)
            self.engine_choice_changed.emit(self.engine_choice)

        def failed(msg: str) -> None:
            self.engine_rows = self.engine_choice = None
            self.show_error(f"could not ask the engines for their devices: {msg}")

        def finished() -> None:
            self.engines_job = None
            if self._engines_again:  # the binary, runtime or hardware changed while it ran
                self._engines_again = False
                self.check_engines()

        job = self.engines_job = self.track(CoreJob(factory, self))
        job.event.connect(on_event)
        job.failed.connect(failed)
        job.finished.connect(finished)
        self.engine_choice = None
        self.engine_choice_changed.emit(None)
        job.start()
        return job

    def _engines_changed(self) -> None:
        """A llama-server, runtime or hardware change: ask the engines again if they were asked."""
        if self._one_change:
            return
        if self.engines_job is not None:
            self._engines_again = True
        elif self.engine_rows is not None:
            self.check_engines()

    # -- the sweep shown and its verdict ---------------------------------------------------
    _KEEP = object()

    def set_results(self, records: list, path: Path | None, *, notes: list[str] | None = None,
                    cost_records=_KEEP) -> None:
        """The sweep to show (a finished sweep, an opened file, or an empty list while one runs)."""
        self.records, self.results_path, self.setting_index = list(records), path, 0
        self.file_notes = list(notes or [])
        if cost_records is not self._KEEP:
            self.cost_records = list(cost_records)
        self.records_changed.emit()
        self.rebuild_verdict()

    def set_setting(self, index: int) -> None:
        """Judge the sweep's ``index``-th setting (see setting_labels)."""
        self.setting_index = index
        self.rebuild_verdict()

    def add_probe(self, rec) -> None:
        """A cost-probe record (the Machine tab's probe, or the adaptive sweep's)."""
        from app.core.verdict import probe_sentence  # the verdict layer: loaded with the first results

        self.probe_record = rec
        self.probe_text = probe_sentence(rec)
        self.cost_records.append(rec)
        self.probe_changed.emit(rec)
        self.rebuild_verdict()

    def probe_costs(self):
        """The costs the verdict uses (probe or fitted from the runs), or None."""
        return self.verdict.costs if self.verdict is not None else None

    def rebuild_verdict(self) -> None:
        """The one place the verdict is built (by the core's build_verdict); tabs only render it."""
        ok = [r for r in self.records if r.status == "ok"]
        if not ok:
            self.verdict, self.mix_error = None, None
            self.verdict_changed.emit(None)
            return
        # the analysis, the verdict and the export: numpy-backed, loaded with the first results
        from app.core.analysis.analysis import analyze
        from app.core.engines.server.binary import cached_capabilities
        from app.core.verdict import ExportOptions, build_verdict

        from app.core.analysis.settings import pick_setting

        runs, self.setting_labels = pick_setting(self.records, self.setting_index)
        key = (len(self.records), self.setting_index)
        if self._analysis_of is None or self._analysis_of[0] is not self.records or self._analysis_of[1] != key:
            self._analysis_of = (self.records, key, analyze(runs))
        analysis = self._analysis_of[2]
        binary = self.find_server()
        caps = cached_capabilities(binary) if binary else None
        if binary and caps is None and binary not in self.caps_failed:
            # the command's flags are checked on a worker; the verdict is rebuilt when it answers
            self.read_capabilities(binary, lambda _c: self.rebuild_verdict(), lambda _m: self.rebuild_verdict())
        kw = dict(cost_records=self.cost_records, caps=caps, binary=binary, analysis=analysis,
                  options=ExportOptions(shell=self.shell, n_gpu_layers=self.n_gpu_layers))
        try:
            self.verdict, self.mix_error = build_verdict(runs, mix=self.task_mix or None, **kw), None
        except UserError as e:  # a bad task mix: the rest is shown with equal weights
            self.verdict, self.mix_error = build_verdict(runs, **kw), str(e)
        self.verdict_changed.emit(self.verdict)

    def caps_pending(self) -> str | None:
        """The binary whose flags are being read for the verdict's command, or None."""
        binary = self.find_server()
        return binary if binary and binary in self.caps_jobs else None
