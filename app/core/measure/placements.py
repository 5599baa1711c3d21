"""Where drafting runs when the model is split over llama.cpp RPC workers: each placement a setting
of the sweep (a named axis of measure.axes, its value a bundle of llama-server flags), measured
whole with its own baseline, since moving layers changes plain decoding too::

    axis, notes = placement_axis(("auto",), model="/m.gguf", server_bin=None, rpc=workers, drafter=False)
    axis.values    # ("default", "mtp-local"): each a setting, as an --axis value is (measure.axes)
    axis.bundles   # ((), ("-ot", "blk\\.4\\.=CPU"))

The session makes the axis once the sweep's workers are up (SweepRequest.placements; its own
workers, --rpc-local, start first).

The placements (each flag as the bundled llama.cpp's --help and common/arg.cpp give it):

- ``default``: llama.cpp's own split over this machine's devices and the workers (no flag);
- ``drafter-local``: a drafter model (-md) on this machine: ``--device-draft`` naming this
  machine's GPUs, or ``none`` (its CPU) without one; only for a sweep with a drafter;
- ``mtp-local``: the model's NextN (MTP) blocks, its last ``nextn_predict_layers`` blocks, on this
  machine: ``-ot "blk\\.N\\.=CPU"`` (the first local CUDA GPU's buffer instead, when there is one);
- ``workers``: every other layer on the workers: ``--device RPC0,RPC1`` (llama.cpp names a
  worker's devices RPC0, RPC1 ... in the order of ``--rpc``; asked of ``llama-server --rpc ...
  --list-devices``) and the NextN blocks on this machine's CPU, as ``mtp-local``.

``--device`` names RPC devices only once ``--rpc`` has registered them: llama.cpp reads its
arguments in order, so a command must give ``--rpc`` first (llama-server's argv does:
commands.build_server_argv writes ``--rpc`` before the user's flags; so does the exported command,
verdict.export). Without a GPU here, ``workers`` is ``mtp-local``: llama.cpp offloads to the
workers only.

The records carry a placement's flags in ``server_args``; ``placement_in`` names the placement
from them (the analysis' labels and the verdict's sentence), and the exported command is the
recorded flags, so it carries the placement that paid; ``placements_measured`` names a whole
sweep's from its records, to measure them again (``bench --again``)."""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from app.core.common.workers import Workers
from app.core.common.errors import EngineError, UserError
from app.core.common.redact import redact_args
from app.core.engines.commands import Capabilities
from app.core.engines.backend_truth import Device
from app.core.engines.recorded_flags import kept_flags
from app.core.engines.user_command import is_value
from app.core.measure.axes import Axis

AXIS = "placement"
DEFAULT, DRAFTER_LOCAL, MTP_LOCAL, WORKERS = "default", "drafter-local", "mtp-local", "workers"
NAMES = (DEFAULT, DRAFTER_LOCAL, MTP_LOCAL, WORKERS)
AUTO = "auto"
# what each placement is, in a setting's label, and what to do, in the verdict's sentence
LABELS = {DEFAULT: "llama.cpp's own split", DRAFTER_LOCAL: "drafter on this machine",
          MTP_LOCAL: "MTP block on this machine", WORKERS: "all but the MTP block on the workers"}
ADVICE = {DEFAULT: "keep llama.cpp's own split", DRAFTER_LOCAL: "run the drafter on this machine",
          MTP_LOCAL: "keep the MTP block on this machine",
          WORKERS: "put every layer but the MTP block on the workers"}
# the placements that move the model's trunk (what plain decoding runs), not only what drafting uses
MOVES_TRUNK = frozenset({WORKERS})
DEVICE, DEVICE_DRAFT, OVERRIDE = "--device", "--device-draft", "-ot"
_NEXTN_OT = re.compile(r"blk\\\.\d+\\\.=[^,=]+(,blk\\\.\d+\\\.=[^,=]+)*")
_RPC_DEVICE = re.compile(r"RPC\d+")
PLACEMENTS_NEED_WORKERS = ("--placements: where drafting runs is measured over RPC workers; name them with --rpc "
                           "(or start some with --rpc-local N)")


def parse_placements(text: str) -> tuple[str, ...]:
    """``--placements``: ``auto`` or names from NAMES, comma-separated; ``default`` first (the
    reference: llama.cpp's own split), added when missing. UserError naming the problem."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        raise UserError(f"--placements: name {AUTO} or some of {', '.join(NAMES)}")
    if names == [AUTO]:
        return (AUTO,)
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise UserError(f"--placements: {bad[0]!r} is not a placement; {AUTO} or some of {', '.join(NAMES)}")
    if len(set(names)) < len(names):
        raise UserError("--placements: a placement is named twice")
    return (DEFAULT, *(n for n in names if n != DEFAULT))


def nextn_blocks(block_count: int, nextn_layers: int) -> tuple[int, ...]:
    """The NextN (MTP) blocks: the model's last ``nextn_layers`` of ``block_count``."""
    return tuple(range(max(block_count - nextn_layers, 0), block_count)) if nextn_layers > 0 else ()


def nextn_override(blocks: Iterable[int], buffer: str) -> str:
    """``-ot``'s value that puts the ``blocks`` in ``buffer`` ("CPU", "CUDA0")."""
    return ",".join(rf"blk\.{b}\.={buffer}" for b in blocks)


def local_buffer(local: Sequence[Device]) -> str:
    """Where this machine keeps the MTP block: its first CUDA GPU (whose buffer type llama.cpp
    names as the device), else its CPU (the one buffer every build has)."""
    return next((d.name for d in local if re.fullmatch(r"CUDA\d+", d.name)), "CPU")


def placement_flags(name: str, *, nextn: Sequence[int], rpc_devices: Sequence[str],
                    local: Sequence[Device]) -> tuple[str, ...]:
    """The llama-server flags of placement ``name`` (() for the default)."""
    if name == DEFAULT:
        return ()
    if name == DRAFTER_LOCAL:
        return (DEVICE_DRAFT, ",".join(d.name for d in local) or "none")
    if name == MTP_LOCAL:
        return (OVERRIDE, nextn_override(nextn, local_buffer(local)))
    if name == WORKERS:
        return (DEVICE, ",".join(rpc_devices), OVERRIDE, nextn_override(nextn, "CPU"))
    raise ValueError(name)


def placements_for(asked: Sequence[str], *, nextn: Sequence[int], drafter: bool, rpc_devices: Sequence[str],
                   local: Sequence[Device]) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], list[str]]:
    """The placements to measure, each (name, flags), default first, and why any asked is not:
    ``auto`` is each that applies and differs from the others (``workers`` is ``mtp-local`` on a
    machine without a GPU: llama.cpp offloads to the workers only); a named one that cannot apply
    (no drafter, no NextN block, no worker device) is a UserError."""
    auto = tuple(asked) == (AUTO,)
    names = NAMES if auto else tuple(asked)
    why = {DRAFTER_LOCAL: None if drafter else "the sweep has no drafter model (--drafter)",
           MTP_LOCAL: None if nextn else "the model has no MTP (NextN) block",
           WORKERS: (None if nextn and rpc_devices else "the model has no MTP (NextN) block" if not nextn
                     else "the workers have no device")}
    out: list[tuple[str, tuple[str, ...]]] = []
    notes: list[str] = []
    for name in names:
        problem = why.get(name)
        if problem:
            if not auto:
                raise UserError(f"--placements {name}: {problem}")
            notes.append(f"placement {name} left out: {problem}")
            continue
        if auto and name == WORKERS and not local:
            notes.append(f"placement {name} left out: without a GPU here every layer llama.cpp offloads goes to "
                         f"the workers already (the same as {MTP_LOCAL})")
            continue
        flags = placement_flags(name, nextn=nextn, rpc_devices=rpc_devices, local=local)
        out.append((name, flags))
    return tuple(out), notes


def placement_axis(asked: Sequence[str], *, model: str, server_bin: str | None, rpc: Workers | None,
                   drafter: bool) -> tuple[Axis, list[str]]:
    """The placement axis of a sweep over the workers ``rpc`` (asked of the model's GGUF and of
    the llama-server that will run it: this machine's devices, and the workers' as it names them),
    and what was left out. UserError without workers."""
    from app.core.engines.server.binary import find_server_binary
    from app.core.engines.server.devices import list_devices, read_devices
    from app.core.machine.gguf_info import read_header

    if not rpc:
        raise UserError(PLACEMENTS_NEED_WORKERS)
    hdr = read_header(model, keep_arrays=False)
    binary = find_server_binary(server_bin)
    local = list_devices(binary)
    try:
        with_workers = read_devices(binary, rpc=rpc.arg)
    except EngineError as e:
        raise UserError(f"--placements: the workers' devices could not be listed: {e}") from None
    rpc_devices = [d.name for d in with_workers if _RPC_DEVICE.fullmatch(d.name)]
    chosen, notes = placements_for(asked, nextn=nextn_blocks(hdr.block_count, hdr.nextn_layers), drafter=drafter,
                                   rpc_devices=rpc_devices, local=local)
    return Axis(AXIS, tuple(n for n, _ in chosen), frozenset(), tuple(f for _, f in chosen)), notes


def placement_in(groups: Sequence[tuple[str, ...]]) -> tuple[str | None, list[tuple[str, ...]]]:
    """The placement that server flags (as groups, each a flag and its values) hold and the
    groups left: (WORKERS, [...]) for ``--device RPC0,RPC1 -ot blk\\.4\\.=CPU``, (None, groups)
    when they hold none (the default placement, or a sweep without placements)."""
    rest = list(groups)
    found = None
    ot = next((g for g in rest if len(g) == 2 and g[0] == OVERRIDE and _NEXTN_OT.fullmatch(g[1])), None)
    dev = next((g for g in rest if len(g) == 2 and g[0] == DEVICE
                and all(_RPC_DEVICE.fullmatch(n) for n in g[1].split(","))), None)
    if ot is not None and dev is not None:
        found, taken = WORKERS, [ot, dev]
    elif ot is not None:
        found, taken = MTP_LOCAL, [ot]
    else:
        draft = next((g for g in rest if len(g) == 2 and g[0] == DEVICE_DRAFT), None)
        found, taken = (DRAFTER_LOCAL, [draft]) if draft is not None else (None, [])
    return found, [g for g in rest if g not in taken]


def placements_measured(server_args: Iterable[Sequence[str] | None]) -> tuple[str, ...]:
    """The placements a sweep measured, from its records' server flags (``server_args``), as
    parse_placements gives them (default first, then in NAMES' order), to measure them again
    (``bench --again``); () when it measured none. Flags every setting shares (the user's own
    ``-ot`` of their command) are no placement: only what sets a setting apart is."""
    settings = [flag_groups(a or ()) for a in dict.fromkeys(tuple(a or ()) for a in server_args)]
    if len(settings) < 2:
        return ()
    common = set.intersection(*(set(s) for s in settings))
    found = {placement_in([g for g in s if g not in common])[0] for s in settings}
    return (DEFAULT, *(n for n in NAMES if n in found and n != DEFAULT)) if found - {None} else ()


def flag_groups(args: Sequence[str]) -> list[tuple[str, ...]]:
    """Server flags as groups, each a flag and the values after it (``-ub 64``, ``-fa on``), as
    placement_in reads them."""
    out: list[tuple[str, ...]] = []
    for a in args:
        if out and is_value(a):
            out[-1] += (a,)
        else:
            out.append((a,))
    return out


def recorded_flags(args: Sequence[str] | None, caps: Capabilities | None = None) -> tuple[str, ...]:
    """A results file's recorded server flags (outside text) as a command, a report or a card
    may show them: a placement's flags (the tuner's own: placement_in) as recorded, after the
    others that the rule for the user's command keeps (engines.recorded_flags.kept_flags: never
    an owned, secret or refused flag); every value redacted."""
    groups = flag_groups(args or ())
    _, rest = placement_in(groups)
    return (*kept_flags([a for g in rest for a in g], caps),
            *redact_args([a for g in groups if g not in rest for a in g]))
