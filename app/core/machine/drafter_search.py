"""Which drafter Tune for me measures a model with: the user's (``tune --drafter FILE``, checked
by llama.cpp's own pairing rule, refused in one line naming the difference), else one found on
this machine.

Where it looks (``candidates``): the models folder (app.core.common.paths.models_dir, under
``MTP_TUNER_HOME``), the Hugging Face cache and the user's library folders (hub.local_library:
the library the Start page and the Model tab list), the target's own folder (its GGUFs, not its
subfolders) and the models the user opened. The GGUFs there that pair with the target
(drafter.matching_drafters: llama.cpp's common_speculative_are_compatible for an ordinary model;
kind, width and vocabulary for the drafters made for one target) are ranked by one rule
(``RULE``): a drafter made for the model first, else the smallest ordinary model (the cheapest
draft step: a drafter pays only when its step is much cheaper than the target's)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Iterable, Sequence

from app.core.common.cancel import CancelToken
from app.core.common.paths import models_dir
from app.core.common.units import size
from app.core.machine import hub
from app.core.machine.drafter import DrafterInfo, check_pair, inspect_drafter, matching_drafters

RULE = "a drafter made for the model first, else the smallest that pairs (the cheapest draft step)"
PAIRING = "llama.cpp's pairing rule (vocabulary type and size, special tokens)"  # an ordinary model's
PAIRING_MADE = "the pair check (the drafter's kind, width and vocabulary)"  # a drafter made for one target


@dataclasses.dataclass(frozen=True)
class DrafterPick:
    """The drafter chosen for a model (``path`` None: none pairs), its own mode (draft-simple for
    an ordinary model), whether the user gave it, every GGUF that pairs in the rule's order, and the
    places looked in."""

    path: str | None
    mode: str | None = None
    given: bool = False
    found: tuple[str, ...] = ()
    looked_in: tuple[str, ...] = ()
    size: int = 0

    def sentence(self) -> str:
        """Which drafter and why, in one line: "NAME (size, mode): why", or where no GGUF paired."""
        if self.path is None:
            return (f"no GGUF in {' or '.join(self.looked_in) or 'the models folder'} pairs with it by "
                    f"{PAIRING} (give one with --drafter FILE, or put one in the models folder)")
        name = f"{Path(self.path).name} ({size(self.size)}, {self.mode})"
        rule = PAIRING if self.mode == "draft-simple" else PAIRING_MADE
        if self.given:
            return f"{name}: yours, and it pairs with the model by {rule}"
        if len(self.found) == 1:
            return f"{name}: found in {_where(self.path)}, the one GGUF here that pairs by {rule}"
        others = ", ".join(Path(p).name for p in self.found[1:])
        return (f"{name}: found in {_where(self.path)}; {len(self.found)} GGUFs pair, and the rule "
                f"picks {RULE} (also pair: {others})")


def _where(path: str) -> str:
    return str(Path(path).parent)


def _rank(d: DrafterInfo) -> tuple[bool, int, str]:
    return (d.kind == "model", d.weight_bytes, d.path)


def candidates(target: str, dirs: Sequence[str | os.PathLike[str]] = (),
               opened: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """The GGUFs a drafter is looked for among, each once, and the places looked in (words): the
    library (models folder, the user's folders, the Hugging Face cache), the target's folder, the
    models opened."""
    own = Path(target).expanduser().parent
    lib = hub.local_library(models_dir(), [Path(d) for d in dirs])
    paths = [m.path for m in lib if m.problem is None]
    paths += [str(p) for p in sorted(own.glob("*.gguf"))
              if p.is_file() and not (hub.SPLIT_RE.search(p.name) and "-00001-of-" not in p.name)]
    paths += [str(p) for p in opened if p]
    seen: set[str] = set()
    out = []
    for p in paths:
        key = os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    places = [f"the models folder ({models_dir()})", f"the model's own folder ({own})"]
    places += [str(d) for d in dirs]
    return out, places


def find_drafter(target: str, dirs: Sequence[str | os.PathLike[str]] = (), opened: Iterable[str] = (),
                 cancel: CancelToken | None = None) -> DrafterPick:
    """A drafter for ``target`` among ``candidates``, by ``RULE``; a pick with no path when none pairs."""
    paths, places = candidates(target, dirs, opened)
    infos = sorted((inspect_drafter(p) for p in matching_drafters(target, paths, cancel)), key=_rank)
    if not infos:
        return DrafterPick(None, looked_in=tuple(places))
    best = infos[0]
    return DrafterPick(best.path, best.modes[0], False, tuple(d.path for d in infos), tuple(places), best.size)


def given_drafter(target: str, path: str) -> DrafterPick:
    """The user's drafter, checked against ``target`` in its own mode (draft-simple for an ordinary
    model): a UserError of one line naming the difference when it cannot pair."""
    d = inspect_drafter(path)
    checked = check_pair(target, path, d.modes[0])  # its one line starts with the file's name
    assert checked is not None  # a drafter was given: its summary, or the error
    return DrafterPick(checked.path, d.modes[0], True, (checked.path,), (), checked.size)
