"""The README's two set-up commands (also in docs/building.md): one opens the app on the demo, one
runs the tests, and both build llama.cpp with RPC (llama-server's --rpc and its worker) and cap the
builds at one compiler per core."""

from __future__ import annotations

import re
import subprocess

from conftest import ROOT

CAP = "CMAKE_ARGS=-DGGML_RPC=ON CMAKE_BUILD_PARALLEL_LEVEL=$(getconf _NPROCESSORS_ONLN) LLAMA_CPP_BUILD_JOBS=$(getconf _NPROCESSORS_ONLN) "


def _setup_commands(text: str) -> list[str]:
    return [ln for ln in re.findall(r"```bash\n(.*?)```", text, re.S) for ln in ln.splitlines()
            if ln.startswith("python3 -m venv .venv")]


def test_the_two_commands_build_rpc_cap_the_build_jobs_and_say_why():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    cmds = _setup_commands(readme)
    assert len(cmds) == 2 and cmds[0].endswith("mtp-tuner-gui --demo") and cmds[1].endswith("-m pytest")
    for c in cmds:
        assert f"&& {CAP}.venv/bin/pip install -e '.[server" in c
        assert subprocess.run(["bash", "-n", "-c", c]).returncode == 0  # valid shell
    assert "one compiler per CPU" in readme and "make -j" in readme and "ggml-rpc-server" in readme
    assert _setup_commands((ROOT / "docs" / "building.md").read_text(encoding="utf-8")) == cmds
    cores = subprocess.run(["getconf", "_NPROCESSORS_ONLN"], capture_output=True, text=True).stdout.strip()
    assert cores.isdigit() and int(cores) >= 1


def test_the_readme_names_the_windows_tabs_as_they_are(window):
    """The README's list of the window's tabs is the window's own, in its order."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"a desktop window \(([^)]*)\)", text)
    assert m, "the README names the window's tabs"
    listed = [t.strip() for t in m.group(1).split(",")]
    assert listed == [window.tabs.tabText(i) for i in range(window.tabs.count())]
