"""Any llama-server flag as a sweep axis: ``--axis "--n-cpu-moe=20,24,28"``, ``--axis "-ub=256,512"``.

A flag such as ``--n-cpu-moe`` or ``-ub`` changes plain decoding as much as speculation, so each
value is a setting of its own: the whole plan (its baseline included) is measured once per value
(per combination of values, for several axes), every llama-server started with the user's flags
with the axis value in place of that flag's. The records carry the value in ``server_args``; the
analysis pairs runs within one value only (app.core.analysis.settings), and the verdict judges each
value on its own and picks the best joint setting against the reference, the user's command as it
is (app.core.verdict.joint).

The reference is measured first: the user's own value of the flag when their command has one (it
is added to the values when they lack it), else each axis' first value.

An axis may also name bundles of flags (``Axis.bundles``: the placements of the draft over RPC
workers, app.core.measure.placements): each value a name standing for flags added after the user's
(llama.cpp reads its arguments in order, the last ``--device`` winning and each ``-ot`` adding).

A flag is an axis only when llama-server's ``--help`` lists it with one value; never the model,
the flags the measurement owns (host, port, ``-np`` ...), a speculative flag (the arms bring their
own) or a secret; nor ``-c``, which the sweep sizes for its prompts and depths (measure at other
depths with ``--depths``). ``-t`` and ``-ngl`` are the engine's own settings and follow the value."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Iterable, Sequence

from app.core.common.errors import UserError
from app.core.engines.base import EngineSettings
from app.core.engines.commands import FLAG_SPELLINGS, Capabilities
from app.core.engines.flag_rule import flag_class
from app.core.engines.user_command import flag_name, help_flags, is_value, option_value

MAX_VALUES = 16  # values of one axis; several axes multiply
MAX_SETTINGS = 32  # combinations of every axis' values: each is a whole sweep
SEP = "="


@dataclasses.dataclass(frozen=True)
class Axis:
    """One flag and its values, the reference's first (``aliases``: every spelling of the flag
    that --help lists, for replacing the user's own). With ``bundles`` (one per value) a named
    axis: ``flag`` its name ("placement"), each value a name for the flags of its bundle."""

    flag: str
    values: tuple[str, ...]
    aliases: frozenset[str] = frozenset()
    bundles: tuple[tuple[str, ...], ...] = ()

    def value_in(self, args: Sequence[str]) -> str | None:
        """The value ``args`` give this axis: the flag's last value, or the named value whose
        bundle ``args`` hold (the longest; the one with no flags when none)."""
        if not self.bundles:
            return _own_value(args, self.aliases)
        words = tuple(args)
        held = [(len(b), v) for v, b in zip(self.values, self.bundles)
                if not b or any(words[i:i + len(b)] == b for i in range(len(words) - len(b) + 1))]
        return max(held)[1] if held else None


def parse_axis(text: str) -> Axis:
    """``--n-cpu-moe=20,24,28`` as an Axis (not yet checked against llama-server); UserError
    naming the problem."""
    flag, sep, values = text.strip().partition(SEP)
    flag = flag.strip()
    flag = flag.replace("_", "-") if flag.startswith("--") else flag  # as llama-server reads it
    named = f"--axis {flag}" if re.fullmatch(r"--?[A-Za-z][A-Za-z0-9.-]{0,60}", flag) else "--axis"
    if not sep or not flag.startswith("-") or len(flag) < 2 or is_value(flag) or " " in flag:
        raise UserError(f"{named}: expected a llama-server flag, '=' and its values, e.g. "
                        "--axis \"-ub=256,512\" or --axis \"--n-cpu-moe=20,24,28\"")
    vals = [v.strip() for v in values.split(",")]
    if not vals or any(not v for v in vals):
        raise UserError(f"{named}: an empty value; give the values separated by commas")
    if any(not is_value(v) for v in vals):
        raise UserError(f"{named}: a value starts with '-', which llama-server would read as a flag")
    if len(set(vals)) < len(vals):
        raise UserError(f"{named}: a value is given twice")
    if len(vals) > MAX_VALUES:
        raise UserError(f"{named}: {len(vals)} values, more than the {MAX_VALUES} an axis may have")
    return Axis(flag, tuple(vals), frozenset({flag}))


def check_axes(axes: Sequence[Axis], caps: Capabilities | None, user_args: Sequence[str] = ()) -> tuple[Axis, ...]:
    """``axes`` checked against this llama-server's ``--help`` (None: their spellings only) and
    each other, each with the flag's every spelling, and its values led by the user's own value
    of the flag (``user_args``) when they have one: the reference is measured first. UserError
    naming the first problem."""
    specs = help_flags(caps.help_text) if caps is not None else {}
    out: list[Axis] = []
    for axis in axes:
        spec = specs.get(axis.flag)
        if caps is not None and spec is None:
            raise UserError(f"--axis {axis.flag}: not a flag of this llama-server ({caps.version}); check its --help")
        aliases = spec.aliases if spec is not None else frozenset({axis.flag})
        if spec is not None and spec.arity != 1 and not spec.optional:
            raise UserError(f"--axis {axis.flag}: the flag takes {spec.arity or 'no'} values, an axis one")
        why = _refused(aliases)
        if why:
            raise UserError(f"--axis {axis.flag}: {why}")
        if any(aliases & o.aliases for o in out):
            raise UserError(f"--axis {axis.flag}: that flag is already an axis")
        if aliases & set(FLAG_SPELLINGS["threads"]):
            _whole(axis, 1)
        if aliases & set(FLAG_SPELLINGS["n_gpu_layers"]):
            _whole(axis, -1, ("auto", "all"))
        own = _own_value(user_args, aliases)
        values = axis.values if own is None else (own, *(v for v in axis.values if v != own))
        out.append(Axis(axis.flag, values, aliases))
    n = 1
    for axis in out:
        n *= len(axis.values)
    if n > MAX_SETTINGS:
        raise UserError(f"the axes make {n} settings, each a whole sweep; at most {MAX_SETTINGS}")
    return tuple(out)


def _refused(aliases: frozenset[str]) -> str | None:
    """Why a flag cannot be an axis (the command's rule, flag_rule.flag_class, and the sweep's
    own: the context, the RPC workers), or None."""
    kind, why = flag_class(aliases)
    if kind == "model":
        return "the model is the sweep's; measure another model in its own sweep"
    if kind == "secret":
        return "a secret is never measured, recorded or shown"
    if kind == "owned":
        return "the measurement owns this flag (where the server listens, its one slot, its logs)"
    if kind == "speculative":
        return "a speculative flag: the arms bring their own (--k, --modes, --p-min, --drafter)"
    if kind == "rpc":
        return "the RPC workers are the sweep's (--rpc); where the layers run over them is --placements"
    if kind == "refused":
        return why
    if aliases & set(FLAG_SPELLINGS["ctx_size"]):
        return "the sweep sizes the context for its prompts and depths; measure deeper contexts with --depths"
    return None


def _whole(axis: Axis, lo: int, words: tuple[str, ...] = ()) -> None:
    for v in axis.values:
        if v not in words and not (v.lstrip("-").isdigit() and int(v) >= lo):
            raise UserError(f"--axis {axis.flag}: {v!r} is not a whole number of at least {lo}")


def _own_value(args: Sequence[str], aliases: frozenset[str]) -> str | None:
    """The last value ``args`` give the flag of ``aliases``, or None."""
    found = None
    for i, a in enumerate(args):
        if flag_name(a) in aliases:
            if "=" in a and a.startswith("--"):
                found = a.split("=", 1)[1]
            elif i + 1 < len(args) and is_value(args[i + 1]):
                found = args[i + 1]
    return found


def with_value(args: Iterable[str], axis: Axis, value: str) -> tuple[str, ...]:
    """``args`` with the flag of ``axis`` set to ``value``: in the place of the user's own (each
    spelling, each time given: the first one replaced, the others dropped), else at the end. A
    named axis' value: its bundle's flags after ``args``."""
    if axis.bundles:
        return (*args, *axis.bundles[axis.values.index(value)])
    out: list[str] = []
    placed = False
    words = list(args)
    i = 0
    while i < len(words):
        a = words[i]
        if flag_name(a) in axis.aliases:
            joined = "=" in a and a.startswith("--")
            i += 1 if joined or not (i + 1 < len(words) and is_value(words[i + 1])) else 2
            if not placed:
                out += [axis.flag, value]
                placed = True
            continue
        out.append(a)
        i += 1
    return tuple(out) if placed else (*out, axis.flag, value)


def axis_settings(user_args: Sequence[str], axes: Sequence[Axis]) -> list[tuple[tuple[str, ...], str]]:
    """The server flags of each setting the axes make, the reference's first, with its label
    (``-ub 64``): the user's flags with each axis' value in place (every combination, for several)."""
    out = []
    for combo in itertools.product(*(a.values for a in axes)):
        args = tuple(user_args)
        for axis, value in zip(axes, combo):
            args = with_value(args, axis, value)
        out.append((args, " ".join(f"{a.flag} {v}" for a, v in zip(axes, combo))))
    return out


def engine_for(settings: EngineSettings, args: tuple[str, ...], axes: Sequence[Axis]) -> EngineSettings:
    """``settings`` for one axis setting: llama-server started with ``args``; the threads and GPU
    layers, which are the engine's own settings (the engine drops them from the flags), from them;
    its logs in a folder of the setting's own (``ub-64``) under the log folder, so that no value's
    server log overwrites another's."""
    threads = option_value(args, "threads")
    log_dir = settings.log_dir
    if log_dir:
        tag = "_".join(f"{a.flag.lstrip('-')}-{a.value_in(args)}" for a in axes)
        log_dir = str(Path(log_dir) / re.sub(r"[^A-Za-z0-9.=-]+", "_", tag))
    return dataclasses.replace(settings, user_args=args, threads=int(threads) if threads else settings.threads,
                               n_gpu_layers=option_value(args, "n_gpu_layers") or settings.n_gpu_layers,
                               log_dir=log_dir)
