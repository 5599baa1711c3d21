"""The release archives are named once and cannot drift: the release workflow's matrix
(.github/workflows/release.yml), packaging/archive_name.py (which the build scripts call) and the
README's Install section name the same three archives. actionlint (in .ci/run) checks the
workflow itself."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
RUNNER_SYSTEM = {"windows": "windows", "macos": "macos", "ubuntu": "linux"}


def _archive_name_module():
    spec = importlib.util.spec_from_file_location("archive_name", ROOT / "packaging" / "archive_name.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def _matrix() -> list[dict]:
    return _workflow()["jobs"]["build"]["strategy"]["matrix"]["include"]


def _workflow_archives() -> set[str]:
    return {f"mtp-tuner-<version>-{leg['archive']}" for leg in _matrix()}


def _readme_archives() -> set[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    install = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(mtp-tuner-<version>-[^`]+)`", install))


def test_matrix_has_the_three_runners():
    assert [leg["os"] for leg in _matrix()] == ["windows-2022", "macos-14", "ubuntu-22.04"]


def test_workflow_names_the_readme_archives():
    assert _workflow_archives() == _readme_archives()
    assert len(_readme_archives()) == 3


def test_build_scripts_name_the_workflow_archives():
    mod = _archive_name_module()
    version = mod.version()
    for leg in _matrix():
        system = RUNNER_SYSTEM[leg["os"].split("-")[0]]
        machine = "arm64" if system == "macos" else "x64"
        assert mod.archive_name(system, machine, version) == f"mtp-tuner-{version}-{leg['archive']}"


def test_upload_and_release_use_the_archive_name():
    wf = _workflow()
    steps = wf["jobs"]["build"]["steps"]
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == "packaging/dist/${{ steps.meta.outputs.archive }}"
    assert upload["with"]["if-no-files-found"] == "error"
    meta = next(s for s in steps if s.get("id") == "meta")
    assert 'archive="mtp-tuner-${version}-${TAIL}"' in meta["run"]
    # YAML 1.1 reads the key `on` as True
    triggers = wf.get("on", wf.get(True))
    assert triggers["push"]["tags"] == ["v*"]
    release = wf["jobs"]["release"]
    assert release["needs"] == "build" and release["if"] == "startsWith(github.ref, 'refs/tags/v')"


def test_macos_leg_builds_metal_and_actions_are_pinned():
    legs = {leg["os"]: leg for leg in _matrix()}
    assert "-DGGML_METAL=on" in legs["macos-14"]["cmake_args"]
    wf = _workflow()
    for job in wf["jobs"].values():
        for step in job["steps"]:
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
