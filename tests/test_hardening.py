"""Hardening: no file outside the models folder, no corrupted download, no lost
record, one verdict per sweep, a message for every write failure, no impossible number in the
statistics. Real processes where the behaviour needs them (two CLI downloads at once, disk limits)."""

from __future__ import annotations

import hashlib
import json
import ntpath
import os
import posixpath
import re
import stat
import subprocess
import sys
import time
from pathlib import Path, PureWindowsPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.machine import hub, hub_download, hub_names
from app.core.common.errors import UserError
from app.core.records.reader import load_records
from app.core.records.sweeps import select_sweep
from app.core.records.writer import ResultsWriter
from conftest import EMPTY_GGUF, HUB_REPO, ROOT

from hubserver import COMMIT
from tests.helpers import clean_error, cli, make_record, two_model_file


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------------------------------
# 1. a Hub listing cannot write outside the models folder

HOSTILE = ["/x.gguf", "C:/x.gguf", "C:x.gguf", "\\\\server\\share\\x.gguf", "\\\\?\\C:\\x.gguf",
           "\\\\.\\PhysicalDrive0.gguf", "..\\x.gguf", "../x.gguf", "a/../../x.gguf", "a/./x.gguf", "a//x.gguf",
           "a/.. /x.gguf", "..../x.gguf", "NUL.gguf", "con.Q4_0.gguf", "a/COM1.gguf", "x.gguf:stream.gguf",
           "a\nb.gguf", "a\x00b.gguf", "evil\u202egguf.gguf", "x.gguf ", "x.gguf.", ""]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused(name, tmp_path):
    with pytest.raises(UserError, match="refused|not a"):
        hub_names.target_path(tmp_path, HUB_REPO, name)


def test_plain_names_land_inside_the_repo_folder(tmp_path):
    for name in ("Qwen3.6-27B-Q4_K_M.gguf", "UD-Q4_K_XL/Qwen3.6-27B-UD-Q4_K_XL-00001-of-00002.gguf",
                 "a b/c (1).gguf"):
        p = hub_names.target_path(tmp_path, "unsloth/Qwen3.6-27B-MTP-GGUF", name)
        assert p == tmp_path.joinpath("unsloth__Qwen3.6-27B-MTP-GGUF", *name.split("/"))
    for repo in ("..", "../x", "a/..", "a/b/c", "/a/b", "a\\b/c"):
        with pytest.raises(UserError, match="repo id"):
            hub_names.target_path(tmp_path, repo, "x.gguf")


# the characters and pieces that make paths escape, mixed with ordinary text
PIECES = st.sampled_from(["/", "\\", "..", ".", ":", "C:", "c:", "//", "\\\\", " ", "\x00", "\n", "\t", "NUL",
                          "con", "com1", "a", "b", ".gguf", "-Q4_0", "\u202e", "\u200b", "?", "*", "~",
                          "%2e", "\u2024", "\uff0e", "\uff0f", "$DATA", "::"])
NAMES = st.one_of(st.lists(PIECES, max_size=10).map("".join), st.text(max_size=30),
                  st.tuples(st.text(max_size=10), PIECES, st.text(max_size=10)).map("".join))


def _posix_inside(name: str) -> bool:
    root = "/srv/models/o__r"
    return posixpath.normpath(posixpath.join(root, name)).startswith(root + "/")


def _windows_inside(name: str) -> bool:
    """Win32 rules, independently of the code under test: / and \\ both separate, a drive or
    a root escapes, trailing dots and spaces are trimmed from each part, device names win."""
    if PureWindowsPath(name).anchor or ntpath.splitdrive(name)[0] or ":" in name:
        return False
    parts = re.split(r"[\\/]", name)
    trimmed = [p.rstrip(". ") for p in parts]
    if any(p in ("", ".", "..") for p in trimmed):
        return False
    if any(re.match(r"^(con|prn|aux|nul|com[0-9¹²³]|lpt[0-9¹²³])(\..*)?$", p.strip(), re.I) for p in parts):
        return False
    root = "C:\\models\\o__r"
    return ntpath.normpath(ntpath.join(root, *trimmed)).startswith(root + "\\")


@settings(max_examples=600, deadline=None)
@given(NAMES)
def test_any_accepted_name_stays_inside_on_posix_and_windows(name):
    try:
        p = hub_names.target_path(Path("/srv/models"), "o/r", name)
    except UserError:
        return
    assert _posix_inside(name), name
    assert _windows_inside(name), name
    assert not any(ord(c) < 32 for c in name)
    assert str(p).startswith("/srv/models/o__r/")


def test_a_hostile_listing_writes_nothing_outside_the_models_folder(fake_hub, tmp_path):
    outside = tmp_path / "outside"
    escaped = "/" + str(outside / "ESCAPED-Q4_0.gguf")  # //tmp/.../ESCAPED-Q4_0.gguf, as found
    names = [escaped, "../ESCAPED-Q8_0.gguf", "C:/ESCAPED-F16.gguf", "\\\\server\\share\\ESCAPED-BF16.gguf"]
    fake_hub.add("tester/Evil-GGUF", {**{n: b"x" * 100 for n in names}, "ok-Q4_0.gguf": b"y" * 100})
    client = hub.HubClient(fake_hub.url)
    rf = client.repo_files("tester/Evil-GGUF")
    assert [f.path for f in rf.ggufs] == ["ok-Q4_0.gguf"]  # never offered for download
    assert len(rf.refused) == len(names) and all("refused" in why for why in rf.refused)
    models = tmp_path / "models"
    for n in names:  # asked for by name all the same (the CLI, or an old listing in the window)
        with pytest.raises(UserError, match="refused"):
            for _ in hub_download.download(client, "tester/Evil-GGUF", n, models_dir=models):
                pass
    # the real CLI, as the issue found it: exit 2, no "sha256 verified", nothing written
    r = cli("models", "download", "tester/Evil-GGUF", escaped, "--dest", str(models),
            "--endpoint", fake_hub.url)
    clean_error(r, "absolute path")
    assert "verified" not in r.stdout
    assert not outside.exists()
    assert files_under(tmp_path) <= {f"models/{x}" for x in files_under(models)} if models.exists() else True
    assert not [p for p in tmp_path.rglob("*ESCAPED*")]


def test_a_hostile_commit_id_or_revision_is_refused(fake_hub, tmp_path):
    client = hub.HubClient(fake_hub.url)
    fake_hub.commit = "../../../../etc"
    with pytest.raises(hub.HubError, match="invalid commit id"):
        client.repo_files(HUB_REPO)
    fake_hub.commit = COMMIT
    for rev in ("../main", "main\n", "a b", "..", "main//x"):
        with pytest.raises(UserError, match="not a usable revision"):
            client.repo_files(HUB_REPO, rev)


# ------------------------------------------------------------------------------------------
# 2. two downloads of the same file at once


@pytest.mark.slow
@pytest.mark.parametrize("gap", [0.0, 0.2, 1.0])
def test_two_cli_downloads_of_one_file_never_corrupt_it(fake_hub, tmp_path, gap):
    data = EMPTY_GGUF + os.urandom(16 * 2**20)
    fake_hub.add("tester/Big-GGUF", {"big-Q4_0.gguf": data})
    # the overlap is made, not hoped for: no file body flows until one of the two has given up,
    # so whichever took the lock is still downloading when the other asks for it, however fast or
    # slow this machine starts the two (the gap only varies who gets there first)
    fake_hub.flowing.clear()
    dest = tmp_path / "models"
    argv = [sys.executable, "-m", "app", "models", "download", "tester/Big-GGUF", "big-Q4_0.gguf",
            "--dest", str(dest), "--endpoint", fake_hub.url,
            "--stall-timeout", "600"]  # the held download must not give up while it waits
    a = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(gap)
    b = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180  # only a guard against waiting forever
    while a.poll() is None and b.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    fake_hub.flowing.set()
    outs = {p.pid: (p, *p.communicate(timeout=180)) for p in (a, b)}
    results = {pid: (p.returncode, out, err) for pid, (p, out, err) in outs.items()}
    for rc, out, err in results.values():
        assert "Traceback" not in err + out, err
    winners = [pid for pid, (rc, out, _) in results.items() if rc == 0 and "sha256 verified" in out]
    losers = [pid for pid, (rc, _, err) in results.items() if rc == 2 and "already downloading" in err]
    assert len(winners) == 1 and len(losers) == 1, results
    assert f"(pid {winners[0]})" in results[losers[0]][2]  # names the process that holds it
    final = dest / "tester__Big-GGUF" / "big-Q4_0.gguf"
    assert hashlib.sha256(final.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert files_under(dest) == {"tester__Big-GGUF/big-Q4_0.gguf"}  # no .part, .part.json or .lock left
    # the second one, run again now, finds the verified file and downloads nothing
    served = fake_hub.bytes_served
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "sha256 verified" in r.stdout
    assert fake_hub.bytes_served == served


def test_the_lock_is_per_file_and_released(tmp_path):
    from app.core.common import filelock

    target = tmp_path / "m.gguf.lock"
    with filelock.exclusive(target, "busy (pid {pid})"):
        assert target.read_text() == str(os.getpid())
        with pytest.raises(filelock.LockBusy, match=f"busy \\(pid {os.getpid()}\\)"):
            with filelock.exclusive(target, "busy (pid {pid})"):
                pass
        with filelock.exclusive(tmp_path / "other.gguf.lock", "busy"):
            pass  # another file: no conflict
    assert not target.exists()
    with filelock.exclusive(target, "busy"):  # free again
        pass


# ------------------------------------------------------------------------------------------
# 3. a line cut by a crash does not swallow the next record


def test_a_cut_line_is_ended_before_the_next_record_and_reported(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        for i in range(55):
            w.append(make_record(run_id=f"r{i}"))
    with open(path, "ab") as f:  # a crash (or a full disk) in the middle of record 56
        f.write(make_record(run_id="cut").to_json()[:70].encode())
    with ResultsWriter(path) as w:  # the next sweep appends to the same file
        w.append(make_record(run_id="after"))
    assert len(w.notes) == 1 and f"{path} line 56" in w.notes[0] and "cut short" in w.notes[0]
    problems: list[str] = []
    got = load_records(path, problems)
    assert len(got) == 56 and got[-1].run_id == "after"  # 56 of 56 whole records readable
    assert len(problems) == 1 and problems[0].startswith(f"{path} line 56: cut short")


def test_a_sweep_into_a_file_with_a_cut_line_says_so(tmp_path, make_model):
    out = tmp_path / "r.jsonl"
    out.write_text(make_record().to_json() + "\n" + make_record(run_id="cut").to_json()[:50])
    r = cli("bench", "--model", str(make_model(0.0)), "--k", "1", "--reps", "1", "--warmup", "0",
            "--n-predict", "8", "--tasks", "code", "--per-task", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "line 2: the last line was cut short" in r.stderr
    problems: list[str] = []
    assert len(load_records(out, problems)) == 3 and len(problems) == 1


# ------------------------------------------------------------------------------------------
# 4. a results file holding two models is not pooled into one verdict


def test_recommend_judges_one_sweep_and_says_which(tmp_path):
    path = tmp_path / "mixed.jsonl"
    two_model_file(path)
    r = cli("recommend", str(path), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["recommendation"]["mtp"] is False and "B-Q4_0.gguf" in j["command"] and "A-Q4_0" not in j["command"]
    assert "holds 2 sweeps of 2 models; showing the latest: new222" in r.stderr and "--sweep" in r.stderr
    for choice in (("--model", "/models/A-Q4_0.gguf"), ("--sweep", "old"), ("--model", "A-Q4_0.gguf")):
        r = cli("recommend", str(path), "--json", *choice)
        j = json.loads(r.stdout)
        assert j["recommendation"]["mtp"] is True and j["recommendation"]["k"] == 2, choice
        assert "A-Q4_0.gguf" in j["command"] and "B-Q4_0" not in j["command"]
        assert "showing the one asked for: old111" in r.stderr
    clean_error(cli("recommend", str(path), "--sweep", "zzz"), "no sweep 'zzz'", "old111", "new222")
    clean_error(cli("recommend", str(path), "--model", "C.gguf"), "no sweep of model 'C.gguf'")
    # compare takes each file's latest sweep, and says so
    r = cli("compare", str(path), str(path), "--sweep-a", "old111")
    assert r.returncode == 0, r.stderr
    assert "--sweep-b" in r.stderr


def test_select_sweep_never_pools():
    recs = [make_record(run_id="a", sweep_id="s1", timestamp_utc="2026-01-01T00:00:00+00:00"),
            make_record(run_id="b", sweep_id="s2", model_path="/n.gguf", timestamp_utc="2026-01-01T01:00:00+00:00")]
    runs, chosen, note = select_sweep(recs)
    assert [r.run_id for r in runs] == ["b"] and chosen.sweep_id == "s2" and "2 sweeps of 2 models" in note
    runs, chosen, note = select_sweep(recs[:1])
    assert [r.run_id for r in runs] == ["a"] and note is None
    with pytest.raises(UserError, match="names 2 sweeps"):
        select_sweep(recs, sweep="s")


def test_the_window_shows_one_sweep_of_a_mixed_file_and_offers_the_other(window, tmp_path):
    path = tmp_path / "mixed.jsonl"
    two_model_file(path)
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "run_id": "cut", "sta\n')  # a cut line, ended by a later writer
    results, state = window.results_tab, window.state
    results.open_results(str(path))
    box = results.file_sweep_box
    verdicts = lambda: [results.table.item(r, _col(results.table, "verdict")).text()  # noqa: E731
                        for r in range(results.table.rowCount())]
    assert not box.isHidden() and box.count() == 2 and box.currentData() == "new222"
    assert {r.sweep_id for r in state.records} == {"new222"}
    notes = results.findings.toPlainText()
    assert "holds 2 sweeps of 2 models; showing the latest: new222" in notes
    assert f"{path} line 25: cut short" in notes
    assert verdicts() == ["baseline", "slower"]
    box.setCurrentIndex(1)
    box.activated.emit(1)
    assert {r.sweep_id for r in state.records} == {"old111"}
    assert "showing the one asked for: old111" in results.findings.toPlainText()
    assert verdicts() == ["baseline", "faster"]
    assert "A-Q4_0.gguf" in window.export_tab.command.toPlainText()


# ------------------------------------------------------------------------------------------
# 6. every write failure is a message, and no measurement is lost to one


def test_a_full_disk_stops_the_sweep_cleanly_keeping_what_was_written(tmp_path, make_model):
    out = tmp_path / "r.jsonl"
    model = make_model(0.0)
    # about three records fit under the limit; the fourth write fails as on a full disk
    size = len(make_record().to_json()) * 3
    r = cli("bench", "--model", str(model), "--k", "1", "--reps", "3", "--warmup", "0", "--n-predict", "8",
            "--tasks", "code", "--per-task", "1", "--out", str(out), fsize=size * 2)
    clean_error(r, str(out), "cannot write the results file (the file is larger than this system allows)",
                "record(s) written before are kept", "the sweep stopped there")
    problems: list[str] = []
    kept = load_records(out, problems)
    assert kept and not problems  # whole records only: the failed one left no cut line behind
    n = int(re.search(r"the (\d+) record\(s\) written before", r.stderr).group(1))
    assert len(kept) == n


def test_dev_full_is_one_message():
    """A device is no results file: refused before the work, and left as it is."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with pytest.raises(UserError, match="/dev/full: is a device, not a regular file; give a file name"):
        ResultsWriter("/dev/full")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_download_write_failures_are_messages(fake_hub, tmp_path):
    # a file-size limit below the download's size: the bytes so far are kept, run again continues
    dest = tmp_path / "models"
    r = cli("models", "download", HUB_REPO, "blob-F16.gguf", "--dest", str(dest), "--endpoint", fake_hub.url,
            fsize=2**20)
    clean_error(r, "cannot write (the file is larger than this system allows)",
                "bytes downloaded so far are kept")
    part = dest / "tester__Tiny-MTP-GGUF" / "blob-F16.gguf.part"
    assert part.stat().st_size == 2**20
    served = fake_hub.bytes_served
    r = cli("models", "download", HUB_REPO, "blob-F16.gguf", "--dest", str(dest), "--endpoint", fake_hub.url)
    assert r.returncode == 0 and "sha256 verified" in r.stdout, r.stderr
    assert fake_hub.bytes_served - served == len(EMPTY_GGUF) + 6 * 2**20 - 2**20  # only the rest
    # a file where the models folder should be; a folder where the model file should be
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    clean_error(cli("models", "download", HUB_REPO, "tiny-Q8_0.gguf", "--dest", str(blocker),
                    "--endpoint", fake_hub.url), "is a file, not a folder")
    (tmp_path / "m2" / "tester__Tiny-MTP-GGUF" / "tiny-Q8_0.gguf").mkdir(parents=True)
    clean_error(cli("models", "download", HUB_REPO, "tiny-Q8_0.gguf", "--dest", str(tmp_path / "m2"),
                    "--endpoint", fake_hub.url), "a folder is in the way")


def test_report_destinations_are_checked_before_the_work(tmp_path):
    path = tmp_path / "mixed.jsonl"
    two_model_file(path)
    clean_error(cli("recommend", str(path), "--report", str(tmp_path)), "is a folder")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    clean_error(cli("recommend", str(path), "--report", str(blocker / "r.md")), "is a file, not a folder")
    r = cli("recommend", str(path), "--report", str(tmp_path / "new" / "folder" / "r.md"))
    assert r.returncode == 0, r.stderr  # a missing folder is made
    assert "# MTP Tuner report" in (tmp_path / "new" / "folder" / "r.md").read_text()


def test_probe_destination_checked_first_and_result_printed_when_saving_fails(tmp_path, make_model):
    model = str(make_model(0.0))
    clean_error(cli("probe", "--model", model, "--out", str(tmp_path), "--max-rounds", "2"), "is a folder")
    out = tmp_path / "probe.jsonl"
    out.write_text("\n" * 8192)  # already past the file-size limit below: the append fails
    r = cli("probe", "--model", model, "--out", str(out), "--max-rounds", "2", "--max-batch", "3",
            fsize=4096)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "T(n)/T(1)" in r.stdout or "verify" in r.stdout.lower()  # the measurement is shown
    assert "could not be saved" in r.stderr and str(out) in r.stderr


# ------------------------------------------------------------------------------------------
# 7. numbers and values


def test_impossible_numbers_are_warnings_naming_the_line_and_left_out(tmp_path):
    path = tmp_path / "r.jsonl"
    two_model_file(path)
    good = len(path.read_text().splitlines())
    bad = [dict(tok_s=float("inf")), dict(tok_s=float("nan")), dict(tok_s=-5.0), dict(tok_s=0.0),
           dict(acceptance=1.5), dict(draft_accepted=9, draft_n=3), dict(tok_s_engine=float("-inf"))]
    with open(path, "a") as f:
        for i, kw in enumerate(bad):
            f.write(make_record(run_id=f"bad{i}", sweep_id="new222", model_path="/models/B-Q4_0.gguf",
                                timestamp_utc="2026-01-01T00:59:00+00:00", **kw).to_json() + "\n")
    problems: list[str] = []
    assert len(load_records(path, problems)) == good
    assert len(problems) == len(bad)
    for i, msg in enumerate(problems):
        assert msg.startswith(f"{path} line {good + 1 + i}:") and "left out of the statistics" in msg
    assert "tok_s is inf" in problems[0] and "tok_s is nan" in problems[1] and "tok_s is -5.0" in problems[2]
    for args in (("recommend", str(path)), ("compare", str(path), str(path)), ("recommend", str(path), "--json")):
        r = cli(*args)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert f"line {good + 1}: tok_s is inf" in r.stderr


@pytest.mark.parametrize("args, fragment", [
    (("bench", "--temperature", "nan"), "--temperature: expected a finite number"),
    (("bench", "--temperature", "-1"), "--temperature: must be at least 0"),
    (("bench", "--ngl", "abc"), "--ngl: expected a number of layers"),
    (("bench", "--threads", "0"), "--threads: must be at least 1"),
    (("bench", "--threads", "-1"), "--threads: must be at least 1"),
    (("bench", "--reps", "0"), "--reps: must be at least 1"),
    (("inspect", "x.gguf", "--ctx", "-5"), "--ctx: must be at least 1"),
    (("inspect", "x.gguf", "--k", "-1"), "--k: must be 1 to 64"),
    (("recommend", "x.jsonl", "--ctx-size", "-1"), "--ctx-size: must be at least 0"),
    (("recommend", "x.jsonl", "--ngl", "lots"), "--ngl: expected a number of layers"),
    (("models", "download", "a/b", "c.gguf", "--stall-timeout", "nan"), "--stall-timeout: expected a finite"),
    (("models", "download", "a/b", "c.gguf", "--stall-timeout", "0"), "--stall-timeout: must be more than 0"),
    (("make-model", "x.gguf", "--p-reject", "inf"), "--p-reject: expected a finite number"),
])
def test_bad_values_are_one_clear_error(args, fragment):
    clean_error(cli(*args), fragment)


@pytest.mark.parametrize("args, fragment", [
    (("--k", "3-1"), "the range '3-1' runs backwards"),
    (("--k", ","), "--k: no numbers"),
    (("--p-min", "nan"), "--p-min: nan is not a finite number"),
    (("--ctx-size", "1"), "the context size 1 is too small"),
    (("--adaptive", "--mix", "code=nan"), "--mix: 'nan' is not a finite number"),
    (("--adaptive", "--mix", "code=inf"), "--mix: 'inf' is not a finite number"),
])
def test_bad_sweep_settings_fail_once_before_anything_runs(args, fragment, tmp_path, make_model):
    out = tmp_path / "r.jsonl"
    r = cli("bench", "--model", str(make_model(0.0)), "--tasks", "code", "--per-task", "1", "--out", str(out),
            *args)
    clean_error(r, fragment)
    assert r.stderr.count("error:") == 1
    assert not out.exists()  # no empty results file left behind


def test_a_prompt_file_with_a_byte_order_mark_loads(tmp_path):
    from app.core.measure.prompts import load_prompt_file

    p = tmp_path / "p.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"id": "a", "task": "code", "text": "def f():"}]).encode())
    assert [x.id for x in load_prompt_file(p)] == ["a"]
    p.write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "task": "code", "text": "x"}\n{"id": "b", "task": "code", "text": "y"}\n')
    assert [x.id for x in load_prompt_file(p)] == ["a", "b"]


def test_a_server_with_fewer_bytes_than_listed_is_said_once_and_the_part_dropped(fake_hub, tmp_path):
    data = fake_hub.repos[HUB_REPO].files["blob-F16.gguf"]
    sha = hashlib.sha256(data).hexdigest()
    dest = tmp_path / "models"
    folder = dest / "tester__Tiny-MTP-GGUF"
    folder.mkdir(parents=True)
    # a part as long as the whole file, from a listing that claimed 100 bytes more
    (folder / "blob-F16.gguf.part").write_bytes(data)
    meta = {"repo": HUB_REPO, "file": "blob-F16.gguf", "commit": COMMIT, "sha256": sha, "size": len(data) + 100}
    (folder / "blob-F16.gguf.part.json").write_text(json.dumps(meta))
    with pytest.raises(hub.HubError, match="fewer bytes than the .* the Hub listed") as e:
        for _ in hub_download.download(hub.HubClient(fake_hub.url), HUB_REPO, "blob-F16.gguf", revision=COMMIT,
                              models_dir=dest, expected_sha256=sha, expected_size=len(data) + 100):
            pass
    assert str(e.value).count("416") == 1
    assert files_under(dest) == set()  # no part left to ask about again


def test_search_asks_once_when_the_hub_cannot_be_reached_and_shows_the_catalog():
    """No timing: an endpoint that accepts and drops every connection is asked exactly once
    (huggingface_hub's list_models asked six times with back-off, 24 s), and the catalog's
    matches still show, with what went wrong."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    accepted = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    try:
        r = cli("models", "search", "qwen3.6", "--endpoint", url)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "unsloth/Qwen3.6-27B-MTP-GGUF" in r.stdout and "showing the catalog only" in r.stderr
        assert len(accepted) == 1
        r = cli("models", "search", "no-such-model-anywhere", "--endpoint", url)
        clean_error(r, "search for 'no-such-model-anywhere'")
        assert len(accepted) == 2
    finally:
        srv.close()


def _col(table, header):
    return [table.horizontalHeaderItem(c).text().strip() for c in range(table.columnCount())].index(header)
