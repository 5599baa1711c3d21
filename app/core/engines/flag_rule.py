"""The rule for each flag of the user's own llama-server command (and of an ``--axis``): kept only
when it is known to change the measurement and nothing else, by class (an allow-list); the
measurement's own and the speculative flags replaced while measuring; every other flag refused
with its reason: one that runs a program, opens a network connection, downloads, writes or
serves files, loads another model file, sets a preset, or that no class names.

``flag_class`` sorts one option by all its spellings (llama-server's ``--help`` lists them on one
line); app.core.engines.flag_table writes the rule over a whole ``--help`` into docs/limits.md."""

from __future__ import annotations

from typing import Iterable, NamedTuple

from app.core.engines.commands import FLAG_SPELLINGS


def _spellings(*options: str) -> tuple[str, ...]:
    return tuple(s for o in options for s in FLAG_SPELLINGS[o])


MODEL_FLAGS = frozenset(FLAG_SPELLINGS["model"])
SECRET_FLAGS = frozenset({"--api-key", "--api-key-file", "--hf-token", "-hft"})
RPC_FLAGS = frozenset(FLAG_SPELLINGS["rpc"])

# kept: the allow-list, by class (any spelling of an option names it)
KEPT: dict[str, frozenset[str]] = {name: frozenset(flags) for name, flags in {
    "threads": ("-t", "-tb", "--threads-batch", "-C", "--cpu-mask", "-Cr", "--cpu-range", "--cpu-strict", "--prio",
                "--poll", "-Cb", "--cpu-mask-batch", "-Crb", "--cpu-range-batch", "--cpu-strict-batch",
                "--prio-batch", "--poll-batch", "--numa", *FLAG_SPELLINGS["threads"]),
    "performance": ("-bs", "--backend-sampling", *FLAG_SPELLINGS["flash_attn"]),
    "memory": ("-lm", "--load-mode", "-lzm", "--lazy-mode", "--mlock", "--mmap", "--no-mmap", "-dio", "--direct-io",
               "--no-direct-io", "--repack", "--no-repack", "--no-host", "-fit", "--fit", "-fitt", "--fit-target",
               "-fitc", "--fit-ctx", "--check-tensors"),
    "context": ("--keep", "--swa-full", "--context-shift", "--no-context-shift", "-ctxcp", "--ctx-checkpoints",
                "--swa-checkpoints", "-cms", "--checkpoint-min-step", "-kvu", "--kv-unified", "-no-kvu",
                "--no-kv-unified", "--kv-unified-per-slot", "--rope-scaling", "--rope-scale", "--rope-freq-base",
                "--rope-freq-scale", "--yarn-orig-ctx", "--yarn-ext-factor", "--yarn-attn-factor",
                "--yarn-beta-slow", "--yarn-beta-fast", *FLAG_SPELLINGS["ctx_size"]),
    "KV cache": ("-kvo", "--kv-offload", "-nkvo", "--no-kv-offload", "-dt", "--defrag-thold", "-cram", "--cache-ram",
                 "--cache-idle-slots", "--no-cache-idle-slots", "--cache-prompt", "--no-cache-prompt",
                 "--cache-reuse", "-sps", "--slot-prompt-similarity",
                 *_spellings("cache_type_k", "cache_type_v")),
    "offload": ("-ot", "--override-tensor", "-cmoe", "--cpu-moe", "-ncmoe", "--n-cpu-moe", "-ncffn", "--n-cpu-ffn",
                "-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu", "--op-offload",
                "--no-op-offload", *FLAG_SPELLINGS["n_gpu_layers"]),
    "batching": ("-b", "--batch-size", "-ub", "--ubatch-size", "-cb", "--cont-batching", "-nocb",
                 "--no-cont-batching"),
    "devices": ("-dev", "--device"),
    "sampling defaults": ("--samplers", "--sampler-seq", "--sampling-seq", "--ignore-eos", "--top-nsigma",
                          "--top-n-sigma", "--xtc-probability", "--xtc-threshold", "--typical", "--typical-p",
                          "--repeat-last-n", "--presence-penalty", "--frequency-penalty", "--dry-multiplier",
                          "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n", "--dry-sequence-breaker",
                          "--adaptive-target", "--adaptive-decay", "--dynatemp-range", "--dynatemp-exp",
                          "--mirostat", "--mirostat-lr", "--mirostat-ent", "-l", "--logit-bias", "--grammar", "-j",
                          "--json-schema", "-n", "--predict", "--n-predict",
                          *_spellings("temp", "top_k", "top_p", "min_p", "repeat_penalty", "seed")),
    "chat template": ("--chat-template", "--chat-template-file", "--skip-chat-parsing", "--prefill-assistant",
                      "--no-prefill-assistant", "--reasoning-format", "--reasoning-effort", "--reasoning-budget-message",
                      "--reasoning-preserve", "--no-reasoning-preserve",
                      *_spellings("jinja", "reasoning", "chat_template_kwargs", "reasoning_budget")),
}.items()}

# owned: the measurement's own server (where it listens, how it is asked and answers, its logs):
# replaced while measuring, said once, and kept in the command the answer gives
OWNED: dict[str, frozenset[str]] = {why: frozenset(flags) for why, flags in {
    "the measuring server's own: where it listens, how it answers, its one slot": (
        "--reuse-port", "--api-prefix", "--ssl-key-file", "--ssl-cert-file", "--slots", "--no-slots", "--props",
        "--no-props", "-to", "--timeout", "--sse-ping-interval", "--threads-http", "--sleep-idle-seconds",
        "--path", "--cors-origins", "--cors-methods", "--cors-headers", "--cors-credentials", "--ui", "--webui",
        "--no-ui", "--no-webui", "--ui-config", "--webui-config", "--ui-config-file", "--webui-config-file",
        "-a", "--alias", "--tags", "--warmup", "--no-warmup", "--offline",
        *_spellings("host", "port", "parallel", "metrics")),
    "the measurement reads its own server log and timings": (
        "--perf", "--no-perf", "--log-disable", "--log-jsonl", "--no-log-jsonl", "--log-colors", "-v", "--verbose", "--log-verbose",
        "--log-prefix", "--no-log-prefix", "--log-timestamps", "--no-log-timestamps", *FLAG_SPELLINGS["verbosity"]),
}.items()}

_SPEC_OPTIONS = ("spec_type", "draft_model", "draft_n_gpu_layers", "draft_cache_type_k", "draft_cache_type_v",
                 "draft_n_max", "draft_p_min", "draft_sampling")
SPEC_FLAGS = frozenset(_spellings(*_SPEC_OPTIONS))

RUNS = "runs programs or opens network connections (MCP servers, tools, the agent)"
DOWNLOADS = ("downloads its model or a file (from the Hub or a URL) at every server start: give the downloaded "
             "file with -m FILE.gguf; the sweep measures a file")
WRITES = "writes files while measuring (the sweep's prompts, its slots or logs) to a folder of its own"
MULTIMODAL = ("multimodal (a second model file, the projector, and its inputs): the sweep measures text "
              "generation with -m alone")
PRESET = "a preset: sets -hf (a download from the Hub), the port and other flags behind the command's back"
# refused by name, each with its reason
REFUSED: dict[str, frozenset[str]] = {why: frozenset(flags) for why, flags in {
    RUNS: ("--mcp-servers-json", "--mcp-servers-config", "--tools", "--tools-runtime", "-ag", "--agent",
           "--ui-mcp-proxy", "--webui-mcp-proxy", "--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
    "runs a program (ffmpeg, from this folder)": ("--video-ffmpeg-dir",),
    "the router mode: starts other llama-servers": ("--models-dir", "--models-preset", "--models-max",
                                                     "--models-autoload", "--no-models-autoload"),
    DOWNLOADS: ("-mu", "--model-url", "-dr", "--docker-repo", "-mmu", "--mmproj-url"),
    WRITES: ("--log-file", "--log-prompts-dir", "--slot-save-path", "-lcd", "--lookup-cache-dynamic",
             "--logits-output-dir", "-o", "--output", "--output-file"),
    "lets requests read this machine's files": ("--media-path",),
    "loads a file the sweep does not check (a lookup cache, a grammar or schema file): give it inline":
        ("-lcs", "--lookup-cache-static", "--grammar-file", "-jf", "--json-schema-file"),
    MULTIMODAL: ("-mm", "--mmproj", "--mmproj-auto", "--no-mmproj", "--no-mmproj-auto", "-mmdev", "--mmproj-device",
                 "--mmproj-offload", "--no-mmproj-offload", "--image-min-tokens", "--image-max-tokens",
                 "--mtmd-batch-max-tokens", "--video-fps", "--video-timestamp-interval"),
    "loads an adapter (LoRA or control vector): the sweep measures the -m model as it is":
        ("--lora", "--lora-scaled", "--lora-init-without-apply", "--control-vector", "--control-vector-scaled",
         "--control-vector-layer-range"),
    "changes the model's own metadata (its template, its layers): the sweep measures the model as its file says":
        ("--override-kv",),
    "makes an embedding or reranking server, which generates no text":
        ("--embedding", "--embeddings", "--rerank", "--reranking", "--pooling", "--embd-normalize"),
    "prints something and exits: the server would not start": (
        "-h", "--help", "--usage", "--version", "--list-devices", "-cl", "--cache-list", "--completion-bash",
        "-fitp", "--fit-print"),
}.items()}
UNCLASSED = "not in a class known to change the measurement and nothing else"


class FlagClass(NamedTuple):
    """``kind``: model, secret, rpc, owned, speculative, kept or refused; ``why``: the class of a
    kept flag, else what the measurement does with the flag, or why it is refused (one line)."""

    kind: str
    why: str


def is_speculative(name: str) -> bool:
    """A speculative decoding flag: named so, or an alias of one (``-md`` of --spec-draft-model)."""
    return (name in SPEC_FLAGS or name.startswith(("--spec-", "--draft", "--no-spec-"))
            or name.endswith("-draft") or "-draft-" in name)


def _refusal(names: frozenset[str]) -> str | None:
    for why, flags in REFUSED.items():
        if names & flags:
            return why
    if any(n.startswith(("-hf", "--hf-")) or n.endswith(("-hf", "-url")) for n in names):
        return DOWNLOADS
    if any(n.endswith(("-default", "-spec")) for n in names):
        return PRESET
    if any(n.startswith("--log-") and n.endswith(("-dir", "-file", "-path")) for n in names):
        return WRITES
    return None


def flag_class(names: Iterable[str]) -> FlagClass:
    """The rule for one option, by all its spellings (``--help``'s line, or the flag as written)."""
    names = frozenset(names)
    if names & SECRET_FLAGS:
        return FlagClass("secret", "a secret: never passed to a measuring server, recorded or shown")
    if names & MODEL_FLAGS:
        return FlagClass("model", "the sweep's model")
    refused = _refusal(names)
    if refused:
        return FlagClass("refused", refused)
    if names & RPC_FLAGS:
        return FlagClass("rpc", "the sweep's RPC workers")
    for why, flags in OWNED.items():
        if names & flags:
            return FlagClass("owned", why)
    if any(is_speculative(n) for n in names):
        return FlagClass("speculative", "speculative: each arm brings its own")
    for cls, flags in KEPT.items():
        if names & flags:
            return FlagClass("kept", cls)
    return FlagClass("refused", UNCLASSED)
