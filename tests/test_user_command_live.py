"""The user's own llama-server command on real llama-server processes: a sweep started from it
runs every server with its flags, records them and answers with the same command plus the
picked flags; a secret in it appears nowhere; shell metacharacters in it run nothing."""

from __future__ import annotations

import json
import shlex

import pytest

from conftest import servers_mentioning
from helpers import cli

pytestmark = pytest.mark.server

SECRET = "s3cret-KEY-never-shown-4711"
KEPT = ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-c", "4096"]


def test_sweep_from_the_users_command(tmp_path, make_model, server_bin):
    model = make_model(0.0)  # every draft right: K=2 pays
    command = shlex.join([server_bin, "-m", str(model), *KEPT, "--port", "9", "-np", "4", "--api-key", SECRET,
                          "--spec-type", "ngram-mod", "--spec-draft-n-max", "7"])
    out, logs = tmp_path / "r.jsonl", tmp_path / "logs"
    r = cli("bench", "--server-command", command, "--k", "2", "--reps", "2", "--warmup", "0", "--n-predict", "24",
            "--tasks", "code", "--per-task", "1", "--out", str(out), "--log-dir", str(logs))
    assert r.returncode == 0, r.stderr
    assert "replaced while measuring: --port 9, -np 4, --spec-type ngram-mod, --spec-draft-n-max 7" in r.stderr
    assert "engine: llama-server, for your own llama-server command" in r.stderr
    # the servers ran with the user's flags (their load logs), one slot and the arm's own K
    texts = {p.name: p.read_text(encoding="utf-8") for p in logs.iterdir()}
    assert set(texts) == {"llama-server-baseline.log", "llama-server-draft-mtp-k2-p0.log"}
    for text in texts.values():
        assert "flash_attn            = enabled" in text and "K (q8_0)" in text and "V (q8_0)" in text
        assert "n_slots = 1" in text and "n_ctx_slot = 4096" in text
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    runs = [x for x in records if x["record_type"] == "run"]
    assert len(runs) == 4 and all(x["server_args"] == KEPT for x in runs)
    # the answer from the results file: the measured flags, in order, then the picked flags (none
    # when it leaves MTP off: a noisy machine may say so after two repetitions)
    r2 = cli("recommend", str(out), "--for", "code", "--server-bin", server_bin, "--json")
    assert r2.returncode == 0, r2.stderr
    answer = json.loads(r2.stdout)
    picked = (["--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "--spec-draft-type-k", "q8_0",
               "--spec-draft-type-v", "q8_0"] if answer["k"] == 2 else [])
    assert answer["argv"] == [server_bin, "-m", str(model), *KEPT, *picked], answer
    # ... and from the command itself: the user's own port, slots and key (a placeholder) kept
    r3 = cli("recommend", str(out), "--for", "code", "--server-command", command, "--json")
    assert r3.returncode == 0, r3.stderr
    assert json.loads(r3.stdout)["argv"] == [server_bin, "-m", str(model), *KEPT, "--port", "9", "-np", "4",
                                             "--api-key", "<your api-key>", *picked]
    # the secret: not on the screen, not in a record, not in a log
    for text in (r.stdout, r.stderr, r2.stdout, r2.stderr, r3.stdout, r3.stderr, out.read_text(encoding="utf-8"),
                 *texts.values()):
        assert SECRET not in text


@pytest.mark.parametrize("tail", ["; touch {mark}", "&& touch {mark}", "| tee {mark}", "$(touch {mark})",
                                  "`touch {mark}`", "\ntouch {mark}"])
def test_shell_metacharacters_run_nothing(tmp_path, make_model, server_bin, tail):
    model = make_model(0.0)
    mark = tmp_path / "ran"
    command = f"{shlex.quote(server_bin)} -m {shlex.quote(str(model))} -c 512 " + tail.format(mark=mark)
    r = cli("bench", "--server-command", command, "--k", "1", "--reps", "1", "--n-predict", "8",
            "--out", str(tmp_path / "r.jsonl"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "would run or expand; nothing is run here" in r.stderr
    assert not mark.exists() and not (tmp_path / "r.jsonl").exists()
    assert servers_mentioning(str(model)) == []


def test_unknown_flag_named_before_anything_runs(tmp_path, make_model, server_bin):
    model = make_model(0.0)
    r = cli("bench", "--server-command", f"llama-server -m {model} --flash-atn on", "--server-bin", server_bin,
            "--out", str(tmp_path / "r.jsonl"))
    assert r.returncode == 2 and "word 4 of the command is not a flag of this llama-server" in r.stderr, r.stderr
    assert "did you mean --flash-attn?" in r.stderr and not (tmp_path / "r.jsonl").exists()
