"""Model tab: the local library, catalog and Hub search, a repo's files with fit badges, resumable
downloads, and the inspection summary with the memory fit baseline vs MTP."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any
from pathlib import Path

from PySide6.QtCore import QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import (QComboBox, QFileDialog, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QPlainTextEdit, QProgressBar, QPushButton, QSpinBox, QSplitter, QTabWidget,
                               QVBoxLayout, QWidget)

from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.common.paths import cache_dir, models_dir
from app.core.common.text import printable
from app.core.machine import hub, hub_download
from app.core.machine.download import DownloadProgress, progress_text
from app.core.machine.fit import FitSummary, fit_summary, overhead_line, sized_by_line, spread_line
from app.core.machine.hardware import HardwareSnapshot
from app.core.machine.hub_token import read_token
from app.core.machine.modelinfo import ModelInfo, format_info, inspect
from app.core.session.memory import sized_fit_summary

from ..adapter import CoreJob
from ..common import fill, gib, table
from ..jobs import Jobs
from ..state import AppState
from ..drafter_row import DrafterRow, library_dirs

FIT_JOB = "model-tab-fit"  # the Model tab's dry run of the fit (one at a time)
log = logging.getLogger("mtp_tuner")

FIT_TIP = ("From the file size plus ~15 % for KV cache, the MTP context and buffers, against this "
           "machine's GPU memory (or RAM without a GPU). The exact figure comes from inspecting the file")


class ModelTab(QWidget):
    download_finished = Signal()

    def __init__(self, state: AppState, jobs: Jobs, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.jobs = jobs
        self.settings = state.settings
        lay = QVBoxLayout(self)
        row = QHBoxLayout()
        self.model_edit = QLineEdit()
        self.model_edit.setPlaceholderText("a GGUF with MTP heads (e.g. Qwen3.6-27B-MTP-Q4_K_M.gguf)")
        self.model_edit.setToolTip("The model every sweep and the cost probe run on")
        browse = QPushButton("Open GGUF…")
        browse.clicked.connect(self.browse_model)
        demo = QPushButton("Use demo model")
        demo.setToolTip("A calibrated MTP model whose acceptance per task is known exactly (no download): "
                        "code accepts almost every draft, story almost none, so MTP pays for one and "
                        "not the other; its sweep takes about a minute on a 2-core CPU")
        demo.clicked.connect(state.use_demo_model)
        row.addWidget(self.model_edit, 1)
        row.addWidget(browse)
        row.addWidget(demo)
        self.model_edit.editingFinished.connect(lambda: self.set_model(self.model_edit.text()))
        lay.addLayout(row)
        self._local: list[hub.LocalModel] = []
        self.drafter_row = DrafterRow(state, jobs, lambda: [m.path for m in self._local if m.problem is None], self)
        self.drafter_row.checked.connect(lambda _info: self.update_fit())
        lay.addWidget(self.drafter_row)

        split = QSplitter(Qt.Orientation.Horizontal)
        left = QTabWidget()
        # local library
        lib = QWidget()
        ll = QVBoxLayout(lib)
        self.library = table(["file", "size", "MTP", "arch", "where"],
                             {2: "Whether the file carries MTP heads (nextn layers)"})
        self.library.doubleClicked.connect(self._library_pick)
        self.library.setToolTip("GGUFs in the models folder and the Hugging Face cache; double-click to use one")
        lrow = QHBoxLayout()
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.refresh_library)
        add_dir = QPushButton("Add folder…")
        add_dir.setToolTip("Also list the GGUFs in a folder of yours (remembered)")
        add_dir.clicked.connect(self.add_library_dir)
        lrow.addWidget(refresh)
        lrow.addWidget(add_dir)
        lrow.addStretch(1)
        self.library_note = QLabel("")
        self.library_note.setWordWrap(True)
        ll.addWidget(self.library, 1)
        ll.addWidget(self.library_note)
        ll.addLayout(lrow)
        left.addTab(lib, "On this machine")
        # find and download
        find = QWidget()
        fl = QVBoxLayout(find)
        srow = QHBoxLayout()
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("search MTP GGUFs, e.g. qwen3.6 (empty: the catalog)")
        self.search_edit.returnPressed.connect(self.search_models)
        self.search_btn = QPushButton("Search")
        self.search_btn.setToolTip("The built-in catalog first, then Hugging Face repos whose name has gguf and mtp")
        self.search_btn.clicked.connect(self.search_models)
        srow.addWidget(self.search_edit, 1)
        srow.addWidget(self.search_btn)
        self.repos = table(["repo", "arch", "kind", "notes", "source"])
        self.repos.itemSelectionChanged.connect(self.list_repo_files)
        self.files = table(["quant", "size", "fit", "file"], {2: FIT_TIP})
        self.download_btn = QPushButton("Download selected")
        self.download_btn.setToolTip("Resumable: an interrupted download continues where it stopped; the "
                                     "file is checked against its sha256 before it is used")
        self.download_btn.clicked.connect(self.download_selected)
        self.download_cancel_btn = QPushButton("Cancel download")
        self.download_cancel_btn.setEnabled(False)
        self.download_cancel_btn.clicked.connect(self._cancel_download)
        self.download_progress = QProgressBar()
        self.download_label = QLabel("")
        drow = QHBoxLayout()
        drow.addWidget(self.download_btn)
        drow.addWidget(self.download_cancel_btn)
        fl.addLayout(srow)
        fl.addWidget(self.repos, 1)
        fl.addWidget(self.files, 1)
        fl.addLayout(drow)
        fl.addWidget(self.download_progress)
        fl.addWidget(self.download_label)
        left.addTab(find, "Find and download")
        self.model_sources = left
        split.addWidget(left)
        # inspection and fit
        right = QWidget()
        rl = QVBoxLayout(right)
        self.model_info = QPlainTextEdit(readOnly=True)
        self.model_info.setToolTip("Read from the GGUF header only (the file is not loaded)")
        form = QFormLayout()
        self.fit_ctx = QSpinBox(minimum=512, maximum=1048576, value=8192, singleStep=4096)
        self.fit_ctx.setToolTip("Context length (-c) to budget the KV cache for")
        self.fit_cache = QComboBox()
        self.fit_cache.addItems(["f16", "q8_0", "q4_0", "bf16", "f32"])
        self.fit_cache.setToolTip("KV cache type (--cache-type-k/-v); q8_0 about halves the KV memory")
        self.fit_k = QSpinBox(minimum=1, maximum=16, value=3)
        self.fit_k.setToolTip("Draft width: hybrid models keep 1 + K copies of their recurrent state with MTP on")
        for wdg in (self.fit_ctx, self.fit_cache, self.fit_k):
            (wdg.valueChanged if isinstance(wdg, QSpinBox) else wdg.currentTextChanged).connect(
                lambda *_: self.update_fit())
        form.addRow("context", self.fit_ctx)
        form.addRow("KV cache", self.fit_cache)
        form.addRow("draft width K", self.fit_k)
        self.fit_table = table(["", "needs", "verdict", "flags", "largest context"],
                               {2: "fits / fits with flags (--n-cpu-moe or -ngl) / does not fit",
                                3: "llama-server flags that make it fit"})
        self.fit_table.setMaximumHeight(140)
        self.fit_label = QLabel("")
        self.fit_label.setWordWrap(True)
        # llama.cpp's dry run sizes the fit after the inputs rest for a moment (a spin box's steps size once)
        self._fit_sizing = QTimer(self, singleShot=True, interval=400)
        self._fit_sizing.timeout.connect(self._size_fit)
        self._fit_again = False
        self._fit_unsized = False  # the fit shown is the header model's, to be sized when the tab is shown
        rl.addWidget(self.model_info, 1)
        rl.addLayout(form)
        rl.addWidget(QLabel("Memory fit: baseline, MTP, and with the drafter"))
        rl.addWidget(self.fit_table)
        rl.addWidget(self.fit_label)
        split.addWidget(right)
        split.setSizes([600, 500])
        lay.addWidget(split, 1)
        self.model_info_obj: ModelInfo | None = None
        self.search_job: CoreJob | None = None
        self.files_job: CoreJob | None = None
        self.download_job: CoreJob | None = None
        self._repo_entries: list[hub.CatalogEntry] = []
        self._quants: list[hub.Quant] = []
        state.model_changed.connect(self._model_changed)
        state.hardware_changed.connect(lambda _hw: self.update_fit())
        state.rpc_workers_changed.connect(self.update_fit)
        self.refresh_library()

    # -- library --------------------------------------------------------------------------
    def _library_dirs(self) -> list[Path]:
        return library_dirs(self.settings)

    def add_library_dir(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Folder with GGUF models")
        if d:
            dirs = [str(p) for p in self._library_dirs()]
            if d not in dirs:
                self.settings.setValue("library_dirs", dirs + [d])
            self.refresh_library()

    def refresh_library(self) -> None:
        """The library; a file that does not read is a row marked unreadable with its reason, and
        a refresh that fails (it runs while the window is built) is a note here, never a crash."""
        note = ""
        try:
            self._local = hub.local_library(models_dir(), self._library_dirs() + [cache_dir() / "models"])
        except Exception as e:  # noqa: BLE001 - logged with its traceback, and said in the tab
            log.exception("library refresh failed")
            self._local = []
            note = f"could not list the models: {type(e).__name__}: {str(e)[:300]}"
        fill(self.library, [(m.path, gib(m.size), {True: "yes", False: "no", None: "unreadable"}[m.has_mtp],
                             m.arch or "?", m.where) for m in self._local],
             [m.problem for m in self._local])
        bad = [m.problem for m in self._local if m.problem]
        if bad and not note:
            note = (f"{len(bad)} file(s) could not be read and cannot be used (hover a row for why): "
                    + "; ".join(bad[:2]))
        self.library_note.setText(printable(note))

    def _library_pick(self, index: QModelIndex) -> None:
        self.set_model(self._local[index.row()].path)

    # -- find and download ----------------------------------------------------------------
    def hub_client(self) -> hub.HubClient:
        try:  # the token as the CLI reads it (HF_TOKEN / HUGGING_FACE_HUB_TOKEN)
            return hub.HubClient(token=read_token())
        except UserError as e:  # a malformed token: said (never shown), and the Hub asked without it
            self.state.show_error(str(e))
            return hub.HubClient()

    def search_models(self) -> None:
        q = self.search_edit.text().strip()
        catalog = hub.load_catalog()
        if not q:
            self._show_repos(catalog)
            return
        self.search_btn.setEnabled(False)
        client = self.hub_client()
        self._show_repos(hub.merged_search(None, q, catalog))  # the catalog's answer at once

        def factory(cancel: CancelToken) -> Iterator[list[hub.CatalogEntry]]:
            yield hub.merged_search(client, q, catalog)

        self.search_job = self.jobs.run(factory, self, event=self._show_repos, failed=self._say,
                                        finished=lambda: self.search_btn.setEnabled(True))

    def _show_repos(self, entries: Sequence[hub.CatalogEntry]) -> None:
        self._repo_entries = list(entries)
        fill(self.repos, [(e.repo, e.arch, e.kind, e.notes, e.source) for e in self._repo_entries])
        if not entries:
            self.download_label.setText("no MTP GGUF repos found")

    def list_repo_files(self) -> None:
        rows = self.repos.selectionModel().selectedRows()
        if not rows or self.files_job is not None:
            return
        entry = self._repo_entries[rows[0].row()]
        client = self.hub_client()
        self._say(f"listing {entry.repo}…")

        def factory(cancel: CancelToken) -> Iterator[hub.RepoFiles]:
            yield client.repo_files(entry.repo)

        def done() -> None:
            self.files_job = None

        self.files_job = self.jobs.run(factory, self, event=lambda rf: self._show_files(rf, entry), failed=self._say,
                                       finished=done)

    def _show_files(self, rf: hub.RepoFiles, entry: hub.CatalogEntry) -> None:
        h = self.state.hardware()
        gpu = h.gpus[0].vram_total if h.gpus else None
        ram = h.ram_total
        self._repo_files = rf
        self._quants = list(rf.quants)
        fill(self.files, [(q.name, gib(q.size), hub.size_fit(q.size, gpu, ram, entry.kind == "moe"),
                           q.first.path + (f" ({len(q.files)} parts)" if len(q.files) > 1 else ""))
                          for q in self._quants])
        self._say(f"{rf.repo} at {rf.commit[:12]}: {len(self._quants)} GGUF(s)"
                  + (f"; {len(rf.refused)} listed name(s) refused as unsafe to save: "
                     + "; ".join(rf.refused[:3]) if rf.refused else ""))

    def download_selected(self) -> None:
        rows = self.files.selectionModel().selectedRows()
        if not rows:
            self.state.show_error("choose a file to download (select a repo, then a row in its files)")
            return
        rf, q = self._repo_files, self._quants[rows[0].row()]
        client = self.hub_client()
        dest = models_dir()

        def factory(cancel: CancelToken) -> Iterator[DownloadProgress | hub_download.DownloadResult]:
            for f in q.files:  # split parts one after another, each resumable and verified
                yield from hub_download.download(client, rf.repo, f.path, revision=rf.commit, models_dir=dest,
                                        expected_sha256=f.sha256, expected_size=f.size, cancel=cancel)

        results: list[hub_download.DownloadResult] = []

        def on_event(ev: DownloadProgress | hub_download.DownloadResult) -> None:
            if isinstance(ev, hub_download.DownloadResult):
                results.append(ev)
                return
            self.download_progress.setMaximum(max(1, ev.total // 1024))
            self.download_progress.setValue(ev.done // 1024)
            self._say(f"{q.name}: {progress_text(ev)}")

        def done() -> None:
            self.download_btn.setEnabled(True)
            self.download_cancel_btn.setEnabled(False)
            assert self.download_job is not None  # this is its finished handler
            cancelled = self.download_job.cancel_token.cancelled
            self.download_job = None
            if cancelled:
                self.download_label.setText("download cancelled; Download again continues where it stopped")
            elif len(results) == len(q.files):
                r = results[0]
                mtp = {True: "MTP heads present", False: "NO MTP heads", None: "not inspected"}[r.has_mtp]
                self._say(f"{r.path}: sha256 verified; {mtp}")
                self.refresh_library()
                self.set_model(str(r.path))
            self.download_finished.emit()

        self.download_btn.setEnabled(False)
        self.download_cancel_btn.setEnabled(True)
        self.download_job = self.jobs.run(factory, self, event=on_event, failed=self._say,  # said once, beside the button
                                          finished=done)

    def _cancel_download(self) -> None:
        if self.download_job is not None:
            self.download_job.cancel()

    def _say(self, text: str) -> None:
        """The download line: Hub names, file names and errors come from outside (printable)."""
        self.download_label.setText(printable(text))

    # -- the chosen model -----------------------------------------------------------------
    def browse_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open GGUF", "", "GGUF models (*.gguf)")
        if path:
            self.set_model(path)

    def set_model(self, path: str) -> None:
        self.state.set_model(path)

    def _model_changed(self, path: str) -> None:
        if self.model_edit.text() != path:
            self.model_edit.setText(path)
        self.inspect_model()

    def inspect_model(self) -> None:
        path = self.state.model
        if not path:
            return
        try:
            info = inspect(path)
            self.model_info.setPlainText(printable(format_info(info)))
            self.settings.setValue("last_model", path)
        except UserError as e:
            info = None
            self.model_info.setPlainText(printable(e))
        self.model_info_obj = info
        self.update_fit()
        self.state.set_model_info(info)

    def _fit_inputs(self) -> tuple[ModelInfo, HardwareSnapshot, dict[str, Any]] | None:
        m = self.model_info_obj
        if m is None:
            return None
        return m, self.state.hardware(), {"ctx": self.fit_ctx.value(), "cache_type": self.fit_cache.currentText(),
                                          "k": self.fit_k.value(), "drafter": self.drafter_row.info}

    def update_fit(self) -> None:
        """The fit at once by the header model, then, once llama.cpp's dry run has sized it (the
        sweep's own memory check, session.memory.sized_fit_summary: seconds, in a job), by that."""
        got = self._fit_inputs()
        if got is None:
            fill(self.fit_table, [])
            self.fit_label.setText("")
            return
        m, hw, kw = got
        if self.isVisible():
            self._show_fit(fit_summary(m, hw, **kw), "; sizing it with llama.cpp's dry run...")
            self._fit_sizing.start()
        else:  # sized by llama.cpp when the tab is shown (no child process for a tab nobody looks at)
            self._show_fit(fit_summary(m, hw, **kw))
            self._fit_unsized = True

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if self._fit_unsized:
            self._fit_unsized = False
            self.update_fit()

    def hideEvent(self, event: QHideEvent) -> None:  # noqa: N802 (Qt's name)
        super().hideEvent(event)
        if self._fit_sizing.isActive():  # passed through: sized when shown again
            self._fit_sizing.stop()
            self._fit_unsized = True

    def _size_fit(self) -> None:
        """One dry run at a time: a change meanwhile sizes again when it ends."""
        got = self._fit_inputs()
        if got is None:
            return
        if self.jobs.get(FIT_JOB) is not None:
            self._fit_again = True
            return
        m, hw, kw = got

        def factory(cancel: CancelToken) -> Iterator[FitSummary]:
            yield sized_fit_summary(m, hw, **kw, cancel=cancel)

        def current() -> bool:
            now = self._fit_inputs()
            return now is not None and now[0] is m and now[2] == kw

        def show(s: FitSummary) -> None:
            if current():
                self._show_fit(s)

        def failed(e: object) -> None:  # the header model's fit stays, said so
            if current():
                self._show_fit(fit_summary(m, hw, **kw), f" (llama.cpp's dry run failed: {printable(str(e))})")

        def done() -> None:
            if self._fit_again:
                self._fit_again = False
                self._size_fit()

        self.jobs.run(factory, self, key=FIT_JOB, event=show, failed=failed, finished=done)

    def _show_fit(self, s: FitSummary, pending: str = "") -> None:
        fill(self.fit_table, [(f.mode, gib(f.need_bytes), f.verdict, " ".join(f.flags), f.max_context or "-")
                              for f in s.fits], [f.explanation for f in s.fits])
        text = f"on {s.target}; {sized_by_line(s)}{pending}"
        if s.ceiling_tok_s:
            text += f"; roofline ceiling {s.ceiling_tok_s:.0f} tok/s at {s.bandwidth_gbs:.0f} GB/s"
        for f in s.fits[1:]:
            text += "\n" + overhead_line(s.fits[0], f)
        free = [self.state.rpc_worker_free[w] for w in self.state.rpc_workers if w in self.state.rpc_worker_free]
        if free:  # split over RPC workers (Machine tab): the fits across this machine and them
            text += "".join("\n" + spread_line(f, free) for f in s.fits)
        self.fit_label.setText(text)
