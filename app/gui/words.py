"""Plain words for a verdict, shared by the Start page and the Results tab's banner: a task's
name ("Stories"), one line per pick ("Code: turn MTP on, K=2 -> 1.34x faster (1.20-1.49, sure)",
"Stories: leave it off (0.65x, 0.60-0.70: slower)"), the demo's note, and what a model's header
says (MTP heads, the demo). The lines render the core's picks (``Verdict.pick``, ``per_task``: the
arm, its paired ratio, its reason); nothing is computed here."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Mapping

from app.core.analysis.advice import (ALL_LAYERS, CTX_SIZE, GPU_LAYERS, GREEDY, MEMORY_LIMIT, N_PREDICT,
                                     REPS, RESUME, RUNTIME, SELFTEST, SERVER_ENGINE, WARMUP, say)
from app.core.analysis.decide import NO_GAIN, PAYS, SLOWER, at_most_words
from app.core.analysis.findings import Finding
from app.core.analysis.provisional import PROVISIONAL
from app.core.analysis.recommend import Pick
from app.core.analysis.repetition import NOT_SURE
from app.core.analysis.stats import Ratio
from app.core.common.errors import UserError

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.verdict import Verdict

TASK_NAMES = {"code": "Code", "story": "Stories", "tongue-twister": "Tongue-twisters", "edit": "Edits",
              "chat": "Chat"}
DEMO_NOTE = "synthetic demo model: drafts are wrong on purpose, per task"
BUSY = f"{PROVISIONAL}: measured while the machine was busy"  # an answer from disturbed runs, as every screen marks it
ON, OFF, UNSURE = "#2e7d32", "#c62828", "#b26a00"  # green, red, amber
FEW_PAIRS = "not sure: too few runs of this setting itself"  # a pick on fewer pairs than stats.MIN_PAIRS
CATALOG_NEXT = "get this model's MTP build from the catalog (Model tab, Find and download)"
NO_MTP_NEXT = ("MTP needs a model with MTP heads. Next: llama.cpp's n-gram modes draft from the text itself and "
               "work with any GGUF (Start page: \"measure the n-gram modes instead\"; they need llama-server), or "
               + CATALOG_NEXT + ".")
MEASURED_NGRAM_NEXT = "MTP needs a model with MTP heads: for MTP itself, " + CATALOG_NEXT + "."


def no_mtp_next(measured_ngram: bool) -> str:
    """What to do next for a model without MTP heads: the n-gram modes, unless the sweep shown
    measured them already (then only the catalog's MTP build is left to advise)."""
    return MEASURED_NGRAM_NEXT if measured_ngram else NO_MTP_NEXT


def measured_ngram(v: Verdict | None) -> bool:
    """Whether the verdict's sweep measured an n-gram mode."""
    return v is not None and any(c.arm.mode.startswith("ngram-") for c in v.analysis.cells)


def task_name(task: str) -> str:
    return TASK_NAMES.get(task, task[:1].upper() + task[1:])


def _interval(r: Ratio | None) -> str:
    """"1.20-1.49"; "anytime 1.20-1.49" for a sequential sweep's (app.core.analysis.anytime)."""
    if r is None or r.lo is None or r.hi is None:
        return ""
    return f"{'anytime ' if r.anytime else ''}{r.lo:.2f}-{r.hi:.2f}"


def verdict_line(pick: Pick, name: str, withheld: str | None = None, repeats: bool = False,
                 provisional: bool = False) -> tuple[str, str]:
    """(the plain line, its colour) for one of the core's picks, in the decisions' words (pays, no
    gain worth having, slower: app.core.analysis.decide); ``withheld``: the verdict's
    reason for withholding every pick (a busy machine), if it did; ``repeats``: the pick stands
    on output that repeats itself (``Verdict.repeats``), so it is never called sure;
    ``provisional``: it stands on runs measured while the machine was busy
    (``Verdict.is_provisional``): said, in amber. A pick on fewer pairs of its own than
    stats.MIN_PAIRS is not sure (``Pick.sure``). Where the whole answer's speedup differs from
    decode's (``Pick.whole``), the line says it after, in the core's words (``Pick.whole_words``)."""
    line, colour = _verdict_line(pick, name, withheld, repeats, provisional)
    whole = pick.whole_words if not withheld else None
    return (f"{line}; that is decoding alone, {whole}" if whole else line), colour


def _verdict_line(pick: Pick, name: str, withheld: str | None, repeats: bool, provisional: bool) -> tuple[str, str]:
    if withheld:
        return f"{name}: no verdict (withheld: the machine was busy; close other programs and run again)", UNSURE
    r = pick.ratio
    est = r.estimate if r is not None else None
    ci = _interval(r)
    mark = BUSY if provisional else None
    if pick.arm is not None and est is not None:
        what = f"turn MTP on, {pick.arm.label}" if pick.arm.is_mtp else f"turn on {pick.arm.label}"
        if repeats or mark:
            return f"{name}: {what} -> {est:.2f}x faster ({ci + ', ' if ci else ''}{mark or NOT_SURE})", UNSURE
        if not pick.sure:
            return f"{name}: {what} -> {est:.2f}x faster ({ci + ', ' if ci else ''}{FEW_PAIRS})", UNSURE
        return f"{name}: {what} -> {est:.2f}x faster ({ci + ', ' if ci else ''}{PAYS}, sure)", ON
    if mark and r is not None and est is not None:
        return f"{name}: leave it off for now ({est:.2f}x{', ' + ci if ci else ''}; {mark})", UNSURE
    if pick.arm is not None:  # an arm without an estimate: the reason says it
        return f"{name}: {pick.reason}", UNSURE
    if r is None or est is None:
        why = pick.reason.split(": ", 1)[-1].rstrip(".")
        return f"{name}: leave it off ({why})", OFF
    if pick.outcome == NO_GAIN and r.hi is not None:
        return f"{name}: leave it off: {at_most_words(r.hi if r.hi >= 1.0 else 1.0)} ({NO_GAIN}; {est:.2f}x, {ci})", OFF
    if r.verdict == "slower":
        return f"{name}: leave it off ({est:.2f}x, {ci}: {SLOWER})", OFF
    if r.verdict == "too few runs":
        return f"{name}: leave it off for now ({est:.2f}x: too few runs to tell)", UNSURE
    return f"{name}: leave it off ({est:.2f}x, {ci}: not reliably faster)", UNSURE


# each setting the core's advice names (app.core.analysis.advice), said as the control to use:
# its place, tab > section > group > field ("{value}" where its value goes). The CLI says the same
# settings in its own words (CLI_WORDS).
ADVANCED = "Sweep tab > Advanced settings"


def advanced_field(group: str, field: str) -> str:
    """"Sweep tab > Advanced settings > Runs > Repetitions": the Sweep form's field by its group
    and label (tests check each exists)."""
    return f"{ADVANCED} > {group} > {field}"


GPU_FIELD = advanced_field("Engine and threads", "GPU layers")
WINDOW_WORDS: Mapping[str, str] = {
    REPS: f"{{value}} or more repetitions: {advanced_field('Runs', 'Repetitions')}",
    WARMUP: "{value} or more: the window's sweeps make one warmup run each; sweep again (Sweep tab > Start sweep)",
    N_PREDICT: f"generate {{value}} tokens or more per run: {advanced_field('Runs', 'Tokens per run')}",
    GREEDY: f"add temperature 0 in {advanced_field('Sampler and thinking', 'Temperatures')}",
    GPU_LAYERS: f"raise {GPU_FIELD}, or keep a MoE model's experts in system RAM",
    ALL_LAYERS: f"set {GPU_FIELD} to all, or at least {{value}}",
    SELFTEST: "run the self-test (mtp-tuner selftest, in a terminal)",
    SERVER_ENGINE: f"{advanced_field('Engine and threads', 'Engine')}: llama-server, with",
    RUNTIME: "Machine tab > Get llama.cpp for this machine gets one",
    RESUME: "Start page > Finish when quiet",
    CTX_SIZE: f"context size ({advanced_field('Context', 'Context size')})",
    MEMORY_LIMIT: "memory limit (mtp-tuner bench's, in a terminal)",
}


def finding_words(f: Finding) -> str:
    """A finding as the window says it: "... -> run more repetitions (3 or more repetitions: Sweep
    tab > Advanced settings > Runs > Repetitions)"; the llama-server flags of a command stay as they are."""
    return f"{f.message} -> {say(f.advice, WINDOW_WORDS)}"


def gpu_warning_words(v: Verdict) -> str | None:
    """The verdict's GPU warning (the runs missed the machine's GPU) in the window's words; None without one."""
    return v.gpu_warning_said(WINDOW_WORDS)


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
