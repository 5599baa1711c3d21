"""The Results tab's past sweeps (a part of ResultsTab, its base class): the history list (by what
each sweep is: history.py), opening a results file (one sweep of it at a time), comparing two,
running the shown one again; and what a sweep that ends does to what is shown. A cancelled sweep,
or one that finished no run, does not replace the last complete verdict: it is put back, the tab
says so and offers the other (*Show it anyway*); how each of the window's sweeps ended is kept
for the list."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QFileDialog, QLabel, QPushButton, QTableWidget, QTabWidget, QToolButton,
                               QWidget)

from app.core.common.errors import UserError
from app.core.common.paths import results_dir
from app.core.common.text import printable
from app.core.measure.plan import Plan, plan_again
from app.core.records.schema import RunRecord
from app.core.records.sweeps import select_sweep, sweeps_of

from ...common import fill
from ...state import AppState
from .advanced import AdvancedSection, set_headers
from .banner import VerdictBanner
from .card import IntervalPlot
from .history import file_label, set_status, statuses

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.records.cost import CostRecord

# what the tab showed: (records, results file, cost records, file notes, setting index)
Shown = tuple[list[RunRecord], Path | None, list["CostRecord"], list[str], int]


class PastSweeps(QWidget):
    """The history, opening, comparing and sweep-end parts, on the ResultsTab (``self`` is the tab)."""

    # the tab's (ResultsTab.__init__ makes them): the state, its widgets and what it renders with
    state: AppState
    history_box: QComboBox
    compare_box: QComboBox
    file_sweep_box: QComboBox
    stale_label: QLabel
    stale_btn: QPushButton
    banner: VerdictBanner
    intervals: IntervalPlot
    advanced: AdvancedSection
    compare_table: QTableWidget
    compare_label: QLabel
    compare_page: QWidget
    results_tabs: QTabWidget
    whole_pane: QToolButton
    _sweep_text: Callable[[], str]
    _model_note: Callable[[], None]

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._file_records: list[RunRecord] = []
        self._file_problems: list[str] = []
        self._file_costs: list[CostRecord] = []
        self._file_path: Path | None = None
        self._again: tuple[Plan, str] | None = None  # (plan, earlier results file) of a Run again in flight
        self._compare_after: str | None = None
        self._last_shown: Shown | None = None  # of the verdict shown
        self._before: Shown | None = None  # what was shown when a sweep started
        self._probe_before: CostRecord | None = None
        self._stale_path: str | None = None
        self.probe_answer = ""  # a sweep the cost probe decided: no draft width can pay here
        self.last_sweep_status: str | None = None  # how the last sweep of this window ended

    # -- history --------------------------------------------------------------------------
    def refresh_history(self) -> None:
        """The past sweeps, newest first, by what they are; the one shown selected (a file opened
        from elsewhere is listed first)."""
        d = results_dir()
        files = sorted(d.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True) if d.is_dir() else []
        shown = self.state.results_path
        if shown is not None and shown not in files and shown.is_file():
            files.insert(0, shown)
        status = statuses(self.state.settings)
        labels = [file_label(p, status.get(str(p))) for p in files]
        for box in (self.history_box, self.compare_box):
            box.clear()
            for p, text in zip(files, labels):
                box.addItem(text, str(p))
                box.setItemData(box.count() - 1, str(p), Qt.ItemDataRole.ToolTipRole)
        self._select_shown()

    def _select_shown(self) -> None:
        """The history names the file whose data is shown."""
        shown = str(self.state.results_path) if self.state.results_path else None
        i = self.history_box.findData(shown) if shown else -1
        if shown and i < 0 and Path(shown).is_file():
            self.refresh_history()
            return
        if i >= 0:
            self.history_box.setCurrentIndex(i)

    def browse_results(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open results", str(results_dir()), "Results (*.jsonl)")
        if path:
            self.open_results(path)

    def _load(self, path: str, problems: list[str] | None = None) -> list[RunRecord] | None:
        """The records of a results file, or None after telling the user why not; lines left out
        (cut short, not records, impossible numbers) are added to ``problems``."""
        from app.core.records.reader import load_records  # msgspec's decoders: only when a file is read

        try:
            recs = load_records(path, problems)
            if not [r for r in recs if r.status == "ok"]:
                raise UserError(f"{path}: no finished runs in this results file")
        except UserError as e:
            self.state.show_error(str(e))
            return None
        return recs

    def open_results(self, path: str | None) -> None:
        from app.core.records.reader import load_cost_records  # see _load

        if not path:
            return
        problems: list[str] = []
        recs = self._load(path, problems)
        if recs is None:
            return
        self._file_records, self._file_problems, self._file_path = recs, problems, Path(path)
        try:
            self._file_costs = load_cost_records(path, problems)  # a bad record: said with the lines left out
        except UserError as e:  # the runs are fine; only the probe record is not
            self.state.show_error(f"{e}; the break-even curves use the runs' own costs")
            self._file_costs = []
        sweeps = sweeps_of(recs)
        self.file_sweep_box.clear()
        for sw in reversed(sweeps):  # latest first
            self.file_sweep_box.addItem(printable(sw.label, one_line=True), sw.sweep_id)
        self.file_sweep_box.setVisible(len(sweeps) > 1)
        self._show_file_sweep(None)

    def _show_file_sweep(self, sweep_id: str | None) -> None:
        """Show one sweep of the opened file, the latest when ``sweep_id`` is None (a file may
        hold several; they are never pooled)."""
        runs, chosen, note = select_sweep(self._file_records, sweep_id, where=str(self._file_path))
        assert chosen is not None  # the file has finished runs (_load)
        self._clear_stale()
        self.state.set_results(runs, self._file_path, notes=list(self._file_problems) + ([note] if note else []),
                               cost_records=self._file_costs)
        self._select_shown()
        self.state.status.emit(f"{self._file_path}: {len(runs)} runs of sweep {chosen.sweep_id}")

    def compare_results(self, path: str | None, shown_is_b: bool = False) -> None:
        """The shown sweep (A) against the one in ``path`` (B); with ``shown_is_b`` the other way
        round (Run again: the earlier sweep is A, the new one B)."""
        # the analysis layer: loaded with the first results, not to show the window
        from app.core.analysis.analysis import analyze
        from app.core.analysis.settings import setting_of, split_by_setting
        from app.core.analysis.compare import (builds, compare, format_builds, format_changes, format_summary,
                                               setting_changes)
        from app.core.analysis.fields import COMPARE_FIELDS, table as field_table

        v = self.state.verdict
        if not path or v is None:
            self.state.show_error("open a sweep first, then choose another one to compare with")
            return
        other_records = self._load(path)
        if other_records is None:
            return
        other_records = select_sweep(other_records, where=str(path))[0]  # its latest sweep
        groups = split_by_setting(other_records)  # one setting of each, never pooled: the shown one's, else its first
        other_records = groups.get(setting_of(v.records[0])) or next(iter(groups.values()))
        a, b = v.analysis, analyze(other_records)
        recs_a, recs_b, path_a, path_b = list(v.records), other_records, str(self.state.results_path), str(path)
        if shown_is_b:
            a, b, recs_a, recs_b, path_a, path_b = b, a, recs_b, recs_a, path_b, path_a
        cmp = compare(a, b, recs_a, recs_b)  # with the records: each cell's B/A interval (changed or noise)
        headers, rows = field_table(cmp, COMPARE_FIELDS)
        set_headers(self.compare_table, headers)
        fill(self.compare_table, rows)
        self.compare_label.setText(f"A: {path_a}\nB: {path_b}\n{format_builds(builds(recs_a, recs_b))}\n"
                                   + format_changes(setting_changes(recs_a, recs_b)) + "\n" + format_summary(cmp)
                                   + printable(_watch_text(path_a, path_b)))
        self.compare_table.setToolTip(f"A: {path_a}\nB: {path_b}")
        self.results_tabs.setCurrentWidget(self.compare_page)
        self.whole_pane.setChecked(True)  # the comparison gets the room (press Whole pane to bring the rest back)
        self.advanced.set_open(True)

    # -- run again ------------------------------------------------------------------------
    def run_again(self) -> None:
        """The shown sweep again: the exact same plan goes to the Sweep tab (through the state),
        which shows its settings and starts it; afterwards the new sweep is compared with it."""
        if not self.state.records or self.state.results_path is None:
            self.state.show_error("open a sweep first (Results tab), then run it again")
            return
        if self.state.sweep_running:
            self.state.show_error("a sweep is running: cancel it or let it finish first")
            return
        try:
            plan = plan_again(self.state.records, prompt_file=self.state.user_prompt_file())
        except UserError as e:
            self.state.show_error(str(e))
            return
        self._again = (plan, str(self.state.results_path))
        self.state.sweep_requested.emit(plan)

    def _sweep_started(self, plan: Plan) -> None:
        self.file_sweep_box.setVisible(False)  # notes about an opened file do not apply to a new sweep
        again, self._again = self._again, None
        self._compare_after = again[1] if again is not None and again[0] is plan else None
        self._before = self._last_shown  # the sweep start cleared the state's: what the tab showed
        self._probe_before = self.state.probe_record

    def _sweep_finished(self, cancelled: bool) -> None:
        from app.core.verdict import probe_pays  # the verdict layer: loaded with the first results

        st = self.state
        ok = [r for r in st.records if r.status == "ok"]
        probe = st.probe_record if st.probe_record is not self._probe_before else None
        probe_decided = not ok and not cancelled and probe is not None and probe.prices_steps \
            and not probe_pays(probe)
        status = "cancelled" if cancelled else "complete" if ok or probe_decided else "no run finished"
        self.last_sweep_status = status
        path = st.results_path
        if path is not None and path.is_file():
            set_status(st.settings, path, status)
        before, self._before = self._before, None
        if status != "complete" and before is not None:
            # the last complete verdict stays; the other sweep is offered, not shown
            n = len(ok)
            self._stale_path = str(path) if path is not None and path.is_file() else None
            what = "cancelled" if cancelled else "that finished no run"
            kept = f" ({n} finished runs in {path.name})" if n and path is not None else ""
            self.stale_label.setText(f"The sweep just {what}{kept} is not shown: the verdict below is still the "
                                     "last complete one.")
            self.stale_label.setVisible(True)
            self.stale_btn.setVisible(self._stale_path is not None)
            records, rpath, costs, notes, setting = before
            st.set_results(records, rpath, notes=notes, cost_records=costs)
            if setting:
                st.set_setting(setting)
        elif probe_decided:
            self._clear_stale()
            self.probe_answer = f"the cost probe says no draft width can pay on this machine. {st.probe_text}"
            self.banner.show_verdict(None)
            self.banner.what.setText("The cost probe decided it: no run was needed.")
            self.intervals.show_records([])
            self.intervals.setVisible(False)  # no run, so no interval to come
            self._model_note()
        else:
            self._clear_stale()
            if status != "complete":  # nothing complete to keep: the partial sweep is shown, marked
                self._last_shown = None
                self.banner.what.setText(self._sweep_text())
        if path is not None or before is not None:
            self.refresh_history()
        again_of, self._compare_after = self._compare_after, None
        if again_of and not cancelled and self.state.records:
            self.compare_results(again_of, shown_is_b=True)  # "Run again": the earlier sweep (A) against this one

    def _clear_stale(self) -> None:
        self._stale_path = None
        self.stale_label.setVisible(False)
        self.stale_btn.setVisible(False)

    def _open_stale(self) -> None:
        path = self._stale_path
        if path:
            self.open_results(path)



def _watch_text(path_a: str, path_b: str) -> str:
    """The two files' watch summaries side by side, as compare prints them ("" when neither holds
    one, or a file cannot be read again)."""
    from app.core.analysis.watched import format_pairs, newest
    from app.core.records.reader import load_watch_records  # see _load

    try:
        seen = [newest(load_watch_records(p)) for p in (path_a, path_b)]
    except UserError:
        return ""
    return "\n\n" + format_pairs(*seen) if any(seen) else ""
