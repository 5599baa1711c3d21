"""Text from outside (a model's name, a prompt id, a release's tag, a binary's --version, a Hub
listing) made safe to show: control characters become visible escapes before anything displays
them, so a file cannot move the terminal's cursor, recolour it, set its title, hide a line behind
a carriage return or reverse the reading order of what follows.

``printable`` is the one function for it: the CLI passes everything it prints through it, the
window the text it puts in labels and tables, the result card every field it shares. Line breaks
and tabs stay (a message may span lines); everything else is written as ``\\u001b``, an escape
that also keeps a JSON document valid and equal to what it was."""

from __future__ import annotations

import re

# C0 controls except tab and line feed, DEL, C1 controls (0x9b is a one-byte CSI on some
# terminals), and the invisible formatting characters that reorder or hide text: zero-width
# spaces and joiners, the bidirectional marks, embeddings, overrides and isolates, the line and
# paragraph separators, the byte order mark, and the interlinear annotation marks.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064"
                     "\u2066-\u206f\ufeff\ufff9-\ufffb]")
_UNSAFE_ONE_LINE = re.compile(_UNSAFE.pattern[:-1] + "\n\t]")


def _escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def printable(text: object, one_line: bool = False) -> str:
    """``text`` as a string with every control or invisible formatting character written as a
    visible ``\\uXXXX`` escape; line breaks and tabs stay unless ``one_line``."""
    s = text if isinstance(text, str) else str(text)
    return (_UNSAFE_ONE_LINE if one_line else _UNSAFE).sub(_escape, s)


# ---- outside text, one function per destination -------------------------------------------------
# A string from outside (a file, a server, a process name, the Hub, a release, a model's metadata)
# reaches a message, a window label, a file name or a report only through one of these. Each
# escapes every control and invisible formatting character *and line breaks* (so outside text can
# never print a line of its own, such as "recommendation: run K=8") and bounds the length.

SHOWN_LIMIT = 200
ELLIPSIS = "\u2026"
_SLUG_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def shown(text: object, limit: int = SHOWN_LIMIT) -> str:
    """Outside text for a terminal line or a window label: one line (line breaks, tabs and every
    control or bidi character as ``\\uXXXX`` escapes), at most ``limit`` characters of it kept
    with an ellipsis after."""
    s = text if isinstance(text, str) else str(text)
    if len(s) > limit * 8:  # escaping a huge string only to cut it: cut first
        s = s[:limit * 8]
    s = printable(s, one_line=True)
    return s if len(s) <= limit else s[:limit].rstrip("\\") + ELLIPSIS


def slug(text: object, limit: int = 60, empty: str = "unnamed") -> str:
    """Outside text as a piece of a file name: ASCII letters, digits, ``.``, ``_`` and ``-`` only
    (every other run of characters one ``-``), no leading dot, at most ``limit`` characters."""
    s = _SLUG_BAD.sub("-", str(text)).strip(".-")[:limit].strip(".-")
    return s or empty


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#])")


def markdown(text: object, limit: int = SHOWN_LIMIT) -> str:
    """Outside text for a Markdown report (a table cell or a line): ``shown``, then Markdown's and
    HTML's special characters escaped, so a name cannot close a table cell, start a heading, open
    a link or a tag."""
    return _MD_SPECIAL.sub(r"\\\1", shown(text, limit))


def html_text(text: object, limit: int = SHOWN_LIMIT) -> str:
    """Outside text for HTML (a rich-text window label): ``shown``, then HTML-escaped."""
    import html

    return html.escape(shown(text, limit), quote=True)


def one_line(text: str) -> str:
    """``text`` with every control and invisible formatting character, line breaks and tabs
    included, as a ``\\uXXXX`` escape; nothing cut (a path stays whole)."""
    return printable(text, one_line=True)  # re.sub gives the string itself back when nothing matched


def clean_strings(value: object, depth: int = 0) -> object:
    """A value read from outside (a JSON document's str, list, dict, ...) with every string in it,
    keys included, made ``one_line``: read once, it is safe wherever it is shown later. A value
    with nothing to clean is returned as it is (the same object: shared values stay shared)."""
    if isinstance(value, str):
        return one_line(value)
    if depth > 32 or not isinstance(value, (dict, list, tuple)):
        return value
    if isinstance(value, dict):
        items = [(clean_strings(k, depth + 1), clean_strings(v, depth + 1)) for k, v in value.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(items, value.items())):
            return value
        return dict(items)
    cleaned = [clean_strings(v, depth + 1) for v in value]
    if all(a is b for a, b in zip(cleaned, value)):
        return value
    return type(value)(cleaned)


_PATH_SEP = re.compile(r"/|\\(?!u[0-9a-f]{4})")


def file_name(path: str) -> str:
    """The last part of a path written on any system ("/" or "\\" between parts), where a
    ``\\uXXXX`` escape that ``one_line`` wrote is part of a name, not a separator."""
    parts = [p for p in _PATH_SEP.split(path) if p]
    name = parts[-1] if parts else ""
    return "" if re.fullmatch(r"[A-Za-z]:", name) else name
