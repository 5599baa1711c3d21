"""The one capped read of a file the user names (common.reading.read_capped): every reader of a
command, chat template, token, prompt, community table or release listing file goes through it, so
each refuses in one line naming the file and the cause, and a file over the cap is refused from
its size, before a byte is read (no 256 MiB read to learn that a file is too long)."""

from __future__ import annotations

import re

import pytest

from app.core.analysis.community_cells import MAX_BYTES, read_table_text
from app.core.common import reading
from app.core.common.errors import UserError
from app.core.engines.chat_template import MAX_TEMPLATE_FILE_BYTES, user_template
from app.core.engines.user_command import MAX_FILE_BYTES, read_command_file
from app.core.machine.hub_token import MAX_TOKEN_FILE, read_token
from app.core.machine.runtime_release import MAX_RELEASE_BYTES, load_releases
from app.core.measure.prompts import MAX_PROMPT_FILE_BYTES, load_prompt_file

READERS = [  # (read the file, its cap, what the refusal calls it, the cap in words)
    (read_command_file, MAX_FILE_BYTES, "command file", "64 KiB"),
    (lambda p: user_template(["--chat-template-file", p]), MAX_TEMPLATE_FILE_BYTES, "chat template file", "1 MiB"),
    (read_token, MAX_TOKEN_FILE, "token file", "4 KiB"),
    (load_prompt_file, MAX_PROMPT_FILE_BYTES, "prompt file", "256 MiB"),
    (read_table_text, MAX_BYTES, "community table", "4 MiB"),
    (load_releases, MAX_RELEASE_BYTES, "release listing", "16 MiB"),
]


class Asked(list):
    """The read sizes asked of the files opened; ``grow``: bytes appended to a file after it was
    opened (after its size was looked at), as a file written meanwhile grows."""

    grow = 0


class _Spy:
    """open_regular's file, noting each read in ``asked`` (and growing the file first, when asked)."""

    def __init__(self, f, path, asked: Asked) -> None:
        self.f, self.path, self.asked = f, path, asked

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def fileno(self):
        return self.f.fileno()

    def read(self, n=-1):
        if self.asked.grow:
            with open(self.path, "ab") as g:
                g.write(b"x" * self.asked.grow)
        self.asked.append(n)
        return self.f.read(n)


@pytest.fixture
def asked(monkeypatch):
    calls = Asked()
    real = reading.open_regular
    monkeypatch.setattr(reading, "open_regular", lambda path, what, buffering=-1: _Spy(real(path, what, buffering),
                                                                                         path, calls))
    return calls


@pytest.mark.parametrize("read, cap, what, words", READERS, ids=[r[2] for r in READERS])
def test_a_file_over_the_cap_is_refused_from_its_size_before_a_byte_is_read(tmp_path, asked, read, cap, what, words):
    big = tmp_path / "big.file"
    with open(big, "wb") as f:
        f.truncate(cap + 1)  # sparse: a size past the cap, nothing written
    with pytest.raises(UserError) as e:
        read(str(big))
    assert str(e.value) == f"{big}: {cap + 1:,} bytes, more than the {words} a {what} may have" + (
        " (--chat-template-file)" if what == "chat template file" else "")
    assert asked == []  # refused from fstat's size: nothing was read


GROWN = [r for r in READERS if r[1] <= 16 << 20]  # (not 256 MiB written to grow a prompt file)


@pytest.mark.parametrize("read, cap, what, words", GROWN, ids=[r[2] for r in GROWN])
def test_a_file_that_grows_past_the_cap_while_read_is_refused(tmp_path, asked, read, cap, what, words):
    f = tmp_path / "growing.file"
    f.write_bytes(b"x")
    asked.grow = cap + 10  # written after the size was looked at
    with pytest.raises(UserError, match=rf"growing\.file: {cap + 1:,} bytes, more than the {words} a {what}"):
        read(str(f))
    assert asked == [cap + 1]  # the cap and one byte, never the whole file


@pytest.mark.parametrize("read, cap, what, words", READERS, ids=[r[2] for r in READERS])
def test_a_missing_file_and_a_folder_are_named_with_their_cause(tmp_path, read, cap, what, words):
    gone = tmp_path / "gone.file"
    with pytest.raises(UserError, match=rf"^{re.escape(str(gone))}: {what} not found"):
        read(str(gone))
    with pytest.raises(UserError, match=rf"^{re.escape(str(tmp_path))}: is a folder.*: the {what}.* must be a file$"):
        read(str(tmp_path))
