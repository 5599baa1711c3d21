"""docs/architecture.md describes the tree as it is: its Layout names every package under app/
and every module of each (a subfolder's modules in the parentheses after its name), and no file,
folder or dotted module it names is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def layout_sections(text: str) -> dict[str, str]:
    """The Layout block's sections: each line that starts with a path (``app/core/common/``)
    opens one, its text running to the next."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    out: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"^(\S+)\s", line + " ")
        if m and not line.startswith(" "):
            current = m.group(1)
            out[current] = line[len(current):]
        elif current is not None:
            out[current] += "\n" + line
    return out


def packages() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "app").rglob("__init__.py"))


def modules(pkg: Path) -> list[str]:
    return sorted(f.stem for f in pkg.glob("*.py") if f.name != "__init__.py")


def section_of(pkg: Path, sections: dict[str, str]) -> tuple[str, str] | None:
    """The section that describes ``pkg``: its own, else the nearest enclosing package's."""
    rel = pkg.relative_to(ROOT)
    for p in [rel, *rel.parents]:
        key = p.as_posix() + "/"
        if key in sections:
            return key, sections[key]
    return None


def sub_lists(text: str) -> dict[str, list[str]]:
    """``start/ (tab, uses, plan)`` -> {"start": ["tab", "uses", "plan"]}: the items of the list
    after a folder's name that are one word (a module or folder of it), a nested folder's own list
    left to it."""
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"\b([a-z_]+)/ \(", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        inner = re.sub(r"\([^()]*\)", "", text[m.end():i - 1])  # a nested folder's own list is its own
        out[m.group(1)] = [w for part in inner.split(",") if re.fullmatch(r"[a-z_]+", w := part.strip())]
    return out


def test_the_layout_names_every_package_and_module():
    sections = layout_sections(DOC.read_text(encoding="utf-8"))
    missing = []
    for pkg in packages():
        found = section_of(pkg, sections)
        rel = pkg.relative_to(ROOT).as_posix()
        if found is None:
            missing.append(f"{rel}/: no section")
            continue
        key, text = found
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
        if key != rel + "/" and pkg.name not in words:
            missing.append(f"{rel}/: not named in {key}")
        for m in modules(pkg):
            if m not in words:
                missing.append(f"{rel}/{m}.py")
    assert not missing, "docs/architecture.md leaves out:\n" + "\n".join(missing)


def test_the_layout_names_no_file_that_is_gone():
    text = DOC.read_text(encoding="utf-8")
    sections = layout_sections(text)
    gone = [key for key in sections if not (ROOT / key).exists()]
    for key, body in sections.items():
        base = ROOT / key
        for name in re.findall(r"\b([a-z_]+\.py)\b", body):
            if not list(base.rglob(name)) and not list((ROOT / "app").rglob(name)):
                gone.append(f"{key}: {name}")
        for folder, items in sub_lists(body).items():
            where = [p for p in base.rglob(folder) if p.is_dir()]
            if not where:
                gone.append(f"{key}: {folder}/")
                continue
            for item in items:
                if not any((w / f"{item}.py").is_file() or (w / item).is_dir() for w in where):
                    gone.append(f"{key}{folder}/: {item}")
    # dotted names of the app's modules anywhere in the document: `engines.factory`, `app.core.session.events`
    for dotted in re.findall(r"`((?:app\.)?(?:core|cli|gui|drawing|common|records|engines|calibrated|measure|"
                             r"analysis|verdict|watch|session|machine)\.[a-z_.]+)`", text):
        parts = dotted.split(".")
        parts = parts[1:] if parts[0] == "app" else parts
        for root in (ROOT / "app", ROOT / "app" / "core"):
            path = root.joinpath(*parts)
            if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
                break
        else:
            gone.append(f"`{dotted}`")
    assert not gone, "docs/architecture.md names what is gone:\n" + "\n".join(gone)
