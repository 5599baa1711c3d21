"""What counts as "this machine has a GPU" everywhere: the analysis (measured on the CPU of a GPU
machine), the engine choice and the Sweep tab read the same vendors of a hardware snapshot's GPUs."""

from __future__ import annotations

# GPUs a llama.cpp GPU build would use: NVIDIA (CUDA, Vulkan), Apple (Metal), AMD (ROCm/HIP,
# Vulkan). Not Intel: nearly every laptop has an Intel iGPU, and measuring on its CPU is no mistake.
GPU_VENDORS = ("nvidia", "apple", "amd")


def is_gpu_vendor(vendor: object) -> bool:
    """Whether a snapshot's (or a record host's) GPU vendor is one a llama.cpp GPU build would use."""
    return vendor in GPU_VENDORS
