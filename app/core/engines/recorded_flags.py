"""The llama-server flags a results file recorded (a run record's ``server_args``), read back as
outside text: each flag sorted by the one rule for the user's command (user_command.flag_kind),
so that only the kept ones (those a measuring server started with) reach an exported command, a
report or a card. The measurement's own flags (host, port, ``-np``, metrics, logging ...), the
model, the RPC workers, the speculative flags, the secrets and every flag the rule does not keep
are left out, and so is a word that follows no flag; what is kept is redacted (common.redact)."""

from __future__ import annotations

from typing import Iterable, Sequence

from app.core.common.redact import is_secret_flag, redact_args
from app.core.engines.commands import FLAG_SPELLINGS, Capabilities
from app.core.engines.user_command import flag_kind, flag_name, help_flags, is_value


def kept_flags(args: Iterable[str] | None, caps: Capabilities | None = None) -> tuple[str, ...]:
    """The kept flags of recorded ``args``, in their order, each with its values, redacted.
    ``caps``: the llama-server whose ``--help`` says each flag's spellings and how many values it
    takes (a flag it does not list is left out); None: a flag's values are the words after it
    that look like values."""
    words: Sequence[str] = tuple(args or ())
    specs = help_flags(caps.help_text) if caps is not None else None
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if is_value(word):  # a word that follows no flag: no flag's, left out
            i += 1
            continue
        name = flag_name(word)
        spec = specs.get(name) if specs is not None else None
        if "=" in word and word.startswith("--"):
            arity = 0
        elif spec is not None:
            has_value = i + 1 < len(words) and is_value(words[i + 1])
            arity = 0 if spec.optional and not has_value else spec.arity
        else:
            arity = 1 if i + 1 < len(words) and is_value(words[i + 1]) else 0
        group = words[i:i + 1 + arity]
        i += len(group)
        if specs is not None and spec is None:
            continue  # not a flag of this llama-server
        if any(is_secret_flag(w) for w in group):
            continue  # a secret flag, or one taken as another's value (-a --api-key KEY)
        if flag_kind(spec.aliases if spec is not None else _spellings(name)) == "kept":
            out += group
    return redact_args(out)


def _spellings(name: str) -> frozenset[str]:
    """Every spelling of the flag ``name`` that commands.FLAG_SPELLINGS knows (no --help to ask)."""
    return next((frozenset(v) for v in FLAG_SPELLINGS.values() if name in v), frozenset({name}))
