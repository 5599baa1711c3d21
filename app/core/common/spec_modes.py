"""llama.cpp's speculative modes (``--spec-type`` names, common/speculative.cpp): one row per mode
holding all the app knows about it. The arms (app.core.records.arm), the llama-server argv
(app.core.engines.commands), the engines' mode checks, the drafter checks
(app.core.machine.drafter) and the Sweep tab read this table, so a new n-gram mode is one row and a
new drafter mode one row plus its pairing rule (what its drafter file looks like, in
app.core.machine.drafter).

A newer binary may list a name this table lacks; the engines check each against its own --help,
and ``mode_or_guess`` infers such a mode's row from llama.cpp's naming (draft-*: drafts K tokens
with a model; ngram-*: drafts from the text)."""

from __future__ import annotations

import dataclasses
from typing import Iterable


@dataclasses.dataclass(frozen=True)
class SpecMode:
    """One ``--spec-type`` mode.

    ``takes_k``: drafts K tokens at a time (--spec-draft-n-max, and p_min); ``needs_drafter``:
    cannot run without a separate drafter file (-md); ``drafter_kinds``: the drafter file kinds
    (app.core.machine.modelinfo.drafter_kind; "model": an ordinary model) that draft with it, the
    kind it was made for first; ``in_process``: the in-process engine runs it, on the model's own
    heads only (with a drafter file it needs llama-server); ``fresh_server``: each run needs a new
    llama-server (its draft table lives as long as the server and learns from every request);
    ``tip``: one line on what drafts and which flags."""

    name: str
    takes_k: bool = False
    needs_drafter: bool = False
    drafter_kinds: tuple[str, ...] = ()
    in_process: bool = False
    fresh_server: bool = False
    tip: str = ""

    @property
    def takes_drafter(self) -> bool:
        """Can a drafter file draft for it (every mode that drafts with a model)?"""
        return bool(self.drafter_kinds)


BASELINE = "none"
MTP = "draft-mtp"
_NGRAM_TIP = "no drafter, no K; --spec-type {name}{flags}. llama-server only"

_ROWS = (
    SpecMode(BASELINE, in_process=True,
             tip="No speculation: the baseline every mode is compared with. In-process or llama-server"),
    SpecMode("draft-simple", takes_k=True, needs_drafter=True, drafter_kinds=("model",),
             tip="A separate small draft model of the same vocabulary drafts K tokens; needs a Drafter; "
                 "--spec-type draft-simple -md FILE --spec-draft-n-max K. llama-server only"),
    SpecMode("draft-eagle3", takes_k=True, needs_drafter=True, drafter_kinds=("eagle3",),
             tip="An EAGLE-3 head trained for this model drafts K tokens from its hidden states; needs a "
                 "Drafter; --spec-type draft-eagle3 -md FILE --spec-draft-n-max K. llama-server only"),
    SpecMode(MTP, takes_k=True, drafter_kinds=("mtp-head", "gemma4-assistant"), in_process=True,
             tip="The model's own MTP heads draft K tokens (or a Gemma 4 assistant given as Drafter); "
                 "--spec-type draft-mtp --spec-draft-n-max K. In-process or llama-server"),
    SpecMode("draft-dflash", takes_k=True, needs_drafter=True, drafter_kinds=("dflash", "dspark"),
             tip="A DFlash block-diffusion drafter trained for this model drafts K tokens at once; needs a "
                 "Drafter; --spec-type draft-dflash -md FILE --spec-draft-n-max K. llama-server only"),
    SpecMode("draft-dspark", takes_k=True, needs_drafter=True, drafter_kinds=("dspark",),
             tip="A DFlash drafter with a Markov head (DSpark) drafts K tokens; needs a Drafter; "
                 "--spec-type draft-dspark -md FILE --spec-draft-n-max K. llama-server only"),
    SpecMode("ngram-simple", fresh_server=True,
             tip="Drafts the tokens that followed the last n-gram where it appeared earlier in the text; "
                 + _NGRAM_TIP.format(name="ngram-simple", flags="")),
    SpecMode("ngram-map-k", fresh_server=True,
             tip="Drafts from a map of the text's n-grams to what followed them (keys only); "
                 + _NGRAM_TIP.format(name="ngram-map-k", flags="")),
    SpecMode("ngram-map-k4v", fresh_server=True,
             tip="Like ngram-map-k, keeping up to four continuations per n-gram; "
                 + _NGRAM_TIP.format(name="ngram-map-k4v", flags="")),
    SpecMode("ngram-mod", fresh_server=True,
             tip="Drafts from a hash table of the context's n-grams, kept for the server's life; "
                 + _NGRAM_TIP.format(name="ngram-mod", flags=" (--spec-ngram-mod-n-min/-n-max)")),
    SpecMode("ngram-cache", fresh_server=True,
             tip="Drafts from n-gram statistics of the text (and of cache files, if given); "
                 + _NGRAM_TIP.format(name="ngram-cache", flags="")),
)

MODES: dict[str, SpecMode] = {m.name: m for m in _ROWS}
SPEC_TYPES: tuple[str, ...] = tuple(MODES)


def mode(name: str) -> SpecMode | None:
    """The table's row for ``name``, or None for a name it does not know."""
    return MODES.get(name)


def mode_or_guess(name: str) -> SpecMode:
    """The table's row for ``name``; for a combined mode (``draft-mtp+ngram-mod``) the row its
    parts make (combined_row); for a name only a newer llama.cpp lists, a row inferred from
    llama.cpp's naming: draft-* drafts K tokens with a model (a drafter file optional, as far as
    the app knows), ngram-* and others draft from the text kept by the server."""
    row = MODES.get(name)
    if row is not None:
        return row
    if COMBINE in name:
        return combined_row(name)
    if name.startswith("draft-"):
        return SpecMode(name, takes_k=True, tip=f"--spec-type {name}: listed by this llama-server; "
                                                "drafts K tokens (--spec-draft-n-max K)")
    return SpecMode(name, fresh_server=name.startswith("ngram-"),
                    tip=f"--spec-type {name}: listed by this llama-server; no K")


# A combined mode: several --spec-type names at once, joined by "+" in the app (an arm's mode,
# --modes, a record's spec_type) and by "," on llama-server's command line. llama.cpp
# (common/speculative.cpp, common_speculative_init and common_speculative_draft) asks its modes in a
# fixed order each step, the n-gram ones first, and drafts with the first that has a draft: an n-gram
# match where the text repeats, else the draft model's K tokens. --spec-draft-n-max, p_min and the
# draft sampling apply to the draft-* part; each n-gram part keeps its own lookup settings.
COMBINE = "+"
# the combinations the window offers (a drafter mode with an n-gram one; two n-gram modes), each
# where the llama-server lists all its parts; --modes takes any other
SUGGESTED_COMBINATIONS = ("draft-mtp+ngram-mod", "draft-mtp+ngram-simple", "draft-simple+ngram-mod",
                          "draft-simple+ngram-simple", "ngram-simple+ngram-mod")


def parts(name: str) -> tuple[str, ...]:
    """The --spec-type names of a mode: one, or a combined mode's parts."""
    return tuple(name.split(COMBINE))


def is_combined(name: str) -> bool:
    return COMBINE in name


def combination_problem(name: str) -> str | None:
    """Why ``name`` is no combination llama-server runs (a part twice, "none" in it, two modes that
    draft with a model: one draft width and one drafter per server), or None."""
    names = parts(name)
    if len(names) < 2 or not all(names):
        return f"{name!r} is not a combination of modes (like draft-mtp+ngram-mod)"
    if BASELINE in names:
        return f"{name}: 'none' turns speculation off and combines with nothing"
    if len(set(names)) < len(names):
        return f"{name}: a mode appears twice"
    drafting = [n for n in names if mode_or_guess(n).takes_k]
    if len(drafting) > 1:
        return (f"{name}: {' and '.join(drafting)} both draft with a model; a combination has at most one "
                "(one draft width, one drafter), with n-gram modes")
    return None


def canonical(name: str) -> str:
    """A combined mode's name in one order (llama.cpp's table's, draft-* first, names it lacks last),
    so that ngram-mod+draft-mtp and draft-mtp+ngram-mod are one arm; a single mode as it is."""
    if not is_combined(name):
        return name
    order = {m: i for i, m in enumerate(SPEC_TYPES)}
    return COMBINE.join(sorted(parts(name), key=lambda m: order.get(m, len(order))))


def spec_type_value(name: str) -> str:
    """The value of llama-server's --spec-type for a mode: ``draft-mtp,ngram-mod`` for a combined one."""
    return ",".join(parts(name))


def combined_row(name: str) -> SpecMode:
    """A combined mode's row: it drafts K tokens, needs llama-server, takes or needs a drafter and
    a fresh server per run as its parts do (an n-gram part's table outlives requests)."""
    rows = [mode_or_guess(n) for n in parts(name)]
    drafting = next((r for r in rows if r.takes_k), None)
    return SpecMode(name, takes_k=drafting is not None, needs_drafter=any(r.needs_drafter for r in rows),
                    drafter_kinds=drafting.drafter_kinds if drafting else (),
                    fresh_server=any(r.fresh_server for r in rows),
                    tip=f"{' and '.join(parts(name))} together: each step llama.cpp asks the n-gram modes first "
                        "and drafts with the first that has a draft (where the text repeats)"
                        + (f", else {drafting.name} drafts K tokens" if drafting else "")
                        + f"; --spec-type {spec_type_value(name)}. llama-server only")


def takes_k(name: str) -> bool:
    """Does this mode draft with a model, K tokens at a time?"""
    return mode_or_guess(name).takes_k


def needs_drafter(name: str) -> bool:
    """Can this mode not run without a separate drafter file?"""
    return mode_or_guess(name).needs_drafter


def needs_server(mode: str, drafter: str | None) -> bool:
    """Does (mode, drafter) need llama-server? The in-process engine runs only the baseline and
    draft-mtp on the model's own heads; every other mode, and any drafter file, needs llama-server."""
    return bool(drafter) or not mode_or_guess(mode).in_process


def server_label(mode: str, drafter: str | None) -> str:
    """How notes name a (mode, drafter) pair that needs llama-server: "ngram-mod", "draft-mtp with a
    drafter" (a mode that runs in process on its own heads, given a drafter file)."""
    return mode + (" with a drafter" if drafter and mode_or_guess(mode).in_process else "")


def server_only(pairs: Iterable[tuple[str, str | None]]) -> list[str]:
    """The sorted labels (server_label), each once, of the (mode, drafter) pairs that need
    llama-server; [] when the in-process engine runs them all."""
    return sorted({server_label(m, d) for m, d in pairs if needs_server(m, d)})


def drafter_modes(kind: str) -> tuple[str, ...]:
    """The modes a drafter file of ``kind`` drafts with, the mode it was made for first; an unknown
    kind drafts as an ordinary model."""
    rows = [m for m in MODES.values() if kind in m.drafter_kinds]
    if not rows:
        return drafter_modes("model") if kind != "model" else ()
    return tuple(m.name for m in sorted(rows, key=lambda m: m.drafter_kinds[0] != kind))


# llama.cpp builds that cannot run a mode at all, with the fix: b10741-b10748 fail to start
# draft-mtp on any GGUF with MTP heads (llama.cpp #28159, fixed by #28173 in b10749)
BROKEN_BUILDS: dict[str, tuple[range, str]] = {
    MTP: (range(10741, 10749), "builds b10741-b10748 cannot start draft-mtp on any model with MTP heads "
                               "(llama.cpp #28159); use b10749 or newer (mtp-tuner runtime install)"),
}


def build_problem(mode: str, build: int | None) -> str | None:
    """Why llama.cpp build number ``build`` cannot run ``mode`` (a known broken build, for any part
    of a combined mode), or None."""
    for part in parts(mode):
        broken = BROKEN_BUILDS.get(part)
        if broken is not None and build is not None and build in broken[0]:
            return f"this llama-server is b{build}: {broken[1]}"
    return None


# derived views, for readers that want a set or a map
NEEDS_DRAFTER: frozenset[str] = frozenset(m.name for m in _ROWS if m.needs_drafter)
DRAFTER_MODES: dict[str, tuple[str, ...]] = {
    kind: drafter_modes(kind) for kind in dict.fromkeys(k for m in _ROWS for k in m.drafter_kinds)}
