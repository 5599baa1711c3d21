"""A 10,000-row community table loads in under a second.

Builds a table in the community's format from the 50-row test fixture
(tests/data/community_table.md): its rows repeated with each device made distinct (a row number in
its name, so no look-up is shared) and the speeds varied, the cell styles kept (ranges, bold,
"avg (...)", links, an -np written in the cell). Then times, best of --repeat runs: parse_table on
the text (the import), load_table from a file (read + import), and place (the standing and its
text), each with the module's caches emptied first. Prints the seconds and rows per second.

    python benchmarks/community_import.py [--rows 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.analysis import community, community_cells  # noqa: E402
from app.core.analysis.community import load_table, parse_table, place  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "community_table.md"


def big_table(rows: int, seed: int = 0) -> str:
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| GPU"))
    body = [ln for ln in lines[head + 2:] if ln.startswith("| ")]
    rng = random.Random(seed)
    out = lines[:head + 2]
    for n in range(rows):
        cells = body[n % len(body)].split(" | ")
        cells[0] = f"{cells[0]} #{n}"
        if cells[7].replace(".", "", 1).isdigit():
            cells[7] = f"{float(cells[7]) * rng.uniform(0.9, 1.1):.1f}"
        out.append(" | ".join(cells))
    return "\n".join(out + [""])


def cold() -> None:
    """Forget what an earlier parse cached (cells, numbers, bandwidths): each run imports afresh."""
    for f in (community.clean, community_cells.figure, community_cells.acceptance, community.bandwidth_of):
        f.cache_clear()


def best(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        cold()
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    text = big_table(args.rows)
    t = parse_table(text)
    assert len(t.rows) == args.rows
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "table.md"
        path.write_text(text, encoding="utf-8")
        parse_s = best(lambda: parse_table(text), args.repeat)
        load_s = best(lambda: load_table(str(path)), args.repeat)
    place_s = best(lambda: place(t, 1.5, 30.0, "NVIDIA GeForce RTX 3090"), args.repeat)
    print(f"{args.rows} rows ({len(text) / 2 ** 20:.1f} MiB), best of {args.repeat}:")
    print(f"  parse_table  {parse_s:.3f} s  ({args.rows / parse_s:,.0f} rows/s)")
    print(f"  load_table   {load_s:.3f} s  (file read + parse)")
    print(f"  place        {place_s:.3f} s")
    print(f"  import + placement: {load_s + place_s:.3f} s (target: under 1 s)")


if __name__ == "__main__":
    main()
