"""Runtime installs are bounded: what an archive unpacks to (its listed sizes, then counted, and
the free disk space), a full disk named as such, work folders of a killed install cleaned by the
next runtime command and listed while their install runs, an install that never touches another
build's files, and hostile listings (nested JSON, a file:// URL) as one-line errors. Real
archives built here from the real llama-server, served by the real release server
(tests/releaseserver.py); real processes for the disk limit and the killed install."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from app.core.machine import runtime_archive, runtime_store, runtimes
from tests.releaseserver import ReleaseServer, build_files, make_tar_gz, make_zip
from tests.helpers import clean_error, cli

ROOT = Path(__file__).resolve().parent.parent
TAG = "b9999"
CPU_TGZ = f"llama-{TAG}-bin-ubuntu-x64.tar.gz"
CPU_ZIP = f"llama-{TAG}-bin-ubuntu-x64.zip"
LIMIT_ENV = "MTP_TUNER_RUNTIME_MAX_BYTES"  # the limit on what a runtime may unpack to


@pytest.fixture
def srv():
    s = ReleaseServer().start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def build(server_bin):
    return build_files(server_bin)


def unpacked(files: list[Path]) -> int:
    """What the build unpacks to: links become copies of their files."""
    return sum(f.stat().st_size for f in files)


def zip_with(files: list[Path], extra: dict[str, bytes], listed: dict[str, int] | None = None) -> bytes:
    """The build as a zip, plus ``extra`` members; ``listed`` makes the central directory state
    another uncompressed size for a member than it holds (what a hand-made archive can do)."""
    buf = io.BytesIO(make_zip(files))
    with zipfile.ZipFile(buf, "a", zipfile.ZIP_DEFLATED) as z:
        for name, data in extra.items():
            z.writestr(name, data)
        for name, size in (listed or {}).items():
            z.getinfo(name).file_size = size
    return buf.getvalue()


def leftovers() -> list[str]:
    root = runtime_store.runtimes_dir()
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def one_line(r) -> None:
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "not a readable archive" not in r.stderr, r.stderr


def install(srv, asset: str, *more, env=None, fsize=None):
    return cli("runtime", "install", "--release-url", srv.release_url(), "--asset", asset, *more, env=env,
               fsize=fsize)


# ------------------------------------------------------------------------------------------
# what an archive unpacks to


@pytest.mark.server
@pytest.mark.parametrize("case", ["over the limit", "over the free disk space"])
def test_a_member_listed_larger_than_allowed_is_refused_before_unpacking(srv, build, case):
    """A member whose listed size (10^15 bytes) is over the limit, or (with the limit raised) over
    the free disk space: refused from the listing, naming the archive and the bound; the member
    holds 1 KiB, so the old code installed the build."""
    srv.add(TAG, {CPU_ZIP: zip_with(build, {"big.bin": b"\0" * 1024}, {"big.bin": 10**15})})
    env = {LIMIT_ENV: str(10**18)} if "disk" in case else None
    r = install(srv, CPU_ZIP, env=env)
    want = ("not enough disk space to unpack", "it unpacks to") if "disk" in case else ("lists more than 4.00 GiB",
                                                                                        LIMIT_ENV)
    clean_error(r, CPU_ZIP, *want, "nothing installed")
    one_line(r)
    assert runtime_store.installed() == [] and leftovers() == []


@pytest.mark.server
@pytest.mark.parametrize("fmt", ["zip", "tgz"])
def test_a_bomb_is_refused_and_a_build_within_the_limit_installs(srv, build, fmt):
    """The build plus 8 MiB of zeros (a few KiB packed) with the limit 1 MiB over the build: the
    plain build installs, the bomb is refused and the installed build stays selected and whole."""
    zeros = {"zeros.bin": b"\0" * (8 << 20)}
    plain, bomb = (make_zip(build), zip_with(build, zeros)) if fmt == "zip" else \
        (make_tar_gz(build), make_tar_gz(build, extra=zeros))
    name = CPU_ZIP if fmt == "zip" else CPU_TGZ
    assert len(bomb) < len(plain) + (1 << 20)  # the zeros are nearly free to send
    srv.add("b9998", {name.replace(TAG, "b9998"): plain})
    srv.add(TAG, {name: bomb})
    env = {LIMIT_ENV: str(unpacked(build) + (1 << 20))}
    r = cli("runtime", "install", "--release-url", srv.release_url("b9998"), env=env)
    assert r.returncode == 0, r.stderr
    r = install(srv, name, env=env)
    clean_error(r, name, "more than", LIMIT_ENV, "nothing installed")
    one_line(r)
    assert [x.name for x in runtime_store.installed()] == ["b9998-cpu"] and runtime_store.selected().name == "b9998-cpu"
    assert leftovers() == ["b9998-cpu", "selected.json"]
    # the refused archive is not kept in the download cache (it would be refused again)
    from app.core.engines.server.runtime_install import downloads_dir

    assert not [p.name for p in downloads_dir().iterdir() if not p.name.endswith(".lock")]


def test_links_that_become_copies_count_against_the_limit(tmp_path, monkeypatch):
    """A tar lists one 1 MiB file and 40 links to it: 41 MiB once the links are copies, though the
    listed sizes add up to 1 MiB. Refused with a limit of 8 MiB before anything is written."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        ti = tarfile.TarInfo("d/libx.so.1")
        ti.size = 1 << 20
        t.addfile(ti, io.BytesIO(b"\0" * ti.size))
        for i in range(40):
            li = tarfile.TarInfo(f"d/libx{i}.so")
            li.type, li.linkname = tarfile.SYMTYPE, "libx.so.1"
            t.addfile(li)
    arc = tmp_path / "a.tar.gz"
    arc.write_bytes(buf.getvalue())
    dest = tmp_path / "out"
    dest.mkdir()
    monkeypatch.setenv(LIMIT_ENV, str(8 << 20))
    with pytest.raises(runtimes.RuntimeInstallError, match=r"lists more than 8.0 MiB") as e:
        runtime_archive.safe_extract(arc, dest)
    assert "\n" not in str(e.value) and list(dest.iterdir()) == []


@pytest.mark.server
def test_a_full_disk_is_named_while_downloading_and_while_unpacking(srv, build):
    """A file-size limit in the child stands in for a full disk: below the archive's size the
    download says it cannot write; above it, a member larger than the limit says it cannot unpack
    there, and why, never "not a readable archive"."""
    biggest = max(f.stat().st_size for f in build)
    probe = zip_with(build, {"zeros.bin": b"\0" * (biggest + (4 << 20))})
    fsize = max(len(probe), biggest) + (1 << 20)
    arc = zip_with(build, {"zeros.bin": b"\0" * (fsize + (1 << 20))})
    assert len(arc) < fsize
    srv.add(TAG, {CPU_ZIP: arc})
    r = install(srv, CPU_ZIP, fsize=len(arc) // 2)
    clean_error(r, CPU_ZIP, "cannot write (the file is larger than this system allows)")
    r = install(srv, CPU_ZIP, fsize=fsize)
    clean_error(r, "zeros.bin: cannot unpack there (the file is larger than this system allows)",
                "nothing installed")
    one_line(r)
    assert runtime_store.installed() == [] and leftovers() == []


# ------------------------------------------------------------------------------------------
# work folders left by a killed install


def test_a_killed_install_is_listed_while_it_runs_and_cleaned_after(srv, tmp_path):
    """A real install stopped in validation (its llama-server waits on a FIFO): `runtime list`
    shows its staging folder as in use and leaves it; once the process is killed, the next
    runtime command (here a failing `remove`) deletes it."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!/bin/sh\ncat '{fifo}' > /dev/null\nexit 1\n")
    exe.chmod(0o755)
    srv.add(TAG, {CPU_TGZ: make_tar_gz([exe], extra={"build/bin/padding.bin": b"p" * (3 << 20)})})
    env = dict(os.environ)
    child = subprocess.Popen([sys.executable, "-m", "app", "runtime", "install", "--release-url",
                              srv.release_url()], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    staging = runtime_store.runtimes_dir() / f".staging-{TAG}-cpu-{child.pid}"
    try:
        with open(fifo, "wb") as w:  # opens once the child's llama-server --version reads it
            assert staging.is_dir() and (staging / "build" / "bin" / "padding.bin").is_file()
            r = cli("runtime", "list")
            assert r.returncode == 0, r.stderr
            assert str(staging) in r.stdout and f"by pid {child.pid} still running" in r.stdout, r.stdout
            assert staging.is_dir()  # in use: not removed
            child.kill()
            child.wait()
            w.write(b"x")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert staging.is_dir()  # what a killed install leaves
    r = cli("runtime", "remove", "nope")
    clean_error(r, f"removed {staging.name} (3.0 MiB), left over from an install that stopped",
                "'nope': no such runtime installed")
    assert leftovers() == []
    r = cli("runtime", "list")
    assert r.returncode == 0 and ".staging-" not in r.stdout + r.stderr


def test_a_runtime_moved_aside_by_a_killed_reinstall_comes_back(tmp_path):
    """A reinstall killed between moving the old build aside and moving the new one in leaves
    ``.replaced-<name>-<pid>``: the next runtime command puts the build back under its name."""
    aside = runtime_store.runtimes_dir() / ".replaced-b1-cpu-4194999"
    aside.mkdir(parents=True)
    exe = aside / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (aside / runtimes.META).write_text(json.dumps({"server": "llama-server", "tag": "b1", "backend": "cpu",
                                            "asset": "a.zip", "version": "1"}))
    r = cli("runtime", "list")
    assert r.returncode == 0, r.stderr
    assert "b1-cpu: put back from .replaced-b1-cpu-4194999" in r.stderr and "  b1-cpu " in r.stdout, r.stdout
    assert leftovers() == ["b1-cpu"] and (runtime_store.runtimes_dir() / "b1-cpu" / "llama-server").is_file()


# ------------------------------------------------------------------------------------------
# one install, one folder


@pytest.mark.server
def test_another_asset_with_the_same_tag_and_backend_is_installed_beside(srv, build):
    """Two CPU builds of one release (a .tar.gz and a .zip): the second, with --no-select, goes
    into its own folder; the selected build's folder, files and runtime.json are untouched."""
    srv.add(TAG, {CPU_TGZ: make_tar_gz(build), CPU_ZIP: make_zip(build)})
    r = install(srv, CPU_TGZ)
    assert r.returncode == 0, r.stderr
    first = runtime_store.selected()
    assert first is not None and first.name == f"{TAG}-cpu" and first.asset == CPU_TGZ
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in first.folder.rglob("*")}
    r = install(srv, CPU_ZIP, "--no-select")
    assert r.returncode == 0, r.stderr
    assert f"{TAG}-cpu (holds {CPU_TGZ}): taken, so {CPU_ZIP} is installed beside it as {TAG}-cpu-2" in r.stdout
    assert f"installed {TAG}-cpu-2" in r.stdout
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in first.folder.rglob("*")} == before
    sel = runtime_store.selected()
    assert sel is not None and sel.name == first.name and sel.asset == CPU_TGZ
    assert {x.name: x.asset for x in runtime_store.installed()} == {f"{TAG}-cpu": CPU_TGZ, f"{TAG}-cpu-2": CPU_ZIP}


# ------------------------------------------------------------------------------------------
# hostile listings


@pytest.mark.parametrize("body", [b"[" * 200_000 + b"]" * 200_000,
                                  b'{"tag_name": "b1", "assets": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"])
def test_a_deeply_nested_release_listing_is_one_line(srv, body):
    srv.add("deep", {"release.json": body})  # served as given, at /download/deep/release.json
    r = cli("runtime", "install", "--release-url", f"{srv.url}/download/deep/release.json")
    clean_error(r, "deep/release.json", "nested too deeply")
    one_line(r)


def test_a_file_url_asset_is_refused(srv, tmp_path):
    secret = tmp_path / "secret.tar.gz"
    secret.write_bytes(b"not for download")
    name = "llama-b1-bin-ubuntu-x64.tar.gz"
    srv.add("b1", {name: secret.read_bytes()})
    listing = srv.release_json

    def with_file_url(tag):  # the release lists the asset at a file:// URL
        d = listing(tag)
        d["assets"][0]["browser_download_url"] = secret.as_uri()
        return d

    srv.release_json = with_file_url
    r = cli("runtime", "install", "--release-url", srv.release_url("b1"), "--asset", name)
    clean_error(r, secret.as_uri(), "not an https:// URL", "refused")
    one_line(r)
    r = cli("runtime", "install", "--release-url", secret.as_uri())
    clean_error(r, secret.as_uri(), "not an https:// URL")
    one_line(r)
    assert runtime_store.installed() == [] and leftovers() == []


def test_a_saved_release_listing_that_is_a_fifo_is_refused_at_once(tmp_path):
    """`runtime install --releases FILE` reads through the one capped reader of input files
    (common.reading.read_capped): a FIFO with no writer is refused in one line, not waited on."""
    from app.core.machine.runtime_release import MAX_RELEASE_BYTES, load_releases

    fifo = tmp_path / "releases.json"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "app", "runtime", "install", "--releases", str(fifo)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{fifo}: is a FIFO (named pipe), not a regular file" in r.stderr
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_RELEASE_BYTES + 1))
    with pytest.raises(runtimes.RuntimeInstallError, match=r"big\.json: [\d,]+ bytes, more than the \S+ \S+ a release listing may have$"):
        load_releases(big)
