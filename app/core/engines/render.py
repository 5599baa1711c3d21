"""Rendering one llama-server argv for a shell (bash, PowerShell, cmd), as a script file, or as a
llama-server preset (INI): exactly the arguments, or a UserError naming the one a shell cannot
carry. Pure functions; the argv comes from app.core.engines.commands.build_server_argv."""

from __future__ import annotations

import re
import shlex

from app.core.common.errors import UserError

SHELLS = ("bash", "powershell", "cmd")
# PowerShell's tokenizer takes each of these as a single quote (CharExtensions.IsSingleQuote): any
# of them ends a single-quoted string, so each is doubled inside one, as ' is.
PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
# bare words PowerShell's argument mode passes on as written: a flag, a plain integer, or a word
# that starts with a letter. Anything else is quoted: a comma makes an array (two arguments), and a
# number literal may be converted (0x10 -> 16, 1kb -> 1024, 1e3 -> 1000, 0.50 -> 0.5).
_PS_FLAG = re.compile(r"^--?[A-Za-z][A-Za-z0-9-]*$")
_PS_BARE = re.compile(r"^(?:0|[1-9][0-9]*|[A-Za-z][A-Za-z0-9_.-]*)$")
_CMD_META = set('&|<>^()')
# cmd cannot carry these, quoted or not: a line feed ends the command (in a script as well as
# typed) and carriage returns are dropped, so a path with a line break would be cut in two; the
# other control characters are not safe either (Ctrl-Z can end what cmd reads of a script line,
# pasted ones act as console keys). Tab is fine (quoted). Refused with a message naming the argument.
_CMD_CONTROLS = frozenset(chr(i) for i in range(32)) - {"\t"}


def _visible(a: str) -> str:
    """``a`` for a message: control characters written as escapes, the rest as is."""
    return "".join(repr(c)[1:-1] if ord(c) < 32 or c == "\x7f" else c for c in a)


def _argument_name(argv: list[str], i: int) -> str:
    if i == 0:
        return "the llama-server path"
    if argv[i - 1].startswith("-") and i > 1:
        return f"the value of {argv[i - 1]}"
    return f"argument {i} ({argv[i]!r})" if not any(ord(c) < 32 for c in argv[i]) else f"argument {i}"


def check_renderable(argv: list[str], shell: str) -> None:
    """Raise UserError, naming the argument, when ``shell`` cannot carry one of ``argv`` exactly.

    Every shell: no NUL (no program argument can hold one) and no lone surrogate (a file name that
    is not valid text cannot be written into a UTF-8 script). bash and PowerShell: anything else,
    line breaks included - their single-quoted strings hold any character, a newline as well.
    cmd: no line break or other control character (see _CMD_CONTROLS), no double quote in the
    program's path (Windows paths cannot have one, and the runtime reads the program name without
    escapes)."""
    for i, a in enumerate(argv):
        what = _argument_name(argv, i)
        if "\0" in a:
            raise UserError(f"cannot write this command for {shell}: {what} ({_visible(a)}) contains a NUL "
                            "character, which no program argument can hold")
        if any("\ud800" <= c <= "\udfff" for c in a):
            raise UserError(f"cannot write this command for {shell}: {what} is not valid text (a file name "
                            f"in another encoding?): {a.encode('utf-8', 'backslashreplace').decode('ascii')}; "
                            "rename it")
        if shell == "cmd":
            bad = next((c for c in a if c in _CMD_CONTROLS), None)
            if bad is not None:
                kind = "a line break" if bad in "\n\r" else f"a control character ({_visible(bad)})"
                raise UserError(f"cannot write this command for cmd: {what} ({_visible(a)}) contains {kind}, "
                                "which a cmd command cannot carry; rename the file or folder, or export for "
                                "PowerShell or bash")
            if i == 0 and '"' in a:
                raise UserError(f"cannot write this command for cmd: {what} ({a}) contains a double quote")


# a secret's placeholder (user_command.placeholder: "<your api-key>") and the environment variable
# an exported command reads the secret from instead (llama-server reads LLAMA_API_KEY itself too)
_SECRET = re.compile(r"<your ([a-z0-9-]+)>")
_SECRET_VARS = {"hf-token": "HF_TOKEN"}


def secret_variable(placeholder: str) -> str | None:
    """The environment variable for a secret's placeholder (``<your api-key>``: LLAMA_API_KEY)."""
    m = _SECRET.fullmatch(placeholder)
    if m is None:
        return None
    return _SECRET_VARS.get(m.group(1), "LLAMA_" + m.group(1).upper().replace("-", "_"))


def secret_reference(variable: str, shell: str) -> str:
    """How ``shell`` reads ``variable`` as one argument: ``"$V"``, ``$env:V`` or ``"%V%"``."""
    return {"powershell": f"$env:{variable}", "cmd": f'"%{variable}%"'}.get(shell, f'"${variable}"')


def secret_note(argv: list[str], shell: str) -> str | None:
    """One line saying to set the variables an env_secrets render reads (None: it reads none)."""
    names = list(dict.fromkeys(v for a in argv if (v := secret_variable(a))))
    if not names:
        return None
    how = {"powershell": "$env:{0} = '...'", "cmd": "set {0}=..."}.get(shell, "export {0}='...'")
    return ("set " + ", ".join(names) + " to your secret first (" + "; ".join(how.format(n) for n in names)
            + "): the command reads it from there")


def render(argv: list[str], shell: str, *, env_secrets: bool = False) -> str:
    """One command line for ``shell`` that runs exactly ``argv``, to copy into an open window.

    Raises UserError (naming the argument) for an argument the shell cannot carry, see
    check_renderable. bash/zsh: POSIX quoting (shlex). PowerShell (7.3+, native argument passing
    "Standard"): the call operator ``&`` and single-quoted strings, every kind of single quote
    doubled inside. cmd: each argument quoted by the Microsoft C runtime rules (what llama-server's
    argv parser undoes), then cmd's own layer: ``^`` before & | < > ^ ( ) where cmd sees them
    unquoted, and each ``%`` written as ``"%"`` (see _msvcrt_quote). A saved .cmd script needs a
    different line (``%%``): render_script.

    ``env_secrets``: a secret's placeholder (``<your api-key>``) is written as a reference to its
    environment variable that the shell resolves (secret_reference; say so: secret_note), so the
    command pasted as it is never passes the placeholder as the key."""
    return _render(argv, shell, script=False, env_secrets=env_secrets)


def _render(argv: list[str], shell: str, *, script: bool, env_secrets: bool = False) -> str:
    if not env_secrets or not any(secret_variable(a) for a in argv):
        return _render_words(argv, shell, script=script)
    import secrets

    marks: dict[str, str] = {}  # a bare word no shell quotes, unguessable, for each placeholder
    words = []
    for a in argv:
        v = secret_variable(a)
        if v is not None:
            mark = marks.setdefault(a, "mtpsecret" + secrets.token_hex(8) + "x")
            words.append(mark)
        else:
            words.append(a)
    line = _render_words(words, shell, script=script)
    for a, mark in marks.items():
        line = line.replace(mark, secret_reference(secret_variable(a) or "", shell))
    return line


def _render_words(argv: list[str], shell: str, *, script: bool) -> str:
    if shell not in ("bash", "zsh", "sh", "powershell", "cmd"):
        raise ValueError(f"unknown shell {shell!r}; use one of {', '.join(SHELLS)}")
    check_renderable(argv, shell)
    if shell in ("bash", "zsh", "sh"):
        return shlex.join(argv)
    if shell == "powershell":
        parts = []
        for i, a in enumerate(argv):
            bare = i > 0 and (_PS_FLAG.fullmatch(a) or _PS_BARE.fullmatch(a))  # not match: "$" passes "0\n"
            parts.append(a if bare else "'" + "".join(c * 2 if c in PS_SINGLE_QUOTES else c for c in a) + "'")
        return "& " + " ".join(parts)
    line = " ".join(_msvcrt_quote(a, program=i == 0, script=script) for i, a in enumerate(argv))
    return _cmd_escape(line, script=script)


def _msvcrt_quote(a: str, *, program: bool = False, script: bool = True) -> str:
    """``a`` as the Microsoft C runtime reads it back: in double quotes where it has a space, tab,
    quote or a character cmd treats specially; backslashes doubled before a quote, quotes escaped.

    The program name (``program``) is read without escapes, up to a space outside quotes, so it is
    only put in quotes. Typed into an open cmd window (``script`` False), ``%NAME%`` would expand
    where NAME is a variable, and ``%%`` stays two characters; so each ``%`` closes the quotes and
    opens them again right after it (``"100"%"\\m.gguf"``): every ``%`` is then followed by a quote,
    and no variable name starts with a quote. A script doubles ``%`` instead (_cmd_escape)."""
    if a and not any(c in a for c in ' \t"&|<>^()%!'):
        return a
    out, bs = ['"'], 0
    for c in a:
        if c == "\\" and not program:
            bs += 1
            continue
        if c == '"':
            out.append("\\" * (2 * bs + 1) + '"')
        elif c == "%" and not script:
            out.append("\\" * (2 * bs) + '"%"')
        else:
            out.append("\\" * bs + c)
        bs = 0
    out.append("\\" * (2 * bs) + '"')
    return "".join(out)


def _cmd_escape(line: str, *, script: bool = True) -> str:
    out, quoted = [], False
    for c in line:
        if c == '"':
            quoted = not quoted
            out.append(c)
        elif c == "%" and script:
            out.append("%%")
        elif c in _CMD_META and not quoted:
            out.append("^" + c)
        else:
            out.append(c)
    return "".join(out)


SCRIPT_HEADS = {"bash": "#!/bin/sh\n", "powershell": "", "cmd": "@echo off\r\n"}


def render_script(argv: list[str], shell: str, *, env_secrets: bool = False) -> bytes:
    """The bytes of a script file that runs ``argv`` in ``shell`` (UTF-8; saved as they are).

    bash: ``#!/bin/sh`` and the command, LF line ends. PowerShell: the command, with a UTF-8 BOM when
    it is not all ASCII (Windows PowerShell 5.1 reads a .ps1 without a BOM in the ANSI code page;
    PowerShell 7 reads either). cmd: CRLF line ends, ``%`` doubled, and no BOM (cmd would take it as
    part of the first command).

    cmd reads a script in the console's code page (437, 850, 1252...), line by line, each line just
    before it runs, so "Ana María" saved as UTF-8 reads as "Mar├¡a". Refusing non-ASCII would refuse
    users whose Windows user name (and so every path under their profile) has an accent; so a
    command that is not all ASCII is wrapped: the current code page is saved, ``chcp 65001`` (UTF-8)
    runs before the command line is read, and the old code page is put back after llama-server
    exits (the console window is shared with whatever ran the script), keeping its exit code. The
    lines read before the switch and after it are ASCII, so they read the same in any code page.
    (Stopping llama-server with Ctrl+C and answering Y to "Terminate batch job" skips the restore.)
    An all-ASCII command reads the same in every code page and gets no switch. The one-line command
    shown for pasting into an open window (render) needs no chcp either: the console hands typed
    and pasted text to cmd as Unicode, whatever the code page."""
    if shell not in SCRIPT_HEADS:
        raise ValueError(f"unknown shell {shell!r}; use one of {', '.join(SHELLS)}")
    line = _render(argv, shell, script=True, env_secrets=env_secrets)
    if shell == "bash":
        return (SCRIPT_HEADS[shell] + line + "\n").encode("utf-8")
    if shell == "powershell":
        return (("" if line.isascii() else "\ufeff") + line + "\n").encode("utf-8")
    lines = ["@echo off"]
    if line.isascii():
        lines.append(line)
    else:
        lines += ["setlocal",
                  'set "MTP_TUNER_CP="',
                  # "Active code page: 850" (or "Aktive Codepage: 850." ...): the number after the colon
                  "for /f \"tokens=2 delims=:.\" %%p in ('chcp') do set /a \"MTP_TUNER_CP=%%p\" >nul 2>nul",
                  "chcp 65001 >nul",
                  line,
                  'set "MTP_TUNER_RC=%ERRORLEVEL%"',
                  "if defined MTP_TUNER_CP chcp %MTP_TUNER_CP% >nul",
                  "exit /b %MTP_TUNER_RC%"]
    return ("\r\n".join(lines) + "\r\n").encode("utf-8")


def render_preset(argv: list[str], name: str = "mtp-tuner") -> str:
    """A llama-server preset (INI) section with the same options (``--models-preset``). An INI
    value is one line: a value with a line break (or another control character) cannot be
    written, and would add lines of its own (``model = a.gguf`` + ``port = 1``): ValueError."""
    lines = [f"[{name}]"]
    i = 1
    while i < len(argv):
        a = argv[i]
        key = a.lstrip("-")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
            if any(ord(c) < 32 or ord(c) == 127 for c in value):
                raise ValueError(f"the {key} value {value!r} has a line break or another control character, "
                                 "which an INI value cannot hold")
            lines.append(f"{key} = {value}")
            i += 2
        else:
            lines.append(f"{key} = true")
            i += 1
    return "\n".join(lines) + "\n"
