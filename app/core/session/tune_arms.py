"""What Tune for me measures on a model (session.tune's plain sweep), decided once per model by
``tune_arms``, which the Start page and ``mtp-tuner tune`` both call before tune_request.

- A model with MTP heads: its own heads (the adaptive sweep); with the user's drafter, that
  drafter's modes.
- A model without MTP heads: said in one line, then what can pay there: llama.cpp's n-gram modes
  (``NGRAM_MODES``: any GGUF), a drafter (the user's ``--drafter``, else one found on this machine
  by app.core.machine.drafter_search, paired by llama.cpp's rule) in its own mode (draft-simple for
  an ordinary model), and the drafter combined with ``COMBINED_NGRAM`` (llama.cpp asks the n-gram
  table first each step and drafts with the model where the text does not repeat).
- Quick (about 2 minutes) measures fewer of them (the drafter at ``QUICK_DRAFTER_KS`` only, no
  combination; the n-gram modes cost no more than the baseline's runs): on a real model on a CPU one
  round of the whole set takes longer than Quick's budget (Qwen2.5-Coder 1.5B on 2 cores, 128
  tokens a run: 11 settings with the baseline, 4 prompts, about 7 minutes a round), so Quick ended
  with most settings unmeasured;
  the n-gram modes and the drafter at one width (on one prompt a task: session.tune) say whether
  either family can pay here. Thorough measures every one (``DRAFTER_KS``, the combination)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable, Sequence

from app.core.common.cancel import CancelToken
from app.core.common.spec_modes import COMBINE, MTP, canonical, combination_problem, takes_k
from app.core.common.text import printable
from app.core.machine.drafter_search import DrafterPick, find_drafter, given_drafter

NGRAM_MODES = ("ngram-mod", "ngram-simple")  # drafting from the text itself: any GGUF (llama-server)
# the n-gram mode combined with a drafter: ngram-mod, whose table outlives requests (one combination
# keeps the sweep short; --modes on bench takes the others, e.g. draft-simple+ngram-simple)
COMBINED_NGRAM = "ngram-mod"
DRAFTER_KS = (1, 2, 3, 4)  # a drafter's draft widths, Thorough (a plain sweep: each costs runs)
QUICK_DRAFTER_KS = (2,)  # Quick: the drafter at one width (the middle of DRAFTER_KS, cheap to verify on a CPU)


def drafter_ks(quick: bool) -> tuple[int, ...]:
    """The draft widths a drafter is measured at: Quick's one, else DRAFTER_KS."""
    return QUICK_DRAFTER_KS if quick else DRAFTER_KS


def plain_modes(ngram: bool, drafters: dict[str, str], quick: bool = False) -> tuple[list[str], dict[str, str]]:
    """The modes of tune's plain sweep and their drafter files: the n-gram modes (``ngram``), each
    drafter's mode and, with the n-gram modes, each drafter mode combined with COMBINED_NGRAM;
    ``quick``: without the combinations."""
    modes = list(NGRAM_MODES) if ngram else []
    files = dict(drafters)
    for mode, path in drafters.items():
        modes.append(mode)
        combined = canonical(f"{mode}{COMBINE}{COMBINED_NGRAM}")
        if ngram and not quick and takes_k(mode) and combination_problem(combined) is None:
            modes.append(combined)
            files[combined] = path
    return modes, files


@dataclasses.dataclass(frozen=True)
class TuneArms:
    """What the flow measures on ``model``: its own heads (``has_mtp``), or, without them, the
    n-gram modes and the drafter ``pick`` (None for a model with heads and no drafter given)."""

    model: str
    has_mtp: bool
    pick: DrafterPick | None = None

    @property
    def drafters(self) -> dict[str, str]:
        """The drafter file per mode (its own mode), none when no drafter was given or found."""
        p = self.pick
        return {p.mode: p.path} if p is not None and p.path is not None and p.mode is not None else {}

    @property
    def ngram(self) -> bool:
        """The n-gram modes measured: a model without MTP heads."""
        return not self.has_mtp

    def modes(self, quick: bool = False) -> list[str]:
        """The speculative modes measured, in the order said (empty: the model's own heads)."""
        return plain_modes(self.ngram, self.drafters, quick)[0]

    def settings(self, quick: bool = False) -> str:
        """The settings measured, in words: "ngram-mod, draft-simple at K=2"."""
        def one(mode: str) -> str:
            if not takes_k(mode.split(COMBINE)[0]):
                return mode
            ks = drafter_ks(quick)
            return f"{mode} at K={ks[0]}" if len(ks) == 1 else f"{mode} at K={ks[0]}-{ks[-1]}"

        return ", ".join(one(m) for m in self.modes(quick))

    def lines(self, quick: bool = False) -> list[str]:
        """What is said before the sweep: nothing for a model with its own heads and no drafter;
        else the plan in one line (Quick's and, where it measures less, what Thorough adds) and the
        drafter's choice in another."""
        name = printable(Path(self.model).name, one_line=True)
        if self.has_mtp and self.pick is None:
            return []
        if self.has_mtp:
            head = f"{name} has MTP heads; measuring your drafter: "
        elif self.pick is not None and self.pick.mode == MTP:  # a Gemma 4 target and its assistant
            head = f"{name} has no MTP heads of its own; measuring its drafter and what else can pay: "
        else:
            head = f"{name} has no MTP heads, so MTP cannot run on it; measuring what can pay without them: "
        out = [head + self.settings(quick) + (f" (Quick; --thorough: {self.settings()})"
                                              if quick and self.settings(True) != self.settings() else "")]
        if self.pick is not None:
            out.append(("drafter " if self.pick.path else "no drafter: ") + printable(self.pick.sentence(), one_line=True))
        return out


def tune_arms(model: str, drafter: str | None = None, dirs: Sequence[str] = (), opened: Iterable[str] = (),
              cancel: CancelToken | None = None) -> TuneArms:
    """What Tune for me measures on ``model`` (read from its header): with ``drafter`` (the user's),
    that drafter checked against it (a UserError of one line naming the difference when it cannot
    pair); without one, for a model without MTP heads, a drafter found in the models folder, the
    model's own folder, ``dirs`` (the user's library folders) and ``opened`` (the models opened)."""
    from app.core.machine.modelinfo import inspect

    has_mtp = inspect(model).has_mtp
    if drafter:
        return TuneArms(model, has_mtp, given_drafter(model, drafter))
    if has_mtp:
        return TuneArms(model, True)
    return TuneArms(model, False, find_drafter(model, dirs, opened, cancel))
