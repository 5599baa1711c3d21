"""Chat templates rendered within bounds: a Jinja sandbox that counts its steps and sizes.

A GGUF's chat template is a program from outside. Jinja's sandbox keeps it away from Python's
internals, but not from running long: two nested ``range(100000)`` loops take hours, a string
doubled in a loop fills the memory. :class:`BoundedEnvironment` counts, in every render:

- steps: each loop iteration (every ``{% for %}``, recursive ones included) one, each call of a
  function, method, macro or filter :data:`CALL_STEPS`; more than :data:`MAX_STEPS` stops the render;
- sizes: a string, list or number built by ``*``, ``**``, ``+``, ``%``, ``~``, a call or a filter,
  and the output itself, past :data:`MAX_CHARS` characters (or :data:`MAX_INT_BITS` bits) stops it.

A stopped render raises :class:`TemplateTooCostly`, whose text says which bound it met. The bounds
are counts, so a render stops at the same point on every machine; an ordinary template (loops over
the messages and tools) takes a few thousand steps.
"""

from __future__ import annotations

import contextvars
import copy
import functools
from typing import Any, Iterable, Iterator

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_STEPS = 2_000_000  # loop iterations and calls in one render
CALL_STEPS = 20  # the steps of one call (a macro's call, a recursive loop's next level cost many iterations)
MAX_CHARS = 64 << 20  # characters of one value or of the output (a prompt at the deepest --depth fits)
MAX_INT_BITS = 1 << 16  # bits of one number

# the Environment options a copy of another environment takes over (jinja2's constructor names)
_OPTIONS = ("block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
            "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
            "trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "undefined",
            "finalize", "autoescape", "optimized")


class TemplateTooCostly(Exception):
    """A render that met a bound; the text names it ("2,000,000 steps ...")."""


class _Budget:
    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = MAX_STEPS


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("template_budget", default=None)


def _budget() -> _Budget:
    """The render's budget (BoundedEnvironment.concat sets one per render); a render that did not
    start there (Template.generate) counts each loop and call on its own."""
    return _BUDGET.get() or _Budget()


def _out_of_steps() -> TemplateTooCostly:
    return TemplateTooCostly(f"{MAX_STEPS:,} steps (loop iterations and calls)")


def _counted(items: Iterable[Any]) -> Iterator[Any]:
    b = _budget()
    for x in items:
        b.steps -= 1
        if b.steps < 0:
            raise _out_of_steps()
        yield x


def _step() -> None:
    b = _budget()
    b.steps -= CALL_STEPS
    if b.steps < 0:
        raise _out_of_steps()


def _too_large(what: str) -> TemplateTooCostly:
    return TemplateTooCostly(f"its size bound ({what})")


def _sized(value: Any) -> Any:
    """``value``, unless it is a string or container over MAX_CHARS, or a number over MAX_INT_BITS."""
    if isinstance(value, (str, list, tuple, dict, set)) and len(value) > MAX_CHARS:
        raise _too_large(f"a value of more than {MAX_CHARS:,} items")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _too_large(f"a number of more than {MAX_INT_BITS:,} bits")
    return value


def _check_operands(op: str, a: Any, b: Any) -> None:
    """Refuse, before it is computed, an operation whose result would pass the size bounds."""
    if isinstance(a, int) and isinstance(b, int):
        bits = (a.bit_length() + b.bit_length() if op == "*" else
                (abs(a).bit_length() - 1) * b if op == "**" and b > 0 else 0)
        if bits > MAX_INT_BITS:
            raise _too_large(f"a number of more than {MAX_INT_BITS:,} bits")
        return
    n = 0
    if op == "*":
        seq, times = (a, b) if isinstance(b, int) else (b, a)
        if isinstance(times, int) and hasattr(seq, "__len__"):
            n = len(seq) * max(times, 0)
    elif op == "+" and hasattr(a, "__len__") and hasattr(b, "__len__"):
        n = len(a) + len(b)
    if n > MAX_CHARS:
        raise _too_large(f"a value of more than {MAX_CHARS:,} items")


def _bounded_filter(f: Any) -> Any:
    """A filter that counts as a step and whose result is size-checked (jinja's pass_* marks kept)."""

    if getattr(f, "bounded", False):
        return f

    @functools.wraps(f)
    def filt(*args: Any, **kwargs: Any) -> Any:
        _step()
        return _sized(f(*args, **kwargs))

    filt.bounded = True  # type: ignore[attr-defined]
    return filt


class _Compiler(CodeGenerator):
    """Jinja's code generator with every loop's items counted and every ``~`` size-checked."""

    def visit_For(self, node: nodes.For, frame: Any) -> None:
        node = copy.copy(node)  # the loop over environment.count_steps(<its items>)
        node.iter = nodes.Call(nodes.EnvironmentAttribute("count_steps", lineno=node.lineno), [node.iter], [],
                               None, None, lineno=node.lineno)
        super().visit_For(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:
        self.write("environment.sized(")
        super().visit_Concat(node, frame)
        self.write(")")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox within the step and size bounds (see the module)."""

    code_generator_class = _Compiler
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.globals["range"] = _bounded_range
        self.filters = {k: _bounded_filter(f) for k, f in self.filters.items()}

    @staticmethod
    def count_steps(items: Iterable[Any]) -> Iterator[Any]:
        return _counted(items)

    @staticmethod
    def sized(value: Any) -> Any:
        return _sized(value)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_operands(operator, left, right)
        return _sized(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's names)
        _step()
        if isinstance(__obj, LoopContext) and args:  # loop(items) in a recursive loop: its items count too
            args = (_counted(args[0]),) + args[1:]
        return _sized(super().call(__context, __obj, *args, **kwargs))

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """The whole render (Template.render joins its output here): a fresh budget, and the output
        cut off at MAX_CHARS."""
        token = _BUDGET.set(_Budget())
        try:
            out, n = [], 0
            for s in parts:
                n += len(s)
                if n > MAX_CHARS:
                    raise _too_large(f"more than {MAX_CHARS:,} characters of output")
                out.append(s)
            return "".join(out)
        finally:
            _BUDGET.reset(token)

    @classmethod
    def like(cls, other: Any) -> "BoundedEnvironment":
        """A bounded copy of the Jinja environment ``other``: its options, extensions, filters
        (each bounded), tests and globals (but the bounded ``range``)."""
        env = cls(loader=other.loader, extensions=[type(e) for e in other.extensions.values()],
                  **{k: getattr(other, k) for k in _OPTIONS})
        env.filters.update({k: _bounded_filter(f) for k, f in other.filters.items()})
        env.tests.update(other.tests)
        env.globals.update({k: v for k, v in other.globals.items() if k != "range"})
        env.policies.update(other.policies)
        return env


def _bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_STEPS:
        raise _out_of_steps()
    return r
