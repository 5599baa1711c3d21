"""The result card: the Markdown row has the community's columns in order, the JSON
round-trips, nothing private (paths, user or host names) appears anywhere in it, the PNG renders
offscreen; the CLI and the Results tab's dialog show what is shared."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.common.errors import UserError
from app.core.records.reader import load_records
from app.core.records.writer import ResultsWriter
from app.core.verdict import card as card_mod
from app.core.verdict.card import (ALL_TASKS, CARD_SCHEMA, COLUMNS, card_dict, card_from_json, card_json, card_of,
                                   markdown_row, model_and_quant, scrub)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
FIXTURE = DATA / "compare_before.jsonl"
MARK = "zqmarkerzq"
PNG = b"\x89PNG\r\n\x1a\n"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def test_the_markdown_row_has_the_communitys_columns_in_order():
    card = card_of(load_records(FIXTURE))
    lines = markdown_row(card).splitlines()
    assert _cells(lines[0]) == list(COLUMNS) == [
        "GPU/CPU", "backend", "VRAM", "model", "quant", "build", "mode", "n-max", "p-min", "baseline tok/s",
        "best tok/s", "acceptance", "speedup [CI]", "task", "tokens", "reps"]
    assert set(lines[1]) == {"|", "-"} and lines[1].count("---") == len(COLUMNS)
    rows = [dict(zip(COLUMNS, _cells(ln))) for ln in lines[2:]]
    assert [r["task"] for r in rows] == [ALL_TASKS, "code", "story"]
    code = rows[1]
    assert (code["GPU/CPU"], code["backend"], code["VRAM"], code["model"], code["quant"]) == (
        "NVIDIA GeForce RTX 3090", "CUDA", "24 GB", "Qwen3.8-27B", "Q4_K_M")
    assert (code["build"], code["mode"], code["n-max"], code["p-min"], code["tokens"], code["reps"]) == (
        "b10450 (0f1e2d3)", "draft-mtp", "2", "0", "64", "3")
    assert code["speedup [CI]"].startswith("1.49x [") and code["acceptance"] == "0.80"
    assert float(code["best tok/s"]) > float(code["baseline tok/s"]) > 35
    assert markdown_row(card, header=False).splitlines() == lines[2:]


def test_the_json_round_trips():
    for path in (FIXTURE, DATA / "demo_sweep.jsonl"):
        card = card_of(load_records(path))
        text = card_json(card)
        assert card_from_json(text) == card
        assert json.loads(text) == card_dict(card) and json.loads(text)["schema"] == CARD_SCHEMA
    with pytest.raises(UserError, match="not a result card"):
        card_from_json('{"schema": "something else"}')
    with pytest.raises(UserError, match="not a result card"):
        card_from_json("[1, 2")


def test_model_and_quant_from_the_file_name():
    assert model_and_quant("/m/Qwen3.8-27B-Q4_K_M.gguf") == ("Qwen3.8-27B", "Q4_K_M")
    assert model_and_quant("C:\\models\\Qwen3.6-27B-MTP-UD-Q4_K_XL-00001-of-00002.gguf") == (
        "Qwen3.6-27B-MTP", "UD-Q4_K_XL")
    assert model_and_quant("/x/gemma-4-E2B-it-bf16.gguf") == ("gemma-4-E2B-it", "BF16")
    assert model_and_quant("/x/model.gguf") == ("model", "-")


def _private_sweep(tmp_path: Path) -> Path:
    """The fixture sweep with the marker in every path, the host's fields and a failed run's error."""
    recs = load_records(FIXTURE)
    host = dict(recs[0].host, os=f"Linux-6.8.0-{MARK}-x86_64", node=f"{MARK}-box", user=MARK,
                home=f"/home/{MARK}")
    out = []
    for r in recs:
        drafter = None if r.k is None else {"path": f"/srv/{MARK}/drafters/mtp-qwen.gguf", "sha256": "ab" * 32,
                                            "arch": "qwen35", "size": 1}
        out.append(dataclasses.replace(r, model_path=f"/home/{MARK}/models/Qwen3.8-27B-Q4_K_M.gguf", host=host,
                                       drafter=drafter, sampling=dict(r.sampling, prompts=f"/home/{MARK}/p.jsonl"),
                                       llama_build=f"b10450 (/home/{MARK}/llama.cpp/build)"))
    out.append(dataclasses.replace(out[0], run_id="failed", status="failed", tok_s=None,
                                   error=f"cannot open /home/{MARK}/models/x.gguf on {MARK}-box"))
    path = tmp_path / f"{MARK}-results.jsonl"
    with ResultsWriter(path) as w:
        for r in out:
            w.append(r)
    return path


def test_nothing_private_appears_anywhere_in_the_card(tmp_path, monkeypatch):
    pytest.importorskip("PySide6")
    from app.drawing import card_png

    path = _private_sweep(tmp_path)
    card = card_of(load_records(path))
    shared = markdown_row(card) + card_json(card) + repr(card)
    assert MARK not in shared.lower() and "/home" not in shared and "/srv" not in shared
    assert "mtp-qwen.gguf" in markdown_row(card)  # the drafter by its file name: what the arm was
    assert MARK.encode() not in card_png.png_bytes(card_png.render_card(card))
    # the CLI prints exactly what is shared (its notes about the files go to stderr)
    r = subprocess.run([sys.executable, "-m", "app", "card", str(path), "--png", str(tmp_path / "c.png")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert MARK not in r.stdout.lower() and "Qwen3.8-27B" in r.stdout
    assert MARK.encode() not in (tmp_path / "c.png").read_bytes()
    # this user's and this machine's names, where a file name carries them
    monkeypatch.setattr(card_mod.getpass, "getuser", lambda: "zqalicezq")
    monkeypatch.setattr(card_mod.socket, "gethostname", lambda: "zqlabboxzq.example.org")
    recs = [dataclasses.replace(r, model_path="/m/zqalicezq-zqlabboxzq-Qwen3.8-27B-Q4_K_M.gguf")
            for r in load_records(FIXTURE)]
    text = card_json(card_of(recs)) + markdown_row(card_of(recs))
    assert "zqalicezq" not in text and "zqlabboxzq" not in text and "<redacted>-<redacted>-Qwen3.8-27B" in text
    assert scrub("C:\\Users\\bob\\m.gguf and /home/bob/x y", []) == "m.gguf and x y"
    # the brackets and punctuation around a path stay: only its folders go
    assert scrub("no probe matches (/home/bob/results):", []) == "no probe matches (results):"
    assert scrub('"C:\\Users\\bob\\m.gguf", and [/x/y/]', []) == '"m.gguf", and [y]'


def test_the_png_renders_offscreen_without_a_display(tmp_path):
    """`mtp-tuner card --png` in a process with no display and no Qt platform chosen."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    out = tmp_path / "card.png"
    r = subprocess.run([sys.executable, "-m", "app", "card", str(FIXTURE), "--png", str(out), "--json"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert card_from_json(r.stdout) == card_of(load_records(FIXTURE))
    data = out.read_bytes()
    assert data[:8] == PNG
    pytest.importorskip("PySide6")
    from PySide6.QtGui import QImage

    img = QImage()
    assert img.loadFromData(data) and img.width() == 1000 and img.height() > 300
    colours = {img.pixel(x, y) for x in range(0, img.width(), 7) for y in range(0, img.height(), 7)}
    assert len(colours) > 10  # drawn on, not a blank page


def test_card_cli_messages(tmp_path):
    r = subprocess.run([sys.executable, "-m", "app", "card", str(FIXTURE), "--placement-png", str(tmp_path / "p.png")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--placement-png needs --community TABLE" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "app", "card", str(tmp_path / "none.jsonl")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "none.jsonl: results file not found" in r.stderr
    r = subprocess.run([sys.executable, "-m", "app", "card", str(FIXTURE)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "| GPU/CPU | backend | VRAM |" in r.stdout and '"schema": "mtp-tuner-card/1"' in r.stdout


def test_the_results_tab_card_dialog_shows_what_is_shared(window, tmp_path):
    tab = window.results_tab
    tab.open_results(str(FIXTURE))
    tab.show_card()
    dlg = tab.card_dialog
    card = card_of(load_records(FIXTURE))
    assert dlg.md_text.toPlainText() == markdown_row(card) and dlg.json_text.toPlainText() == card_json(card)
    assert not dlg.card_label.pixmap().isNull()
    png, js = dlg.save_png(str(tmp_path / "c.png")), dlg.save_json(str(tmp_path / "c.json"))
    assert Path(png).read_bytes()[:8] == PNG and card_from_json(Path(js).read_text()) == card
    dlg.copy("md")
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == markdown_row(card)
    s = dlg.place_text((DATA / "community_table.md").read_text())
    assert s is not None and s.user is not None and len(s.points) > 30
    assert Path(dlg.save_placement(str(tmp_path / "p.png"))).read_bytes()[:8] == PNG
    window.state.last_error = None
    assert dlg.place_text("| Card | Baseline | With flag |\n| RTX | 1 | 2 |") is None
    assert "line 1" in window.state.last_error
    dlg.close()


# ---- the watch windows of the file (mtp-tuner watch --out) ----------------------------------------

WATCH_COSTS = {1: 10.0, 2: 10.5, 3: 11.0, 4: 11.5, 5: 12.0, 6: 12.5}


def _watched_file(tmp_path, sweep=True):
    """compare_before.jsonl (or nothing) and three watch records of the recorded llama-server: a
    short window then the whole one on one address, and a window of another address."""
    import shutil

    from helpers import ReplayClient, replayed_watch, server_costs

    from app.core.records.writer import append_line

    costs = tmp_path / "costs.jsonl"
    append_line(costs, server_costs(WATCH_COSTS, 0.5).to_json())
    short = replayed_watch(costs, ReplayClient().pages[:4]).record
    whole = dataclasses.replace(replayed_watch(costs).record, timestamp_utc="2099-01-01T00:00:00.000+00:00")
    other = dataclasses.replace(replayed_watch(None, url="http://10.1.2.3:8080").record,
                                timestamp_utc="2098-01-01T00:00:00.000+00:00")
    path = tmp_path / "results.jsonl"
    if sweep:
        shutil.copy(FIXTURE, path)
    for r in (short, whole, other):
        append_line(path, r.to_json())
    return path, short, whole, other


def test_the_card_shows_the_newest_watch_window_of_each_server(tmp_path):
    from app.core.records.reader import load_watch_records

    path, short, whole, other = _watched_file(tmp_path)
    card = card_of(load_records(path), watch=load_watch_records(path))
    assert card_of(load_records(path)).watch == ()  # without them: the card as before
    new, old = card.watch  # the newest first; one per address and model
    assert (new.draft_steps, new.windows, old.windows) == (whole.draft_steps, 2, 1) == (247, 2, 1)
    assert new.accepted_per_pos == (148, 124, 86) and new.acceptance == (round(148 / 247, 4), round(124 / 247, 4),
                                                                         round(86 / 247, 4))
    assert new.server_k == 3 and new.mode == "draft-mtp" and new.model == "calibrated-p0.3.gguf"
    assert [p.k for p in new.predicted] == [0, 1, 2, 3, 4, 5] and new.recommendation_k == whole.recommendation_k
    assert new.predicted[3].speedup == round(whole.predicted[3].speedup, 4) and new.reason == whole.reason
    assert old.predicted == () and old.recommendation_k is None and old.answer == "no recommendation"
    assert "/ 0.50 /" in new.reason  # the shares' separators are not taken for folders
    text = card_json(card)
    assert card_from_json(text) == card and json.loads(text)["watch"][0]["requests_at_least"] == new.requests_at_least
    assert "127.0.0.1" not in text and "10.1.2.3" not in text  # no address goes out
    section = card_mod.watch_text(card)
    assert section.startswith("From your own use (watch)") and "acceptance by position 0.60 / 0.50 / 0.35" in section
    assert "K=4 1.86x [" in section and "extrapolated" in section and "the server ran draft-mtp K=3" in section
    # the answer first, and two servers of one model told apart
    assert "UTC [server 1 of 2 with this model]: K=3 is fine\n" in section
    assert "UTC [server 2 of 2 with this model]: no recommendation" in section and "2 windows in the file" in section


def test_the_cards_watch_section_keeps_private_names_out(tmp_path, monkeypatch):
    from app.core.records.reader import load_watch_records

    path, *_ = _watched_file(tmp_path)
    recs = [dataclasses.replace(r, model_path=f"/home/{MARK}/m/zqalicezq-calibrated.gguf",
                                reason=r.reason + f"; see /home/{MARK}/results/x.jsonl")
            for r in load_watch_records(path)]
    monkeypatch.setattr(card_mod.getpass, "getuser", lambda: "zqalicezq")
    card = card_of(load_records(path), watch=recs)
    text = card_json(card) + card_mod.watch_text(card)
    assert MARK not in text and "zqalicezq" not in text and "<redacted>-calibrated.gguf" in text
    assert "x.jsonl" in text


def test_card_cli_with_watch_records(tmp_path):
    path, _, whole, _ = _watched_file(tmp_path)
    r = subprocess.run([sys.executable, "-m", "app", "card", str(path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    md, rest = r.stdout.split("From your own use (watch)")
    assert "| GPU/CPU |" in md and rest.index("K=3 is fine") < rest.index('"schema"')
    (tmp_path / "w").mkdir()
    only = _watched_file(tmp_path / "w", sweep=False)[0]
    r = subprocess.run([sys.executable, "-m", "app", "card", str(only), "--json"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert list(d) == ["watch"] and d["watch"][0]["accepted_per_pos"] == [148, 124, 86]
    assert "only watch summaries" in r.stderr
    r = subprocess.run([sys.executable, "-m", "app", "card", str(only), "--png", str(tmp_path / "c.png")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "need a sweep's runs" in r.stderr and "Traceback" not in r.stderr


def test_the_card_dialog_carries_the_files_watch_windows(window, tmp_path):
    from app.core.records.reader import load_watch_records

    path, *_ = _watched_file(tmp_path)
    tab = window.results_tab
    tab.open_results(str(path))
    tab.show_card()
    card = card_of(load_records(path), watch=load_watch_records(path))
    assert len(card.watch) == 2 and tab.card_dialog.json_text.toPlainText() == card_json(card)
