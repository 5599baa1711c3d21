"""One reading of llama-server's ``/metrics`` (Prometheus text, prefix ``llamacpp:``): the
counters watch counts with. llama.cpp prints its counters as doubles; a value printed with an
exponent (1e+06 and up) is not exact, and ``inexact`` names it."""

from __future__ import annotations

import dataclasses
import re

PREFIX = "llamacpp:"
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"
COUNTERS = {  # our name: the counter's name after the prefix
    "drafts": "spec_decode_num_drafts_total",
    "draft_tokens": "spec_decode_num_draft_tokens_total",
    "accepted": "spec_decode_num_accepted_tokens_total",
    "generated": "tokens_predicted_total",
    "gen_seconds": "tokens_predicted_seconds_total",
    "prompt_tokens": "prompt_tokens_total",
}
_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POS = re.compile(r'position="([0-9]+)"')
# draft positions kept: llama.cpp drafts at most --spec-draft-n-max tokens a step (16 by default, a
# few in practice); a position past this is no llama-server's, and a hostile one
# (position="100000000000") would size the per-position series
MAX_POSITIONS = 64


@dataclasses.dataclass(frozen=True)
class Reading:
    t: float  # time.monotonic() of the answer
    start: str | None  # the server's Process-Start-Time-Unix header: a new value is a new process
    values: dict[str, float]  # COUNTERS' names -> value (absent when the page lacks it)
    per_pos: dict[int, int]  # draft position -> accepted drafts there (absent before the first)
    inexact: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()  # draft positions past MAX_POSITIONS, left out (the first few)

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    @property
    def has_spec(self) -> bool:
        """The page carries the speculative counters at all (llama.cpp prints them always)."""
        return "drafts" in self.values


def parse(text: str, t: float, start: str | None = None) -> Reading:
    by_name = {v: k for k, v in COUNTERS.items()}
    values: dict[str, float] = {}
    per_pos: dict[int, int] = {}
    inexact: list[str] = []
    ignored: list[str] = []
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, raw = m.group(1)[len(PREFIX):], m.group(2) or "", m.group(3)
        try:
            v = float(raw)
        except ValueError:
            continue
        if v != v or v in (float("inf"), float("-inf")) or v < 0:
            continue
        if "e" in raw.lower() and v >= 1e6:
            inexact.append(name)
        if name == PER_POS:
            pm = _POS.search(labels)
            if pm is None:
                continue
            digits = pm.group(1)
            if len(digits) > 3 or int(digits) >= MAX_POSITIONS:  # never int() of 5,000 digits
                ignored.append(digits if len(digits) <= 12 else digits[:12] + "\u2026")
                continue
            per_pos[int(digits)] = int(v)
        elif name in by_name and not labels:
            values[by_name[name]] = v
    return Reading(t, start, values, per_pos, tuple(sorted(set(inexact))), tuple(dict.fromkeys(ignored))[:5])
