"""The Hub token, read in one place for the CLI and the window: from a token file, else HF_TOKEN,
else HUGGING_FACE_HUB_TOKEN. Surrounding whitespace (a file's final newline) is dropped; a token
that still holds a line break, another control character, a space or a non-ASCII character is
refused with a message that never repeats it (it could not travel in an HTTP header, and the
header error would print it)."""

from __future__ import annotations

import os
from pathlib import Path

from app.core.common.errors import UserError
from app.core.common.reading import read_capped
from app.core.common.redact import TOKEN_ENV_VARS, remember

MAX_TOKEN_FILE = 4096  # a Hub token is about 40 characters


def read_token(token_file: str | os.PathLike[str] | None = None) -> str | None:
    """The token, or None when none is given (no file, the variables unset or empty)."""
    if token_file:
        p = Path(token_file).expanduser()
        data = read_capped(p, "token file", MAX_TOKEN_FILE)  # only a regular file: a FIFO is refused at once
        raw = data.decode("utf-8", errors="replace")
        remember(raw)
        tok = raw.strip()
        if not tok:
            raise UserError(f"{p}: the token file is empty")
        return check_token(tok, f"{p}")
    for var in TOKEN_ENV_VARS:
        value = os.environ.get(var)
        if value:
            remember(value)
            tok = value.strip()
            return check_token(tok, var) if tok else None
    return None


def check_token(tok: str, source: str) -> str:
    """``tok`` when it is one word of visible ASCII; else a UserError naming ``source`` only."""
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in tok):
        raise UserError(f"{source}: the token holds a line break or other control character; "
                        "it must be one line")
    if any(c.isspace() or ord(c) > 126 for c in tok):
        raise UserError(f"{source}: the token holds a space or a non-ASCII character; "
                        "a Hub token is one word of letters, digits and _-")
    return tok
