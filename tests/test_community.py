"""Your machine among others: a community table in the community's format (50 rows,
tests/data/community_table.md) parses; malformed variants (missing header, ragged rows,
non-numeric speeds, HTML inside cells) each parse or give one clear message naming the line;
unreliable rows (no repetitions, -np > 1, no build) are flagged; the result is placed against
memory bandwidth or baseline tok/s, and the plot renders offscreen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.core.analysis.community import (BANDWIDTH, BASELINE, NO_BUILD, NO_REPS, PARALLEL, TableError, clean,
                                         load_table, parse_table, place)
from app.core.common.errors import UserError
from app.core.records.reader import load_records
from app.core.verdict.card import card_of, markdown_row

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
TABLE = DATA / "community_table.md"
HEADER_LINE = 8  # the fixture's header; its rows are lines 10..59


def _text() -> str:
    return TABLE.read_text(encoding="utf-8")


def test_the_50_row_table_in_the_communitys_format_parses():
    t = load_table(str(TABLE))
    assert len(t.rows) == 50 and [r.line for r in t.rows] == list(range(10, 60))
    assert dict(t.columns)["baseline"] == "baseline tok/s" and dict(t.columns)["spec"] == "mtp tok/s"
    assert t.ignored == ("contributor",)  # an unknown column: ignored
    by = {r.line: r for r in t.rows}
    assert (by[10].device, by[10].baseline, by[10].spec, by[10].speedup) == ("RTX 3090 24GB", 30.9, 46.4, 1.5)
    assert by[11].speedup == 1.46 and by[40].speedup == pytest.approx(0.99)  # "1.46x", "-1%"
    assert by[20].baseline == pytest.approx(25.5)  # a range, "25.2-25.8": its middle
    assert by[27].spec == 43.9  # **bold**
    assert (by[33].baseline, by[33].spec) == (16.1, 29.1)  # "16.1 *", "29.1 avg (23.3–32.1)"
    assert by[13].acceptance == 0.65 and by[31].acceptance == 0.72 and by[10].acceptance is None  # a bare range
    assert by[13].build == "b10512" and by[13].n_max == 2 and by[14].p_min == 0.75
    assert by[10].bandwidth_gbs == 936 and by[22].bandwidth_gbs == 546 and by[26].bandwidth_gbs is None  # Apple M4 Max
    # flags: no build where the build cell is empty; the row that writes --parallel 4
    lines = _text().splitlines()
    no_build = {n for n in range(10, 60) if lines[n - 1].split("|")[5].strip() == ""}
    assert {r.line for r in t.rows if NO_BUILD in r.flags} == no_build and len(no_build) == 15
    assert [r.line for r in t.rows if PARALLEL in r.flags] == [39] and by[39].parallel == 4
    assert not any(NO_REPS in r.flags for r in t.rows)
    assert any("repetitions" in n for n in t.notes)  # the table has no reps column: said once


def test_the_real_tables_columns_are_matched_by_name():
    """The community README's own header (Card, Baseline, With flag, n-max, Acceptance,
    Contributor) and its cell styles."""
    text = "\n".join([
        "Some intro text.", "",
        "| Card | Baseline | With flag | n-max | Acceptance | Contributor |",
        "|---|---|---|---|---|---|",
        "| RTX 3090 24GB | 31.0 | 41.3 | 2 | 0.78 | [@a](https://x.com/a) |",
        "| RTX 5090 32GB (desktop) | 62.7 | **108.7** | 3 | 0.72 | [@b](https://github.com/b) |",
        "| RTX 3090 24GB (b10450) | 41.3 | 63.5 | 2 | 0.69-0.87 | [@c](https://github.com/c) |",
        "| GMK EVO-X2, Ryzen AI Max+ 395 (64GB unified, ROCm/HIP) | 10.5-11.1 | 21.4-22.2 | 12 | 0.95-1.0 | [@d](x) |",
        "| RX 7900 GRE 16GB (Vulkan, packed) | 28.7 * | **47.8 avg (36.6–53.8)** | 3 | 0.87–0.96 (avg ~0.93) | [@e](x) |",
        "| RTX 4090 24GB | 47.0 | 68.8 | 2 | — | [@f](x) |",
        "", "\\* footnotes"])
    t = parse_table(text)
    assert [r.line for r in t.rows] == [5, 6, 7, 8, 9, 10]
    assert [round(r.speedup, 3) for r in t.rows] == [round(41.3 / 31.0, 3), round(108.7 / 62.7, 3), round(63.5 / 41.3, 3),
                                                     round(21.8 / 10.8, 3), round(47.8 / 28.7, 3), round(68.8 / 47.0, 3)]
    assert t.rows[2].build == "b10450" and NO_BUILD not in t.rows[2].flags and NO_BUILD in t.rows[0].flags
    assert t.rows[3].n_max == 12 and t.rows[0].acceptance == 0.78 and t.rows[5].acceptance is None
    assert set(t.ignored) == {"contributor"}


def _variant(edit) -> str:
    lines = _text().splitlines()
    edit(lines)
    return "\n".join(lines)


def _one_message(text: str, line: int, *words: str) -> str:
    with pytest.raises(TableError) as e:
        parse_table(text, "t.md")
    msg = str(e.value)
    assert isinstance(e.value, UserError) and e.value.line == line
    assert msg.startswith(f"t.md, line {line}: ") and "\n" not in msg, msg
    assert all(w in msg for w in words), msg
    return msg


def test_malformed_tables_give_one_clear_message_naming_the_line():
    def no_separator(lines):
        del lines[HEADER_LINE]

    _one_message(_variant(no_separator), HEADER_LINE, "without a header", "|---|")

    def ragged(lines):
        lines[29] = lines[29].replace(" | Q4_K_M |", " |", 1).replace(" | Q8_0 |", " |", 1)

    _one_message(_variant(ragged), 30, "11 cells where the header (line 8) has 12")

    def extra(lines):
        lines[44] = lines[44] + " extra |"

    _one_message(_variant(extra), 45, "13 cells")

    def word_speed(lines):
        cells = lines[19].split(" | ")
        cells[7] = "fast"
        lines[19] = " | ".join(cells)

    _one_message(_variant(word_speed), 20, "'baseline tok/s' is 'fast', not a speed")

    def zero_speed(lines):
        cells = lines[24].split(" | ")
        cells[8] = "0"
        lines[24] = " | ".join(cells)

    _one_message(_variant(zero_speed), 25, "'mtp tok/s' is '0'")

    def no_baseline(lines):
        lines[HEADER_LINE - 1] = lines[HEADER_LINE - 1].replace("Baseline tok/s", "Before")

    _one_message(_variant(no_baseline), HEADER_LINE, "no baseline column")
    _one_message("just some text\nno table here\n", 1, "no Markdown table found")
    _one_message("| GPU | Baseline | Speedup |\n|---|---|---|\n\nafter", 1, "header but no rows")
    _one_message("| GPU | Baseline | Acceptance |\n|---|---|---|\n| x | 3 | 0.5 |", 1, "no speculative tok/s column")


def test_html_inside_cells_parses_to_the_same_rows():
    def html(lines):
        for n in range(9, 59):
            cells = lines[n].split(" | ")
            cells[0] = cells[0].replace("| ", "| <b>", 1) + "</b>"
            cells[7] = f"<strong>{cells[7]}</strong>"
            cells[8] = f"{cells[8]}<br>"
            cells[2] = cells[2].replace("Qwen", "Qwen&#8203;") + " <sup>1</sup>"
            lines[n] = " | ".join(cells)

    plain, tagged = parse_table(_text()), parse_table(_variant(html))
    assert [(r.line, r.device, r.baseline, r.spec, r.speedup, r.flags) for r in tagged.rows] == \
        [(r.line, r.device, r.baseline, r.spec, r.speedup, r.flags) for r in plain.rows]
    assert clean("<b>RTX&nbsp;3090</b><br>24&amp;GB") == "RTX 3090 24&GB" and clean("a \\| b") == "a | b"
    t = parse_table("| GPU | Baseline | MTP tok/s |\n|---|---|---|\n| A \\| B | 10 | 20 |")
    assert t.rows[0].device == "A | B" and t.rows[0].speedup == 2.0


def test_unreliable_rows_are_flagged():
    t = parse_table("\n".join([
        "| GPU | Build | Reps | -np | Baseline tok/s | MTP tok/s |",
        "|---|---|---|---|---|---|",
        "| RTX 3090 | b10450 | 3 | 1 | 30 | 45 |",
        "| RTX 3090 | b10450 | 1 | 1 | 30 | 45 |",
        "| RTX 3090 | b10450 |  | 1 | 30 | 45 |",
        "| RTX 3090 | b10450 | 5 | 4 | 30 | 45 |",
        "| RTX 3090 |  | 5 | 1 | 30 | 45 |",
        "| RTX 3090 | - | 1 | 2 | 30 | 45 |"]))
    assert [r.flags for r in t.rows] == [(), (NO_REPS,), (NO_REPS,), (PARALLEL,), (NO_BUILD,),
                                         (NO_REPS, PARALLEL, NO_BUILD)]
    assert [r.reliable for r in t.rows] == [True, False, False, False, False, False] and t.notes == ()


def test_a_cards_own_rows_import_back():
    card = card_of(load_records(DATA / "compare_before.jsonl"))
    t = parse_table(markdown_row(card))
    assert [(r.device, r.baseline, r.spec, round(r.speedup, 4), r.n_max, r.reps, r.build) for r in t.rows] == \
        [(card.device, round(row.baseline_tok_s, 1), round(row.best_tok_s, 1), round(row.speedup, 2), row.n_max,
          row.reps, card.build)
         for row in card.rows]
    assert all(r.reliable for r in t.rows)


def test_placement_against_bandwidth_or_baseline():
    t = load_table(str(TABLE))
    s = place(t, 1.5, 30.0, "NVIDIA GeForce RTX 3090")
    assert s.axis == BANDWIDTH and s.user == (936.0, 1.5, "you") and len(s.points) == 44  # Tesla cards: unknown
    good = [p for p in s.points if p[2]]
    assert s.reliable == len(good) == len([r for r in t.rows if r.reliable and r.bandwidth_gbs]) == 30
    assert s.below == sum(1 for p in good if p[1] < 1.5) and 0 < s.below < 30
    assert f"above {s.below} of 30 unflagged rows" in s.text and "15 flagged" in s.text
    cpu = place(t, 1.2, 8.0, "CPU (x86_64, 16 threads)")
    assert cpu.axis == BASELINE and cpu.user == (8.0, 1.2, "you") and len(cpu.points) == 50
    assert place(t, 1.5, 30.0, "NVIDIA GeForce RTX 3090", axis="baseline").axis == BASELINE
    assert place(t, None, None, "?").user is None


def test_the_placement_plot_renders_offscreen():
    pytest.importorskip("PySide6")
    from PySide6.QtGui import QImage

    from app.drawing import card_png

    data = card_png.png_bytes(card_png.render_placement(place(load_table(str(TABLE)), 1.5, 30.0, "RTX 3090")))
    img = QImage()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and img.loadFromData(data) and img.width() == 1000
    assert img.pixelColor(0, 0).name() == "#ffffff"


def test_card_cli_places_the_result(tmp_path):
    out = tmp_path / "place.png"
    r = subprocess.run([sys.executable, "-m", "app", "card", str(DATA / "compare_before.jsonl"), "--community",
                        str(TABLE), "--placement-png", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Among the table's rows (memory bandwidth (GB/s)):" in r.stdout and "15 flagged" in r.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.md"
    bad.write_text(_text().replace("| 31.7 |", "| fast |"))
    r = subprocess.run([sys.executable, "-m", "app", "card", str(DATA / "compare_before.jsonl"), "--community",
                        str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"{bad}, line 27: 'baseline tok/s' is 'fast'" in r.stderr
    assert "Traceback" not in r.stderr
    with pytest.raises(UserError, match="community table not found"):
        load_table(str(tmp_path / "none.md"))
