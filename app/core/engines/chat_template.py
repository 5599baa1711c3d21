"""The chat template's thinking switch, for both engines, and reasoning tokens counted apart.

Reasoning templates (Qwen3, Qwen3.5/3.6 ...) read ``enable_thinking``: on, the model reasons
between markers such as ``<think>`` and ``</think>`` before it answers; off, the template closes
the block in the generation prompt. ``thinking`` is True, False or None (the template's own
default: nothing is passed).

- in-process: the GGUF's Jinja template rendered with ``enable_thinking`` as a template variable
  (llama-cpp-python's ``Jinja2ChatFormatter`` passes extra keyword arguments into the render);
- llama-server: ``/apply-template`` with ``"chat_template_kwargs": {"enable_thinking": ...}``
  (tools/server/server-common.cpp, ``oaicompat_chat_params_parse``: the request's
  chat_template_kwargs are merged over the command line's, and ``enable_thinking`` "true"/"false"
  overrides the server's default, which is on when the template supports thinking and
  ``--reasoning`` is not off). Jinja must be on: the default in current builds, ``--jinja`` on old.

The reasoning markers are found from the template itself (:func:`reasoning_markers`), never
assumed: an assistant message with ``reasoning_content`` shows what the template wraps reasoning
in; failing that, what the generation prompt adds when thinking is off (an empty, closed block).
A template is a program from outside: the in-process render runs within bounds (template_bounds:
a count of loop steps and calls, and sizes), and a template past them is refused with one line
naming the model (:class:`ModelTemplate`). llama-server renders templates itself, in C++, with no
such bound, so its engine first renders the model's template here (:func:`check_template`), or the
one the user's own command gives instead (``--chat-template-file`` or ``--chat-template``,
:func:`user_template`): the same bound, refused in one line naming the file or the flag.
No Qt here.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

from app.core.common.errors import ModelFileError, UserError
from app.core.engines.template_bounds import BoundedEnvironment, TemplateTooCostly

if TYPE_CHECKING:
    from llama_cpp.llama_types import ChatCompletionRequestMessage

THINKING_KWARG = "enable_thinking"
THINKING_CHOICES = {"on": True, "off": False, "default": None}

# chat messages as the templates read them: {"role": ..., "content": ...} and maybe more
# ("reasoning_content")
Messages = list[dict[str, Any]]
# render(messages, add_generation_prompt, thinking) -> the prompt text
Render = Callable[[Messages, bool, "bool | None"], str]

_REASON = "MTPTUNERREASONINGSENTINEL"
_ANSWER = "MTPTUNERANSWERSENTINEL"
_QUESTION = "MTPTUNERQUESTIONSENTINEL"


def parse_thinking(text: str | bool | None) -> bool | None:
    """"on" / "off" / "default" (or a bool / None) -> True / False / None."""
    if text is None or isinstance(text, bool):
        return text
    key = str(text).strip().lower()
    if key not in THINKING_CHOICES:
        raise UserError(f"--thinking must be one of {', '.join(THINKING_CHOICES)}, got {text!r}")
    return THINKING_CHOICES[key]


def thinking_label(thinking: bool | None) -> str:
    return "default" if thinking is None else ("on" if thinking else "off")


def supports_thinking(template: str | None) -> bool:
    """Whether the template has a thinking switch (it reads ``enable_thinking``)."""
    return template is not None and THINKING_KWARG in template


def template_kwargs(thinking: bool | None) -> dict[str, Any]:
    """The chat template keyword arguments for ``thinking`` ({} for the template's default)."""
    return {} if thinking is None else {THINKING_KWARG: bool(thinking)}


def apply_template_body(text: str, thinking: bool | None) -> dict[str, Any]:
    """llama-server's ``/apply-template`` request for one user message."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
    if thinking is not None:
        body["chat_template_kwargs"] = template_kwargs(thinking)
    return body


def jinja_render(template: str, bos: str, eos: str) -> Render:
    """A renderer for the GGUF's template with llama-cpp-python's Jinja2ChatFormatter (the
    in-process engine's), its template compiled in a bounded copy of the formatter's environment
    (past a bound: TemplateTooCostly); the thinking switch goes in as a template variable."""
    from app.core.engines.llama_backend import choose_library

    choose_library()  # before llama_cpp's first import: which llama.cpp library it loads
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # deferred: part of llama_cpp (heavy)

    # each formatter made with an empty template (its own environment would fold the template's
    # constants, such as 7 ** 100000000, unbounded as it compiles), then given the template compiled
    # in a bounded copy of that environment (the formatter renders its _environment)
    formatters = {g: Jinja2ChatFormatter("", eos, bos, add_generation_prompt=g) for g in (True, False)}
    for f in formatters.values():
        bounded = BoundedEnvironment.like(f._environment.environment)
        f.template, f._environment = template, bounded.from_string(template)

    def render(messages: Messages, add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
        # llama-cpp-python's message types are narrower than what templates read (no
        # reasoning_content); the formatter hands the messages to the template as they are
        sent = cast("list[ChatCompletionRequestMessage]", messages)
        return formatters[bool(add_generation_prompt)](messages=sent, **template_kwargs(thinking)).prompt

    return render


def refusing_render(render: Render, model: str, whose: str = "its chat template",
                    refused: str = "the model") -> Render:
    """``render``, with a render past the bounds (TemplateTooCostly) one ModelFileError naming
    ``model`` ("MODEL: its chat template did not finish rendering within ...; the model is
    refused"; ``whose`` and ``refused`` name a template from elsewhere)."""

    def bounded(messages: Messages, add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
        try:
            return render(messages, add_generation_prompt, thinking)
        except TemplateTooCostly as e:
            raise ModelFileError(f"{model}: {whose} did not finish rendering within {e}; {refused} is "
                                 "refused (a template that runs this long would stall every run)") from None

    return bounded


# a conversation like the one llama-server renders when it starts (its "example_format")
SAMPLE_CONVERSATION = [{"role": "system", "content": "You are a helpful assistant"},
                       {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"},
                       {"role": "user", "content": "How are you?"}]


def check_template(template: str | None, model: str, whose: str = "its chat template",
                   refused: str = "the model") -> None:
    """Refuse (ModelFileError naming ``model``, refusing_render) a template whose render of a
    sample conversation goes past the bounds, before llama-server, which renders it without any,
    is started with it. Other failures are left to llama-server's own template engine (it may
    take what Jinja2 does not)."""
    if not template:
        return
    try:
        render = refusing_render(jinja_render(template, "", ""), model, whose, refused)
    except Exception:  # Jinja2 cannot compile it: nothing to bound here
        return
    for thinking in ((None, True, False) if supports_thinking(template) else (None,)):
        for add_generation_prompt in (True, False):
            try:
                render(SAMPLE_CONVERSATION, add_generation_prompt, thinking)
            except ModelFileError:
                raise
            except Exception:
                pass


MAX_TEMPLATE_FILE_BYTES = 1 << 20  # a chat template is a few KiB; the longest GGUFs carry are under 100 KiB
TEMPLATE_FLAGS = ("--chat-template-file", "--chat-template")


@dataclasses.dataclass(frozen=True)
class UserTemplate:
    """A chat template the user's own llama-server flags give: its text and how to name it."""

    text: str
    name: str  # the file, or the flag for a template given inline
    whose: str  # what the refusal calls it


def user_template(args: Sequence[str]) -> UserTemplate | None:
    """The chat template ``args`` (llama-server flags, "--flag value" or "--flag=value") give in
    place of the model's: the last ``--chat-template-file`` or ``--chat-template``, as llama.cpp
    takes the last. A file is read as llama-server would read it (same folder), only when regular
    (a FIFO is refused at once) and at most MAX_TEMPLATE_FILE_BYTES; UserError naming it otherwise."""
    found: tuple[str, str] | None = None
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        if flag in TEMPLATE_FLAGS and (eq or i + 1 < len(args)):
            found = (flag, inline if eq else args[i + 1])
    if found is None:
        return None
    flag, value = found
    if flag == "--chat-template":
        return UserTemplate(value, flag, "the chat template it gives")
    from app.core.common.reading import read_capped  # deferred: only a command with a template file reads one

    data = read_capped(value, "chat template file", MAX_TEMPLATE_FILE_BYTES, flag="--chat-template-file")
    return UserTemplate(data.decode("utf-8", errors="replace"), value, "the chat template in this file "
                        "(--chat-template-file)")


def server_render(post_json: Callable[[str, dict[str, Any]], dict[str, Any]]) -> Render:
    """A renderer through llama-server's own template (``/apply-template``); ``post_json(path,
    body)`` is the server's JSON request."""

    def render(messages: Messages, add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
        body: dict[str, Any] = {"messages": messages, "add_generation_prompt": bool(add_generation_prompt)}
        if thinking is not None:
            body["chat_template_kwargs"] = template_kwargs(thinking)
        return str(post_json("/apply-template", body)["prompt"])

    return render


def render_user(render: Render, text: str, thinking: bool | None) -> str:
    """One user message through the template, with the generation prompt."""
    return render([{"role": "user", "content": text}], True, thinking)


@dataclasses.dataclass(frozen=True)
class ReasoningMarkers:
    """What the template wraps reasoning in (e.g. ``<think>``, ``</think>``)."""

    start: str
    end: str

    def open_at_end(self, prompt: str) -> bool:
        """Whether ``prompt`` ends inside a reasoning block (the generation prompt opened one):
        then the model's first tokens are reasoning."""
        s, e = prompt.rfind(self.start), prompt.rfind(self.end)
        return s >= 0 and (e < 0 or e + len(self.end) <= s)


def reasoning_markers(render: Render) -> ReasoningMarkers | None:
    """The template's reasoning markers, or None when it marks none (then nothing is counted apart).

    First: an assistant turn with ``reasoning_content`` (the start marker is the last word before
    the reasoning, the end marker the text between reasoning and answer). Else, when the
    switch changes the generation prompt: the generation prompt with thinking off, which ends in an
    empty closed block whose two words are the markers."""
    q = [{"role": "user", "content": _QUESTION}]
    try:
        turn = render(q + [{"role": "assistant", "content": _ANSWER, "reasoning_content": _REASON}], False, None)
    except (ModelFileError, TemplateTooCostly):  # past the bounds: the model is refused
        raise
    except Exception:  # a template that refuses the turn: try the other way
        turn = ""
    i, j = turn.find(_REASON), turn.find(_ANSWER)
    if 0 <= i < j:
        before = turn[:i].split()
        end = turn[i + len(_REASON):j].strip()
        if before and end and _QUESTION not in before[-1]:
            return ReasoningMarkers(_unglue(before[-1]), end)
    try:
        off, on, bare = render(q, True, False), render(q, True, True), render(q, False, False)
    except (ModelFileError, TemplateTooCostly):
        raise
    except Exception:
        return None
    if off == on:
        return None
    k = 0
    while k < min(len(off), len(bare)) and off[k] == bare[k]:
        k += 1
    words = off[k:].split()  # the generation prompt with thinking off: "... <think> </think>"
    if len(words) >= 2 and all(not w.isalnum() for w in words[-2:]):
        return ReasoningMarkers(_unglue(words[-2]), words[-1])
    return None


def _unglue(word: str) -> str:
    """The marker of a word that glues a header to it: "<｜Assistant｜><think>" -> "<think>"."""
    return word[word.rfind("<"):] if word.endswith(">") and word.rfind("<") > 0 else word


def split_reasoning(tokens: Sequence[int], start: Sequence[int], end: Sequence[int],
                    open_at_start: bool) -> tuple[int, int]:
    """(reasoning tokens, answer tokens) of generated ``tokens``: the tokens from a start marker
    through its end marker (both included) are reasoning, the rest answer. ``start``/``end`` are
    the markers' token ids (the engine's tokenizer); ``open_at_start``: the prompt ended inside a
    reasoning block. A block never closed counts as reasoning to the end."""
    toks, start, end = list(tokens), tuple(start), tuple(end)
    inside, reasoning, i = bool(open_at_start), 0, 0
    while i < len(toks):
        marker = end if inside else start
        if marker and tuple(toks[i:i + len(marker)]) == marker:
            reasoning += len(marker)
            i += len(marker)
            inside = not inside
            continue
        reasoning += inside
        i += 1
    return reasoning, len(toks) - reasoning


class ModelTemplate:
    """One model's chat template as an engine uses it: the prompt for a user text with the thinking
    switch (sent only where the template has one), and the reasoning tokens of a generation.
    ``tokenize(text)`` is the engine's tokenizer (special tokens parsed, none added); the markers
    are found on first use. A render past the bounds is a ModelFileError naming ``model``."""

    def __init__(self, template: str | None, render: Render, tokenize: Callable[[str], list[int]],
                 model: str = "the model"):
        self.template, self.render, self.tokenize = template, refusing_render(render, model), tokenize
        self.switch = supports_thinking(template)
        self._markers: tuple[ReasoningMarkers, tuple[int, ...], tuple[int, ...]] | None = None
        self._looked = False  # the markers are looked for once (None: the template marks none)

    def sent(self, thinking: bool | None) -> bool | None:
        """The thinking setting as sent to the template (None where it has no switch)."""
        return thinking if self.switch else None

    def prompt(self, text: str, thinking: bool | None) -> str:
        return render_user(self.render, text, self.sent(thinking))

    def markers(self) -> tuple[ReasoningMarkers, tuple[int, ...], tuple[int, ...]] | None:
        if not self._looked:
            m = reasoning_markers(self.render)
            self._markers = (m, tuple(self.tokenize(m.start)), tuple(self.tokenize(m.end))) if m else None
            self._looked = True
        return self._markers

    def reasoning_n(self, prompt: str, tokens: Sequence[int]) -> int | None:
        """Generated tokens inside reasoning markers (None: the template marks none)."""
        found = self.markers()
        if found is None:
            return None
        m, start, end = found
        return split_reasoning(tokens, start, end, m.open_at_end(prompt))[0]
