"""The watch records of a results file (``mtp-tuner watch``) as ``card`` and ``compare`` show
them: the newest window of each server and model, its counts as the watch printed them, its
predictions and its recommendation; two files' windows side by side.

    seen = newest(load_watch_records(path))   # one WatchSeen per server and model, newest first
    format_seen(seen)                         # the card's "From your own use (watch)" section
    pairs = pair_up(seen_a, seen_b)           # compare: the windows of the same model in A and B
    format_pairs(pairs, seen_a, seen_b)

A window's acceptance at position i is the share of its verification steps that accepted a
draft there (accepted[i] / steps), as the watch prints it. Compare calls a position *changed*
only where the 95 % interval of B - A (two independent binomial shares) excludes 0."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from app.core.records.watch import WatchPrediction, WatchRecord, mode_of
from app.core.common.text import file_name
from app.core.common import units

HEADING = "From your own use (watch)"
Z = 1.96


@dataclasses.dataclass(frozen=True)
class WatchSeen:
    """The newest watch window of one server and model. No address (a card shares it): the
    model by its file name only."""

    model: str  # the model's file name (no folder); "" when the server did not say
    build: str | None
    date: str  # when the window ended: "2026-12-02 04:10" (UTC)
    seconds: float  # the window's length
    requests_at_least: int  # the requests seen finishing in /slots (/metrics counts none): a lower bound
    generated: int
    draft_steps: int
    accepted_per_pos: tuple[int, ...]
    acceptance: tuple[float, ...]  # by position: accepted there over the steps (4 digits)
    mode: str  # "draft-mtp", "no speculation", "mode unknown"
    server_k: int | None  # the draft width the server ran
    predicted: tuple[WatchPrediction, ...]  # off (k 0), then K = 1 ..; empty: no prediction
    recommendation_k: int | None  # 0: off; None: no recommendation (the reason says why)
    reason: str
    windows: int  # the watch records of this server and model in the file (this one the newest)

    @property
    def answer(self) -> str:
        """The recommendation in a few words."""
        k = self.recommendation_k
        if k is None:
            return "no recommendation"
        if k == 0:
            return "turn MTP off"
        return f"K={k} is fine" if k == self.server_k else f"run K={k}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["accepted_per_pos"], d["acceptance"] = list(self.accepted_per_pos), list(self.acceptance)
        d["predicted"] = [dataclasses.asdict(p) for p in self.predicted]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "WatchSeen":
        """What to_dict wrote (a card's JSON): TypeError or KeyError when it is not that."""
        kw = {f.name: d[f.name] for f in dataclasses.fields(cls)}
        kw["accepted_per_pos"] = tuple(int(x) for x in kw["accepted_per_pos"])
        kw["acceptance"] = tuple(float(x) for x in kw["acceptance"])
        kw["predicted"] = tuple(WatchPrediction(**p) for p in kw["predicted"])
        return cls(**kw)


def _model_name(path: str) -> str:
    return file_name(path) if path else ""


def seen_of(rec: WatchRecord, windows: int = 1) -> WatchSeen:
    steps = rec.draft_steps
    rates = tuple(round(a / steps, 4) for a in rec.accepted_per_pos) if steps > 0 else ()
    preds = tuple(WatchPrediction(p.k, round(p.speedup, 4), round(p.lo, 4), round(p.hi, 4), p.extrapolated)
                  for p in rec.predicted)
    return WatchSeen(_model_name(rec.model_path), rec.llama_build, rec.timestamp_utc[:16].replace("T", " "),
                     round(rec.seconds, 1), rec.requests, rec.generated, steps, rec.accepted_per_pos, rates,
                     mode_of(rec.spec_types), rec.server_k, preds, rec.recommendation_k, rec.reason, windows)


def newest(records: Sequence[WatchRecord]) -> list[WatchSeen]:
    """The newest window of each server (its address) and model, the newest first; of two with
    the same time, the one later in the file."""
    groups: dict[tuple[str, str], list[WatchRecord]] = {}
    for r in records:
        groups.setdefault((r.url, r.model_path), []).append(r)
    last = [(max(enumerate(rs), key=lambda ir: (ir[1].timestamp_utc, ir[0]))[1], len(rs)) for rs in groups.values()]
    last.sort(key=lambda rn: rn[0].timestamp_utc, reverse=True)
    return [seen_of(r, n) for r, n in last]


def duration(seconds: float) -> str:
    """How long a window watched: "45 s", "5 minutes", "2.5 hours" (units.duration)."""
    return units.duration(seconds)


def rates_text(s: WatchSeen) -> str:
    return " / ".join(f"{r:.2f}" for r in s.acceptance) or "-"


def server_text(s: WatchSeen) -> str:
    return s.mode + (f" K={s.server_k}" if s.server_k else "")


def prediction_text(p: WatchPrediction) -> str:
    if p.k == 0:
        return f"off {p.speedup:.2f}x"
    return f"K={p.k} {p.speedup:.2f}x [{p.lo:.2f}, {p.hi:.2f}]" + (" extrapolated" if p.extrapolated else "")


def best(s: WatchSeen) -> WatchPrediction | None:
    return max(s.predicted, key=lambda p: p.speedup) if s.predicted else None


def title(s: WatchSeen) -> str:
    build = f" (llama.cpp {s.build})" if s.build else ""
    return f"{s.model or 'a model the server did not name'}{build}, {s.date} UTC"


def format_seen(seen: Sequence[WatchSeen]) -> str:
    """The card's section: per server and model, the answer first, then what it rests on."""
    if not seen:
        return ""
    lines = [f"{HEADING}, the newest window of each server and model:"]
    n_of = {m: sum(1 for s in seen if s.model == m) for m in {s.model for s in seen}}
    nth: dict[str, int] = {}
    for s in seen:
        more = f"; {s.windows} windows in the file" if s.windows > 1 else ""
        nth[s.model] = nth.get(s.model, 0) + 1
        which = f" [server {nth[s.model]} of {n_of[s.model]} with this model]" if n_of[s.model] > 1 else ""
        lines += [f"  {title(s)}{which}: {s.answer}",
                  f"    window {duration(s.seconds)} ({s.draft_steps:,} draft steps, "
                  f"at least {s.requests_at_least} requests{more}); acceptance by position {rates_text(s)}; the server ran {server_text(s)}"]
        if s.predicted:
            lines.append("    predicted speedup: " + ", ".join(prediction_text(p) for p in s.predicted))
        lines.append(f"    recommendation: {s.reason}")
    return "\n".join(lines)


# ---- compare ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PositionChange:
    position: int  # 1 = the first drafted token
    a: float
    b: float
    lo: float  # the 95 % interval of b - a
    hi: float

    @property
    def changed(self) -> bool:
        return self.lo > 0 or self.hi < 0


@dataclasses.dataclass(frozen=True)
class WatchPair:
    """The newest windows of one model in A and in B."""

    model: str
    a: WatchSeen
    b: WatchSeen
    positions: tuple[PositionChange, ...]  # the positions both drafted

    @property
    def same_answer(self) -> bool:
        return self.a.recommendation_k == self.b.recommendation_k


def share_difference(xa: int, na: int, xb: int, nb: int, z: float = Z) -> tuple[float, float, float]:
    """b - a of two binomial shares (x of n each) with its Wald interval (0 width where both
    shares are 0 or 1)."""
    pa, pb = xa / na, xb / nb
    h = z * math.sqrt(pa * (1 - pa) / na + pb * (1 - pb) / nb)
    return pb - pa, pb - pa - h, pb - pa + h


def pair_up(a: Sequence[WatchSeen], b: Sequence[WatchSeen]) -> list[WatchPair]:
    """The models watched in both files (the newest window of each in each), in A's order."""
    first_b: dict[str, WatchSeen] = {}
    for s in b:
        first_b.setdefault(s.model, s)
    out, done = [], set()
    for s in a:
        t = first_b.get(s.model)
        if t is None or s.model in done:
            continue
        done.add(s.model)
        pos = []
        if s.draft_steps > 0 and t.draft_steps > 0:
            for i, (xa, xb) in enumerate(zip(s.accepted_per_pos, t.accepted_per_pos)):
                d, lo, hi = share_difference(min(xa, s.draft_steps), s.draft_steps, min(xb, t.draft_steps),
                                             t.draft_steps)
                pos.append(PositionChange(i + 1, round(xa / s.draft_steps, 4), round(xb / t.draft_steps, 4),
                                          round(lo, 4), round(hi, 4)))
        out.append(WatchPair(s.model, s, t, tuple(pos)))
    return out


def _held(seen: Sequence[WatchSeen]) -> str:
    if not seen:
        return "no watch summary"
    return f"{len(seen)} watch summar{'y' if len(seen) == 1 else 'ies'} (" + ", ".join(
        s.model or "?" for s in seen) + ")"


def format_pairs(a: Sequence[WatchSeen], b: Sequence[WatchSeen]) -> str:
    """compare's watch section: what each file holds; for each model watched in both, the
    answers first, then the acceptance by position (changed where the interval excludes 0) and
    the best predicted width."""
    lines = [f"{HEADING}: A holds {_held(a)}; B holds {_held(b)}"]
    pairs = pair_up(a, b)
    if a and b and not pairs:
        lines.append("  no model was watched in both files: nothing to compare")
    for p in pairs:
        verdict = "the same recommendation" if p.same_answer else "a different recommendation"
        lines.append(f"  {p.model or '?'}: A {p.a.answer}, B {p.b.answer} ({verdict})")
        lines.append(f"    window          A {duration(p.a.seconds)}, {p.a.draft_steps:,} draft steps, "
                     f"{server_text(p.a)}; B {duration(p.b.seconds)}, {p.b.draft_steps:,} draft steps, "
                     f"{server_text(p.b)}")
        for c in p.positions:
            mark = "changed" if c.changed else "same within noise"
            lines.append(f"    position {c.position}      A {c.a:.2f}  B {c.b:.2f}  B-A {c.b - c.a:+.2f} "
                         f"[{c.lo:+.2f}, {c.hi:+.2f}]  {mark}")
        ba, bb = best(p.a), best(p.b)
        if ba is not None or bb is not None:
            lines.append(f"    best predicted  A {prediction_text(ba) if ba else '-'}; "
                         f"B {prediction_text(bb) if bb else '-'}")
    return "\n".join(lines)


def pairs_dict(a: Sequence[WatchSeen], b: Sequence[WatchSeen]) -> dict[str, Any]:
    """compare --json's "watch": each file's newest windows and, per model in both, the changes."""
    return {"a": [s.to_dict() for s in a], "b": [s.to_dict() for s in b],
            "pairs": [{"model": p.model, "a_recommendation_k": p.a.recommendation_k,
                       "b_recommendation_k": p.b.recommendation_k, "same_recommendation": p.same_answer,
                       "positions": [dict(dataclasses.asdict(c), changed=c.changed) for c in p.positions]}
                      for p in pair_up(a, b)]}
