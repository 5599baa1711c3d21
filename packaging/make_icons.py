"""Icons for the frozen app from the one source image, resources/icons/mtp-tuner.png:
Windows .ico (16..256 px) and macOS .icns, written to an output folder (default packaging/build/icons).

    python packaging/make_icons.py [OUT_DIR]
    python packaging/make_icons.py --draw-source   # redraw the source image itself (1024 px)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "resources" / "icons" / "mtp-tuner.png"


def draw_source(path: Path = SOURCE) -> Path:
    """A rounded tile with rising bars (tok/s) and a draft arrow: the app's mark."""
    from PIL import Image, ImageDraw

    n = 1024
    img = Image.new("RGBA", (n, n), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((48, 48, n - 48, n - 48), radius=190, fill=(24, 64, 120, 255))
    d.rounded_rectangle((48, 48, n - 48, n // 2), radius=190, fill=(36, 96, 170, 255))
    d.rectangle((48, n // 2 - 190, n - 48, n // 2), fill=(36, 96, 170, 255))
    base = 820
    for i, h in enumerate((180, 300, 440, 600)):
        x = 190 + i * 170
        d.rounded_rectangle((x, base - h, x + 120, base), radius=24,
                            fill=(255, 255, 255, 255) if i < 3 else (255, 170, 40, 255))
    d.line((170, 560, 420, 400, 600, 300, 840, 150), fill=(255, 170, 40, 255), width=40, joint="curve")
    d.polygon(((870, 120), (770, 150), (850, 230)), fill=(255, 170, 40, 255))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def make_icons(out_dir: Path) -> tuple[Path, Path]:
    from PIL import Image

    if not SOURCE.is_file():
        raise SystemExit(f"{SOURCE}: the source image is missing (python {__file__} --draw-source)")
    img = Image.open(SOURCE).convert("RGBA")
    out_dir.mkdir(parents=True, exist_ok=True)
    ico, icns = out_dir / "mtp-tuner.ico", out_dir / "mtp-tuner.icns"
    img.save(ico, sizes=[(s, s) for s in (16, 24, 32, 48, 64, 128, 256)])
    img.save(icns)
    return ico, icns


if __name__ == "__main__":
    if "--draw-source" in sys.argv:
        print(draw_source())
    else:
        out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "packaging" / "build" / "icons"
        for p in make_icons(out):
            print(p)
