"""One argv builder for llama-server: the engine launches with it and the export renders it.

Pure functions: (binary, configuration, capabilities) -> list of arguments. Flags are spelled the
way the user's binary spells them (current ``--spec-*`` names, or the old ``--draft-*`` names of
older builds), and a flag the binary lacks is never emitted.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from .errors import EngineError

# canonical option -> spellings, newest first
FLAG_SPELLINGS: dict[str, tuple[str, ...]] = {
    "model": ("--model", "-m"),
    "host": ("--host",),
    "port": ("--port",),
    "parallel": ("--parallel", "-np"),
    "ctx_size": ("--ctx-size", "-c"),
    "threads": ("--threads", "-t"),
    "n_gpu_layers": ("--n-gpu-layers", "--gpu-layers", "-ngl"),
    "flash_attn": ("--flash-attn", "-fa"),
    "cache_type_k": ("--cache-type-k", "-ctk"),
    "cache_type_v": ("--cache-type-v", "-ctv"),
    "metrics": ("--metrics",),
    "spec_type": ("--spec-type",),
    "draft_n_max": ("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft"),
    "draft_p_min": ("--spec-draft-p-min", "--draft-p-min"),
    "no_webui": ("--no-webui",),
}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What one llama-server binary accepts, learnt from its --help and --version."""

    flags: frozenset[str]
    version: str = "unknown"
    build_number: int | None = None
    commit: str | None = None
    spec_types: frozenset[str] = frozenset()
    help_text: str = ""

    def spelling(self, option: str) -> str | None:
        for s in FLAG_SPELLINGS.get(option, (option,)):
            if s in self.flags:
                return s
        return None

    def has(self, option: str) -> bool:
        return self.spelling(option) is not None

    @property
    def supports_mtp(self) -> bool:
        return "draft-mtp" in self.spec_types and self.has("spec_type") and self.has("draft_n_max")

    def mtp_problem(self) -> str | None:
        if not self.has("spec_type"):
            return "this llama-server has no --spec-type option (too old for MTP; update llama.cpp)"
        if "draft-mtp" not in self.spec_types:
            return "this llama-server's --spec-type does not accept draft-mtp (update llama.cpp)"
        if not self.has("draft_n_max"):
            return "this llama-server has no draft width option (--spec-draft-n-max)"
        return None


def parse_help(text: str) -> frozenset[str]:
    """The option names listed in llama-server --help (only from lines that start an option).

    A line reads ``-t,    --threads N    description``: options (with commas), metavars (no
    lowercase, or in <>, [], {}), then the description, which may mention other flags and is
    ignored."""
    flags: set[str] = set()
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("-"):
            continue
        for tok in stripped.split():
            tok = tok.rstrip(",")
            m = re.match(r"^(--?[A-Za-z][A-Za-z0-9-]*)$", tok)
            if m:
                flags.add(m.group(1))
                continue
            if tok[:1] in "<[{" or not any(c.islower() for c in tok):
                continue
            break
    return frozenset(flags)


def parse_version(text: str) -> tuple[str, int | None, str | None]:
    """(version text, build number, commit) from ``llama-server --version``.

    Builds print ``version: 11434 (515e855)`` or ``version: 0.6.0-dev (build 0, commit unknown)``."""
    m = re.search(r"version:\s*(\d+)\s*\(([0-9a-fA-F]+|unknown)\)", text)
    if m:
        return f"b{m.group(1)} ({m.group(2)})", int(m.group(1)), m.group(2)
    m = re.search(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*([0-9a-zA-Z]+)\)", text)
    if m:
        number = int(m.group(2)) or None
        commit = None if m.group(3) == "unknown" else m.group(3)
        return f"{m.group(1)} (build {m.group(2)}, commit {m.group(3)})", number, commit
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "unknown")
    return first[:200], None, None


def parse_spec_types(help_text: str) -> frozenset[str]:
    """The --spec-type names listed in --help (``--spec-type none,draft-simple,...``), if any."""
    for line in help_text.splitlines():
        parts = line.strip().split()
        if len(parts) >= 2 and parts[0].rstrip(",") == "--spec-type" and "," in parts[1]:
            return frozenset(x for x in parts[1].split(",") if x)
    return frozenset()


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """One llama-server configuration. ``spec_k`` None means baseline (no speculation)."""

    model: str
    spec_k: int | None = None
    p_min: float | None = None
    ctx_size: int = 4096
    threads: int | None = None
    n_gpu_layers: str | None = None
    flash_attn: str | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    extra: tuple[str, ...] = ()


def _fmt_float(x: float) -> str:
    return f"{x:g}"


def build_server_argv(binary: str, cfg: ServerConfig, caps: Capabilities, *, host: str | None = None,
                      port: int | None = None, metrics: bool = False, no_webui: bool = False,
                      skipped: list[str] | None = None) -> list[str]:
    """The argv for ``cfg``; raises EngineError when the binary lacks a flag the config needs.

    With a ``skipped`` list (export), tuning flags the binary lacks (-fa, cache types, threads,
    -ngl) are left out and named there instead of raising; the model, -np 1 and the MTP flags are
    always required."""
    argv = [binary]
    tuning = {"threads", "n_gpu_layers", "flash_attn", "cache_type_k", "cache_type_v", "ctx_size"}

    def add(option: str, *values: str, required: bool = True) -> None:
        s = caps.spelling(option)
        if s is None:
            if skipped is not None and option in tuning:
                skipped.append(FLAG_SPELLINGS.get(option, (option,))[0])
                return
            if required:
                raise EngineError(f"{binary}: this llama-server does not accept "
                                  f"{FLAG_SPELLINGS.get(option, (option,))[0]}")
            return
        argv.append(s)
        argv.extend(values)

    add("model", cfg.model)
    if host is not None:
        add("host", host)
    if port is not None:
        add("port", str(port))
    add("parallel", "1")
    add("ctx_size", str(cfg.ctx_size))
    if cfg.threads is not None:
        add("threads", str(cfg.threads))
    if cfg.n_gpu_layers is not None:
        add("n_gpu_layers", str(cfg.n_gpu_layers))
    if cfg.flash_attn is not None:
        add("flash_attn", cfg.flash_attn)
    if cfg.cache_type_k is not None:
        add("cache_type_k", cfg.cache_type_k)
    if cfg.cache_type_v is not None:
        add("cache_type_v", cfg.cache_type_v)
    if cfg.spec_k is not None:
        problem = caps.mtp_problem()
        if problem:
            raise EngineError(f"{binary}: {problem}")
        add("spec_type", "draft-mtp")
        add("draft_n_max", str(int(cfg.spec_k)))
        if cfg.p_min is not None and cfg.p_min > 0:
            add("draft_p_min", _fmt_float(cfg.p_min))
    if metrics:
        add("metrics", required=False)
    if no_webui:
        add("no_webui", required=False)
    argv.extend(cfg.extra)
    return argv


# ------------------------------------------------------------------------------------------
# rendering one argv for a shell

SHELLS = ("bash", "powershell", "cmd")
_PS_SAFE = re.compile(r"^[A-Za-z0-9_./:=+,-]+$")
_CMD_META = set('&|<>^()')


def render(argv: list[str], shell: str) -> str:
    """One command line for ``shell`` that runs exactly ``argv``.

    bash/zsh: POSIX quoting (shlex). PowerShell (7.3+, native argument passing "Standard"): the
    call operator ``&`` and single-quoted strings ('' inside). cmd: each argument quoted by the
    Microsoft C runtime rules (what llama-server's argv parser undoes), then cmd's own layer:
    ``^`` before & | < > ^ ( ) where cmd sees them unquoted, and ``%`` doubled, as a .cmd/.bat
    script needs."""
    if shell in ("bash", "zsh", "sh"):
        import shlex

        return shlex.join(argv)
    if shell == "powershell":
        parts = []
        for i, a in enumerate(argv):
            q = a if (_PS_SAFE.match(a) and not a.startswith(("-", "@")) or
                      (i > 0 and re.match(r"^--?[A-Za-z][A-Za-z0-9-]*$", a))) else "'" + a.replace("'", "''") + "'"
            if i == 0 and q == a:
                q = "'" + a.replace("'", "''") + "'"
            parts.append(q)
        return "& " + " ".join(parts)
    if shell == "cmd":
        return _cmd_escape(_msvcrt_join(argv))
    raise ValueError(f"unknown shell {shell!r}; use one of {', '.join(SHELLS)}")


def _msvcrt_quote(a: str) -> str:
    if a and not any(c in a for c in ' \t"&|<>^()%!'):
        return a
    out, bs = ['"'], 0
    for c in a:
        if c == "\\":
            bs += 1
            continue
        if c == '"':
            out.append("\\" * (2 * bs + 1) + '"')
        else:
            out.append("\\" * bs + c)
        bs = 0
    out.append("\\" * (2 * bs) + '"')
    return "".join(out)


def _msvcrt_join(argv: list[str]) -> str:
    return " ".join(_msvcrt_quote(a) for a in argv)


def _cmd_escape(line: str) -> str:
    out, quoted = [], False
    for c in line:
        if c == '"':
            quoted = not quoted
            out.append(c)
        elif c == "%":
            out.append("%%")
        elif c in _CMD_META and not quoted:
            out.append("^" + c)
        else:
            out.append(c)
    return "".join(out)


def render_preset(argv: list[str], name: str = "mtp-tuner") -> str:
    """A llama-server preset (INI) section with the same options (``--models-preset``)."""
    lines = [f"[{name}]"]
    i = 1
    while i < len(argv):
        a = argv[i]
        key = a.lstrip("-")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            lines.append(f"{key} = {argv[i + 1]}")
            i += 2
        else:
            lines.append(f"{key} = true")
            i += 1
    return "\n".join(lines) + "\n"
