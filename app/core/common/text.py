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
