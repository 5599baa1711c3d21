"""A hostile GGUF header (arrays nested 100,000 deep, absurd counts and sizes) is one clear error
everywhere a header is read: the CLI commands, the library listing, a download (deleted before it
is kept) and the window, which still opens with such a file in the models folder."""

from __future__ import annotations

import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.common.errors import ModelFileError
from app.core.common.paths import models_dir
from app.core.machine import gguf_info
from conftest import ROOT
from tests.helpers import clean_error, cli

NESTED = "nested deeper than 8 levels"
EVIL_REPO = "tester/Evil-MTP-GGUF"


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_bytes(kvs: list[tuple[str, int, bytes]], n_tensors: int = 0) -> bytes:
    """A GGUF v3 header of ``kvs`` (key, value type, the value's bytes) and no tensors."""
    out = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kvs))
    for key, vtype, payload in kvs:
        out += _str(key) + struct.pack("<I", vtype) + payload
    return out


def nested(depth: int) -> bytes:
    """The value bytes of an array of arrays ... ``depth`` arrays deep, the innermost holding
    0 uint8 items: the file the issue found (100,000 levels, 1.2 MB)."""
    return struct.pack("<IQ", 9, 1) * (depth - 1) + struct.pack("<IQ", 0, 0)


def hostile_gguf(depth: int = 100_000) -> bytes:
    return gguf_bytes([("general.architecture", 8, _str("llama")), ("evil.nested", 9, nested(depth))])


def write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


# -- the reader -------------------------------------------------------------------------------
def test_nesting_within_the_limit_reads_and_past_it_is_one_clear_error(tmp_path):
    # [[1, 2], [3]] as uint32 arrays in an array, then an array 8 and 9 levels deep
    two = struct.pack("<IQ", 9, 2) + struct.pack("<IQII", 4, 2, 1, 2) + struct.pack("<IQI", 4, 1, 3)
    ok = write(tmp_path / "ok.gguf", gguf_bytes([("a.two", 9, two), ("a.eight", 9, nested(8))]))
    meta = gguf_info.read_header(ok).metadata
    assert meta["a.two"] == [[1, 2], [3]]
    deep = meta["a.eight"]
    for _ in range(7):
        assert isinstance(deep, list) and len(deep) == 1
        deep = deep[0]
    assert deep == []
    for depth in (9, 100_000):
        p = write(tmp_path / f"deep{depth}.gguf", hostile_gguf(depth))
        with pytest.raises(ModelFileError) as ei:
            gguf_info.read_header(p)
        assert str(ei.value) == (f"{p}: corrupt or hostile GGUF header (metadata arrays {NESTED}, "
                                 "in evil.nested)")


@pytest.mark.parametrize("kv, fragment", [
    (("general.alignment", 8, _str("x")), "general.alignment is 'x', not a whole number"),
    (("general.alignment", 4, struct.pack("<I", 3)), "general.alignment is 3, not a power of two"),
    (("llama.block_count", 6, struct.pack("<f", math.inf)), "llama.block_count is inf, not a whole number"),
    (("llama.nextn_predict_layers", 10, struct.pack("<Q", 2**40)), "from 0 to 100,000"),
    (("general.architecture", 4, struct.pack("<I", 7)), "general.architecture is 7, not a text"),
])
def test_counts_and_sizes_the_app_uses_are_checked_in_the_header(tmp_path, kv, fragment):
    """A hostile value that would crash (int('x'), int(inf)) or loop 2**40 times downstream."""
    kvs = [("general.architecture", 8, _str("llama"))] if kv[0] != "general.architecture" else []
    p = write(tmp_path / "m.gguf", gguf_bytes(kvs + [kv]))
    with pytest.raises(ModelFileError, match="corrupt or hostile GGUF header") as ei:
        gguf_info.read_header(p)
    assert str(p) in str(ei.value) and fragment in str(ei.value)


def test_a_header_past_the_size_limit_is_refused_without_reading_it(tmp_path):
    # a sparse 700 MB file whose one key claims 80 million uint64 items (640 MB of header)
    p = write(tmp_path / "big.gguf", gguf_bytes([("a.big", 9, struct.pack("<IQ", 10, 80_000_000))]))
    with open(p, "r+b") as f:
        f.truncate(700 * 10**6)
    with pytest.raises(ModelFileError, match="the header is larger than 512 MiB, in a.big"):
        gguf_info.read_header(p, keep_arrays=False)


def test_the_values_read_one_by_one_are_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_info, "MAX_ITEMS", 1000, raising=False)  # the limit, made small for the test
    strings = struct.pack("<IQ", 8, 2000) + _str("t") * 2000
    p = write(tmp_path / "many.gguf", gguf_bytes([("tokenizer.ggml.tokens", 9, strings)]))
    with pytest.raises(ModelFileError, match="more than 1,000 keys, strings, arrays and tensors"):
        gguf_info.read_header(p)


# -- the CLI ----------------------------------------------------------------------------------
def test_a_hostile_file_is_one_clean_error_in_inspect_bench_and_the_listing(tmp_path, make_model):
    evil = write(tmp_path / "lib" / "evil-Q4_0.gguf", hostile_gguf())
    good = shutil.copy(make_model(0.3), tmp_path / "lib" / "good-Q8_0.gguf")
    for argv in (["inspect", str(evil)], ["inspect", str(good), "--drafter", str(evil)],
                 ["bench", "--model", str(evil), "--n-predict", "8", "--reps", "1", "--per-task", "1",
                  "--out", str(tmp_path / "r.jsonl")]):
        r = cli(*argv)
        clean_error(r, f"{evil}: corrupt or hostile GGUF header", NESTED)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli("models", "list", "--dir", str(tmp_path / "lib"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.strip().startswith(str(tmp_path / "lib"))}
    assert set(lines) == {str(evil), str(good)}
    assert "  MTP" in lines[str(good)]
    assert "unreadable" in lines[str(evil)] and NESTED in lines[str(evil)]


def test_a_hostile_download_is_deleted_with_the_reason(fake_hub, tmp_path):
    fake_hub.add(EVIL_REPO, {"evil-Q4_0.gguf": hostile_gguf()})
    dest = tmp_path / "models"
    target = dest / "tester__Evil-MTP-GGUF" / "evil-Q4_0.gguf"
    argv = ("models", "download", EVIL_REPO, "evil-Q4_0.gguf", "--dest", str(dest), "--endpoint", fake_hub.url)
    r = cli(*argv)
    clean_error(r, f"{target}: corrupt or hostile GGUF header", NESTED, "the downloaded file was deleted")
    assert "verified" not in r.stdout
    assert [p for p in dest.rglob("*") if p.is_file()] == []  # no file, no .part, no .part.json
    # the same file already in place (a download by an older version): checked and deleted too
    write(target, hostile_gguf())
    served = fake_hub.bytes_served
    clean_error(cli(*argv), NESTED, "the downloaded file was deleted")
    assert not target.exists() and fake_hub.bytes_served == served


def test_a_download_that_is_not_a_gguf_at_all_is_deleted_with_the_reason(fake_hub, tmp_path):
    fake_hub.add(EVIL_REPO, {"junk-Q4_0.gguf": b"<html>rate limited</html>" * 40})
    dest = tmp_path / "models"
    r = cli("models", "download", EVIL_REPO, "junk-Q4_0.gguf", "--dest", str(dest), "--endpoint", fake_hub.url)
    clean_error(r, "not a GGUF file", "the downloaded file was deleted")
    assert [p for p in dest.rglob("*") if p.is_file()] == []


# -- the window -------------------------------------------------------------------------------
@pytest.fixture
def hostile_library(make_model):
    """The models folder holds a hostile file and a good model before the window is built."""
    folder = models_dir() / "tester__Evil-MTP-GGUF"
    evil = write(folder / "evil-Q4_0.gguf", hostile_gguf())
    good = shutil.copy(make_model(0.3), folder / "good-Q8_0.gguf")
    return evil, Path(good)


def test_the_window_opens_with_a_hostile_file_in_the_models_folder(hostile_library, window, qtbot):
    evil, good = hostile_library
    tab = window.model_tab
    for _ in range(2):  # as the window was built, then the Refresh button: the same again
        rows = {tab.library.item(r, 0).text(): tab.library.item(r, 2).text() for r in range(tab.library.rowCount())}
        assert rows[str(good)] == "yes" and rows[str(evil)] == "unreadable"
        assert NESTED in tab.library_note.text() and "1 file(s) could not be read" in tab.library_note.text()
        tab.refresh_library()
    tab.set_model(str(evil))
    assert NESTED in tab.model_info.toPlainText() and window.isEnabled()


def test_a_hostile_download_in_the_window_is_refused_and_deleted(window, qtbot, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    fake_hub.add(EVIL_REPO, {"evil-Q4_0.gguf": hostile_gguf()})
    tab = window.model_tab
    tab.search_edit.setText("evil-mtp")
    tab.search_models()
    qtbot.waitUntil(lambda: tab.search_btn.isEnabled() and tab.repos.rowCount() == 1, timeout=20000)
    tab.repos.selectRow(0)
    qtbot.waitUntil(lambda: tab.files.rowCount() == 1, timeout=20000)
    tab.files.selectRow(0)
    errors = []
    window.state.error.connect(errors.append)
    with qtbot.waitSignal(tab.download_finished, timeout=30000):
        tab.download_btn.click()
    # said once, beside the button (no dialog and status line besides)
    assert errors == [] and NESTED in tab.download_label.text()
    assert "the downloaded file was deleted" in tab.download_label.text()
    assert [p for p in models_dir().rglob("*") if p.is_file()] == []
    assert "evil" not in " ".join(tab.library.item(r, 0).text() for r in range(tab.library.rowCount()))


def test_the_gui_entry_opens_with_a_hostile_file_in_the_models_folder(tmp_path):
    pytest.importorskip("PySide6")
    write(models_dir() / "evil-Q4_0.gguf", hostile_gguf())
    # mtp-tuner-gui is app.gui.main:main (pyproject's gui-scripts)
    r = subprocess.run([sys.executable, "-c", "import sys; from app.gui.main import main; "
                        "sys.exit(main(['--exit-after-init']))"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    from app.core.common.logs import log_path

    log = log_path().read_text()
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:], log[-3000:])
    assert "init finished: window shown" in log and "uncaught" not in log


def test_an_uncaught_error_is_said_on_stderr_not_only_in_the_log(qtbot, tmp_path, capfd):
    from PySide6.QtWidgets import QApplication

    from app.gui.crash import CrashHandler

    handler = CrashHandler(tmp_path / "mtp-tuner.log")
    try:
        raise RecursionError("maximum recursion depth exceeded")
    except RecursionError:
        handler(*sys.exc_info())
    err = capfd.readouterr().err
    assert "mtp-tuner: unexpected error: RecursionError: maximum recursion depth exceeded" in err
    assert str(tmp_path / "mtp-tuner.log") in err
    assert handler.shown == 1 and handler.dialog is not None
    handler.dialog.close()
    QApplication.processEvents()
