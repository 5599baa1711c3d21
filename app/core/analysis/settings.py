"""A sweep's settings: the sampler, the chat template's thinking switch, the context depth and the
llama-server flags (the user's own, with a --axis value: app.core.measure.axes) a run was measured at. Runs pair, and a verdict holds, only within one setting, so a sweep that
measured several (an axis) is analysed and judged once per setting (:func:`split_by_setting`)."""

from __future__ import annotations

import functools
from typing import Iterable, Sequence

from app.core.common.errors import UserError
from app.core.measure.placements import DEFAULT, LABELS, flag_groups, placement_in
from app.core.records.sampler import SettingKey, setting_key
from app.core.records.schema import RunRecord

# a run's setting: the sampler's values, the thinking switch, the context depth and the server's flags
Setting = tuple[SettingKey, bool | None, int, tuple[str, ...] | None]


def setting_of(r: RunRecord) -> Setting:
    """The setting a run was measured at, which a speculative run and its baseline must share
    besides the prompt (and a verdict holds within): the sampler's values (seed included; a value
    an older record lacks is llama.cpp's default), the thinking switch, the context depth and the
    llama-server flags the server started with (records.schema: server_args)."""
    return setting_key(r.sampling), r.thinking, r.depth, r.server_args


def split_by_setting(records: Iterable[RunRecord]) -> dict[Setting, list[RunRecord]]:
    """The runs of each setting, in the order the settings first appear."""
    out: dict[Setting, list[RunRecord]] = {}
    for r in records:
        out.setdefault(setting_of(r), []).append(r)
    return out


def setting_label(runs: Sequence[RunRecord], sweep: Sequence[RunRecord] = ()) -> str:
    """What sets one setting's runs apart from the sweep's others: "thinking off, depth 4096",
    "temperature 0.7, ..." ("" when the sweep has one setting)."""
    if not runs:
        return ""
    r0 = runs[0]
    others = list(sweep) or list(runs)
    parts = []
    if len({setting_key(r.sampling) for r in others}) > 1:
        s = r0.sampling or {}
        t = s.get("temperature", 0.0)
        parts.append("greedy" if not t else f"temperature {t:g}" + "".join(
            f", {name.replace('_', '-')} {s[name]:g}" for name in ("top_k", "top_p", "min_p")
            if isinstance(s.get(name), (int, float))))
    if len({r.thinking for r in others}) > 1:
        parts.append("thinking " + ("default" if r0.thinking is None else "on" if r0.thinking else "off"))
    if len({r.depth for r in others}) > 1:
        parts.append(f"depth {r0.depth}")
    if len({r.server_args for r in others}) > 1:
        parts.append(server_label(r0.server_args or (), {r.server_args or () for r in others}))
    return ", ".join(parts)


def server_label(args: Sequence[str], every: Iterable[Sequence[str]]) -> str:
    """What sets the server flags ``args`` apart from ``every`` other setting's: the flags (``-ub
    64``), and the placement of the draft by its name when the sweep measured placements
    (measure.placements: "MTP block on this machine"; "llama.cpp's own split" for the default)."""
    every = list(every)
    name, rest = placement_in(flag_difference(args, every))
    placed = name is not None or any(placement_in(flag_difference(e, every))[0] for e in every)
    flags = " ".join(" ".join(g) for g in rest)
    return ", ".join(w for w in (flags, LABELS[name or DEFAULT] if placed else "") if w)


def flag_difference(args: Sequence[str], every: Iterable[Sequence[str]]) -> list[tuple[str, ...]]:
    """The flags of ``args`` (each with its values) that some of ``every`` lack: ``-ub 64`` among
    ``-ub 64`` and ``-ub 128``, what sets them apart."""
    common = functools.reduce(set.intersection, (set(flag_groups(e)) for e in every), set(flag_groups(args)))
    return [g for g in flag_groups(args) if g not in common]


def pick_setting(records: Sequence[RunRecord], index: int) -> tuple[list[RunRecord], list[str]]:
    """The runs of the ``index``-th setting of a sweep (clamped; the window's "Setting" choice) and
    every setting's label ([] when the sweep has one setting: then all its runs)."""
    groups = list(split_by_setting(records).values())
    if len(groups) < 2:
        return list(records), []
    labels = [setting_label(g, records) for g in groups]
    return groups[max(0, min(index, len(groups) - 1))], labels


def one_setting(records: Sequence[RunRecord], choice: int | None, what: str, option: str) -> list[RunRecord]:
    """The runs of one setting of a sweep, for what must never pool settings (a card, a compare):
    all of them when the sweep has one setting; else the ``choice``-th (1-based), and without a
    choice a UserError listing the settings and naming ``option``."""
    groups = list(split_by_setting(records).values())
    if len(groups) < 2:
        return list(records)
    labels = [f"{i + 1}: {setting_label(g, records)}" for i, g in enumerate(groups)]
    if choice is None or not 1 <= choice <= len(groups):
        raise UserError(f"{what} measured {len(groups)} settings ({'; '.join(labels)}): choose one with {option} N")
    return groups[choice - 1]
