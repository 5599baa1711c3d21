"""A pasted command line split into argv the way bash, PowerShell or cmd would, without running a
shell: quoting and line continuations (``\\``, a backtick, ``^`` at a line's end) are undone, and
anything a shell would run or expand (``;``, ``|``, ``&&``, redirections, ``$(...)``, backticks,
variables, wildcards, brace expansions, ``$'...'``, a script's ``%1``) is refused with one line
naming it, never passed on or run. The inverse of app.core.engines.render for every argv that
render writes."""

from __future__ import annotations

import os
import re

from app.core.common.errors import UserError

SHELLS = ("bash", "powershell", "cmd")
MAX_COMMAND_CHARS = 64 * 1024  # a pasted command longer than this is not a server command

_PS_SINGLE = "'\u2018\u2019\u201a\u201b"  # each ends a single-quoted string in PowerShell (render.PS_SINGLE_QUOTES)
_WINDOWS_PATH = re.compile(r'^\s*(?:&\s*)?["\']?(?:[A-Za-z]:\\|\.\\|\\\\)|\.exe\b', re.IGNORECASE)


class CommandError(UserError):
    """A pasted command that cannot be taken as a llama-server argv (said in one line)."""


def guess_shell(text: str) -> str:
    """The shell a pasted command was written for: cmd for ``^`` continuations, PowerShell for
    backtick continuations, the call operator ``&`` or a Windows path (without cmd's ``^``),
    else bash."""
    if re.search(r"\^\r?\n", text):
        return "cmd"
    if re.search(r"`\r?\n", text) or re.match(r"\s*&\s", text):
        return "powershell"
    if re.search(r"\\\r?\n", text):
        return "bash"
    if _WINDOWS_PATH.search(text):
        return "cmd" if "^" in text or re.search(r"%\w+%", text) else "powershell"
    return "bash"


def split_command(text: str, shell: str = "auto") -> tuple[list[str], str]:
    """(argv, the shell it was read as) of ``text``; CommandError for what would make a shell do
    more than start one program (see the module doc), for an unclosed quote and for nothing."""
    if len(text) > MAX_COMMAND_CHARS:
        raise CommandError(f"the command is {len(text):,} characters long; a llama-server command is shorter "
                           f"than {MAX_COMMAND_CHARS:,}")
    if "\0" in text:
        raise CommandError("the command contains a NUL character")
    shell = guess_shell(text) if shell == "auto" else shell
    if shell not in SHELLS:
        raise CommandError(f"unknown shell {shell!r}: use bash, powershell or cmd")
    argv = {"bash": _bash, "powershell": _powershell, "cmd": _cmd}[shell](text.replace("\r\n", "\n"))
    if not argv:
        raise CommandError("the command is empty: paste the whole llama-server command")
    return argv, shell


def _refuse(what: str, shell: str) -> CommandError:
    return CommandError(f"the command has {what}, which {shell} would run or expand; nothing is run here: "
                        "paste one llama-server command with its flags only")


class _Words:
    """The words being built: a word begins at its first character (quotes included)."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self.cur: list[str] | None = None

    def add(self, s: str) -> None:
        if self.cur is None:
            self.cur = []
        self.cur.append(s)

    def end(self) -> None:
        if self.cur is not None:
            self.words.append("".join(self.cur))
            self.cur = None

    @property
    def at_start(self) -> bool:
        return self.cur is None


def _bash(text: str) -> list[str]:
    """POSIX shell words: '...' literal, "..." with \\ before $ ` " \\ only, \\ outside quotes."""
    text = re.sub(r"\\\n", "", text)
    w, i, n = _Words(), 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            w.end()
        elif c == "\n":
            if text[i + 1:].strip():
                raise _refuse("a line break without a \\ at the end of the line (a second command)", "bash")
        elif c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise CommandError("a single quote (') is not closed")
            w.add(text[i + 1:j])
            i = j
        elif c == '"':
            i = _bash_double(text, i + 1, w)
        elif c == "\\":
            if i + 1 < n:
                w.add(text[i + 1])
                i += 1
        elif c in ";&|<>()`" or (c == "$" and i + 1 < n and re.match(r"[A-Za-z_{(0-9@*#?$!'\"-]", text[i + 1])):
            raise _refuse(_name(text, i), "bash")
        elif _bash_expansion(text, i, w.at_start):
            raise _refuse(_bash_expansion(text, i, w.at_start), "bash")
        elif c == "#" and w.at_start:
            raise _refuse("a comment (#)", "bash")
        elif c == "~" and w.at_start and (i + 1 == n or text[i + 1] in "/ \t\n"):
            w.add(os.path.expanduser("~"))  # the home folder, as bash writes it out
        elif c == "=" and w.cur is not None and not w.words and re.fullmatch(r"[A-Za-z_]\w*", "".join(w.cur)):
            raise CommandError(f"the command starts with an environment setting ({''.join(w.cur)}=...); it is not "
                               "passed on: set it where you start mtp-tuner, and paste the llama-server command")
        else:
            w.add(c)
        i += 1
    w.end()
    return w.words


def _bash_expansion(text: str, i: int, at_start: bool) -> str:
    """What bash would expand from ``i`` outside quotes into other words or file names ("": none):
    a wildcard (``*``, ``?``, ``[...]``), a brace expansion (``{a,b}``, ``{1..3}``), ``~name``."""
    c = text[i]
    if c in "*?" or (c == "[" and re.match(r"\[[^\s\]]*\]", text[i:])):
        return f"a wildcard ({c})"
    if c == "{" and re.match(r"\{[^\s{}]*(,|\.\.)[^\s{}]*\}", text[i:]):
        return "a brace expansion ({a,b})"
    if c == "~" and at_start and re.match(r"~[A-Za-z_+-]", text[i:]):
        return "a home folder by name (~name)"
    return ""


def _bash_double(text: str, i: int, w: _Words) -> int:
    """A double-quoted part from ``i``; returns the closing quote's index."""
    out: list[str] = []
    while i < len(text):
        c = text[i]
        if c == '"':
            w.add("".join(out))
            return i
        if c == "\\" and i + 1 < len(text) and text[i + 1] in '$`"\\':
            out.append(text[i + 1])
            i += 2
            continue
        if c == "`" or (c == "$" and i + 1 < len(text) and re.match(r"[A-Za-z_{(0-9@*#?$!-]", text[i + 1])):
            raise _refuse(_name(text, i), "bash")
        out.append(c)
        i += 1
    raise CommandError('a double quote (") is not closed')


def _powershell(text: str) -> list[str]:
    """PowerShell argument mode: '...' literal ('' is one quote), "..." with ` escapes and ""
    for a quote, ` outside quotes; a leading call operator & is dropped."""
    text = re.sub(r"`\n", "", text)
    text = re.sub(r"^\s*&\s+", "", text)
    w, i, n = _Words(), 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            w.end()
        elif c == "\n":
            if text[i + 1:].strip():
                raise _refuse("a line break without a ` at the end of the line (a second command)", "PowerShell")
        elif c in _PS_SINGLE:
            part: list[str] = []
            i += 1
            while True:
                if i >= n:
                    raise CommandError("a single quote (') is not closed")
                if text[i] in _PS_SINGLE:
                    if i + 1 < n and text[i + 1] in _PS_SINGLE:
                        part.append(text[i])
                        i += 2
                        continue
                    break
                part.append(text[i])
                i += 1
            w.add("".join(part))
        elif c == '"':
            i = _ps_double(text, i + 1, w)
        elif c == "`":
            if i + 1 < n:
                w.add(text[i + 1])
                i += 1
        elif c in ";&|<>(){}" or (c == "$" and i + 1 < n and re.match(r"[A-Za-z_{(?^$:]", text[i + 1])) \
                or (c == "@" and w.at_start and i + 1 < n and text[i + 1] in "({"):
            raise _refuse(_name(text, i), "PowerShell")
        elif c in "*?":  # PowerShell on Linux and macOS expands these for a program's arguments
            raise _refuse(f"a wildcard ({c})", "PowerShell")
        elif c == "#" and w.at_start:
            raise _refuse("a comment (#)", "PowerShell")
        elif text.startswith("--%", i) and w.at_start and (i + 3 == n or text[i + 3] in " \t\n"):
            raise _refuse("the stop-parsing token --%", "PowerShell")
        else:
            w.add(c)
        i += 1
    w.end()
    return w.words


def _ps_double(text: str, i: int, w: _Words) -> int:
    out: list[str] = []
    while i < len(text):
        c = text[i]
        if c == '"':
            if i + 1 < len(text) and text[i + 1] == '"':
                out.append('"')
                i += 2
                continue
            w.add("".join(out))
            return i
        if c == "`" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
            continue
        if c == "$" and i + 1 < len(text) and re.match(r"[A-Za-z_{(?^$:]", text[i + 1]):
            raise _refuse(_name(text, i), "PowerShell")
        out.append(c)
        i += 1
    raise CommandError('a double quote (") is not closed')


def _cmd(text: str) -> list[str]:
    """cmd's layer (^ escapes and & | < > outside quotes, %VAR% anywhere), then the Microsoft C
    runtime's argv rules llama-server's own parser follows (backslashes before a quote)."""
    text = re.sub(r"\^\n", "", text)
    var = re.search(r"%[A-Za-z_][^%\s\"]*%", text)
    if var:
        raise _refuse(f"a variable ({var.group(0)})", "cmd")
    param = re.search(r"%(?:[0-9*]|~[A-Za-z$:]*[0-9])", text)
    if param:
        raise _refuse(f"a script's parameter ({param.group(0)})", "cmd")
    line: list[str] = []
    quoted, i = False, 0
    while i < len(text):  # cmd's layer: what reaches the program's command line
        c = text[i]
        if c == '"':
            quoted = not quoted
        elif not quoted and c == "^":
            i += 1
            if i < len(text):
                line.append("\0" + text[i])  # escaped: literal for the runtime's rules too
            i += 1
            continue
        elif not quoted and c in "&|<>":
            raise _refuse(_name(text, i), "cmd")
        elif c == "\n":
            if text[i + 1:].strip():
                raise _refuse("a line break without a ^ at the end of the line (a second command)", "cmd")
            c = " "
        line.append(c)
        i += 1
    if quoted:
        raise CommandError('a double quote (") is not closed')
    return _msvcrt(line)


def _msvcrt(chars: list[str]) -> list[str]:
    """The Microsoft C runtime's split of a command line (``\\0x`` marks a cmd-escaped x, taken
    as written): 2n backslashes before a quote are n and the quote toggles, 2n+1 are n and a
    literal quote, "" inside quotes is a quote; other backslashes are themselves."""
    w, quoted, i = _Words(), False, 0
    while i < len(chars):
        c = chars[i]
        if c.startswith("\0"):
            w.add(c[1:])
        elif c == "\\":
            j = i
            while j < len(chars) and chars[j] == "\\":
                j += 1
            if j < len(chars) and chars[j] == '"':
                w.add("\\" * ((j - i) // 2))
                if (j - i) % 2:
                    w.add('"')
                    i = j + 1
                    continue
                i = j
                continue
            w.add("\\" * (j - i))
            i = j
            continue
        elif c == '"':
            if quoted and i + 1 < len(chars) and chars[i + 1] == '"':
                w.add('"')
                i += 2
                continue
            quoted = not quoted
            w.add("")
        elif c in " \t" and not quoted:
            w.end()
        else:
            w.add(c)
        i += 1
    w.end()
    return w.words


def _name(text: str, i: int) -> str:
    """What the character at ``i`` starts, for a message: ``;``, ``&&``, ``$(...)``, ``$HOME``."""
    two = text[i:i + 2]
    if two in ("&&", "||", "$(", "${", ">>", "@("):
        return {"$(": "a command substitution $(...)", "${": "a variable ${...}", "@(": "a subexpression @(...)"}.get(
            two, f"'{two}'")
    if two in ("$'", '$"'):
        return f"a quoted string with expansions ({two}...{two[1]})"
    if text[i] == "$":
        m = re.match(r"\$\w+", text[i:])
        return f"a variable ({m.group(0)})" if m else f"'{text[i]}'"
    if text[i] == "`":
        return "a backtick (command substitution)"
    return f"'{text[i]}'"
