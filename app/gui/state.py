"""What the window's tabs share, and the only way they talk to each other: data and signals. Each tab (app/gui/tabs/) reads and writes
only its own widgets, this object and the services (app/gui/services/, jobs.py) it is given. Held here: the model, the sweep shown
(records, results file, probes), the setting judged, its verdict (built in ``rebuild_verdict`` only), settings several tabs use
(llama-server, the user's command, task mix, shell, engine settings, RPC workers, prompts), hardware, errors, status."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QSettings, Signal

from app.core.analysis.answer import answer_length_of
from app.core.common.workers import Workers
from app.core.common.errors import UserError
from app.core.common.paths import user_prompts_path
from app.core.engines.base import EngineKind, EngineSettings
from app.gui.own_command import OwnCommand
from app.core.machine.hardware import HardwareSnapshot, snapshot
from app.core.machine.modelinfo import ModelInfo
from app.core.measure.prompts import BUILTIN_TASKS, user_prompts
from app.core.records.prompt import Prompt
from app.core.records.schema import RunRecord

if TYPE_CHECKING:  # numpy-backed: loaded with the first results (see rebuild_verdict)
    from app.core.analysis.analysis import Analysis
    from app.core.records.cost import CostRecord
    from app.core.verdict import Verdict

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
    rpc_workers_changed = Signal()  # the RPC workers the model is split over (rpc_workers) or their report changed
    records_changed = Signal()  # the sweep shown: records, results_path, cost_records, file_notes
    verdict_changed = Signal(object)  # Verdict or None
    probe_changed = Signal(object)  # the latest cost-probe record (CostRecord)
    demo_chosen = Signal()  # the demo model was chosen: the demo sweep's settings apply
    sweep_requested = Signal(object)  # a Plan to show in the Sweep tab and run (Run again)
    sweep_started = Signal(object)  # the Plan that started
    sweep_finished = Signal(bool)  # cancelled?
    sweep_warning = Signal(str)
    capabilities_needed = Signal(str)  # the verdict's command is checked against this binary's flags
    command_requested = Signal(str)  # show the command for this task on Export ("" for the user's mix)

    def __init__(self, settings: QSettings | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.settings = settings if settings is not None else QSettings("mtp-tuner", "mtp-tuner")
        self.model = ""
        self.drafter = ""
        self.model_info: ModelInfo | None = None
        self._hw: HardwareSnapshot | None = None
        self._user_prompts: list[Prompt] | None = None
        self.server_bin: str | None = str(self.settings.value("server_bin", "")).strip() or None
        self.task_mix = str(self.settings.value("task_mix", "")).strip()
        self.answer_length = answer_length_of(self.settings.value("answer_length", ""))  # None: not set
        self.shell = "bash"
        self.ctx_size = 4096  # -c for the sweep's engines (0: the model's own)
        self.n_gpu_layers: str | None = None  # -ngl text; None: each engine's default
        self.threads: int | None = None
        self.sweep_engine: EngineKind = EngineKind.INPROCESS  # the Sweep tab's engine: where the Machine tab's probe measures
        self.rpc_workers: tuple[str, ...] = ()  # RPC workers ("host:port", --rpc) the model is split over (Machine tab)
        self.rpc_worker_free: dict[str, int] = {}  # free bytes each reported at its last Check: the fit spreads over them
        self.own_command = OwnCommand(self, self)  # the user's own llama-server command: its flags measured and answered with
        self.records: list[RunRecord] = []
        self.results_path: Path | None = None
        self.cost_records: list[CostRecord] = []  # cost-probe records that may apply to the sweep shown
        self.file_notes: list[str] = []  # problems of an opened results file
        self.probe_record: CostRecord | None = None
        self.probe_text = ""
        self.verdict: Verdict | None = None
        self.mix_error: str | None = None
        self.last_error: str | None = None
        self.setting_labels: list[str] = []  # a sweep of several settings (sampler, thinking, depth): their labels
        self.setting_index = 0
        self.where = ""  # over RPC workers: the placement that pays (story.where_story)
        self.sweep_running = False
        self._analysis_of: tuple[list[RunRecord], tuple[int, int], Analysis] | None = None  # records, key, analysis

    # -- messages --------------------------------------------------------------------------
    def show_error(self, message: str) -> None:
        log.warning("shown to the user: %s", message)
        self.last_error = message
        self.status.emit(message)
        self.error.emit(message)

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

    def set_model_info(self, info: ModelInfo | None) -> None:
        self.model_info = info
        self.model_info_changed.emit(info)

    def hardware(self) -> HardwareSnapshot:  # read once (refresh_hardware reads it again)
        if self._hw is None:
            self._hw = snapshot()
        return self._hw

    def set_hardware(self, hw: HardwareSnapshot) -> None:
        self._hw = hw
        self.hardware_changed.emit(hw)

    def refresh_hardware(self) -> None:
        self.set_hardware(snapshot())

    @property
    def user_prompts(self) -> list[Prompt]:
        if self._user_prompts is None:
            self.reload_prompts()
        assert self._user_prompts is not None  # reload_prompts sets it
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
        """The llama-server binary; ``checked``: it answered: kept, and the verdict's flags checked on it."""
        self.server_bin = (path or "").strip() or None
        if checked:
            self.settings.setValue("server_bin", self.server_bin or "")
            self.server_changed.emit()
            self.rebuild_verdict()

    def set_task_mix(self, text: str) -> None:
        self.task_mix = text.strip()
        self.settings.setValue("task_mix", self.task_mix)
        self.rebuild_verdict()

    def set_answer_length(self, tokens: int | None) -> None:  # None: not set; the verdict's gain at it
        self.answer_length = answer_length_of(tokens)
        self.settings.setValue("answer_length", self.answer_length or "")
        self.rebuild_verdict()

    def set_shell(self, shell: str) -> None:
        self.shell = shell
        self.rebuild_verdict()

    def set_engine_options(self, *, ctx_size: int, n_gpu_layers: str | None, threads: int | None) -> None:
        self.ctx_size = ctx_size
        self.n_gpu_layers = n_gpu_layers
        self.threads = threads

    def engine_settings(self, kind: EngineKind | str) -> EngineSettings:
        """The settings every engine of the window is made from (sweeps and the export confirm)."""
        kind = EngineKind.SERVER if self.rpc_workers else EngineKind.parse(kind)  # only llama-server takes workers
        return self.own_command.applied(EngineSettings(kind=kind, ctx_size=self.ctx_size, threads=self.threads, rpc=Workers.parse(self.rpc_workers) if self.rpc_workers else None,
                                        n_gpu_layers=self.n_gpu_layers, server_bin=self.server_bin if kind is EngineKind.SERVER else None))

    def find_server(self) -> str | None:
        """The llama-server binary that would be used, or None when there is none."""
        from app.core.verdict.judge import find_server  # process plumbing: only when asked

        return find_server(self.server_bin, cached_only=True).binary

    # -- the sweep shown and its verdict ---------------------------------------------------
    def set_results(self, records: Iterable[RunRecord], path: Path | None, *, notes: list[str] | None = None,
                    cost_records: Iterable[CostRecord] | None = None) -> None:
        """The sweep to show (finished, opened, or [] while one runs); ``cost_records``: None keeps those held."""
        self.records = list(records)
        self.results_path = path
        from app.gui.story import where_story  # the verdict layer (numpy): with the first results
        if cost_records is not None:
            self.cost_records = list(cost_records)
        # placements over RPC: the core's joint verdict, priced as the verdict below is
        self.setting_index, self.where = where_story(self.records, self.task_mix or None, self.cost_records)
        self.file_notes = list(notes or [])
        self.records_changed.emit()
        self.rebuild_verdict()

    def set_setting(self, index: int) -> None:  # judge the sweep's index-th setting (setting_labels)
        self.setting_index = index
        self.rebuild_verdict()

    def add_probe(self, rec: CostRecord) -> None:  # the Machine tab's probe, or the adaptive sweep's
        from app.core.verdict import probe_sentence  # the verdict layer: loaded with the first results

        self.probe_record = rec
        self.probe_text = probe_sentence(rec)
        self.cost_records.append(rec)
        self.probe_changed.emit(rec)
        self.rebuild_verdict()

    def rebuild_verdict(self) -> None:
        """The one place the verdict is built (by the core's one entry, verdict.judge); tabs only render it."""
        ok = [r for r in self.records if r.status == "ok"]
        if not ok:
            self.verdict = None
            self.mix_error = None
            self.verdict_changed.emit(None)
            return
        from app.core.analysis.analysis import analyze  # analysis, verdict, export: numpy, with the first results
        from app.core.analysis.settings import pick_setting
        from app.core.verdict import ExportOptions
        from app.core.verdict.judge import find_server, judge

        runs, _ = pick_setting(self.records, self.setting_index)
        key = (len(self.records), self.setting_index)
        if self._analysis_of is None or self._analysis_of[0] is not self.records or self._analysis_of[1] != key:
            self._analysis_of = (self.records, key, analyze(runs))
        server = find_server(self.server_bin, cached_only=True)  # its flags as already read
        if server.binary and server.caps is None:  # its flags are read on a worker; the verdict is rebuilt with them
            self.capabilities_needed.emit(server.binary)

        def options(runs: Sequence[RunRecord]) -> ExportOptions:
            return ExportOptions(shell=self.shell, n_gpu_layers=self.n_gpu_layers,
                                 base_argv=self.own_command.base_argv_for(runs))

        # the core's one entry (as recommend, bench and tune): one setting, the window's probes
        j = judge(self.records, cost_records=self.cost_records, mix=self.task_mix or None, server=server,
                  options_for=options, setting=self.setting_index, joint=False, analysis=self._analysis_of[2],
                  lenient_mix=True, answer_tokens=self.answer_length)
        self.verdict = j.verdict
        self.mix_error = j.mix_error
        self.setting_labels = list(j.labels) if len(j.labels) > 1 else []
        self.verdict_changed.emit(self.verdict)
