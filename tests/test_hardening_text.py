"""Text from outside reaches no terminal, table or card raw: a model name, a prompt id, a task, a
release's tag or a binary's --version text carrying escape sequences is shown with its control
characters as visible escapes, in the CLI (recommend, compare, card, runtime list), the window's
tables and labels, and the card's Markdown, JSON and PNG."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "compare_before.jsonl"
# a title change, a colour, a screen clear, a one-byte CSI, a carriage return that hides what
# came before, and a right-to-left override
HOSTILE = "\x1b]0;pwned\x07\x1b[31mred\x1b[2J\x9b6n\rhidden\u202eevil"
RAW = ("\x1b", "\x07", "\x9b", "\r", "\u202e")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, timeout=300,
                          env=e)


def _assert_clean(r: subprocess.CompletedProcess, *, shown: bool = True) -> str:
    out = (r.stdout + r.stderr).decode("utf-8")
    assert "Traceback" not in out, out
    for ch in RAW:
        assert ch not in out, (ch, out)
    if shown:
        assert "\\u001b" in out, out  # shown, as an escape: not dropped silently
    return out


def _hostile_sweep(tmp_path: Path) -> Path:
    """The fixture sweep with escape sequences in the model's file name, the prompt ids and the build."""
    path = tmp_path / "hostile.jsonl"
    with ResultsWriter(path) as w:
        for r in load_records(FIXTURE):
            w.append(dataclasses.replace(r, model_path=f"/models/{HOSTILE}-Q4_K_M.gguf",
                                         prompt_id=r.prompt_id + HOSTILE, llama_build="b1" + HOSTILE))
    return path


def test_printable_escapes_every_control_and_keeps_json_valid():
    from app.core.common.text import printable

    s = printable(HOSTILE)
    assert not any(ch in s for ch in RAW) and "\\u001b]0;pwned\\u0007" in s and "\\u202e" in s
    assert printable("two\nlines\tand a tab") == "two\nlines\tand a tab"
    assert printable("two\nlines", one_line=True) == "two\\u000alines"
    doc = json.dumps({"name": HOSTILE}, ensure_ascii=False)
    assert json.loads(printable(doc)) == {"name": HOSTILE}  # the escape is JSON's own


@given(st.text())
def test_printable_leaves_no_control_character_and_is_stable(text):
    from app.core.common.text import printable

    s = printable(text)
    assert all(ch in "\n\t" or (ord(ch) >= 0x20 and not 0x7f <= ord(ch) <= 0x9f) for ch in s)
    assert printable(s) == s


def test_recommend_and_compare_show_escapes_not_raw_sequences(tmp_path):
    path = _hostile_sweep(tmp_path)
    r = _cli("recommend", str(path))
    assert r.returncode == 0, r.stderr
    _assert_clean(r)
    r = _cli("recommend", str(path), "--json")
    assert r.returncode == 0, r.stderr
    _assert_clean(r, shown=False)
    json.loads(r.stdout)  # still one valid JSON document
    r = _cli("compare", str(FIXTURE), str(path))
    assert r.returncode in (0, 1), r.stderr
    _assert_clean(r)


def test_the_card_shares_no_control_characters(tmp_path):
    pytest.importorskip("PySide6")
    from app.drawing import card_png
    from app.core.verdict.card import card_from_json, card_json, card_of, markdown_row

    path = _hostile_sweep(tmp_path)
    card = card_of(load_records(path))
    md, js = markdown_row(card), card_json(card)
    for ch in RAW:
        assert ch not in md and ch not in js and ch not in repr(card)
    assert "\\u001b" in md
    assert card_from_json(js) == card
    # a card pasted from elsewhere is cleaned as it is read
    other = json.loads(js)
    other["model"] = HOSTILE
    assert "\x1b" not in card_from_json(json.dumps(other)).model
    assert card_png.png_bytes(card_png.render_card(card)).startswith(b"\x89PNG")
    r = _cli("card", str(path), "--json")
    assert r.returncode == 0, r.stderr
    _assert_clean(r, shown=False)
    r = _cli("card", str(path))
    assert r.returncode == 0, r.stderr
    _assert_clean(r)


def test_runtime_list_shows_a_hostile_tag_and_version_escaped(tmp_path):
    home = tmp_path / "home"
    folder = home / "data" / "runtimes" / "b1-cpu"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "llama-server").write_text("#!/bin/sh\n")
    (folder / "runtime.json").write_text(json.dumps({
        "name": "b1-cpu", "server": "bin/llama-server", "tag": "b1" + HOSTILE, "backend": "cpu",
        "asset": "llama-b1-bin-ubuntu-x64.tar.gz", "version": "version: 1 (abc)" + HOSTILE, "devices": [HOSTILE],
        "why": HOSTILE}))
    r = _cli("runtime", "list", env={"MTP_TUNER_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    out = _assert_clean(r)
    assert "b1-cpu" in out


def test_the_progress_line_keeps_its_own_redraw(capsys, monkeypatch):
    """The CLI's progress line still redraws in place on a terminal (its own escape), while the
    text it shows is cleaned."""
    from app.cli.common import Progress, clean_output

    with clean_output():
        p = Progress()
        p.tty = True
        p.line("code/p" + HOSTILE)
    err = capsys.readouterr().err
    assert err.startswith("\r\x1b[K") and "\x1b" not in err[4:] and "\\u001b" in err


def test_the_windows_tables_and_labels_show_escapes(window, tmp_path):
    from app.gui.common import fill, table

    t = table(["a", "b"])
    fill(t, [(HOSTILE, 1)], tips=[HOSTILE])
    assert "\x1b" not in t.item(0, 0).text() and "\\u001b" in t.item(0, 0).text()
    assert "\x1b" not in t.item(0, 0).toolTip()
    results = window.results_tab
    results.open_results(str(_hostile_sweep(tmp_path)))
    cells = [results.equiv_table.item(r, 1).text() for r in range(results.equiv_table.rowCount())]
    cells += [results.file_sweep_box.itemText(i) for i in range(results.file_sweep_box.count())]
    cells.append(window.export_tab.verdict_label.text())
    assert cells and not any(ch in c for c in cells for ch in RAW)
    assert any("\\u001b" in c for c in cells)


def test_the_model_tab_shows_a_hostile_file_name_escaped(window, tmp_path, make_model):
    import shutil

    hostile = tmp_path / f"m{HOSTILE}.gguf"
    shutil.copy(make_model(0.0), hostile)
    window.state.set_model(str(hostile))
    info = window.model_tab.model_info.toPlainText()
    assert str(tmp_path) in info and "\\u001b" in info
    assert not any(ch in info for ch in RAW)
    hostile.write_bytes(b"not a gguf")  # the error names the file: cleaned too
    window.model_tab.inspect_model()
    info = window.model_tab.model_info.toPlainText()
    assert "not a GGUF" in info and not any(ch in info for ch in RAW)
