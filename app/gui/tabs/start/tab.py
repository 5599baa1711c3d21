"""Start page, "Tune for me": the first tab, three choices and one button.

1. The model: the demo (no download), one on this machine (the models folder and the Hugging Face
   cache, or any GGUF file), or one from the catalog (the Model tab's Find and download).
2. What it is used for: code, chat or stories, tongue-twisters, the user's own prompts; several
   with weights. The declared use is kept in the settings (``declared_use``: a task or "mix";
   ``declared_weights``: the weights as "code=2,story=1") for Export's default, and becomes the
   task mix the verdict weighs.
3. How long: Quick (about 2 minutes) or Thorough (until every task is decided).

The parts: what the model is used for (uses.py); the request is the core's (app.core.session.tune,
as `mtp-tuner tune`'s), its time here how_long.py's. The button asks the engines which device each
uses (the device check), then starts an adaptive sweep (the cost probe first, then the runs,
stopping when decided or at the budget) on the window's sweep service
(app/gui/services/sweep.py), which runs it through the core session like any sweep; the Sweep tab
shows it too, its form following these choices. Progress shows here; at the end the window goes
to the verdict (Results), and the page keeps each task's answer, then the mix's (story.answer_html).
A model without MTP heads is said before anything starts, with what Tune for me measures there
instead (no_heads.py, the core's session.tune_arms as `mtp-tuner tune`'s: the n-gram modes, the
drafter it picked and why, their combination; a plain sweep on llama-server until decided) and the
catalog's MTP builds. The demo carries its banner: its drafts are wrong on purpose, per task."""

from __future__ import annotations

import html
import time
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (QButtonGroup, QCheckBox, QComboBox, QFileDialog, QGridLayout, QGroupBox, QHBoxLayout,
                               QLabel, QProgressBar, QPushButton, QRadioButton, QSizePolicy, QSpinBox,
                               QWidget)

from app.core.common.errors import UserError
from app.core.common.paths import models_dir
from app.core.common.text import printable
from app.core.common.units import duration
from app.core.engines.devices import EngineChoice
from app.core.session.clock import request_budget, tok_s_known
from app.core.session.request import Prepared, SweepRequest
from app.core.session.tune import QUICK_S, tune_engine, tune_request

from ...command_box import ServerCommandBox
from ...common import scrolling_page
from ...drafter_row import drafter_dirs
from ...jobs import Jobs
from ...services.engines import Engines
from ...services.sweep import SweepEnd, Sweeps
from ...state import AppState
from ...story import answer_html
from ...words import DEMO_NOTE, model_facts
from .finish import finish_request
from .how_long import flow_time, how_long_texts
from .library import fill_library, show_in_box
from .no_heads import NoHeadsPlan
from .uses import UseChooser

DEMO, DISK, CATALOG = 0, 1, 2


class StartTab(QWidget):
    catalog_requested = Signal()  # show the Model tab's catalog

    def __init__(self, state: AppState, engines: Engines, sweeps: Sweeps, parent: QWidget | None = None,
                 jobs: Jobs | None = None):
        super().__init__(parent)
        self.state = state
        self.engines = engines
        self.sweeps = sweeps
        settings = state.settings
        lay = scrolling_page(self)  # the command box open: the page scrolls, the window keeps the screen's height
        title = QLabel("<h2>Tune for me</h2>Three choices and one button: the app measures MTP on this machine "
                       "and tells you whether to turn it on, and with which draft width, for what you do.")
        title.setWordWrap(True)
        lay.addWidget(title)
        self.demo_banner = QLabel(f"<b>{DEMO_NOTE}</b>: the demo shows how the app decides; its verdicts say "
                                  "nothing about MTP on real models")
        self.demo_banner.setWordWrap(True)
        self.demo_banner.setStyleSheet("background: #fff3e0; color: #6d4c00; padding: 6px; border-radius: 3px")
        self.demo_banner.setVisible(False)
        lay.addWidget(self.demo_banner)
        # 1. the model
        box = QGroupBox("1. The model")
        g = QGridLayout(box)
        self.source = QButtonGroup(self)
        self.demo_radio = QRadioButton("The demo model (no download, about a minute)")
        self.disk_radio = QRadioButton("A model on this machine")
        self.catalog_radio = QRadioButton("One from the catalog")
        for i, b in enumerate((self.demo_radio, self.disk_radio, self.catalog_radio)):
            self.source.addButton(b, i)
        self.disk_box = QComboBox()
        self.disk_box.setToolTip("GGUFs in your models folder and the Hugging Face cache")
        self.disk_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.disk_box.setMinimumContentsLength(30)
        self.disk_box.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.disk_box.activated.connect(lambda _i: self._disk_chosen())
        browse = QPushButton("Open GGUF…")
        browse.clicked.connect(self.browse_model)
        catalog = QPushButton("Open the catalog")
        catalog.setToolTip("The Model tab's catalog of GGUFs with MTP heads: download one, then come back")
        catalog.clicked.connect(self.catalog_requested.emit)
        g.addWidget(self.demo_radio, 0, 0)
        g.addWidget(self.disk_radio, 1, 0)
        g.addWidget(self.disk_box, 1, 1)
        g.addWidget(browse, 1, 2)
        g.addWidget(self.catalog_radio, 2, 0)
        g.addWidget(catalog, 2, 1, Qt.AlignmentFlag.AlignLeft)
        g.setColumnStretch(1, 1)
        self.model_label = QLabel("")
        self.model_label.setWordWrap(True)
        self.model_label.setTextFormat(Qt.TextFormat.RichText)
        g.addWidget(self.model_label, 3, 0, 1, 3)
        # a model without MTP heads: what is measured instead, and the drafter picked and why
        self.plan = NoHeadsPlan(jobs if jobs is not None else Jobs(self), lambda: drafter_dirs(settings),
                                lambda: self.quick.isChecked(), self)
        self.plan.ready.connect(self._update)
        g.addWidget(self.plan, 4, 0, 1, 3)
        self.source.idToggled.connect(self._source_toggled)
        lay.addWidget(box)
        self.command_box = ServerCommandBox(state, folded=True)  # or: the user's own llama-server command (its model too)
        lay.addWidget(self.command_box)
        # 2. what for
        self.uses = UseChooser(state)
        self.uses.changed.connect(self._update)
        lay.addWidget(self.uses)
        # 3. how long
        howlong = QGroupBox("3. How long")
        hl = QHBoxLayout(howlong)
        self.quick = QRadioButton("Quick (about 2 minutes)")
        self.quick.setToolTip("Stops after about 2 minutes and says what is decided and what is not")
        self.thorough = QRadioButton("Thorough (until decided)")
        self.thorough.setToolTip("Runs until every task is decided: its best setting's interval within ±5 % and "
                                 "clear of the others, or every setting slower than MTP off")
        (self.thorough if settings.value("tune_length", "quick") == "thorough" else self.quick).setChecked(True)
        self.quick.toggled.connect(lambda on: settings.setValue("tune_length", "quick" if on else "thorough"))
        self.quick.toggled.connect(lambda _: self.plan.refresh())
        hl.addWidget(self.quick)
        hl.addWidget(self.thorough)
        hl.addStretch(1)
        lay.addWidget(howlong)
        # the button
        row = QHBoxLayout()
        self.tune_btn = QPushButton("Tune for me")
        f = self.tune_btn.font()
        f.setPointSizeF(f.pointSizeF() * 1.3)
        f.setBold(True)
        self.tune_btn.setFont(f)
        self.tune_btn.setMinimumHeight(44)
        self.tune_btn.clicked.connect(self.tune)
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setEnabled(False)
        self.cancel_btn.clicked.connect(sweeps.cancel)
        self.finish_btn = QPushButton("Finish when quiet")  # shown for a busy sweep's provisional answer
        self.finish_btn.setToolTip("Measure again, in quiet moments, only the runs of the last sweep that other "
                                   "programs disturbed (or it did not reach); its quiet runs are kept")
        self.finish_btn.clicked.connect(self.finish)
        row.addWidget(self.tune_btn, 1)
        row.addWidget(self.finish_btn)
        row.addWidget(self.cancel_btn)
        lay.addLayout(row)
        self.why_not = QLabel("")  # why the button is disabled
        self.why_not.setWordWrap(True)
        self.why_not.setStyleSheet("color: #c62828")
        lay.addWidget(self.why_not)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.progress_label = QLabel("")
        self.progress_label.setWordWrap(True)
        self.answer = QLabel("")
        self.answer.setWordWrap(True)
        self.answer.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.progress)
        lay.addWidget(self.progress_label)
        lay.addWidget(self.answer)
        lay.addStretch(1)
        self.running = False  # a sweep of this page's runs (or is being prepared)
        self._waiting_engines = False
        self._budget: float | None = None
        self._t0 = 0.0
        self._facts: tuple[bool | None, bool, str | None] = (None, False, None)
        self.timer = QTimer(self)
        self.timer.setInterval(1000)
        self.timer.timeout.connect(self._tick)
        self.refresh_library()
        state.model_changed.connect(self._model_changed)
        state.drafter_changed.connect(lambda _d: self._show_plan())
        state.verdict_changed.connect(lambda _v: self._update())  # "Finish when quiet" follows the verdict
        state.prompts_changed.connect(lambda: self.uses.set_tasks(self._facts[1]))
        sweeps.started.connect(self._sweep_started)
        sweeps.progress.connect(self._progress)
        sweeps.finished.connect(self._sweep_finished)
        engines.choice_changed.connect(self._engine_answer)
        self._model_changed(state.model)

    # -- 1. the model -----------------------------------------------------------------------
    def refresh_library(self) -> None:
        fill_library(self.disk_box)

    def browse_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open GGUF", str(models_dir()), "GGUF models (*.gguf);;All files (*)")
        if path:
            self.choose_model(path)

    def choose_model(self, path: str) -> None:
        """A model on this machine (the file chooser's, the list's, or a test's)."""
        show_in_box(self.disk_box, path)
        self.disk_radio.setChecked(True)
        self.state.set_model(path)

    def _disk_chosen(self) -> None:
        path = self.disk_box.currentData()
        if path:
            self.disk_radio.setChecked(True)
            if path != self.state.model:
                self.state.set_model(path)

    def _source_toggled(self, which: int, on: bool) -> None:
        if not on:
            return
        if which == DEMO and not (self.state.model and model_facts(self.state.model)[1]):
            try:
                self.state.use_demo_model()
            except UserError as e:
                self.state.show_error(str(e))
        elif which == DISK:
            self._disk_chosen()
        elif which == CATALOG:  # the catalog is on the Model tab: the window goes there
            self.catalog_requested.emit()
        self._update()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        self._sync_source()  # back from the catalog: the choice names the model chosen

    def _sync_source(self) -> None:
        """The model choice that names the state's model (the demo, or one on this machine)."""
        radio = self.demo_radio if self._facts[1] else self.disk_radio if self.state.model else None
        if radio is not None and not radio.isChecked():
            self.source.blockSignals(True)
            radio.setChecked(True)
            self.source.blockSignals(False)

    def _model_changed(self, path: str) -> None:
        self._facts = model_facts(path) if path else (None, False, None)
        has_mtp, demo, problem = self._facts
        self._sync_source()
        if path and not demo:
            show_in_box(self.disk_box, path)
        self.demo_banner.setVisible(demo)
        name = html.escape(printable(Path(path).name, one_line=True)) if path else ""
        if not path:
            text = "No model chosen yet: the demo needs no download."
        elif problem:
            text = f'<span style="color:#c62828">{html.escape(printable(problem))}</span>'
        elif demo:
            text = f"{name}: the demo model, with MTP heads (its acceptance per task is set on purpose)"
        elif has_mtp:
            text = f"{name}: has MTP heads"
        else:
            text = (f'<span style="color:#c62828"><b>{name} has no MTP heads</b>, so MTP cannot be tuned on it.</span> '
                    "Tune for me measures what can pay without them instead (below): llama.cpp's n-gram modes "
                    "(they draft from the text itself, so they work with any GGUF) and a drafter model that "
                    "pairs with it; or get this model's MTP build from the catalog.")
        self.model_label.setText(text)
        if not self.running:  # the last answer was another model's: it goes with it
            self.answer.setText("")
        self._show_plan()
        self.uses.set_tasks(demo)
        self._update()

    def _show_plan(self) -> None:
        """What is measured on a model without MTP heads (the core's choice, worked out on a worker)."""
        if self.running:
            return
        has_mtp, _demo, problem = self._facts
        self.plan.show_for(self.state.model, None if problem else has_mtp, self.state.drafter)
        self._update()

    @property
    def use_boxes(self) -> dict[str, tuple[QCheckBox, QSpinBox]]:
        return self.uses.use_boxes

    # -- the button -------------------------------------------------------------------------
    def problem(self) -> str | None:
        """Why the button cannot run now, in words; None when it can."""
        path = self.state.model
        has_mtp, _demo, unreadable = self._facts
        if self.running:
            return None
        if self.sweeps.running:
            return "a sweep is running (Sweep tab): wait for it or cancel it"
        if not path:
            return "choose a model first: the demo needs no download"
        if unreadable:
            return unreadable
        if has_mtp is False and self.plan.looking:
            return "looking for a drafter that pairs with this model…"
        if has_mtp is False and self.plan.problem:
            return self.plan.problem
        if not self.uses.weights():
            return "tick at least one use"
        return None

    def _update(self) -> None:
        why = self.problem()
        self.tune_btn.setEnabled(why is None and not self.running)
        v = self.state.verdict
        self.finish_btn.setVisible(not self.running and self.state.results_path is not None and v is not None
                                   and bool(v.provisional or v.withheld))
        self.why_not.setText(printable(why) if why and not self.running else "")
        if why is None and not self.running:
            self._say_how_long()

    def _say_how_long(self) -> None:
        """Quick's and Thorough's time from this machine's measured speed (plain words until known)."""
        known = tok_s_known(self.state.model, self.state.probe_record, self.state.records) is not None
        try:
            quick, thorough = (self.estimate(self.request(quick=q)) for q in (True, False)) if known else (None, None)
        except UserError:
            quick = thorough = None
        for button, text in zip((self.quick, self.thorough), how_long_texts(quick, thorough)):
            button.setText(text)

    def estimate(self, request: SweepRequest) -> float | None:
        return flow_time(self.state, request)

    def tune(self) -> None:
        """The device check (once), then the sweep."""
        why = self.problem()
        if why is not None or self.running:
            if why:
                self.state.show_error(why)
            return
        self.running = True
        self._t0 = time.monotonic()  # the flow's clock: the device check counts against Quick's time
        self.answer.setText("")
        self._set_running(True)
        self.state.set_task_mix(self.uses.mix_text() if len(self.uses.weights()) > 1 else "")
        if self.engines.choice is None:
            self._waiting_engines = True
            self.progress_label.setText("Checking which device each engine runs on…")
            job = self.engines.check()
            job.finished.connect(self._engines_done)
        else:
            self._launch()

    def _engine_answer(self, choice: EngineChoice | None) -> None:
        if self._waiting_engines and choice is not None:
            self._waiting_engines = False
            self._launch()

    def _engines_done(self) -> None:
        if self._waiting_engines:  # no answer (said by the engines): measure where the defaults put it
            self._waiting_engines = False
            self._launch()

    def request(self, quick: bool | None = None) -> SweepRequest:
        """The sweep the choices ask for (``quick``: Quick or not, else as chosen), as a session request."""
        engine = tune_engine(self.engines.choice)  # the device check's, as `mtp-tuner tune`'s
        quick = self.quick.isChecked() if quick is None else quick
        arms = self.plan.arms if self.plan.model == self.state.model else None  # no MTP heads: the core's choice
        return tune_request(self.state.model, self.uses.weights(), quick=quick, engine=engine,
                            settings=self.state.engine_settings(engine), user_prompts=self.state.user_prompt_file(),
                            quick_s=QUICK_S, started=self._t0, arms=arms)

    def finish(self) -> None:
        """"Finish when quiet": the last sweep's runs that were not measured quietly, measured again."""
        try:
            request = finish_request(self.state)
        except UserError as e:
            self.state.show_error(str(e))
            return
        self.running, self._budget, self._t0 = True, None, time.monotonic()
        self.answer.setText("")
        self._set_running(True)
        self.progress_label.setText("Finishing the last sweep: waiting for quiet moments…")
        if not self.sweeps.start(request):
            self._failed(self.state.last_error or "the sweep did not start")

    def _launch(self) -> None:
        try:
            request = self.request()
        except UserError as e:
            self._failed(str(e))
            return
        self.state.last_error = None
        self._budget = request_budget(request)[0]  # Quick's, on every path
        self.progress_label.setText("Starting: the cost probe first, then the runs…")
        if not self.sweeps.start(request, estimate_s=self.estimate(request)):
            self._failed(self.state.last_error or "the sweep did not start")

    def _failed(self, message: str) -> None:
        self.running = False
        self._set_running(False)
        self.answer.setText(f'<span style="color:#c62828">Could not start: {html.escape(printable(message))}</span>')

    def _set_running(self, on: bool) -> None:
        self.cancel_btn.setEnabled(on)
        self.progress.setVisible(on)
        if on:
            self.progress.setRange(0, 0)  # busy until the budget is known
        else:
            self.timer.stop()
        for w in (self.demo_radio, self.disk_radio, self.catalog_radio, self.disk_box, self.quick, self.thorough):
            w.setEnabled(not on)
        self.uses.setEnabled(not on)
        self._update()

    # -- while it runs ----------------------------------------------------------------------
    def _sweep_started(self, _prepared: Prepared) -> None:
        if not self.running:  # the Sweep tab's: the button waits for it
            self._update()
            return
        self.timer.start()
        self._tick()

    def _tick(self) -> None:
        """The flow's one clock (the sweep service's): one run count, the time left never below zero."""
        clock = self.sweeps.clock
        left = clock.left()
        if left is not None:
            el = clock.elapsed()
            self.progress.setRange(0, max(1, int(el + left)))
            self.progress.setValue(int(el))
        self.progress.setFormat(clock.line())

    def _progress(self, message: str) -> None:
        if self.running and not self._waiting_engines:
            self.progress_label.setText(printable(message, one_line=True))

    def _sweep_finished(self, end: SweepEnd) -> None:
        if not self.running:
            self._update()
            return
        cancelled = end.cancelled
        self.running = False
        self._set_running(False)
        el = time.monotonic() - self._t0
        st = self.state
        v = st.verdict
        if cancelled:
            self.progress_label.setText(f"Cancelled after {el:.0f} s.")
            self.answer.setText("Cancelled: the last complete verdict (if any) is still on the Results tab.")
            return
        ok = [r for r in st.records if r.status == "ok"]
        if not ok:
            from app.core.verdict import probe_pays  # the verdict layer: loaded with the first results

            rec = st.probe_record
            probe = st.probe_text if rec is not None and rec.prices_steps and not probe_pays(rec) else ""
            if probe:
                self.answer.setText("<b>Leave MTP off</b>: the cost probe says no draft width can pay on this "
                                    f"machine. {html.escape(probe)}")
            elif self._budget and el >= self._budget:
                self.answer.setText('<span style="color:#c62828">No measured run finished within the Quick budget: '
                                    "the cost probe and the first runs took longer on this machine. Choose "
                                    "Thorough (it runs until decided), or close other programs.</span>")
            else:
                self.answer.setText('<span style="color:#c62828">No measured run finished: '
                                    f"{html.escape(printable(st.last_error or 'see the status line'))}</span>")
            self.progress_label.setText(f"Done in {el:.0f} s.")
            return
        cut = (f", stopped at Quick's budget of {duration(self._budget)} (what is undecided is said)"
               if end.stopped == "budget" and self._budget else "")
        self.progress_label.setText(f"Done in {el:.0f} s, {len(ok)} runs{cut}; the verdict is on the Results tab.")
        if v is not None:
            self.answer.setText(answer_html(v))

