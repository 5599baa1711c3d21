"""The user's own llama-server command: read as argv (app.core.engines.shell_split, never through
a shell), its program checked to be llama-server before anything is run, every flag checked
against the binary's own ``--help`` and sorted by the rule (app.core.engines.flag_rule):

- the model (``-m``): the sweep's model;
- the measurement's own flags (host, port, ``-np``, ``--metrics``, logging, the API's prefix and
  TLS, ``/slots``, the web UI) and every speculative flag (``--spec-*``, ``--draft-*``, ``-md``
  ...): replaced while measuring (each arm brings its own speculative flags), said once;
- secrets (``--api-key``, ``--api-key-file``, ``--hf-token``): never passed to a measuring
  server, never in a record, a log or on the screen (the exported command has a placeholder);
- the RPC workers (``--rpc host:port,...``): the sweep's workers (EngineSettings.rpc), given to
  every measuring server by the engine and written once into the exported command;
- the flags known to change the measurement and nothing else (``-fa on -ctk q8_0 --n-cpu-moe 24
  -c 131072`` ...: flag_rule.KEPT's classes): every measuring server starts with them, every run
  record carries them (``server_args``), and the exported command is the user's own with the
  picked speculative flags added;
- every other flag (MCP, tools, downloads, presets, ``--log-file`` ...): refused, one line naming
  it and why. A ``--flag=value`` is read as two words (llama-server takes no ``=``); a problem is
  named by the word's place, never by the word, which may be a secret."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
from pathlib import Path
from typing import Iterable

from app.core.common.workers import Workers
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.commands import FLAG_SPELLINGS, Capabilities, option_lines
from app.core.engines.flag_rule import SECRET_FLAGS, flag_class
from app.core.engines.shell_split import CommandError, split_command

MAX_FILE_BYTES = 64 * 1024  # --server-command-file: read no more than this

# the settings an engine takes as its own fields (EngineSettings: ctx_size, threads, n_gpu_layers)
ENGINE_OPTIONS = ("ctx_size", "threads", "n_gpu_layers")


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """One option of ``--help``: its spellings and how many values follow it (``optional``: a
    bracketed value, ``-fa [on|off|auto]``, taken when the next word is not a flag)."""

    aliases: frozenset[str]
    arity: int
    optional: bool = False


_NAME = re.compile(r"--?[A-Za-z][A-Za-z0-9.-]*,?")  # a dot too: --fim-qwen-1.5b-default


@functools.lru_cache(maxsize=8)
def help_flags(help_text: str) -> dict[str, FlagSpec]:
    """Every option ``--help`` lists, by each spelling. A line reads ``-c,    --ctx-size N    size
    ...``: spellings joined by commas, then the value's name one space after the last, then two
    or more spaces and the description (a line with no room for one ends after the value)."""
    out: dict[str, FlagSpec] = {}
    for stripped in option_lines(help_text):
        names: list[str] = []
        pos = 0
        while True:
            m = _NAME.match(stripped, pos)
            if not m or (m.end() < len(stripped) and not stripped[m.end()].isspace()):
                break
            names.append(m.group(0).rstrip(","))
            pos = m.end()
            if not m.group(0).endswith(","):
                break
            pos = len(stripped) - len(stripped[pos:].lstrip())
        if not names:
            continue
        rest = stripped[pos:]
        value = "" if rest.startswith("  ") or not rest.strip() else re.split(r"\s{2,}", rest[1:])[0].strip()
        words = len(re.sub(r"<[^>]*>|\[[^]]*]|\{[^}]*}", "x", value).split())
        spec = FlagSpec(frozenset(names), min(words, 2) if words else 0,
                        optional=value.startswith("[") and value.endswith("]"))
        for n in names:
            out.setdefault(n, spec)
    return out


@dataclasses.dataclass(frozen=True)
class UserCommand:
    """A checked llama-server command: its program, and each flag with its values in the user's
    order, each sorted (``kinds``: model, owned, speculative, secret, rpc, kept)."""

    program: str
    groups: tuple[tuple[str, ...], ...]
    kinds: tuple[str, ...]
    shell: str
    checked_against: str | None  # the llama-server build whose --help checked the flags

    def _of(self, kind: str) -> list[tuple[str, ...]]:
        return [g for g, k in zip(self.groups, self.kinds) if k == kind]

    @property
    def model(self) -> str:
        return self._of("model")[-1][-1]

    @property
    def kept(self) -> tuple[str, ...]:
        """The flags every measuring server starts with and every record carries, in order."""
        return tuple(a for g in self._of("kept") for a in g)

    @property
    def replaced(self) -> tuple[str, ...]:
        """The flags replaced while measuring, as written (``--port 8080``, ``--spec-type draft-mtp``)."""
        return tuple(" ".join(g) for g, k in zip(self.groups, self.kinds) if k in ("owned", "speculative"))

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret flags' names (their values are never shown)."""
        return tuple(flag_name(g[0]) for g in self._of("secret"))

    @property
    def rpc(self) -> Workers | None:
        """The RPC workers of the command's --rpc (the last one given), each checked; None: none."""
        groups = self._of("rpc")
        return Workers.parse(groups[-1][-1]) if groups else None

    def value(self, option: str) -> str | None:
        """The value of a kept ``option`` (commands.FLAG_SPELLINGS' name), the last one given."""
        return option_value(self.kept, option)

    def settings(self, base: EngineSettings, binary: str) -> EngineSettings:
        """``base`` made to measure with this command: llama-server (``binary``), its context
        (none given: the model's own, as llama-server's default), threads and GPU layers as the
        engine's own settings, the kept flags as the user's, and the command's RPC workers as the
        sweep's unless ``base`` names workers (--rpc, the Machine tab's: those are the ones asked for)."""
        numbers: dict[str, int | None] = {}
        for option, name in (("ctx_size", "context size"), ("threads", "threads")):
            text = self.value(option)
            try:
                numbers[option] = int(text) if text is not None else None
            except ValueError:  # the value not shown: a word that failed is never echoed
                raise CommandError(f"the command's {name} ({FLAG_SPELLINGS[option][-1]}) is not a whole "
                                   "number") from None
        return dataclasses.replace(base, kind=EngineKind.SERVER, server_bin=binary, ctx_size=numbers["ctx_size"] or 0,
                                   rpc=base.rpc or self.rpc,
                                   threads=numbers["threads"] or base.threads,
                                   n_gpu_layers=self.value("n_gpu_layers") or base.n_gpu_layers, user_args=self.kept)

    def base_argv(self) -> tuple[str, ...]:
        """The command to export, before the picked speculative flags: the user's own in their
        order, without speculative flags and --rpc (the export writes the workers measured), each
        secret value a placeholder."""
        out = [self.program]
        for g, kind in zip(self.groups, self.kinds):
            if kind in ("speculative", "rpc"):
                continue
            if kind == "secret":
                name = flag_name(g[0])
                out += [name, placeholder(name)]
            else:
                out += g
        return tuple(out)

    def note(self) -> str:
        """What the measurement does with the command, in one line (no secret in it)."""
        parts = [f"your llama-server command: measuring with {' '.join(self.kept) or 'no flags of its own'}"]
        if self.replaced:
            parts.append(f"replaced while measuring: {', '.join(self.replaced)}")
        if self.rpc:
            parts.append(f"split over {len(self.rpc)} RPC worker{'s' if len(self.rpc) != 1 else ''} (your --rpc)")
        if self.secrets:
            parts.append(f"left out, never recorded or shown: {', '.join(self.secrets)}")  # a word after one is masked
        return "; ".join(parts)


def flag_name(arg: str) -> str:
    """``--ctx-size`` of ``--ctx-size=4096``."""
    return arg.split("=", 1)[0] if arg.startswith("--") else arg


def placeholder(name: str) -> str:
    return f"<your {name.lstrip('-')}>"


def option_value(args: Iterable[str], option: str) -> str | None:
    """The last value ``args`` give ``option`` (a commands.FLAG_SPELLINGS name), or None."""
    spellings = FLAG_SPELLINGS.get(option, (option,))
    args = list(args)
    found = None
    for i, a in enumerate(args):
        if flag_name(a) in spellings:
            found = a.split("=", 1)[1] if "=" in a and a.startswith("--") else (
                args[i + 1] if i + 1 < len(args) else None)
    return found


def without_options(args: Iterable[str], options: Iterable[str]) -> tuple[str, ...]:
    """``args`` less the flags of ``options`` with their one value each (an engine's own
    settings: the engine writes them itself)."""
    names = {s for o in options for s in FLAG_SPELLINGS.get(o, (o,))}
    out: list[str] = []
    it = iter(args)
    for a in it:
        if flag_name(a) in names:
            if not ("=" in a and a.startswith("--")):
                next(it, None)
            continue
        out.append(a)
    return tuple(out)


def is_value(word: str) -> bool:
    return not word.startswith("-") or bool(re.fullmatch(r"-\d+(\.\d+)?", word))


def check_program(argv0: str) -> None:
    """The command's program must be llama-server (by name, a path's last part, ``.exe`` or a
    suffix such as ``llama-server-cuda`` allowed): checked before anything is run, since the
    binary's ``--version`` and ``--help`` are run to check the flags."""
    name = Path(argv0.replace("\\", "/")).name.lower()
    if argv0.startswith("-") or not re.fullmatch(r"llama-server([-_.][\w.-]*)?", name):
        raise CommandError("the command must start with llama-server (or its path); its first word is another "
                           "program, which is never run")


def _ordinal(i: int) -> str:
    return f"word {i + 1} of the command"


def _secret_words(argv: list[str]) -> set[int]:
    """The words that are a secret however the words around them are read: each one following a
    secret flag's spelling (``-a --api-key KEY``: KEY), and a secret flag with its value joined."""
    out: set[int] = set()
    for i, word in enumerate(argv):
        name, joined, _ = word.partition("=")
        if _normal(name) in SECRET_FLAGS:
            out.add(i if joined else i + 1)
    return out


def _normal(name: str) -> str:
    """A flag as llama-server reads it: ``_`` in a ``--`` flag is ``-`` (``--ctx_size``)."""
    return name.replace("_", "-") if name.startswith("--") else name


def parse_argv(argv: list[str], shell: str, caps: Capabilities | None) -> UserCommand:
    """The command of ``argv``; every flag checked against ``caps``' --help (None: not checked,
    values taken by their look) and sorted by the rule (flag_rule.flag_class). CommandError
    naming the first problem by the word's place, never by the word (it may be a secret)."""
    check_program(argv[0])
    specs = help_flags(caps.help_text) if caps is not None else None
    words, place = list(argv), list(range(len(argv)))  # place: each word's place in what was written
    secret = _secret_words(argv)
    groups: list[tuple[str, ...]] = []
    kinds: list[str] = []
    i = 1
    while i < len(words):
        word, at = words[i], _ordinal(place[i])
        if not word.startswith("-") or is_value(word):
            raise CommandError(f"{at} is not a flag (llama-server takes no plain arguments; a value with spaces "
                               "needs quotes)")
        raw, joined, rest = word.partition("=")
        name = _normal(raw)
        spec = specs.get(name) if specs is not None else None
        if specs is not None and spec is None:
            near = difflib.get_close_matches(name, list(specs), n=1, cutoff=0.8)
            raise CommandError(f"{at} is not a flag of this llama-server ({caps.version if caps else ''}): "
                               + (f"did you mean {near[0]}?" if near else "check its --help, or update llama.cpp"))
        names = spec.aliases if spec is not None else frozenset({name})
        shown = name if spec is not None else "that flag"  # a flag --help lists is no secret
        c = flag_class(names)
        if c.kind == "refused":
            raise CommandError(f"{shown} ({at}) is refused: {c.why}")
        if joined:  # llama-server takes no --flag=value: the flag and its value as two words
            words[i:i + 1], place[i:i + 1] = [name, rest], [place[i], place[i]]
        if spec is not None:
            arity = 0 if spec.optional and not (i + 1 < len(words) and is_value(words[i + 1])) else spec.arity
        else:
            arity = 1 if i + 1 < len(words) and is_value(words[i + 1]) else 0
        if joined and arity == 0:
            raise CommandError(f"{shown} ({at}) takes no value, and '=' gives it one")
        if i + arity >= len(words):
            raise CommandError(f"{shown} ({at}) needs a value")
        flag_like = next((j for j in range(i + 1, i + 1 + arity) if not is_value(words[j])), None)
        if flag_like is not None:  # llama-server would take that flag for a value: a command it reads otherwise
            raise CommandError(f"{shown} ({at}) needs a value, and {_ordinal(place[flag_like])} is a flag")
        if c.kind != "secret" and any(place[j] in secret for j in range(i, i + arity + 1)):
            raise CommandError(f"{shown} ({at}) would take a secret flag's value as its own: give it its value")
        groups.append((name, *words[i + 1:i + 1 + arity]))
        kinds.append(c.kind)
        i += 1 + arity
    if "model" not in kinds:
        raise CommandError("the command names no model: add -m FILE.gguf")
    return UserCommand(argv[0], tuple(groups), tuple(kinds), shell, caps.version if caps else None)


def flag_kind(names: Iterable[str]) -> str:
    """The rule's kind for one option by its spellings (flag_rule.flag_class: the kind with its
    reason): model, secret, rpc, owned, speculative, kept or refused."""
    return flag_class(names).kind


def program_path(argv0: str) -> str | None:
    """The binary the command names by a path (``./build/bin/llama-server``), else None (a bare
    ``llama-server``: found as the tuner finds one)."""
    return argv0 if ("/" in argv0 or "\\" in argv0) else None


def read_command_file(path: str | os.PathLike[str]) -> str:
    """A command from a file (a script's line or a note), read up to MAX_FILE_BYTES; only a regular
    file (a FIFO, a device or a folder is refused at once, read_capped)."""
    from app.core.common.reading import read_capped  # the module's one file read: its import here

    data = read_capped(path, "command file", MAX_FILE_BYTES)
    text = data.decode("utf-8", errors="replace").lstrip("\ufeff")
    lines = [ln for ln in text.splitlines() if not re.match(r"\s*(#!|#|REM\b|::)", ln, re.IGNORECASE)]
    return "\n".join(lines).strip()
