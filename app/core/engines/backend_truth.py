"""Backend truth, the leaf every engine module may import: which ggml backends and devices an
engine really has, and where a loaded model's layers went.

- ``llama-server --list-devices`` prints "Available devices:" and one line per non-CPU device,
  ``  CUDA0: NVIDIA GeForce RTX 4090 (24564 MiB, 23012 MiB free)``; a build without a GPU backend
  prints ``  (none)`` (parse_list_devices).
- After a load, llama.cpp logs ``using device CUDA0 (...)`` per device it uses and ``offloaded
  N/M layers to GPU`` (only when the build can offload at all; llama-server shows these library
  lines from ``-lv 4`` on), and ``<buffer> model buffer size`` per weight buffer (parse_load_log).
- The in-process engine asks its own library (llama_backend.inprocess_backends).

Which engine a sweep uses by default (engines.devices) is built on these.

What a run record keeps of it is a Placement: the backend that held the weights ("CPU", "CUDA",
"Metal", "Vulkan", ...), the devices, and N of M layers on a GPU (0 of M on a CPU-only build)."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Iterable

from app.core.common.errors import EngineError

if TYPE_CHECKING:  # for annotations only
    from app.core.machine.gguf_info import GGUFHeader
    from app.core.records.schema import RunRecord

CPU = "CPU"


@dataclasses.dataclass(frozen=True)
class Device:
    name: str  # ggml's device name: "CUDA0", "Metal", "Vulkan0", "CPU"
    description: str  # "NVIDIA GeForce RTX 4090"
    kind: str = "gpu"  # "cpu", "gpu", "igpu", "accel"
    memory_total: int | None = None  # bytes
    memory_free: int | None = None

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("gpu", "igpu")

    @property
    def backend(self) -> str:
        """The backend of a device name: "CUDA0" -> "CUDA", "Vulkan1" -> "Vulkan", "MTL0" -> "Metal"."""
        return backend_of(self.name)

    def label(self) -> str:
        mem = f", {self.memory_total / 2**30:.1f} GiB" if self.memory_total else ""
        return f"{self.name}: {self.description}{mem}" if self.description else self.name


def backend_of(name: str) -> str:
    """The backend of a device or buffer name: "CUDA0" -> "CUDA", "Vulkan1" -> "Vulkan",
    "MTL0" -> "Metal", "CPU_Mapped" -> "CPU"."""
    n = name.strip()
    if not n or n.upper().startswith("CPU"):
        return CPU
    base = re.sub(r"\d+$", "", n.split("_")[0])
    return "Metal" if base.upper() in ("MTL", "METAL") else base


_DEV_LINE = re.compile(r"^\s+([^\s:]+):\s*(.*?)\s*(?:\((\d+) MiB, (\d+) MiB free\))?\s*$")


def parse_list_devices(text: str) -> tuple[Device, ...]:
    """The GPU (and other non-CPU) devices ``llama-server --list-devices`` printed; () for
    "(none)". Raises EngineError when the text is not such a list (an old build without the option)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == "Available devices:"), None)
    if start is None:
        raise EngineError("--list-devices did not print 'Available devices:' (a llama-server too old "
                          "for --list-devices?)")
    out = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            continue
        if ln.strip() == "(none)":
            break
        m = _DEV_LINE.match(ln)
        if not m or not ln.startswith((" ", "\t")):
            break  # the list ended (some builds log more after it)
        total = int(m.group(3)) * 2**20 if m.group(3) else None
        free = int(m.group(4)) * 2**20 if m.group(4) else None
        out.append(Device(m.group(1), m.group(2), "gpu", total, free))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one engine's model ran: what run records keep (backend, devices, offloaded_layers,
    layers_total). ``offloaded`` None: not known (an old build that did not say)."""

    backend: str
    devices: tuple[str, ...]
    offloaded: int | None
    layers_total: int | None

    @classmethod
    def of_record(cls, r: RunRecord) -> "Placement | None":
        """Where a run record's model ran (schema 2), None where the record does not say (schema 1)."""
        if r.backend is None:
            return None
        return cls(r.backend, tuple(r.devices), r.offloaded_layers, r.layers_total)

    @property
    def on_cpu(self) -> bool:
        """On the CPU: a CPU backend, or no layer offloaded to the GPU."""
        return self.backend == CPU or self.offloaded == 0

    def text(self) -> str:
        """In words: "CUDA (CUDA0); 20/33 layers on the GPU"."""
        layers = ""
        if self.offloaded is not None and self.layers_total:
            layers = f"; {self.offloaded}/{self.layers_total} layers on the GPU"
        return f"{self.backend} ({', '.join(self.devices) or '-'}){layers}"


def layers_total(hdr: GGUFHeader) -> int | None:
    """A model's layer count as llama.cpp's "offloaded N/M layers" counts it: its blocks and the
    output layer (a GGUF header's <arch>.block_count + 1); None where the header does not say."""
    blocks = hdr.metadata.get(f"{hdr.arch}.block_count")
    return blocks + 1 if type(blocks) is int else None


_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_USING = re.compile(r"using device (\S+) \(([^)]*)\)")
_MODEL_BUF = re.compile(r"load_tensors:\s+(\S+) model buffer size\s*=")


def parse_load_log(lines: Iterable[str], available: Iterable[Device] = (),
                   layers_total: int | None = None) -> Placement:
    """The placement a llama.cpp load log shows. Its "using device" lines name the devices the
    model was given, "offloaded N/M layers to GPU" how many layers went to them, and the model
    buffer lines which backends hold weights. A log with none of them comes from a build that
    cannot offload (or, for llama-server, from one run below -lv 4): then the devices it listed
    (``available``) decide: none means the CPU."""
    used: dict[str, str] = {}
    offloaded = total = None
    buffers: list[str] = []
    for ln in lines:
        m = _USING.search(ln)
        if m:
            used.setdefault(m.group(1), m.group(2))
        m = _OFFLOADED.search(ln)
        if m:
            offloaded, total = int(m.group(1)), int(m.group(2))
        m = _MODEL_BUF.search(ln)
        if m and m.group(1) not in buffers:
            buffers.append(m.group(1))
    gpus = [d for d in available if d.is_gpu]
    total = total or layers_total
    if offloaded == 0 or (not used and offloaded is None and not gpus):
        return Placement(CPU, (CPU,), 0 if (offloaded == 0 or not gpus) else None, total)
    if used:
        names = tuple(f"{n} ({d})" if d else n for n, d in used.items())
        return Placement(backend_of(next(iter(used))), names, offloaded, total)
    gpu_bufs = [b for b in buffers if backend_of(b) != CPU and not b.endswith("_Host")]
    if gpu_bufs:
        return Placement(backend_of(gpu_bufs[0]), tuple(gpu_bufs), offloaded, total)
    if offloaded is None:  # the log said nothing of the load (llama-server below -lv 4): not known
        return Placement(backend_of(gpus[0].name), tuple(d.label() for d in gpus), None, total)
    # "offloaded N/M layers" with no device used and no weights off the CPU: a build whose only
    # offload backend is RPC run without workers says N of the -ngl asked for, yet all ran here
    return Placement(CPU, (CPU,), 0, total)


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """What one engine has before any load: its backends and devices (CPU included when known),
    whether it can offload, and a note (why it is not known, or what the build said)."""

    engine: str  # "inprocess" or "server"
    build: str
    backends: tuple[str, ...]
    devices: tuple[Device, ...]
    gpu_offload: bool
    note: str | None = None

    @property
    def gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.is_gpu)

    def will_use(self) -> str:
        """The device this engine will really run the model on, in words."""
        if self.gpus:
            return ", ".join(d.label() for d in self.gpus)
        return "the CPU (this build has no GPU backend)" if not self.gpu_offload else "the CPU (no GPU device found)"

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "build": self.build, "backends": list(self.backends),
                "devices": [dataclasses.asdict(d) for d in self.devices], "gpu_offload": self.gpu_offload,
                "will_use": self.will_use(), "note": self.note}
