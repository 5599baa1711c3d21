"""The engine that matches the GPU: choose_engine, a pure function of the
hardware snapshot's GPUs and each engine's BackendInfo, on recorded answers (NVML, Apple sysctl,
--list-devices texts as builds print them, the device registry of a Metal llama-cpp-python)."""

from __future__ import annotations

from app.core.engines.devices import choose_engine, engine_choice, host_gpu_names
from app.core.machine import hardware as H
from tests.helpers import INPROC_CPU, INPROC_METAL, LIST_CUDA, LIST_NONE, gpu_snapshot, server_info


def apple_snapshot() -> H.HardwareSnapshot:
    g, notes = H.apple_gpu({"machdep.cpu.brand_string": "Apple M5 Max", "hw.memsize": "137438953472",
                            "iogpu.wired_limit_mb": "0"}.get, 40)
    return H.HardwareSnapshot("macOS", "Apple M5 Max", 16, 16, 128 * 2**30, 100 * 2**30, (g,), True, tuple(notes))


def test_nvidia_with_a_cuda_runtime_measures_on_the_gpu_through_llama_server():
    hw = gpu_snapshot()
    c = choose_engine(host_gpu_names(hw), (INPROC_CPU, None), (server_info(LIST_CUDA), None),
                      runtime="b6123-cuda")
    assert (c.kind, c.on_gpu) == ("server", True)
    assert c.sentence() == ("will measure on: NVIDIA GeForce RTX 3060 via llama-server b6123, runtime b6123-cuda "
                            "(CUDA)")
    assert "in-process build has no GPU backend" in c.reason and "b6123-cuda lists NVIDIA GeForce RTX 3060" in c.reason
    # the other engine, if the user picks it, says it is not the GPU
    assert c.sentence("inprocess") == ("will measure on: CPU (in-process; this build has no GPU backend), not your "
                                       f"{hw.gpus[0].name}")


def test_nvidia_with_only_cpu_builds_stays_in_process_and_says_it_is_not_the_gpu():
    hw = gpu_snapshot()
    name = hw.gpus[0].name
    c = choose_engine(host_gpu_names(hw), (INPROC_CPU, None), (server_info(LIST_NONE, "b6000 (0000000)"), None))
    assert (c.kind, c.on_gpu) == ("inprocess", False)
    assert c.sentence() == f"will measure on: CPU (in-process; this build has no GPU backend), not your {name}"
    assert c.sentence("server") == f"will measure on: CPU (llama-server b6000; --list-devices shows no GPU), not your {name}"
    assert c.reason.startswith(f"no engine here runs on your {name}") and "Get llama.cpp for this machine" in c.reason
    # no llama-server at all: the same choice, and the reason says why llama-server is out
    c2 = choose_engine(host_gpu_names(hw), (INPROC_CPU, None), (None, "no llama-server found"))
    assert c2.kind == "inprocess" and "no llama-server (no llama-server found)" in c2.reason
    assert c2.sentence("server").startswith("will measure on: nothing; the llama-server engine is not available")


def test_apple_with_a_metal_llama_cpp_python_measures_in_process_even_beside_a_gpu_server():
    hw = apple_snapshot()
    metal_server = "Available devices:\n  MTL0: Apple M5 Max (98304 MiB, 98303 MiB free)\n"
    c = choose_engine(host_gpu_names(hw), (INPROC_METAL, None), (server_info(metal_server), None))
    assert (c.kind, c.on_gpu) == ("inprocess", True)
    assert c.sentence() == "will measure on: Apple M5 Max (in-process llama-cpp-python 0.3.16, Metal)"
    assert c.sentence("server") == "will measure on: Apple M5 Max via llama-server b6123 (Metal)"
    assert "offloads to Apple M5 Max" in c.reason


def test_no_gpu_measures_in_process_on_the_cpu_without_blaming_anyone():
    hw = gpu_snapshot(gpus=False)
    assert host_gpu_names(hw) == []
    c = choose_engine(host_gpu_names(hw), (INPROC_CPU, None), (server_info(LIST_NONE), None))
    assert (c.kind, c.on_gpu) == ("inprocess", False)
    assert c.sentence() == "will measure on: CPU (in-process; this build has no GPU backend)"
    assert c.reason == "no GPU in this machine: in-process (llama-cpp-python) on the CPU"
    # without llama-cpp-python, llama-server on the CPU is what is left
    c2 = choose_engine([], (None, "llama-cpp-python is not installed"), (server_info(LIST_NONE), None))
    assert c2.kind == "server" and c2.sentence() == "will measure on: CPU (llama-server b6123; --list-devices shows no GPU)"


def test_engine_choice_reads_the_rows_of_engine_backends():
    rows = [("inprocess", INPROC_CPU, None), ("server", server_info(LIST_CUDA), None)]
    assert engine_choice(["NVIDIA GeForce RTX 3060"], rows).kind == "server"
    assert engine_choice([], [("inprocess", INPROC_CPU, None)]).sentence("server").endswith("(not asked)")
