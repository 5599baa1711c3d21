"""llama.cpp runtimes from upstream releases, and what their modules share: the error every step
raises, the server's file names, the name and marker file of an installed build. Read in this order:

- runtime_release: reading a release (GitHub's release API JSON: asset names, sizes,
  ``digest: "sha256:..."``; read from https only, bounded in size, a hostile answer one line);
- runtime_host: the machine the build is for (OS, architecture, GPUs, Vulkan loader, HIP runtime),
  from the hardware snapshot or a described machine;
- runtime_choice: picking the build for that machine (a pure function of the host and the asset
  list, saying why), and the release to take it from;
- runtime_archive: unpacking; runtime_store: the per-user runtimes folder (several builds side by
  side, one selected).

Downloading goes through app.core.machine.download (resumable, sha256-checked); validating a
build (``--version``, ``--list-devices``, ``--help``) and the install as a whole are in
app.core.engines.server.runtime_install, which runs llama-server.

A runtime is offered only when its folder holds ``runtime.json``, written last, after the build
was validated; a folder is moved into the runtimes folder whole (one rename), so nothing
half-unpacked ever sits under a runtime's name."""

from __future__ import annotations

import re
from pathlib import Path

from app.core.common.errors import UserError, os_reason

SERVER_NAMES = ("llama-server", "llama-server.exe")
META = "runtime.json"
RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class RuntimeInstallError(UserError):
    """A runtime that cannot be listed, downloaded, unpacked, validated or selected."""


def os_error_text(e: OSError, where: Path) -> str:
    """One line for a failed file operation in the runtimes folder: the path and the cause."""
    return f"{e.filename or where}: cannot change the runtimes folder there ({os_reason(e)})"
