"""One rule for outside text (issue 36): whatever a file, a server, a release listing, a GGUF's
metadata or another program's name says, it reaches a terminal, a report, a file name or a window
label as one escaped, bounded line. One hostile corpus, every command and label that shows outside
text: no raw control character, no line of its own ("recommendation: run K=8" printed as if the
app had said it), and no 10,000-character name printed whole."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, cli, sparse_gguf

from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter

FIXTURE = ROOT / "tests" / "data" / "compare_before.jsonl"
FORGED = "recommendation: run K=8"
# a title change (OSC ... BEL), a colour, a carriage return that hides what came before, a
# right-to-left override, a NUL, a line break that starts a forged line, and 10,000 characters
HOSTILE = "\x1b]0;pwned\x07\x1b[31mred\rhid\u202eevil\x00\n" + FORGED + "\n" + "A" * 10_000
SHORT = "\x1b]0;pwned\x07\rhid\u202e\x00\n" + FORGED + "\n"
# a results file's text fields are refused past 1,024 characters (RunRecord: MAX_TEXT), so what
# a record shows carries the corpus at a length a record may have
RECORD_TEXT = SHORT + "A" * 600
RAW = ("\x1b", "\x07", "\x9b", "\r", "\u202e", "\x00")
LONGEST_RUN = 1_000  # no piece of the 10,000-character name printed whole


def assert_clean(text: str, where: str = "") -> None:
    """No raw control character, no forged line, no 10k name printed whole."""
    assert "Traceback" not in text, (where, text[-3000:])
    for ch in RAW:
        assert ch not in text, (where, repr(ch), text[:3000])
    for line in text.splitlines():
        assert not line.lstrip(" >*-|#`").startswith(FORGED), (where, line[:300])
    assert "A" * LONGEST_RUN not in text, (where, "the long name printed whole")


def _out(r: subprocess.CompletedProcess) -> str:
    out = r.stdout + r.stderr
    return out if isinstance(out, str) else out.decode("utf-8", "replace")


def hostile_results(tmp_path: Path, text: str = RECORD_TEXT, disturbed: bool = False) -> Path:
    """The fixture sweep with the corpus in every text field a record shows (and, ``disturbed``,
    every other run disturbed by a program named so)."""
    from app.core.measure.busy import DISTURBED

    path = tmp_path / "hostile.jsonl"
    with ResultsWriter(path) as w:
        for i, r in enumerate(load_records(FIXTURE)):
            if disturbed and i % 2:
                r = dataclasses.replace(r, flags=(*r.flags, DISTURBED), other_cpu=0.6)
            w.append(dataclasses.replace(
                r, model_path=f"/models/{text}.gguf", prompt_id=r.prompt_id + text, task=r.task + text,
                llama_build="b1" + text, backend="CPU" + text, devices=("CPU" + text,),
                host={**r.host, "os": text, "gpus": [{"name": text}]}, other_top={"name": text, "cpu": 0.5}))
    return path


def test_a_record_with_a_10k_text_field_is_left_out_with_one_warning_naming_the_line(tmp_path):
    good = load_records(FIXTURE)
    path = tmp_path / "long.jsonl"
    with ResultsWriter(path) as w:
        w.append(dataclasses.replace(good[0], prompt_id="A" * 10_000))
        for r in good[1:]:
            w.append(r)
    problems: list[str] = []
    recs = load_records(path, problems)
    assert len(recs) == len(good) - 1
    assert len(problems) == 1 and f"{path} line 1" in problems[0] and "prompt_id is 10,000 characters" in problems[0]
    r = cli("recommend", str(path))
    assert_clean(_out(r), "recommend")
    assert "line 1" in _out(r)


def test_records_read_clean_even_on_the_fast_path(tmp_path):
    """A record with a line break or an escape in its text is read with it escaped, whichever path
    of the reader reads it (msgspec's fast one looks at no string)."""
    recs = load_records(hostile_results(tmp_path))
    assert recs
    for r in recs:
        for v in (r.model_path, r.prompt_id, r.task, r.llama_build, r.backend, r.devices[0], r.host["os"],
                  r.host["gpus"][0]["name"], r.other_top["name"]):
            assert "\n" not in v and "\x1b" not in v and "\\u000a" in v


@pytest.mark.parametrize("args", [
    ("recommend", "{f}"), ("recommend", "{f}", "--json"), ("recommend", "{f}", "--verbose"),
    ("recommend", "{f}", "--mix", "code=1"),
    ("compare", str(FIXTURE), "{f}"), ("compare", "{f}", "{f}"),
    ("card", "{f}"), ("card", "{f}", "--json"),
    ("bench", "--again", "{f}"),
], ids=lambda a: " ".join(a).replace("{f}", "F"))
def test_every_results_command_shows_the_corpus_as_one_escaped_line(tmp_path, args):
    f = hostile_results(tmp_path)
    r = cli(*[a.replace("{f}", str(f)) for a in args])
    out = _out(r)
    assert_clean(out, " ".join(args))
    if "--json" in args and r.returncode == 0:
        json.loads(r.stdout)  # still one valid document


def test_the_markdown_report_has_no_raw_control_character(tmp_path):
    f = hostile_results(tmp_path)
    report = tmp_path / "report.md"
    r = cli("recommend", str(f), "--report", str(report))
    assert r.returncode == 0, _out(r)
    text = report.read_text(encoding="utf-8")
    assert_clean(text, "report.md")
    assert "\\u001b" in text  # shown, as an escape: not dropped


def test_inspect_and_models_list_show_a_hostile_gguf_escaped(tmp_path):
    """GGUF metadata (its name, its architecture) and the file's own name."""
    home = tmp_path / "home"
    models = home / "data" / "models"
    models.mkdir(parents=True)
    model = models / ("m" + "\x1b[2J\u202e\nrecommendation: run K=8\n" + "B" * 200 + ".gguf")
    sparse_gguf(model, "llama", {"general.name": HOSTILE, "general.architecture": "llama",
                                 "llama.block_count": 2, "llama.embedding_length": 64,
                                 "llama.context_length": 128, "llama.attention.head_count": 4,
                                 "general.description": HOSTILE},
                [("token_embd.weight", (64, 32), "F16")])
    env = {"MTP_TUNER_HOME": str(home)}
    for args in (("inspect", str(model)), ("inspect", str(model), "--json"), ("models", "list")):
        r = cli(*args, env=env)
        assert_clean(_out(r), " ".join(args))


def test_a_hostile_release_tag_is_shown_escaped(tmp_path):
    listing = json.loads((ROOT / "tests" / "data" / "releases_2026late_b11434.json").read_text())
    for rel in listing:
        rel["tag_name"] = "b11434" + SHORT
        rel["name"] = HOSTILE
    path = tmp_path / "releases.json"
    path.write_text(json.dumps(listing))
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"os": "linux", "arch": "x64", "gpus": []}))
    r = cli("runtime", "install", "--dry-run", "--releases", str(path), "--host", str(host))
    assert r.returncode == 0, _out(r)
    assert_clean(_out(r), "runtime install --dry-run")
    assert "would install" in _out(r) and "\\u001b" in _out(r)
    r = cli("runtime", "install", "--dry-run", "--json", "--releases", str(path), "--host", str(host))
    assert_clean(_out(r), "runtime install --dry-run --json")


def _hostile_process(name: str, folder: Path) -> subprocess.Popen:
    """A real process (sleep) whose name as psutil reads it is ``name``: its kernel name is the
    file it ran (a link to sleep named by ``name``'s first 15 bytes), and its command line's first
    word, which psutil takes when it starts with those, is ``name``."""
    link = folder / name.encode()[:15].decode("utf-8", "ignore")
    link.symlink_to("/bin/sleep")
    return subprocess.Popen([name, "30"], executable=str(link), stdout=subprocess.DEVNULL)


def test_a_busy_process_name_is_bounded_and_escaped():
    from app.core.measure.busy_counters import NAME_LIMIT, _name

    s = _name(HOSTILE, 7)
    assert len(s) <= NAME_LIMIT + 1 and "\n" not in s and "\x1b" not in s
    assert _name("", 7) == "pid 7" and _name(None, 8) == "pid 8"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl names a process on Linux")
def test_a_real_process_with_a_10k_hostile_name_is_kept_bounded_and_escaped(tmp_path):
    """The busy check's own reading of a real process named with escapes, a line break and 10,000
    characters: one escaped line of at most NAME_LIMIT characters, and so in the text shown."""
    import psutil

    from app.core.measure.busy import Busy
    from app.core.measure.busy_counters import NAME_LIMIT, sample

    name = HOSTILE.replace("\x00", "")  # a command line cannot hold a NUL
    p = _hostile_process(name, tmp_path)
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(p.pid).name()) < 10_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        raw = psutil.Process(p.pid).name()  # psutil reads the hostile name itself
        assert len(raw) > 10_000 and raw.startswith("\x1b]0;pwned") and "\n" + FORGED in raw
        s = sample()
        assert s is not None
        kept = s.procs[p.pid][0]
        assert len(kept) <= NAME_LIMIT + 1 and kept.startswith("\\u001b")
        assert_clean(kept, "kept name")
        assert_clean(Busy(cpu=0.6, top=name, top_cpu=0.5).text(), "busy text")
    finally:
        p.kill()
        p.wait()


def test_the_window_shows_the_corpus_as_one_escaped_line(window, tmp_path):
    """Every label, text box, table cell and list entry of the window, after it opened a hostile
    results file."""
    from PySide6.QtWidgets import (QAbstractButton, QComboBox, QLabel, QLineEdit, QListWidget,
                                   QPlainTextEdit, QTableWidget, QTextEdit)

    window.results_tab.open_results(str(hostile_results(tmp_path)))
    texts: list[tuple[str, str]] = []
    for w in window.findChildren(QLabel):
        texts.append((w.objectName() or "label", w.text()))
    for w in window.findChildren(QTextEdit) + window.findChildren(QPlainTextEdit):
        texts.append(("text", w.toPlainText()))
    for w in window.findChildren(QLineEdit):
        texts.append(("line", w.text()))
    for w in window.findChildren(QAbstractButton):
        texts.append(("button", w.text()))
    for w in window.findChildren(QComboBox):
        texts += [("combo", w.itemText(i)) for i in range(w.count())]
    for w in window.findChildren(QListWidget):
        texts += [("list", w.item(i).text()) for i in range(w.count())]
    for t in window.findChildren(QTableWidget):
        for r in range(t.rowCount()):
            for c in range(t.columnCount()):
                it = t.item(r, c)
                if it is not None:
                    texts += [("cell", it.text()), ("tip", it.toolTip())]
    assert any("\\u001b" in t for _, t in texts)  # the corpus is shown somewhere, escaped
    for where, t in texts:
        assert_clean(t, where)


def test_the_export_tab_shows_a_long_hostile_busy_name_bounded(window, tmp_path):
    """Runs disturbed by a program with a 10,000-character name carrying escapes and a line break:
    the Export tab's labels show it as one bounded, escaped line (defect 12)."""
    from PySide6.QtWidgets import QLabel

    window.results_tab.open_results(str(hostile_results(tmp_path, disturbed=True)))
    texts = [w.text() for w in window.export_tab.findChildren(QLabel)]
    assert any("busy" in t or "disturbed" in t for t in texts), texts
    for t in texts:
        assert_clean(t, "export label")


def test_a_sweep_over_a_hostile_prompt_file_prints_its_ids_and_tasks_escaped(tmp_path, make_model):
    """A real (short) sweep whose prompt file names its prompts and tasks with the corpus: the
    progress, the table and the verdict show them as one escaped line each; the results read back
    clean."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p" + HOSTILE, "task": "code" + SHORT, "text": "def add(a, b):\n"}) + "\n")
    out = tmp_path / "r.jsonl"
    r = cli("bench", "--model", str(make_model(0.0)), "--prompts", str(prompts), "--replace-prompts", "--k", "1",
            "--reps", "1", "--warmup", "0", "--n-predict", "8", "--out", str(out))
    assert r.returncode == 0, _out(r)
    assert_clean(_out(r), "bench")
    assert "\\u001b" in _out(r)
    r = cli("recommend", str(out), "--verbose")
    assert_clean(_out(r), "recommend")


def test_hub_listings_show_hostile_file_names_escaped(fake_hub):
    """A Hub repo whose files are named with escapes and a line break: `models files` and
    `models search` show them as one escaped line (or refuse them), never raw."""
    fake_hub.add("tester/Hostile-MTP-GGUF", {"x\x1b]0;t\x07\n" + FORGED + "-Q4_K_M.gguf": b"GGUF" + bytes(20),
                                              "ok-Q8_0.gguf": b"GGUF" + bytes(20)})
    for args in (("files", "tester/Hostile-MTP-GGUF"), ("search", "Hostile")):
        r = cli("models", *args, "--endpoint", fake_hub.url)
        assert_clean(_out(r), "models " + " ".join(args))


def test_hw_shows_a_hostile_llama_servers_words_escaped(tmp_path):
    """A llama-server on PATH whose --version and --list-devices carry escapes and a forged line:
    `hw` names its devices and build as one escaped line each."""
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n"
                    "  --version) printf 'version: 1 (abc)\\033]0;pwned\\007\\nrecommendation: run K=8\\n' >&2 ;;\n"
                    "  --list-devices) printf 'Available devices:\\n  CUDA0: \\033[31mNVIDIA\\nrecommendation: run K=8"
                    " (1000 MiB, 900 MiB free)\\n' ;;\n"
                    "  --help) printf -- '--model FNAME\\n--spec-type {none,draft-mtp}\\n--spec-draft-n-max N\\n' ;;\n"
                    "esac\nexit 0\n")
    fake.chmod(0o755)
    r = cli("hw", env={"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"})
    out = _out(r)
    assert r.returncode == 0, out
    assert_clean(out, "hw")
    assert "CUDA0: \\u001b[31mNVIDIA" in out  # the fake's device, shown escaped


def test_probe_shows_a_hostile_model_file_name_escaped(tmp_path, make_model):
    """A model file named with escapes and a line break (a download keeps the name it was given):
    the cost probe's lines show it as one escaped line."""
    import shutil

    model = tmp_path / ("m\x1b]0;t\x07\n" + FORGED + ".gguf")
    shutil.copy(make_model(0.0), model)
    r = cli("probe", "--model", str(model), "--max-batch", "2", "--max-rounds", "2", "--depth", "64",
            "--threads", "1", "--out", str(tmp_path / "p.jsonl"))
    out = _out(r)
    assert r.returncode == 0, out
    assert_clean(out, "probe")
    assert "\\u001b" in out
