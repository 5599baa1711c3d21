"""Hardware detection: recorded NVML and sysctl answers, and this machine (no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.core.machine import hardware as H
from conftest import ROOT
from tests.helpers import RTX3060, RecordedNVML


def test_rtx_3060_bandwidth_from_bus_and_clock():
    nv = RecordedNVML([RTX3060])
    gpus, notes = H.nvml_gpus(nv)
    g = gpus[0]
    assert g.name == "NVIDIA GeForce RTX 3060" and g.vram_total == 12884901888
    assert g.bandwidth_gbs == pytest.approx(360, rel=0.01) and g.bandwidth_source == "nvml"
    assert g.driver == "550.54.14" and g.cuda == "12.4"
    assert nv.shutdown and not notes


def test_missing_bus_width_falls_back_to_the_table():
    card = dict(RTX3060, name="NVIDIA GeForce RTX 4060", bus=None)
    gpus, notes = H.nvml_gpus(RecordedNVML([card]))
    assert gpus[0].bandwidth_gbs == 272 and gpus[0].bandwidth_source == "table"
    assert any("bus" in n for n in notes)


def test_no_driver_is_a_note_not_a_crash():
    gpus, notes = H.nvml_gpus(RecordedNVML([], fail_init=True))
    assert gpus == [] and "not available" in notes[0]


def test_apple_m5_max_40_core_from_recorded_sysctl():
    answers = {"machdep.cpu.brand_string": "Apple M5 Max", "hw.memsize": "137438953472",
               "iogpu.wired_limit_mb": "0"}
    g, notes = H.apple_gpu(answers.get, 40)
    assert g.vendor == "apple" and g.bandwidth_gbs == 614 and "40-core" in g.name
    assert g.vram_total == 96 * 2**30  # default share: 3/4 of 128 GB
    answers["iogpu.wired_limit_mb"] = "120000"
    g2, notes2 = H.apple_gpu(answers.get, 32)
    assert g2.vram_total == 120000 * 2**20 and g2.bandwidth_gbs == 460 and notes2
    assert H.apple_gpu({"machdep.cpu.brand_string": "Intel(R) Core(TM) i9"}.get, None)[0] is None


def test_table_names():
    assert H.bandwidth_by_name("NVIDIA GeForce RTX 5060 Ti") == 448
    assert H.bandwidth_by_name("NVIDIA GeForce RTX 3060 Ti") == 448
    assert H.bandwidth_by_name("Mystery GPU 9000") is None


def test_amd_gpu_from_sysfs(tmp_path):
    dev = tmp_path / "card0" / "device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1002\n")
    (dev / "product_name").write_text("AMD Radeon RX 7900 XTX\n")
    (dev / "mem_info_vram_total").write_text(str(24 * 2**30))
    (tmp_path / "card0-DP-1").mkdir()
    gpus = H.linux_drm_gpus(str(tmp_path))
    assert len(gpus) == 1 and gpus[0].vendor == "amd" and gpus[0].bandwidth_gbs == 960


def test_this_machine_reports_cpu_only_cleanly():
    h = H.snapshot()
    assert h.cpu_threads and h.ram_total and h.ram_total > 2**30
    if h.cpu_only:
        assert any("CPU only" in n for n in h.notes)
        assert "none (CPU only)" in H.format_snapshot(h)


def test_hw_cli_json():
    # the 60 s subprocess timeout is a guard against a hang, not a speed target; that a stuck
    # tool cannot hang detection is test_stuck_tools_are_given_up_not_waited_for
    r = subprocess.run([sys.executable, "-m", "app", "hw", "--json"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["cpu_threads"] >= 1 and isinstance(d["gpus"], list)


def test_stuck_tools_are_given_up_not_waited_for(monkeypatch):
    """Every external tool detection runs (sysctl, ioreg) gets a time limit; one that runs past it
    reads as "unknown", so `hw` cannot hang on it (checked by what the code asks for, not by a clock)."""
    calls = []

    def stuck(argv, **kw):
        calls.append((argv[0], kw.get("timeout")))
        raise subprocess.TimeoutExpired(argv, kw.get("timeout") or 0)

    monkeypatch.setattr(H.subprocess, "run", stuck)
    assert H._sysctl("hw.memsize") is None
    assert H._apple_gpu_cores() is None
    assert [c[0] for c in calls] == ["sysctl", "ioreg"]
    assert all(t is not None and 0 < t <= 10 for _, t in calls), calls
