"""Plain words for a verdict, shared by the Start page and the Results tab's banner: a task's
name ("Stories"), one line per pick ("Code: turn MTP on, K=2 -> 1.34x faster (1.20-1.49, sure)",
"Stories: leave it off (0.65x, 0.60-0.70: slower)"), the demo's note, and what a model's header
says (MTP heads, the demo). The lines render the core's picks (``Verdict.pick``, ``per_task``: the
arm, its paired ratio, its reason); nothing is computed here."""

from __future__ import annotations

import functools
from typing import Mapping

from app.core.analysis.provisional import PROVISIONAL
from app.core.analysis.recommend import Pick
from app.core.analysis.repetition import NOT_SURE
from app.core.analysis.stats import Ratio
from app.core.common.errors import UserError

TASK_NAMES = {"code": "Code", "story": "Stories", "tongue-twister": "Tongue-twisters", "chat": "Chat"}
DEMO_NOTE = "synthetic demo model: drafts are wrong on purpose, per task"
ON, OFF, UNSURE = "#2e7d32", "#c62828", "#b26a00"  # green, red, amber
NO_MTP_NEXT = ("MTP needs a model with MTP heads. Next: llama.cpp's n-gram modes draft from the text itself and "
               "work with any GGUF (Start page: \"measure the n-gram modes instead\"; they need llama-server), or "
               "get this model's MTP build from the catalog (Model tab, Find and download).")


def task_name(task: str) -> str:
    return TASK_NAMES.get(task, task[:1].upper() + task[1:])


def _interval(r: Ratio | None) -> str:
    return f"{r.lo:.2f}-{r.hi:.2f}" if r is not None and r.lo is not None and r.hi is not None else ""


def verdict_line(pick: Pick, name: str, withheld: str | None = None, repeats: bool = False,
                 provisional: bool = False) -> tuple[str, str]:
    """(the plain line, its colour) for one of the core's picks; ``withheld``: the verdict's
    reason for withholding every pick (a busy machine), if it did; ``repeats``: the pick stands
    on output that repeats itself (``Verdict.repeats``), so it is never called sure;
    ``provisional``: it stands on runs measured while the machine was busy
    (``Verdict.is_provisional``): said, in amber."""
    if withheld:
        return f"{name}: no verdict (withheld: the machine was busy; close other programs and run again)", UNSURE
    r = pick.ratio
    est = r.estimate if r is not None else None
    ci = _interval(r)
    mark = f"{PROVISIONAL}: measured while the machine was busy" if provisional else None
    if pick.arm is not None and est is not None:
        what = f"turn MTP on, {pick.arm.label}" if pick.arm.is_mtp else f"turn on {pick.arm.label}"
        if repeats or mark:
            return f"{name}: {what} -> {est:.2f}x faster ({ci + ', ' if ci else ''}{mark or NOT_SURE})", UNSURE
        return f"{name}: {what} -> {est:.2f}x faster ({ci + ', ' if ci else ''}sure)", ON
    if mark and r is not None and est is not None:
        return f"{name}: leave it off for now ({est:.2f}x{', ' + ci if ci else ''}; {mark})", UNSURE
    if pick.arm is not None:  # an arm without an estimate: the reason says it
        return f"{name}: {pick.reason}", UNSURE
    if r is None or est is None:
        why = pick.reason.split(": ", 1)[-1].rstrip(".")
        return f"{name}: leave it off ({why})", OFF
    if r.verdict == "slower":
        return f"{name}: leave it off ({est:.2f}x, {ci}: slower)", OFF
    if r.verdict == "too few runs":
        return f"{name}: leave it off for now ({est:.2f}x: too few runs to tell)", UNSURE
    return f"{name}: leave it off ({est:.2f}x, {ci}: not reliably faster)", UNSURE


def mix_name(mix: Mapping[str, float]) -> str:
    """"Your mix (code 60 %, stories 40 %)"."""
    return "Your mix (" + ", ".join(f"{task_name(t).lower()} {100 * w:.0f} %" for t, w in mix.items()) + ")"


@functools.lru_cache(maxsize=64)
def _facts(path: str, stamp: tuple[int, ...]) -> tuple[bool | None, bool, str | None]:
    from app.core.calibrated.demo import demo_prompts  # the demo's metadata: read from the header
    from app.core.machine.gguf_info import read_header

    try:
        hdr = read_header(path, keep_arrays=False)
    except (UserError, OSError) as e:
        return None, False, str(e)
    return hdr.has_mtp, bool(demo_prompts(path)), None


def model_facts(path: str) -> tuple[bool | None, bool, str | None]:
    """(has MTP heads, None when unknown; is the demo model; why the file cannot be read, or None)."""
    import os

    try:
        st = os.stat(path)
        stamp: tuple[int, ...] = (st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = ()
    return _facts(path, stamp)
