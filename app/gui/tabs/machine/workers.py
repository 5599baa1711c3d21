"""The Machine tab's RPC workers: the other machines (``host:port``, each running ``mtp-tuner
rpc-worker`` or llama.cpp's ggml-rpc-server) a model is split over with llama-server's --rpc.
Added and removed here (AppState.rpc_workers, rpc_workers_changed); Check asks each one, off the
GUI thread, whether it answers, its round trip, its devices' memory and whether its build fits
this machine's; and the memory fit of the chosen model is spread over this machine and them."""

from __future__ import annotations

from collections.abc import Iterator

from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from app.core.common.workers import Workers
from app.core.common.cancel import CancelToken
from app.core.common.errors import UserError
from app.core.common.text import printable
from app.core.engines.server.rpc_check import (WorkerInfo, build_match, devices_text, gib, iter_workers,
                                                local_version)
from app.core.engines.server.rpc_worker import MAX_WORKERS, REMOTE_WARNING, parse_endpoint
from app.core.machine.fit import fit_summary, spread_line

from ...adapter import CoreJob
from ...common import fill, table
from ...jobs import Jobs
from ...state import AppState

COLUMNS = ["worker", "answers", "round trip", "devices and free memory", "build"]
TIPS = {1: "whether it answered llama.cpp's RPC HELLO (a worker serves one client at a time: one in use "
           "by a llama-server does not answer)",
        2: "the median time of one request and its answer on an open connection",
        3: "as the worker reports them: free of total memory per device",
        4: "whether its llama.cpp speaks the RPC protocol of this machine's llama-server (it refuses others)"}


class _Local:
    """This machine's RPC protocol version, as the check's first event (the worker found beside
    this machine's llama-server, started for a moment and asked)."""

    def __init__(self, version: tuple[int, int, int] | None):
        self.version = version


class WorkersBox(QGroupBox):
    def __init__(self, state: AppState, jobs: Jobs, parent: QWidget | None = None):
        super().__init__("RPC workers: other machines the model is split over (llama-server --rpc)", parent)
        self.state, self.jobs = state, jobs
        self.infos: dict[str, WorkerInfo] = {}
        self.local: tuple[int, int, int] | None = None
        self.job: CoreJob | None = None
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("HOST:PORT of a worker (start one there: mtp-tuner rpc-worker --host ADDRESS)")
        self.edit.setToolTip(REMOTE_WARNING.format(where="a worker"))
        self.edit.returnPressed.connect(self.add)
        add = QPushButton("Add")
        add.clicked.connect(self.add)
        self.remove_btn = QPushButton("Remove")
        self.remove_btn.setToolTip("Remove the selected worker")
        self.remove_btn.clicked.connect(self.remove)
        self.check_btn = QPushButton("Check")
        self.check_btn.setToolTip("Ask each worker: does it answer, its round trip, its devices and memory, "
                                  "its build")
        self.check_btn.clicked.connect(self.check)
        row = QHBoxLayout()
        for w, stretch in ((self.edit, 1), (add, 0), (self.remove_btn, 0), (self.check_btn, 0)):
            row.addWidget(w, stretch)
        self.list = table(COLUMNS, TIPS)
        self.list.setMaximumHeight(110)
        self.note = QLabel("")
        self.note.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.addLayout(row)
        lay.addWidget(self.list)
        lay.addWidget(self.note)
        state.rpc_workers_changed.connect(self.show)
        state.model_info_changed.connect(lambda _info: self.show())
        state.hardware_changed.connect(lambda _hw: self.show())
        self.show()

    def _set(self, workers: tuple[str, ...]) -> None:
        self.state.rpc_workers = workers
        self._publish()

    def _publish(self) -> None:
        """What the listed workers reported, for the fits elsewhere (the Model tab's), and the signal."""
        self.state.rpc_worker_free = {w: i.free_bytes for w, i in self.infos.items()
                                      if i.usable and w in self.state.rpc_workers}
        self.state.rpc_workers_changed.emit()

    def add(self) -> None:
        try:
            endpoint = str(parse_endpoint(self.edit.text()))
        except UserError as e:
            self.note.setText(printable(e))
            return
        if endpoint in self.state.rpc_workers:
            self.note.setText(f"{endpoint} is in the list already")
            return
        if len(self.state.rpc_workers) >= MAX_WORKERS:
            self.note.setText(f"at most {MAX_WORKERS} workers")
            return
        self.edit.clear()
        self._set(self.state.rpc_workers + (endpoint,))

    def remove(self) -> None:
        rows = {i.row() for i in self.list.selectedIndexes()}
        self._set(tuple(w for i, w in enumerate(self.state.rpc_workers) if i not in rows))

    def check(self) -> None:
        """Ask every worker on a job thread, all at once with one deadline for all (iter_workers):
        the check takes the timeout at most, however many workers are dead or hostile."""
        from app.core.engines.server.binary import find_server_binary  # process plumbing: only when asked

        endpoints = list(Workers.parse(self.state.rpc_workers).endpoints) if self.state.rpc_workers else []
        if not endpoints:
            self.note.setText("add a worker first: HOST:PORT")
            return
        server_bin = self.state.server_bin

        def work(cancel: CancelToken) -> Iterator[object]:
            try:
                yield _Local(local_version(find_server_binary(server_bin)))
            except UserError:
                yield _Local(None)  # no llama-server here: the build match stays unknown
            for info in iter_workers(endpoints):  # all at once, one deadline for all
                cancel.check()
                yield info

        self.check_btn.setEnabled(False)
        self.note.setText("asking the workers…")
        self.job = self.jobs.run(work, self, event=self._event, failed=self.note.setText, finished=self._done)

    def _event(self, ev: object) -> None:
        if isinstance(ev, _Local):
            self.local = ev.version
        elif isinstance(ev, WorkerInfo):
            self.infos[str(ev.endpoint)] = ev
            fill(self.list, [self._row(w) for w in self.state.rpc_workers])

    def _done(self) -> None:
        self.job = None
        self._publish()  # shows them (rpc_workers_changed -> show)

    def _row(self, worker: str) -> tuple[str, str, str, str, str]:
        i = self.infos.get(worker)
        if i is None:
            return worker, "not checked", "", "", ""
        if not i.usable:
            return worker, f"no: {i.error}", "", "", ""
        rtt = f"{i.rtt_ms:.2f} ms" if i.rtt_ms is not None else "?"
        return worker, "yes", rtt, devices_text(i.devices), build_match(self.local, i.version)[1]

    def show(self) -> None:
        workers = self.state.rpc_workers
        self.infos = {w: i for w, i in self.infos.items() if w in workers}
        fill(self.list, [self._row(w) for w in workers])
        self.remove_btn.setEnabled(bool(workers))
        self.check_btn.setEnabled(bool(workers) and self.job is None)
        if self.job is None:
            self.note.setText(printable(self._fit_text()))

    def _fit_text(self) -> str:
        """The chosen model spread over this machine and the workers that answered."""
        free = [i.free_bytes for i in self.infos.values() if i.usable]
        if not self.state.rpc_workers:
            return "no workers: the model runs on this machine alone"
        info = self.state.model_info
        if not free or info is None:
            return ("Check the workers to see their memory" if not free else
                    f"{len(free)} worker(s) with {gib(sum(free))} free; choose a model (Model tab) to see "
                    "whether it fits across them")
        s = fit_summary(info, self.state.hardware())
        return "memory fit with the workers:\n" + "\n".join(spread_line(f, free) for f in s.fits)
