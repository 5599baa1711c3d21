"""One arm of a sweep: a speculative mode (llama.cpp's ``--spec-type``), its drafter, draft width K,
p_min and draft sampling; or the baseline (no speculation). The one arm type of plans, engines,
runs, the analysis and the verdict, with one label ("baseline", "K=2", "K=2 p=0.5", "K=2 prob",
"draft-simple K=3", "ngram-mod")."""

from __future__ import annotations

import dataclasses
import functools
import os
import re

from app.core.common.spec_modes import (BASELINE, MTP, canonical, combination_problem, is_combined, mode_or_guess,
                                        needs_server, takes_k)

__all__ = ["BASELINE", "MTP", "MODE_NAME", "GREEDY_DRAFT", "PROBABILISTIC", "DRAFT_SAMPLINGS", "Arm",
           "arm_from_fields", "takes_k"]

# a --spec-type name, or a combined mode's names joined by "+" (spec_modes.COMBINE)
MODE_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?:\+[a-z][a-z0-9]*(?:-[a-z0-9]+)*)*")
# llama.cpp's --spec-draft-sampling (b11368 and later): greedy takes the draft's argmax (the only
# way before); probabilistic samples the draft and the target verifies by rejection sampling
# (lossless), at temperature > 0 only
GREEDY_DRAFT, PROBABILISTIC = "greedy", "probabilistic"
DRAFT_SAMPLINGS = (GREEDY_DRAFT, PROBABILISTIC)


@dataclasses.dataclass(frozen=True)
class Arm:
    """``Arm()`` is the baseline, ``Arm(2)`` draft-mtp with K=2 (the model's own MTP heads),
    ``Arm(2, 0.5)`` the same with p_min 0.5, ``Arm(3, mode="draft-simple", drafter=path)`` a draft
    model, ``Arm(mode="ngram-mod")`` an n-gram mode (no K: its own lookup settings),
    ``Arm(2, mode="draft-mtp+ngram-mod")`` a combined mode (spec_modes.COMBINE: K for its draft-*
    part; its name put in one order).

    ``mode`` left empty is derived: "none" without K, "draft-mtp" with one. ``drafter`` is the path
    of a separate drafter GGUF (a Gemma 4 assistant, a draft model), None for the model's own heads
    and the n-gram modes.

    ``draft_sampling``: how a mode that drafts with a model (K) samples its draft, "greedy" (the
    default, and what every run before llama.cpp's --spec-draft-sampling did) or "probabilistic";
    None for the baseline and the n-gram modes, which draft nothing to sample."""

    k: int | None = None
    p_min: float = 0.0
    mode: str = ""
    drafter: str | None = None
    draft_sampling: str | None = None

    def __post_init__(self) -> None:
        mode = self.mode or (BASELINE if self.k is None else MTP)
        if not MODE_NAME.fullmatch(mode):
            raise ValueError(f"{mode!r} is not a speculative mode name (like draft-mtp or ngram-mod)")
        if is_combined(mode):
            problem = combination_problem(mode)
            if problem:
                raise ValueError(problem)
            mode = canonical(mode)
        if mode == BASELINE and (self.k is not None or self.drafter):
            raise ValueError("the baseline has no draft width and no drafter")
        if takes_k(mode) and self.k is None:
            raise ValueError(f"{mode} needs a draft width K")
        if mode != BASELINE and not takes_k(mode) and (self.k is not None or self.drafter or self.p_min):
            raise ValueError(f"{mode} takes no draft width, p_min or drafter (it drafts from the text itself)")
        if takes_k(mode):
            sampling = self.draft_sampling or GREEDY_DRAFT
            if sampling not in DRAFT_SAMPLINGS:
                raise ValueError(f"draft sampling {sampling!r} is not one of {', '.join(DRAFT_SAMPLINGS)}")
            object.__setattr__(self, "draft_sampling", sampling)
        elif self.draft_sampling not in (None, GREEDY_DRAFT):
            raise ValueError(f"{'the baseline' if mode == BASELINE else mode} drafts nothing to sample "
                             f"({self.draft_sampling} draft sampling)")
        else:
            object.__setattr__(self, "draft_sampling", None)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "p_min", float(self.p_min or 0.0))
        if self.drafter is not None:
            object.__setattr__(self, "drafter", os.fspath(self.drafter))

    @property
    def is_baseline(self) -> bool:
        return self.mode == BASELINE

    @property
    def is_spec(self) -> bool:
        """Any speculative mode (every arm but the baseline)."""
        return self.mode != BASELINE

    @property
    def is_mtp(self) -> bool:
        """draft-mtp: the model's MTP heads, or a Gemma 4 assistant drafter."""
        return self.mode == MTP

    @property
    def own_heads(self) -> bool:
        """A mode on the model's own heads (draft-mtp, no drafter file): the speculative arms the
        in-process engine runs (the mode table's ``in_process``)."""
        return self.is_spec and mode_or_guess(self.mode).in_process and not self.drafter

    @property
    def probabilistic(self) -> bool:
        """Probabilistic draft sampling (llama-server's --spec-draft-sampling probabilistic)."""
        return self.draft_sampling == PROBABILISTIC

    @property
    def needs_server(self) -> bool:
        """Only llama-server runs this arm (every arm but the baseline and draft-mtp on the model's
        own heads, greedy; see app.core.common.spec_modes.needs_server)."""
        return needs_server(self.mode, self.drafter) or self.probabilistic

    @property
    def kind(self) -> str:
        """What a run record's ``arm_kind`` says: "baseline", "mtp" (draft-mtp) or "spec"."""
        return "baseline" if self.is_baseline else "mtp" if self.is_mtp else "spec"

    @property
    def label(self) -> str:
        if self.is_baseline:
            return "baseline"
        if not takes_k(self.mode):
            return self.mode
        width = f"K={self.k}" + (f" p={self.p_min:g}" if self.p_min else "") + (" prob" if self.probabilistic else "")
        return width if self.is_mtp else f"{self.mode} {width}"

    @property
    def mode_label(self) -> str:
        """The mode as tables show it: "-" for the baseline, else the --spec-type name, with
        "+drafter" when a separate drafter file drafts and "probabilistic" for that draft sampling."""
        if self.is_baseline:
            return "-"
        return self.mode + (" +drafter" if self.drafter else "") + (" probabilistic" if self.probabilistic else "")


@functools.lru_cache(maxsize=4096)  # called once per record of files with 200,000 runs
def arm_from_fields(k: int | None, p_min: float | None, spec_type: str | None, drafter: str | None,
                    draft_sampling: str | None = None) -> Arm:
    """The arm of a run record's fields; a record without ``spec_type`` (schema 1 and 2, when
    draft-mtp was the only mode) is draft-mtp when it has a K, else the baseline; one without
    ``draft_sampling`` (before schema 5) drafted greedily."""
    mode = spec_type or (MTP if k is not None else BASELINE)
    if not takes_k(mode) and mode != BASELINE:
        return Arm(None, 0.0, mode)
    if mode == BASELINE:
        return Arm(k, p_min or 0.0, mode)
    return Arm(k, p_min or 0.0, mode, drafter, draft_sampling)
