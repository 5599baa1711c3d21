"""The runtime picker on three recorded release listings of different eras (tests/data/releases_*:
GitHub's release API JSON with upstream's asset names of that time): the build for described
machines (NVIDIA on 12.x and 13.x drivers, AMD with and without the HIP runtime, Apple Silicon,
no GPU on x64 and arm64), the newest bNNNN release with a build for the machine (a "latest" with
no binaries and the builds that cannot start draft-mtp skipped), and ``runtime install --dry-run``
with ``--host``/``--releases``: what would be installed and why, nothing downloaded, and a bad
file one clean error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.machine import runtime_choice, runtime_host, runtime_release, runtimes

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
ERA_2024 = DATA / "releases_2024_b3906.json"  # cu12.2.0 names, avx2 CPU build, zips, no Linux GPU builds
ERA_2026_MID = DATA / "releases_2026mid_b10240.json"  # CUDA 12.4/13.3 for Windows, ROCm 7.2, win-hip-radeon
ERA_2026_LATE = DATA / "releases_2026late_b11434.json"  # Linux CUDA with cudart tarballs, ROCm 10.0, a semver "latest"


def nvidia(cuda, name="NVIDIA GeForce RTX 5090", driver="581.57"):
    return {"vendor": "nvidia", "name": name, "cuda": cuda, "driver": driver}


AMD = {"vendor": "amd", "name": "AMD Radeon RX 7900 XTX", "cuda": None, "driver": None}
APPLE = {"vendor": "apple", "name": "Apple M3 Max", "cuda": None, "driver": None}


def host(os_, arch, gpus=(), vulkan=False, hip=False):
    return {"os": os_, "arch": arch, "gpus": list(gpus), "vulkan_loader": vulkan, "hip_runtime": hip}


CASES = [
    # (listing, machine, release, asset, extras, backend)
    (ERA_2026_LATE, host("linux", "x64", [nvidia("12.9", "NVIDIA GeForce RTX 4090")], vulkan=True),
     "b11434", "llama-b11434-bin-ubuntu-cuda-12.8-x64.tar.gz",
     ["cudart-llama-b11434-bin-ubuntu-cuda-12.8-x64.tar.gz"], "cuda"),
    (ERA_2026_LATE, host("linux", "x64", [nvidia("13.5")], vulkan=True),
     "b11434", "llama-b11434-bin-ubuntu-cuda-13.4-x64.tar.gz",
     ["cudart-llama-b11434-bin-ubuntu-cuda-13.4-x64.tar.gz"], "cuda"),
    (ERA_2026_LATE, host("windows", "x64", [nvidia("12.9", "NVIDIA GeForce RTX 3090")], vulkan=True),
     "b11434", "llama-b11434-bin-win-cuda-12.4-x64.zip", ["cudart-llama-bin-win-cuda-12.4-x64.zip"], "cuda"),
    (ERA_2026_LATE, host("windows", "x64", [nvidia("13.5")], vulkan=True),
     "b11434", "llama-b11434-bin-win-cuda-13.4-x64.zip", ["cudart-llama-bin-win-cuda-13.4-x64.zip"], "cuda"),
    (ERA_2026_LATE, host("macos", "arm64", [APPLE]), "b11434", "llama-b11434-bin-macos-arm64.tar.gz", [], "metal"),
    (ERA_2026_LATE, host("linux", "x64"), "b11434", "llama-b11434-bin-ubuntu-x64.tar.gz", [], "cpu"),
    (ERA_2026_LATE, host("linux", "arm64"), "b11434", "llama-b11434-bin-ubuntu-arm64.tar.gz", [], "cpu"),
    (ERA_2026_LATE, host("windows", "x64"), "b11434", "llama-b11434-bin-win-cpu-x64.zip", [], "cpu"),
    (ERA_2026_LATE, host("windows", "arm64"), "b11434", "llama-b11434-bin-win-cpu-arm64.zip", [], "cpu"),
    (ERA_2026_LATE, host("linux", "x64", [AMD], vulkan=True, hip=True),
     "b11434", "llama-b11434-bin-ubuntu-rocm-10.0-x64.tar.gz", [], "rocm"),
    (ERA_2026_LATE, host("linux", "x64", [AMD], vulkan=True, hip=False),
     "b11434", "llama-b11434-bin-ubuntu-vulkan-x64.tar.gz", [], "vulkan"),
    (ERA_2026_LATE, host("windows", "x64", [AMD], vulkan=True, hip=True),
     "b11434", "llama-b11434-bin-win-rocm-10.0-x64.zip", [], "rocm"),
    (ERA_2026_LATE, host("windows", "x64", [AMD], vulkan=True, hip=False),
     "b11434", "llama-b11434-bin-win-vulkan-x64.zip", [], "vulkan"),
    (ERA_2026_LATE, host("linux", "x64", [{"vendor": "intel", "name": "Intel Arc A770"}], vulkan=True),
     "b11434", "llama-b11434-bin-ubuntu-vulkan-x64.tar.gz", [], "vulkan"),
    (ERA_2026_LATE, host("linux", "x64", [{"vendor": "intel", "name": "Intel Arc A770"}], vulkan=False),
     "b11434", "llama-b11434-bin-ubuntu-x64.tar.gz", [], "cpu"),
    # a driver older than every CUDA build: Vulkan
    (ERA_2026_LATE, host("linux", "x64", [nvidia("12.2")], vulkan=True),
     "b11434", "llama-b11434-bin-ubuntu-vulkan-x64.tar.gz", [], "vulkan"),
    # mid 2026: Windows CUDA 12.4 and 13.3, no Linux CUDA; b10745 (cannot start draft-mtp) skipped
    (ERA_2026_MID, host("windows", "x64", [nvidia("13.5")], vulkan=True),
     "b10240", "llama-b10240-bin-win-cuda-13.3-x64.zip", ["cudart-llama-bin-win-cuda-13.3-x64.zip"], "cuda"),
    (ERA_2026_MID, host("windows", "x64", [nvidia("13.0")], vulkan=True),
     "b10240", "llama-b10240-bin-win-cuda-12.4-x64.zip", ["cudart-llama-bin-win-cuda-12.4-x64.zip"], "cuda"),
    (ERA_2026_MID, host("windows", "x64", [nvidia("12.9")]),
     "b10240", "llama-b10240-bin-win-cuda-12.4-x64.zip", ["cudart-llama-bin-win-cuda-12.4-x64.zip"], "cuda"),
    (ERA_2026_MID, host("linux", "x64", [nvidia("13.5")], vulkan=True),
     "b10240", "llama-b10240-bin-ubuntu-vulkan-x64.tar.gz", [], "vulkan"),
    (ERA_2026_MID, host("linux", "x64", [nvidia("12.9")], vulkan=False),
     "b10240", "llama-b10240-bin-ubuntu-x64.tar.gz", [], "cpu"),
    (ERA_2026_MID, host("linux", "x64", [AMD], hip=True), "b10240", "llama-b10240-bin-ubuntu-rocm-7.2-x64.tar.gz",
     [], "rocm"),
    (ERA_2026_MID, host("windows", "x64", [AMD], hip=True), "b10240", "llama-b10240-bin-win-hip-radeon-x64.zip",
     [], "hip"),
    (ERA_2026_MID, host("windows", "arm64"), "b10240", "llama-b10240-bin-win-cpu-arm64.zip", [], "cpu"),
    (ERA_2026_MID, host("linux", "arm64"), "b10240", "llama-b10240-bin-ubuntu-arm64.tar.gz", [], "cpu"),
    (ERA_2026_MID, host("linux", "x64"), "b10240", "llama-b10240-bin-ubuntu-x64.tar.gz", [], "cpu"),
    (ERA_2026_MID, host("macos", "arm64", [APPLE]), "b10240", "llama-b10240-bin-macos-arm64.tar.gz", [], "metal"),
    # 2024: "cuda-cu12.2.0" names, cudart "win-cu12.2.0", an avx2 CPU build, llvm on arm64
    (ERA_2024, host("windows", "x64", [nvidia("12.4", "NVIDIA GeForce RTX 3060", "551.61")]),
     "b3906", "llama-b3906-bin-win-cuda-cu12.2.0-x64.zip", ["cudart-llama-bin-win-cu12.2.0-x64.zip"], "cuda"),
    (ERA_2024, host("windows", "x64", [nvidia("13.0")]),
     "b3906", "llama-b3906-bin-win-cuda-cu12.2.0-x64.zip", ["cudart-llama-bin-win-cu12.2.0-x64.zip"], "cuda"),
    (ERA_2024, host("windows", "x64", [nvidia("11.8", "NVIDIA GeForce GTX 1080", "522.06")]),
     "b3906", "llama-b3906-bin-win-cuda-cu11.7.1-x64.zip", ["cudart-llama-bin-win-cu11.7.1-x64.zip"], "cuda"),
    (ERA_2024, host("windows", "x64"), "b3906", "llama-b3906-bin-win-avx2-x64.zip", [], "cpu"),
    (ERA_2024, host("windows", "arm64"), "b3906", "llama-b3906-bin-win-llvm-arm64.zip", [], "cpu"),
    (ERA_2024, host("linux", "x64", [nvidia("12.4")], vulkan=True), "b3906", "llama-b3906-bin-ubuntu-x64.zip", [],
     "cpu"),
    (ERA_2024, host("linux", "x64"), "b3906", "llama-b3906-bin-ubuntu-x64.zip", [], "cpu"),
    (ERA_2024, host("macos", "arm64", [APPLE]), "b3906", "llama-b3906-bin-macos-arm64.zip", [], "metal"),
    (ERA_2024, host("windows", "x64", [AMD], vulkan=True, hip=True), "b3906", "llama-b3906-bin-win-vulkan-x64.zip",
     [], "vulkan"),
]


def _id(case):
    listing, h, *_ = case
    gpu = h["gpus"][0]["vendor"] + (f"-cuda{h['gpus'][0]['cuda']}" if h["gpus"][0].get("cuda") else "") if h["gpus"] else "nogpu"
    return f"{listing.stem.split('_')[1]}-{h['os']}-{h['arch']}-{gpu}" + ("-hip" if h["hip_runtime"] else "") \
        + ("-vk" if h["vulkan_loader"] else "")


def _host_file(tmp_path, h) -> Path:
    f = tmp_path / "host.json"
    f.write_text(json.dumps(h))
    return f


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_the_build_for_each_described_machine(case, tmp_path):
    listing, h, tag, asset, extras, backend = case
    rel, choice, skipped = runtime_choice.pick(runtime_host.host_from_file(_host_file(tmp_path, h)),
                                         runtime_release.load_releases(listing))
    assert (rel.tag, choice.asset.name, [x.name for x in choice.extras], choice.backend) == \
        (tag, asset, extras, backend)
    assert choice.why and "\n" not in choice.why
    assert choice.gpu_expected == (backend != "cpu")
    if backend == "cuda":  # says which driver CUDA it read and the build it goes with
        assert h["gpus"][0]["cuda"] in choice.why and extras[0] in choice.why


def test_a_latest_without_binaries_and_the_broken_builds_are_skipped():
    rel, _, skipped = runtime_choice.pick(runtime_host.Host("linux", "x64"), runtime_release.load_releases(ERA_2026_LATE))
    assert rel.tag == "b11434" and skipped == ("v0.6.0: skipped (no binaries in this release)",)
    rel, _, skipped = runtime_choice.pick(runtime_host.Host("linux", "x64"), runtime_release.load_releases(ERA_2026_MID))
    assert rel.tag == "b10240" and len(skipped) == 1 and skipped[0].startswith("b10745: skipped")
    assert "b10749" in skipped[0]
    # order in the listing does not matter: the newest bNNNN first
    rels = runtime_release.load_releases(ERA_2026_LATE)
    assert runtime_choice.pick(runtime_host.Host("linux", "x64"), rels[::-1])[0].tag == "b11434"


def test_the_newest_release_with_a_build_for_this_machine():
    """A newest release without this machine's build (a partial upload) gives way to an older one
    that has it; none at all is one clear error."""
    late = runtime_release.load_releases(ERA_2026_LATE)
    partial = runtime_release.Release("b11435", tuple(a for a in late[1].assets if "ubuntu" not in a.name), "x")
    rel, choice, skipped = runtime_choice.pick(runtime_host.Host("linux", "arm64"), (partial, *late))
    assert rel.tag == "b11434" and choice.asset.name == "llama-b11434-bin-ubuntu-arm64.tar.gz"
    assert skipped[1].startswith("b11435: skipped (the release has no Linux arm64 build")
    with pytest.raises(runtimes.RuntimeInstallError, match="no release has a build for linux arm64") as e:
        runtime_choice.pick(runtime_host.Host("linux", "arm64"), runtime_release.load_releases(ERA_2024))
    assert "\n" not in str(e.value)


def test_patterns_not_versions():
    """A CUDA, ROCm or cudart version no listing here has is matched all the same."""
    names = ["llama-b20000-bin-ubuntu-cuda-14.1-x64.tar.gz", "cudart-llama-b20000-bin-ubuntu-cuda-14.1-x64.tar.gz",
             "llama-b20000-bin-ubuntu-cuda-13.9-x64.tar.gz", "cudart-llama-b20000-bin-ubuntu-cuda-13.9-x64.tar.gz",
             "llama-b20000-bin-ubuntu-rocm-11.3-x64.tar.gz", "llama-b20000-bin-ubuntu-x64.tar.gz"]
    rel = runtime_release.parse_releases({"tag_name": "b20000", "assets": [
        {"name": n, "size": 1, "browser_download_url": f"https://x/{n}"} for n in names]}, "made up")
    h = runtime_host.Host("linux", "x64", (runtime_host.HostGPU("nvidia", "GPU", "14.2"),), True)
    assert runtime_choice.pick(h, rel)[1].asset.name == names[0]
    h = runtime_host.Host("linux", "x64", (runtime_host.HostGPU("nvidia", "GPU", "14.0"),), True)
    c = runtime_choice.pick(h, rel)[1]
    assert c.asset.name == names[2] and "14.1 build needs a newer driver" in c.why
    h = runtime_host.Host("linux", "x64", (runtime_host.HostGPU("amd", "GPU"),), True, True)
    assert runtime_choice.pick(h, rel)[1].asset.name == names[4]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "MTP_TUNER_RELEASES_URL": "http://127.0.0.1:9/none"})


def test_dry_run_json_and_text_offline(tmp_path):
    f = _host_file(tmp_path, host("windows", "x64", [nvidia("13.5")], vulkan=True))
    r = cli("runtime", "install", "--dry-run", "--host", str(f), "--releases", str(ERA_2026_LATE), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {k: out[k] for k in ("asset", "extras", "backend")} == {
        "asset": "llama-b11434-bin-win-cuda-13.4-x64.zip", "extras": ["cudart-llama-bin-win-cuda-13.4-x64.zip"],
        "backend": "cuda"}
    assert "13.5" in out["why"] and out["release"] == "b11434"
    f = _host_file(tmp_path, host("linux", "arm64"))
    r = cli("runtime", "install", "--dry-run", "--host", str(f), "--releases", str(ERA_2026_LATE))
    assert r.returncode == 0, r.stderr
    for frag in ("v0.6.0: skipped (no binaries", "release b11434", "would install: llama-b11434-bin-ubuntu-arm64.tar.gz",
                 "backend: cpu", "why: ", "nothing downloaded"):
        assert frag in r.stdout, (frag, r.stdout)
    # nothing was downloaded or installed
    home = Path(os.environ["MTP_TUNER_HOME"])
    assert not list(home.rglob("*.tar.gz")) and not list(home.rglob("*.zip"))


@pytest.mark.parametrize("content, cause", [
    ("{", "not JSON"),
    ("[]", "expected a JSON object"),
    ('{"os": "beos", "arch": "x64"}', "os is 'beos'"),
    ('{"os": "linux", "arch": "riscv"}', "arch is 'riscv'"),
    ('{"os": "linux", "arch": "x64", "gpus": [{"vendor": "nvidia", "cuda": 12.9}]}', "gpu 1: cuda is 12.9"),
    ('{"os": "linux", "arch": "x64", "gpus": [{"vendor": "3dfx"}]}', "gpu 1: vendor is '3dfx'"),
    ('{"os": "linux", "arch": "x64", "vulkan_loader": "yes"}', "vulkan_loader is 'yes'"),
    ('{"os": "linux", "arch": "x64", "vulkan": true}', "unknown key 'vulkan'"),
    (None, "cannot read the machine description"),
])
def test_a_bad_host_file_is_one_clean_error(tmp_path, content, cause):
    f = tmp_path / "host.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(runtimes.RuntimeInstallError) as e:
        runtime_host.host_from_file(f)
    assert str(e.value).startswith(str(f)) and cause in str(e.value) and "\n" not in str(e.value)


def test_cli_bad_files_are_one_line(tmp_path):
    bad = tmp_path / "host.json"
    bad.write_text('{"os": "linux"}')
    r = cli("runtime", "install", "--dry-run", "--host", str(bad), "--releases", str(ERA_2026_LATE))
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert str(bad) in r.stderr and "arch is None" in r.stderr
    good = _host_file(tmp_path, host("linux", "x64"))
    junk = tmp_path / "rel.json"
    junk.write_text('{"tag_name": "b1"}')
    r = cli("runtime", "install", "--dry-run", "--host", str(good), "--releases", str(junk))
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert str(junk) in r.stderr and "not a GitHub release" in r.stderr
    r = cli("runtime", "install", "--host", str(good), "--releases", str(ERA_2026_LATE))
    assert r.returncode == 2 and "--dry-run" in r.stderr


def test_a_linux_cuda_build_asked_for_by_name_brings_its_cudart():
    rel = runtime_release.load_releases(ERA_2026_LATE)[1]
    c = runtime_choice.choice_for_asset(rel, "llama-b11434-bin-ubuntu-cuda-13.4-arm64.tar.gz")
    assert c.backend == "cuda" and [x.name for x in c.extras] == ["cudart-llama-b11434-bin-ubuntu-cuda-13.4-arm64.tar.gz"]
    assert runtime_choice.choice_for_asset(rel, "llama-b11434-bin-ubuntu-rocm-10.0-x64.tar.gz").backend == "rocm"


def test_this_machine_with_a_hip_runtime_on_windows_gets_the_rocm_build():
    """The snapshot names no AMD GPU on Windows (NVML names NVIDIA's; Linux reads the kernel's):
    there the driver's HIP runtime stands for it."""
    from app.core.machine import hardware as H

    snap = H.HardwareSnapshot("recorded", "cpu", 8, 16, 32 << 30, 16 << 30, (), False, ())
    h = runtime_host.host_from_snapshot(snap, "Windows", "AMD64", vulkan_loader=True, hip_runtime=True)
    rel, c, _ = runtime_choice.pick(h, runtime_release.load_releases(ERA_2026_LATE))
    assert c.asset.name == "llama-b11434-bin-win-rocm-10.0-x64.zip" and c.backend == "rocm"
    h = runtime_host.host_from_snapshot(snap, "Windows", "AMD64", vulkan_loader=True, hip_runtime=False)
    assert runtime_choice.pick(h, runtime_release.load_releases(ERA_2026_LATE))[1].backend == "vulkan"
