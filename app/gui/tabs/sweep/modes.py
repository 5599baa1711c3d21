"""The Sweep tab's tooltips, and its speculative modes and drafter: which ``--spec-type`` modes to
compare (draft-mtp, and the others the chosen llama-server lists), the drafter file they use, and
the line that says when the sweep runs on llama-server because a chosen mode runs nowhere else."""

from __future__ import annotations

from typing import Iterable, Sequence

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QMouseEvent
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QLineEdit, QMenu, QPushButton, QToolButton

from app.core.common.errors import UserError
from app.core.common import spec_modes
from app.core.common.spec_modes import SPEC_TYPES, mode_or_guess, needs_drafter
from app.core.records.arm import MTP, Arm, takes_k

from ...services.capabilities import CapabilityReader
from ...state import AppState

# the Sweep tab's fields
TIPS = {
    "k": "Draft widths K to compare (llama-server --spec-draft-n-max): how many tokens a draft mode "
         "(draft-mtp: the MTP head) drafts per step; the n-gram modes take none. e.g. 1,2,3,4 or 1-6",
    "p_min": "Draft p_min values (--spec-draft-p-min): drafting stops early when the draft's top "
             "probability is below this. 0 = always draft K tokens (the usual choice). e.g. 0,0.5",
    "n_predict": "Tokens generated per run (llama.cpp -n / n_predict). A longer run weighs the prompt and the "
                 "first token less, so its speedup is closer to a long answer's: 128 or more for a verdict to "
                 "act on (Normal: 128, Thorough: 256). Quick and the demo use 64 to stay short",
    "reps": "Measured repetitions per prompt and arm (the adaptive mode's most); speedup intervals need at "
            "least 3",
    "engine": "in-process: llama-cpp-python, one model load for all arms. llama-server: a real server per "
              "configuration. The default is the engine that runs on this machine's GPU (in-process when "
              "its build offloads to it, else llama-server with a GPU build), else in-process on the CPU",
    "tasks": "Prompt suites by task type; code and repetitive text accept drafts well, stories poorly; "
             "edit (text given in the prompt, repeated with a change) is where the n-gram modes pay",
    "mode": "Sweep kind. exhaustive: every K and p_min, every prompt, every repetition (the run count and time "
            "are known before Start). adaptive: a cost probe and a pilot first, then repetitions only for the "
            "best candidates until every task is decided or the budget beside it runs out (far fewer runs; "
            "draft-mtp only)",
    "mix": "How your work divides between task types, e.g. code=0.7,story=0.3 (empty: equal). The "
           "recommendation and the adaptive mode optimise this mix",
    "ctx": "Context size in tokens (llama.cpp -c / --ctx-size): room for the prompt and the generated "
           "tokens; the KV cache grows with it. 0 = the model's own (trained) context",
    "ngl": "Layers offloaded to the GPU (llama.cpp -ngl / --n-gpu-layers): a count, auto (llama.cpp "
           "decides what fits) or all. Empty: each engine's default (in-process: all). No effect without "
           "a GPU build",
}

DRAFTER_TIP = ("A drafter GGUF (llama-server -md / --spec-draft-model). It drafts for the chosen draft-simple, "
               "draft-eagle3, draft-dflash or draft-dspark; with none of those chosen, for draft-mtp (a Gemma 4 "
               "assistant). Empty: draft-mtp uses the model's own MTP heads. Checked against the model before "
               "Start; any drafter runs on llama-server only")
ADAPTIVE_NOTE = ("adaptive sweeps draft-mtp on the model's own MTP heads only: the other modes and the drafter "
                 "are for exhaustive sweeps")


def mode_tip(mode: str) -> str:
    """The mode's one line: the mode table's tip (app.core.common.spec_modes)."""
    return mode_or_guess(mode).tip


def drafters_for(modes: Iterable[str], drafter: str | None) -> dict[str, str]:
    """The one drafter file per mode: for the chosen draft modes other than draft-mtp if any,
    else for draft-mtp (a Gemma 4 assistant); none when no mode takes one."""
    modes = list(modes)
    if not drafter:
        return {}
    own_heads = [m for m in modes if takes_k(m) and MTP in spec_modes.parts(m)]  # draft-mtp, alone or combined
    others = [m for m in modes if takes_k(m) and m not in own_heads]
    return {m: drafter for m in (others or own_heads)}


def server_only(modes: Iterable[str], drafters: dict[str, str]) -> list[str]:
    """The chosen modes only llama-server runs (every mode but draft-mtp on the model's own heads),
    as spec_modes.server_only labels them."""
    return spec_modes.server_only((m, drafters.get(m)) for m in modes)


def server_note(needs: list[str]) -> str:
    if not needs:
        return ""
    what = ", ".join(needs[:-1]) + " and " + needs[-1] if len(needs) > 1 else needs[0]
    return (f"{what} run{'' if len(needs) > 1 else 's'} only in llama-server: this sweep runs on llama-server "
            "(the baseline too, so that each pair compares like with like)")


class _StayOpenMenu(QMenu):
    """A menu of check boxes that stays open while they are ticked."""

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:  # noqa: N802 (Qt's name)
        action = self.activeAction()
        if action is not None and action.isEnabled() and action.isCheckable():
            action.trigger()
            return
        super().mouseReleaseEvent(event)


class ModeChooser(QObject):
    """The Modes button (a menu of check boxes, one per --spec-type the llama-server lists), the
    Drafter field (Browse, Clear) and the line under the form that says where the sweep runs."""

    changed = Signal()

    def __init__(self, state: AppState, capabilities: CapabilityReader, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.capabilities = capabilities  # app.gui.services.capabilities: the llama-server's --spec-type list
        self.button = QToolButton()
        self.button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu = _StayOpenMenu(self.button)
        self.menu.setToolTipsVisible(True)
        self.button.setMenu(self.menu)
        self.actions: dict[str, QAction] = {}
        self.listed: set[str] = set()
        self._listed_by = "no llama-server asked yet"
        self.drafter_edit = QLineEdit(state.drafter)  # the drafter picked on the Model tab, if any
        self.drafter_edit.setPlaceholderText("none: draft-mtp uses the model's own heads")
        self.drafter_edit.setToolTip(DRAFTER_TIP)
        self.drafter_edit.textChanged.connect(lambda *_: self.changed.emit())
        self.browse_btn = QPushButton("Browse…")
        self.browse_btn.clicked.connect(self.browse)
        self.clear_btn = QPushButton("Clear")
        self.clear_btn.clicked.connect(self.drafter_edit.clear)
        self.drafter_row = QHBoxLayout()
        for w in (self.drafter_edit, self.browse_btn, self.clear_btn):
            self.drafter_row.addWidget(w, 1 if w is self.drafter_edit else 0)
        self.note = QLabel("")
        self.note.setWordWrap(True)
        self.adaptive = False
        self.set_spec_types(())
        state.drafter_changed.connect(self.set_drafter)  # a drafter picked (and checked) on the Model tab
        state.server_changed.connect(self.refresh)

    # -- the modes the llama-server lists ----------------------------------------------------
    def refresh(self) -> None:
        """The modes of the llama-server that would run (read on a worker when not known yet)."""
        binary = self.state.find_server()
        if binary is None:
            self._listed_by = "no llama-server found: draft-mtp only (in-process)"
            self.set_spec_types(())
            return
        self.capabilities.read(binary, lambda caps: self._listed(binary, caps.spec_types),
                               lambda msg: self._listed(binary, (), msg))

    def _listed(self, binary: str, spec_types: Iterable[str], problem: str | None = None) -> None:
        self._listed_by = (f"{binary} could not be asked ({problem}): draft-mtp only" if problem
                           else f"the modes {binary} lists for --spec-type")
        self.set_spec_types(spec_types)

    def set_spec_types(self, spec_types: Iterable[str]) -> None:
        """One check box for draft-mtp and each other mode in ``spec_types`` (llama.cpp's order,
        then any newer names); a mode already ticked stays, listed or not."""
        self.listed = set(spec_types) - {"none"}
        self._rebuild(set(self.modes_ticked()) if self.actions else {MTP})

    def _rebuild(self, ticked: set[str]) -> None:
        singles = {m for m in self.listed | ticked if not spec_modes.is_combined(m)}
        names = [m for m in SPEC_TYPES if m == MTP or m in singles]
        names += sorted(singles - set(names))
        # then the combined modes (each where the llama-server lists its parts), after a line
        combined = [m for m in spec_modes.SUGGESTED_COMBINATIONS if self._is_listed(m) or m in ticked]
        combined += sorted(m for m in ticked if spec_modes.is_combined(m) and m not in combined)
        self.menu.clear()
        self.actions = {}
        for m in names + combined:
            if m == next(iter(combined), None):
                self.menu.addSeparator()
            act = self.menu.addAction(m)
            act.setCheckable(True)
            act.setChecked(m in ticked)
            act.setToolTip(mode_tip(m) + ("" if self._is_listed(m) else " (not listed by this llama-server)"))
            act.toggled.connect(self._toggled)
            self.actions[m] = act
        self._update()

    def _is_listed(self, mode: str) -> bool:
        """Does the llama-server list ``mode`` (every part of a combined one; draft-mtp always)?"""
        return all(m == MTP or m in self.listed for m in spec_modes.parts(mode))

    def listed_modes(self) -> list[str]:
        """The single modes in the menu (llama-server's --spec-type names)."""
        return [m for m in self.actions if not spec_modes.is_combined(m)]

    def combined_modes(self) -> list[str]:
        """The combined modes in the menu, under the single ones."""
        return [m for m in self.actions if spec_modes.is_combined(m)]

    # -- what is chosen ----------------------------------------------------------------------
    def modes(self) -> list[str]:
        """The ticked modes; draft-mtp alone in adaptive sweeps."""
        if self.adaptive:
            return [MTP]
        return self.modes_ticked()

    def modes_ticked(self) -> list[str]:
        return [m for m, a in self.actions.items() if a.isChecked()]

    def set_modes(self, modes: Iterable[str]) -> None:
        """Tick exactly ``modes`` (those not listed are added: e.g. a results file's)."""
        self._rebuild(set(modes))
        self.changed.emit()

    def show_arms(self, arms: Sequence[Arm]) -> None:
        """A plan's modes ticked and its drafter in the field."""
        self.set_modes(dict.fromkeys(a.mode for a in arms if a.is_spec))
        self.set_drafter(next((a.drafter for a in arms if a.drafter), None))

    def chosen(self) -> tuple[list[str], dict[str, str]]:
        """(modes, drafter per mode) for make_arms; a UserError when a sweep cannot have them."""
        modes = self.modes()
        if not modes:
            raise UserError("choose at least one speculative mode (Speculative modes)")
        need = [m for m in modes if needs_drafter(m) and not self.drafter()]
        if need:
            raise UserError(f"{need[0]} needs a drafter model: choose one in Drafter")
        return modes, self.drafters()

    def drafter(self) -> str | None:
        return None if self.adaptive else (self.drafter_edit.text().strip() or None)

    def set_drafter(self, path: str | None) -> None:
        self.drafter_edit.setText(path or "")

    def drafters(self) -> dict[str, str]:
        return drafters_for(self.modes(), self.drafter())

    def server_only(self) -> list[str]:
        return server_only(self.modes(), self.drafters())

    def browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.button, "Choose a drafter model", self.drafter_edit.text(),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.drafter_edit.setText(path)

    def set_adaptive(self, adaptive: bool) -> None:
        """Adaptive sweeps: draft-mtp on the model's own heads; the modes and drafter are greyed."""
        self.adaptive = adaptive
        for w in (self.button, self.drafter_edit, self.browse_btn, self.clear_btn):
            w.setEnabled(not adaptive)
        self._toggled()

    def show_note(self, needs: list[str]) -> None:
        self.note.setText(ADAPTIVE_NOTE if self.adaptive else server_note(needs))
        self.note.setVisible(bool(self.note.text()))  # no empty line when there is nothing to say

    def _toggled(self, *_: object) -> None:
        self._update()
        self.changed.emit()

    def _update(self) -> None:
        chosen = self.modes_ticked()
        self.button.setText(", ".join(chosen) if chosen else "none chosen")
        self.button.setToolTip("Speculative modes to compare with the baseline (llama-server --spec-type), "
                               f"from {self._listed_by}. Modes other than draft-mtp run on llama-server; "
                               "the n-gram modes take no K. Hover a mode for what it does")
