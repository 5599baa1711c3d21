"""Secrets never reach a message, a record, a report or a command: ``redact`` takes out every
known secret (the Hub token as read, and whatever the token variables hold) and anything shaped
like a credential from text: an ``Authorization: Bearer ...`` value or any other ``Authorization``
header's, a Hugging Face token, the ``user:password@`` of a URL, the value after a secret flag
(``--api-key KEY``, ``--hf-token=KEY``, ``-hft KEY``: any flag named for a key, token, secret or
password), ``api_key=KEY`` and ``token=KEY``, and a JSON (or JSON-like) value whose key looks like a
key, token, secret or password, at any nesting and in any quoting (``{"apiKey":"sk-..."}``,
``{\"auth\":{\"password\":\"...\"}}``, ``{""token"":""...""}``). ``redact_args`` does the same
for an argument list, where the value after a secret flag is masked however the words around it
are parsed (``-a --api-key KEY``: the key is masked though ``-a`` may take ``--api-key`` as its value).

One function for every way out: the log's formatter, the CLI's streams (cli.common.CleanStream),
the exceptions turned into messages (the Hub client, the CLI's last handler, watch's client, the
window's jobs), llama-server's own log lines (engines.server.process), the records written and
read (records.writer, records.reader: a results file's ``server_args`` and ``error`` are outside
text) and the exported command (verdict.export), which the report and the card show."""

from __future__ import annotations

import os
import re
from typing import Iterable

# where a Hub token may come from; the children the app starts (llama-server) never get them
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")

MASK = "[redacted]"
_MIN_PIECE = 6  # a shorter piece of a broken secret is too common a string to take out of text

# Each pattern is written for lower-case text and matched on the text's lower-case copy (a case-
# insensitive pattern is several times slower over a large output); the group "v" is what is masked.
_BEARER = r"\bbearer\s+(?P<v>[^\s'\",;)}\]]+)"
_HF_TOKEN_RE = re.compile(r"\bhf_[A-Za-z0-9]{16,}")
# a URL's user information (scheme://user:password@host): everything between :// and the @,
# the user name too (it is half of the credential), up to the last @ before a space or a quote (a
# password may hold a /: more is masked rather than less)
_URL_USER = r"\b[a-z][a-z0-9+.\-]*://(?P<v>[^\s'\"<>]*)@"
# an API key or an Authorization header as a field: api_key=KEY, "api-key": "KEY", x-api-key: KEY,
# Authorization: Basic KEY (its scheme word kept; a Bearer's value is masked by _BEARER)
_KEY_FIELD = (r"(?:(?<![a-z0-9_])(?:x-)?api[_-]?key|\bauthorization)['\"]?\s*[:=]\s*['\"]?"
              r"(?:(?:basic|token|digest)\s+)?(?!bearer\s)(?!\[redacted\]|<your )(?P<v>[^\s'\",;&)}\]]+)")
# a flag named for a secret: llama-server's --api-key and --hf-token (-hft), and any other flag whose
# name ends in key, token, secret or password (not --api-key-file: a file's name is no secret)
SECRET_FLAG = r"(?:-hft|--(?:[a-z0-9]+-)*(?:api-key|key|token|secret|password|passwd))"
_SECRET_FLAG_RE = re.compile(rf"(?i){SECRET_FLAG}")
_SEP = r"(?:\s*=\s*|\s+)"
# in text: a secret flag, any secret flags right after it (each taking the next as its value), and
# the value, quoted or one word
# the value is no secret where it is the exported command's reference to the variable holding it
# (render.secret_reference: "$LLAMA_API_KEY", $env:LLAMA_API_KEY, "%LLAMA_API_KEY%", HF_TOKEN; its
# quotes JSON-escaped in a --json answer); a JSON-escaped quoted value is masked whole, or the
# JSON around it would break
_VAR_REF = (r"(?:\\?[\"'])?(?:\$env:|\$|%)(?:llama_[a-z0-9_]+|hf_token)%?(?:\\?[\"'])?"
            r"(?=[\s\"',;)}\]]|$)")
_FLAG_VALUE = (rf"(?<![\w-]){SECRET_FLAG}(?![\w-]){_SEP}(?:{SECRET_FLAG}(?![\w-]){_SEP})*"
               rf"(?![\"']?<your )(?!{_VAR_REF})"
               r"(?P<v>\\\"(?:[^\"\\]|\\[^\"])*\\\"|\"[^\"]*\"|'[^']*'|[^\s'\"]+)")
# a field named for a secret: a JSON or JSON-like key (quoted any way: "k", 'k', \"k\", ""k"", or
# not at all), its name ending in key, token, secret, password, credential(s), auth(orization),
# cookie; then ":" (JSON, spaces allowed) or "=" with no space (a query string, key=value). A
# dotted name (a GGUF metadata key: tokenizer.ggml.add_bos_token=bool:false) is none. Found by
# the name's end, then its start looked for backwards (_field_key).
_FIELD_END = (r"(?:key|token|secret|password|passwd|passphrase|pwd|credentials?|auth|authorization|cookie)"
              r"(?P<q>(?:\\*[\"'`])*)(?P<sep>\s*:\s*|=)")
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_QUOTE_CHARS = frozenset("\\\"'`")
# the words one of which text holds when a secret flag or field can be in it (lower case)
_HINTS = ("key", "token", "secret", "passw", "pwd", "passphrase", "credential", "auth", "cookie", "-hft")
_QUOTES = re.compile(r"(?:\\*[\"'`])+")
_BARE = re.compile(r"[^\s,;&)}\]'\"`\\]+")
# engines.user_command.placeholder, which the exported command has for a secret: no secret in it
_PLACEHOLDER = re.compile(r"<your [a-z0-9-]+>")
_SPLIT_RE = re.compile(r"[\x00-\x20\x7f-\x9f]+")


def _both(pattern: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """A pattern for lower-case text, and the same for any case (where the lower-case copy of a
    text is not as long as the text: a few Unicode letters grow)."""
    return re.compile(pattern), re.compile("(?i)" + pattern)


_BEARER_RES, _URL_USER_RES, _KEY_FIELD_RES, _FLAG_VALUE_RES, _FIELD_END_RES = (
    _both(p) for p in (_BEARER, _URL_USER, _KEY_FIELD, _FLAG_VALUE, _FIELD_END))

_known: set[str] = set()


def remember(secret: str | None) -> None:
    """Take ``secret`` out of every later message: the whole of it, and each piece of it between
    control characters or spaces (a token with a line break shows up as its lines, or in a
    ``repr`` with ``\\n`` between them)."""
    for s in _forms(secret):
        _known.add(s)


def _forms(secret: str | None) -> list[str]:
    if not secret:
        return []
    out = [secret, secret.strip(), repr(secret)[1:-1]]
    out += _SPLIT_RE.split(secret)
    return [s for s in out if len(s) >= _MIN_PIECE]


def redact(text: object) -> str:
    """``text`` as a string with every secret masked."""
    s = str(text)
    known = set(_known)
    for var in TOKEN_ENV_VARS:
        known.update(_forms(os.environ.get(var)))
    for secret in sorted(known, key=len, reverse=True):  # the whole before its pieces
        if secret in s:
            s = s.replace(secret, MASK)
    lower = s.lower()
    if "bearer" in lower:
        s = _masked(s, _BEARER_RES)
    if "://" in s:
        s = _masked(s, _URL_USER_RES)
    if any(h in s.lower() for h in _HINTS):
        s = _masked(s, _FLAG_VALUE_RES)
        s = _fields_masked(s)  # before _KEY_FIELD, whose value ends at a quote (an escaped one too)
        s = _masked(s, _KEY_FIELD_RES)
    return _HF_TOKEN_RE.sub(MASK, s) if "hf_" in s else s


def _matches(s: str, patterns: tuple[re.Pattern[str], re.Pattern[str]]) -> Iterable[re.Match[str]]:
    """The matches in ``s`` of a pattern for lower-case text (_both), at the positions of ``s``."""
    lower = s.lower()
    return patterns[0].finditer(lower) if len(lower) == len(s) else patterns[1].finditer(s)


def _masked(s: str, patterns: tuple[re.Pattern[str], re.Pattern[str]]) -> str:
    """``s`` with the group "v" of every match masked."""
    out: list[str] = []
    pos = 0
    for m in _matches(s, patterns):
        a, b = m.span("v")
        out += [s[pos:a], MASK]
        pos = b
    return "".join(out) + s[pos:] if out else s


def _fields_masked(s: str) -> str:
    """``s`` with the value of every field named for a secret (_FIELD_END) masked: a quoted
    value up to its closing quote (the same quoting), an object or a list whole, else one word."""
    out: list[str] = []
    pos = 0
    for m in _matches(s, _FIELD_END_RES):
        if m.start() < pos or not _field_key(s, m):  # inside a value masked already; no field's name
            continue
        start = m.end()
        end, quote = _value_end(s, start)
        if end is None or (m.group("sep").strip().startswith(":") and not (m.group("q") or quote or
                                                                          s[start:start + 1] in "{[")):
            continue  # "word: text" in a sentence is no field; a quoted key or value makes one
        if s[start:end].strip(quote) == MASK or _PLACEHOLDER.fullmatch(s[start:end].strip(quote)):
            continue
        out += [s[pos:start], f"{quote}{MASK}{quote}" if quote else MASK]
        pos = end
    return "".join(out) + s[pos:] if out else s


def _field_key(s: str, m: re.Match[str]) -> bool:
    """Is the secret word that ``m`` found the end of a field's name: the name's start after a
    character that is no name's (not a dot either), its quotes before it the same as after?"""
    k = m.start()
    while k > 0 and s[k - 1] in _KEY_CHARS:
        k -= 1
    q = k
    while q > 0 and s[q - 1] in _QUOTE_CHARS:
        q -= 1
    return s[q:k] == m.group("q") and not (q > 0 and (s[q - 1] in _KEY_CHARS or s[q - 1] == "."))


def _value_end(s: str, start: int) -> tuple[int | None, str]:
    """Where the value at ``start`` ends, and its quote ("" for an object, a list or a word);
    None when there is no value there."""
    q = _QUOTES.match(s, start)
    if q:
        quote = q.group(0)
        i = q.end()
        while i < len(s):
            if s.startswith(quote, i) and not (len(quote) == 1 and _escaped(s, i)):
                return i + len(quote), quote
            if s[i] == "\n":
                break
            i += 1
        return i, quote  # no closing quote: to the end of the line
    if s[start:start + 1] in ("{", "["):
        depth, i = 0, start
        while i < len(s) and s[i] != "\n":
            depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(s[i], 0)
            i += 1
            if depth == 0:
                break
        return i, ""
    w = _BARE.match(s, start)
    return (w.end(), "") if w else (None, "")


def _escaped(s: str, i: int) -> bool:
    """Is the character at ``i`` escaped (an odd number of backslashes before it)?"""
    n = 0
    while i - n - 1 >= 0 and s[i - n - 1] == "\\":
        n += 1
    return n % 2 == 1


def is_secret_flag(word: str) -> bool:
    """A flag named for a secret (SECRET_FLAG), as written or with ``=VALUE``."""
    return word.startswith("-") and bool(_SECRET_FLAG_RE.fullmatch(word.split("=", 1)[0]))


def redact_args(args: Iterable[str]) -> tuple[str, ...]:
    """An argument list with every secret masked: the word after a secret flag whatever it is
    (a flag-looking word too; after a secret flag that is itself such a value, the next word as
    well), the value of ``--secret-flag=VALUE``, and every word through ``redact``. A placeholder
    (``<your api-key>``, user_command.placeholder) stays."""
    out: list[str] = []
    pending = False
    for a in args:
        if pending:
            pending = is_secret_flag(a) and "=" not in a
            out.append(a if _PLACEHOLDER.fullmatch(a) else MASK)
        elif is_secret_flag(a):
            name, eq, value = a.partition("=")
            out.append(name + eq + (value if _PLACEHOLDER.fullmatch(value) else MASK) if eq else a)
            pending = not eq
        else:
            out.append(redact(a))
    return tuple(out)
