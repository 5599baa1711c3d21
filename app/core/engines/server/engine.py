"""The llama-server engine: a real llama-server process per configuration, reused across
prompts and repetitions, with completions streamed and every token timed as it arrives."""

from __future__ import annotations

import collections
import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any, Generator, Sequence

from app.core.common.cancel import CancelToken
from app.core.common.workers import Workers
from app.core.common.errors import EngineError, MtpUnavailable
from app.core.common.spec_modes import mode_or_guess
from app.core.engines.base import EngineKind, EngineSettings, Generation, Progress, TopTwo, confounder_flags, engine_threads
from app.core.engines.chat_template import ModelTemplate, check_template, server_render, user_template
from app.core.engines.template_bounds import TemplateTooCostly
from app.core.engines.commands import ServerConfig, jinja_off_by_default
from app.core.engines.backend_truth import Placement, layers_total, parse_load_log
from app.core.engines.server.binary import find_server_binary, probe_capabilities
from app.core.engines.server.process import ServerProcess, SpecCounters, token_clock
from app.core.engines.user_command import ENGINE_OPTIONS, without_options
from app.core.machine.gguf_info import read_header, split_parts
from app.core.records.arm import Arm
from app.core.records.sampler import Sampler, greedy
from app.core.records.shape import SweepShape


# a fresh n-gram server's warm requests: each a short prompt and WARM_TOKENS generated, fewer than
# ngram-mod's 24-token lookup in all (so none adds an n-gram), WARM_REQUESTS of them (the runner's own
# warmup would be lost: its server is replaced before the measured run)
WARM_TEXT, WARM_TOKENS, WARM_REQUESTS = "Hello", 16, 2
# how long llama-server may take to render a prompt through the chat template (/apply-template):
# a template checked here (check_template) takes milliseconds, but llama-server's own engine may differ
TEMPLATE_TIMEOUT_S = 60.0


class ServerEngine:
    """Runs arms through llama-server: one server per configuration, reused across prompts and
    repetitions; up to ``pool_size`` servers stay up so that interleaved arms need no restart."""

    kind = EngineKind.SERVER

    def __init__(self, binary: str | None = None, *, ctx_size: int = 4096, threads: int | None = None,
                 n_gpu_layers: str | None = None, flash_attn: str | None = None,
                 extra_args: tuple[str, ...] = (), user_args: tuple[str, ...] | None = None,
                 log_dir: str | os.PathLike[str] | None = None, pool_size: int | None = None,
                 start_timeout: float = 300.0, rpc: Workers | None = None):
        self.binary = find_server_binary(binary)
        self.caps = probe_capabilities(self.binary)
        self.ctx_size, self.threads, self.n_gpu_layers = ctx_size, engine_threads(threads), n_gpu_layers
        self.flash_attn = flash_attn
        # the user's flags (EngineSettings.user_args) as given, for the records; the servers get them
        # less -c, -t and -ngl, which are this engine's own settings (the caller took them from there)
        self.user_args = user_args
        self.extra_args = tuple(extra_args) + without_options(user_args or (), ENGINE_OPTIONS)
        self.log_dir = Path(log_dir) if log_dir else None
        self.rpc = rpc  # the workers the model is split over (llama-server's --rpc: Workers.arg)
        # a worker serves one client at a time: a second server up beside the first would wait for
        # the workers until its start timed out, so with workers one server is up at a time
        self.pool_size = 1 if rpc else pool_size
        self.start_timeout = start_timeout
        self._pool: "collections.OrderedDict[ServerConfig, ServerProcess]" = collections.OrderedDict()
        self._prompt_cache: dict[tuple[str, str, bool, bool | None], list[int]] = {}
        self._placements: dict[int, Placement] = {}  # per server process (pid)
        self._last_placement: Placement | None = None
        self._chats: dict[int, ModelTemplate] = {}  # per server process (pid): its template, rendered there
        self._templates_checked: set[str] = set()  # models whose template rendered within the bounds here
        self.starts = 0

    @property
    def name(self) -> str:
        return self.kind.value

    @property
    def settings(self) -> EngineSettings:
        return EngineSettings(kind=self.kind, ctx_size=self.ctx_size, threads=self.threads,
                              n_gpu_layers=self.n_gpu_layers, server_bin=self.binary,
                              log_dir=str(self.log_dir) if self.log_dir else None, user_args=self.user_args,
                              rpc=self.rpc)

    @property
    def build(self) -> str:
        return self.caps.version

    @property
    def placement(self) -> Placement | None:
        """Where the model of the server used last ran; None before a server is up."""
        return self._last_placement

    def config_for(self, model: str, arm: Arm) -> ServerConfig:
        return ServerConfig(model=model, spec_type=arm.mode if arm.is_spec else None,
                            spec_k=arm.k, p_min=arm.p_min if arm.is_spec else None,
                            drafter=arm.drafter, ctx_size=self.ctx_size, threads=self.threads,
                            n_gpu_layers=self.n_gpu_layers,
                            # the drafter where the target is (llama.cpp's -ngld default is its own)
                            draft_n_gpu_layers=self.n_gpu_layers if arm.drafter else None,
                            flash_attn=self.flash_attn, extra=self.extra_args,
                            draft_sampling=arm.draft_sampling if arm.probabilistic else None, rpc=self.rpc.arg if self.rpc else None)

    def check_mtp(self) -> None:
        problem = self.caps.mtp_problem()
        if problem:
            raise MtpUnavailable(f"{self.binary}: {problem}")

    def mode_problem(self, arm: Arm) -> str | None:
        """Why this llama-server cannot run ``arm`` (a mode its --help does not list), or None."""
        if not arm.is_spec:
            return None
        problem = self.caps.mode_problem(arm.mode, drafter=bool(arm.drafter),
                                         draft_sampling=arm.draft_sampling if arm.probabilistic else None)
        return f"{self.binary}: {problem}" if problem else None

    def server(self, cfg: ServerConfig, cancel: CancelToken) -> ServerProcess:
        srv = self._pool.get(cfg)
        if srv is not None and srv.alive():
            self._pool.move_to_end(cfg)
            return srv
        if srv is not None:
            srv.stop()
            del self._pool[cfg]
        while self.pool_size is not None and len(self._pool) >= max(1, self.pool_size):
            _, old = self._pool.popitem(last=False)
            old.stop()
        log_path = None
        if self.log_dir:
            tag = ("baseline" if cfg.mode is None else
                   f"{cfg.mode}" + (f"-k{cfg.spec_k}-p{cfg.p_min or 0:g}" if cfg.spec_k is not None else "")
                   + ("-" + Path(cfg.drafter).stem if cfg.drafter else "")
                   + (f"-{cfg.draft_sampling}" if cfg.draft_sampling else ""))
            log_path = self.log_dir / f"llama-server-{tag}.log"
        self.check_template(cfg.model)
        srv = ServerProcess(self.binary, self.caps, cfg, log_path)
        self.starts += 1
        try:
            srv.start(cancel, self.start_timeout)
        except BaseException:
            srv.stop()
            raise
        self._pool[cfg] = srv
        return srv

    def fresh_server(self, cfg: ServerConfig, cancel: CancelToken) -> ServerProcess:
        """A new server for an n-gram mode's run. Its n-gram table lives as long as the server and
        learns from every request (ngram-mod: llama.cpp's common_ngram_mod, one table for all
        requests), so on a reused server a repetition of a prompt would draft the answer the one
        before generated. A fresh server, warmed by requests too short to add an n-gram (see
        WARM_TOKENS), starts each run from an empty table."""
        self.discard(cfg)
        srv = self.server(cfg, cancel)
        warm = self.prompt_tokens(srv, WARM_TEXT, True)[:4]
        for _ in range(WARM_REQUESTS):
            for _ in srv.stream_completion(warm, WARM_TOKENS, greedy(0), cancel):
                pass  # the warm requests' progress is not the run's
        return srv

    def prepare(self, shape: SweepShape) -> None:
        """Each configuration gets its own server when first used. A thinking setting needs the
        server's Jinja templates: --jinja where this build has them off by default."""
        if shape.explicit_thinking and jinja_off_by_default(self.caps) and self.caps.has("jinja") \
                and self.caps.spelling("jinja") not in self.extra_args:
            self.extra_args += (self.caps.spelling("jinja") or "--jinja",)

    def ready_limit(self, model: str, n_configs: int) -> int | None:
        """How many servers of this model can stay up at once (by RAM); sets the pool size."""
        if self.pool_size is not None:
            return self.pool_size
        try:
            import psutil  # deferred: a C extension needed only to size the pool

            size = sum(p.stat().st_size for p in split_parts(model) if p.exists())
            avail = psutil.virtual_memory().available
        except Exception:
            return None
        limit = max(1, int(avail * 0.6 // max(size, 1)))
        if limit < n_configs:
            self.pool_size = limit
            return limit
        return None

    def discard(self, cfg: ServerConfig) -> None:
        srv = self._pool.pop(cfg, None)
        if srv is not None:
            srv.stop()

    def check_template(self, model: str) -> None:
        """Once per model, before a server starts with it: its chat template rendered here within
        the bounds (llama-server renders it when it starts, and would spin on one that runs on),
        or the one the user's own flags give in its place (--chat-template-file, --chat-template)."""
        if model not in self._templates_checked:
            user = user_template(self.extra_args)
            if user is None:
                check_template(_chat_template(model), model)
            else:
                check_template(user.text, user.name, user.whose, "the command")
            self._templates_checked.add(model)

    def chat(self, srv: ServerProcess) -> ModelTemplate:
        """The model's chat template as this server renders it (/apply-template, within
        TEMPLATE_TIMEOUT_S: past it, the model is refused)."""
        key = srv.pid or 0
        if key not in self._chats:
            def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
                t0 = time.monotonic()
                try:
                    answer: dict[str, Any] = srv.request_json("POST", path, body, timeout=TEMPLATE_TIMEOUT_S)
                    return answer
                except EngineError:  # no answer in time from a server still up: still rendering
                    if time.monotonic() - t0 >= TEMPLATE_TIMEOUT_S and srv.proc is not None \
                            and srv.proc.poll() is None:
                        raise TemplateTooCostly(f"{TEMPLATE_TIMEOUT_S:g} s on llama-server") from None
                    raise

            self._chats[key] = ModelTemplate(_chat_template(srv.cfg.model), server_render(post),
                                             lambda t: srv.tokenize(t, add_special=False), model=srv.cfg.model)
        return self._chats[key]

    def prompt_text(self, srv: ServerProcess, text: str, raw: bool, thinking: bool | None = None) -> str:
        return text if raw else self.chat(srv).prompt(text, thinking)

    def prompt_tokens(self, srv: ServerProcess, text: str, raw: bool, thinking: bool | None = None) -> list[int]:
        key = (srv.cfg.model, text, raw, thinking)
        if key not in self._prompt_cache:
            self._prompt_cache[key] = srv.tokenize(self.prompt_text(srv, text, raw, thinking), add_special=True)
        return self._prompt_cache[key]

    def _server_of(self, model: str) -> ServerProcess:
        """A server of this model already up, else its baseline server."""
        srv = next((s for c, s in self._pool.items() if c.model == model and s.alive()), None)
        return srv if srv is not None else self.server(self.config_for(model, Arm()), CancelToken())

    def count_tokens(self, model: str, text: str) -> int:
        return len(self._server_of(model).tokenize(text, add_special=False))

    def top_two(self, model: str, prompt: Sequence[int], answer: Sequence[int], sampler: Sampler,
                cancel: CancelToken) -> TopTwo | None:
        """By the model's baseline server: the answer generated again with llama-server's
        ``n_probs`` (the raw logits' probabilities, before the sampler chain) one token past
        ``answer``; a prefix sent as one batch would sum in another order than the baseline's
        one-token steps, and on quantized weights that alone turns near ties."""
        steps = self.answer_probs(model, prompt, len(answer) + 1, sampler, cancel)
        if len(steps) <= len(answer) or [t for t, _ in steps[:len(answer)]] != list(answer):
            return None
        return steps[len(answer)][1]

    def answer_probs(self, model: str, prompt: Sequence[int], n: int, sampler: Sampler,
                     cancel: CancelToken) -> list[tuple[int, TopTwo | None]]:
        """Up to ``n`` tokens of the plain answer to ``prompt`` under ``sampler`` (through the
        baseline's server, no prompt cache, as a measured run), each with its two most likely
        tokens (None where the answer held no two)."""
        cancel.check()
        srv = self.server(self.config_for(model, Arm()), cancel)
        payload = srv.request_json("POST", "/completion", {
            "prompt": [int(t) for t in prompt], "n_predict": int(n), **sampler.request(), "n_probs": 2,
            "stream": False, "cache_prompt": False, "return_tokens": True}, timeout=600.0)
        probs = payload.get("completion_probabilities") if isinstance(payload, dict) else None
        if not isinstance(probs, list):
            return []
        out = []
        for step in probs[:n]:
            tok = step.get("id") if isinstance(step, dict) else None
            if type(tok) is not int:
                break
            out.append((tok, top_two_of(step)))
        return out

    def generate(self, model: str, arm: Arm, text: str, *, raw: bool,
                 n_predict: int, sampler: Sampler, cancel: CancelToken,
                 ignore_eos: bool = False, thinking: bool | None = None) -> Generator[Progress, None, Generation]:
        cfg = self.config_for(model, arm)
        if mode_or_guess(arm.mode).fresh_server:  # a draft table kept for the server's life
            srv = self.fresh_server(cfg, cancel)
        else:
            srv = self.server(cfg, cancel)
        prompt = self.prompt_tokens(srv, text, raw, thinking)
        if not prompt:
            raise EngineError("the prompt tokenized to nothing")
        before = srv.spec_counters() if arm.is_spec else None
        raw_result = yield from srv.stream_completion(prompt, n_predict, sampler, cancel,
                                                      ignore_eos=ignore_eos, server_times=True)
        per_pos, steps = spec_deltas(before, srv.spec_counters() if before else None, arm.k)
        speculative = None
        n_slots = None
        with contextlib.suppress(EngineError):
            slots = srv.slots()
            if slots:
                speculative = bool(slots[0].get("speculative"))
                n_slots = len(slots)
        ctk = ctv = None
        extra = list(cfg.extra)
        for flag in ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"):
            if flag in extra and extra.index(flag) + 1 < len(extra):
                if "k" in flag.split("-")[-1]:
                    ctk = extra[extra.index(flag) + 1]
                else:
                    ctv = extra[extra.index(flag) + 1]
        flags = confounder_flags(list(srv.log), n_slots=n_slots,
                                 cache_types=(cfg.cache_type_k or ctk, cfg.cache_type_v or ctv))
        tm = raw_result["timings"]
        times = token_clock(raw_result["times"], raw_result["server_times"], tm)  # a burst: the server's clock
        return Generation(
            tokens=tuple(raw_result["tokens"]), token_times=tuple(times),
            prompt_tokens=tuple(prompt), text=raw_result["content"],
            engine_tok_s=_f(tm.get("predicted_per_second")), predicted_n=_i(tm.get("predicted_n")),
            draft_n=_i(tm.get("draft_n")), draft_accepted=_i(tm.get("draft_n_accepted")),
            prompt_n=_i(tm.get("prompt_n")), prompt_ms=_f(tm.get("prompt_ms")),
            prompt_tok_s=_f(tm.get("prompt_per_second")), speculative=speculative,
            server_pid=srv.pid, engine_flags=flags, placement=self.placement_of(srv),
            accepted_per_pos=per_pos, draft_steps=steps,
            thinking=None if raw else self.chat(srv).sent(thinking),
            reasoning_n=None if raw else self.chat(srv).reasoning_n(
                self.prompt_text(srv, text, raw, thinking), raw_result["tokens"]))

    def placement_of(self, srv: ServerProcess) -> Placement:
        """Where this server put the model: its load log (-lv 4: the devices it used and "offloaded
        N/M layers to GPU"), and where the log says nothing, the devices --list-devices showed."""
        key = srv.pid or 0
        if key not in self._placements:
            from app.core.engines.server.devices import list_devices  # one --list-devices per binary

            try:
                available = list_devices(self.binary)
            except EngineError:
                available = ()
            total = None
            with contextlib.suppress(Exception):  # the model's own layer count (+ the output layer)
                total = layers_total(read_header(srv.cfg.model, keep_arrays=False))
            self._placements[key] = parse_load_log(list(srv.log), available, total)
        self._last_placement = self._placements[key]
        return self._last_placement

    def close(self) -> None:
        while self._pool:
            _, srv = self._pool.popitem()
            srv.stop()

    def __enter__(self) -> "ServerEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spec_deltas(before: SpecCounters | None, after: SpecCounters | None,
                k: int | None) -> tuple[tuple[int, ...], int | None]:
    """One run's (accepted per draft position, verification steps) from /metrics read before and
    after it; ((), None) where a counter is missing or not exact, never an error. The positions
    run to the server's draft width (llama.cpp sizes them --spec-draft-n-max), zeros where nothing
    was accepted; a build without the per-position series gives ()."""
    if before is None or after is None or before.drafts is None or after.drafts is None:
        return (), None
    steps = after.drafts - before.drafts
    if steps < 0:  # another server's counters: nothing to say
        return (), None
    if after.per_pos:
        n = max(max(after.per_pos) + 1, k or 0)
        per_pos = tuple(after.per_pos.get(i, 0) - before.per_pos.get(i, 0) for i in range(n))
        return ((), steps) if min(per_pos) < 0 else (per_pos, steps)
    # no series yet: llama.cpp adds it with the first request that verified a draft
    return ((0,) * (k or 0) if steps == 0 else ()), steps


def _chat_template(model: str) -> str | None:
    template = read_header(model, keep_arrays=False).metadata.get("tokenizer.chat_template")
    return template if isinstance(template, str) else None


def _f(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) else None


def _i(x: Any) -> int | None:
    return int(x) if isinstance(x, (int, float)) else None


def top_two_of(step: Any) -> TopTwo | None:
    """The two most likely tokens of one step of llama-server's ``completion_probabilities``
    (``top_logprobs``, or ``top_probs`` in older builds), typed and bounded; None when the step
    does not hold two."""
    try:
        tops = step.get("top_logprobs")
        if tops is not None:
            pairs = [(t["id"], math.exp(t["logprob"])) for t in tops[:2]]
        else:
            pairs = [(t["id"], t["prob"]) for t in step["top_probs"][:2]]
    except (KeyError, IndexError, TypeError, AttributeError, OverflowError):
        return None
    if len(pairs) < 2 or not all(type(i) is int and isinstance(p, (int, float)) and not isinstance(p, bool)
                                 and 0.0 <= p <= 1.0 for i, p in pairs):
        return None
    (a, pa), (b, pb) = sorted(pairs, key=lambda x: -x[1])
    return TopTwo(a, float(pa), b, float(pb))
