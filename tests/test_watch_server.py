"""mtp-tuner watch on a real llama-server serving the calibrated model: the counts it reads from
/metrics equal the designed ones exactly (traffic from a separate client process), a restart
during the watch starts a new window, a server without --metrics gets the flag to add, and an
API key reaches the server but never the output or the record."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, bare_server
from helpers import server_costs

from app.core.calibrated import design as C
from app.core.records.reader import load_records, load_watch_records
from app.core.records.writer import append_line
from app.core.watch.client import Client
from app.core.watch.watcher import Watcher

pytestmark = [pytest.mark.server, pytest.mark.slow]

PROMPT = [104, 105, 106, 107]  # token ids: no tokenizer between the client and the designed chain
N_PREDICT = 60
P_REJECT = 0.3
K = 3

# a separate client process: posts the same /completion `n` times (greedy, no prompt cache)
CLIENT = """
import json, sys, urllib.request
url, n, n_predict, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
key = sys.argv[5] if len(sys.argv) > 5 else None
for _ in range(n):
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url + "/completion", body, headers)
    with urllib.request.urlopen(req, timeout=120) as r:
        json.load(r)
"""


def client(url: str, n: int, key: str | None = None) -> None:
    args = [sys.executable, "-c", CLIENT, url, str(n), str(N_PREDICT), json.dumps(PROMPT)] + ([key] if key else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def designed(model: Path, n: int, k: int = K) -> C.SimResult:
    """What n identical requests verify, by the simulator of the model's design tables."""
    sim = C.simulate(C.load_tables(model), PROMPT, k, N_PREDICT)
    return C.SimResult(sim.tokens, sim.draft_n * n, sim.draft_accepted * n, sim.steps * n,
                       tuple(a * n for a in sim.accepted_per_pos))


def server_args(model: Path, metrics: bool = True, k: int = K) -> list:
    return ["-m", model, "-np", "1", "-c", "1024", "-t", "1", "--spec-type", "draft-mtp",
            "--spec-draft-n-max", k] + (["--metrics"] if metrics else [])


def test_watch_counts_a_separate_clients_traffic_exactly(server_bin, make_model, tmp_path):
    model = make_model(P_REJECT)
    want = designed(model, 4)
    assert 0 < want.accepted_per_pos[-1] < want.accepted_per_pos[0] < want.steps  # a real mix of accepts
    with bare_server(server_bin, server_args(model), tmp_path / "server.log") as url:
        client(url, 2)  # traffic before the watch: not counted
        w = Watcher(Client(url))
        first = w.attach()
        client(url, 4)
        w.poll()
        s = w.summary(cost_files=[])
    c = s.counts
    assert first.server_k == K and s.server_k == K
    assert c.accepted_per_pos == want.accepted_per_pos
    assert (c.draft_steps, c.draft_tokens, c.accepted) == (want.steps, want.draft_n, want.draft_accepted)
    assert c.generated == 4 * N_PREDICT
    assert 1 <= c.requests <= 4  # seen in /slots: at least the last one
    assert c.restarts == 0
    assert s.spec_types and "draft-mtp" in s.spec_types
    assert s.server.model_path and Path(s.server.model_path).name == model.name
    # no cost record anywhere: no prediction, and the reason says how to make one
    assert s.predictions == [] and s.recommendation.k is None
    assert "no cost record" in s.recommendation.reason and "mtp-tuner probe" in s.recommendation.reason


def test_a_restart_during_the_watch_starts_a_new_window(server_bin, make_model, tmp_path):
    from app.core.engines.server.process import free_port

    model = make_model(P_REJECT)
    port = free_port()
    log = tmp_path / "server.log"
    with bare_server(server_bin, server_args(model), log, port=port) as url:
        w = Watcher(Client(url, timeout=3))
        assert w.attach().server_k is None  # a fresh server says its K with its first draft
        client(url, 3)
        before = w.poll().counts
    assert before.accepted_per_pos == designed(model, 3).accepted_per_pos
    down = w.poll()  # the server is gone: a note, not an error
    assert down.note and "does not answer" in down.note
    with bare_server(server_bin, server_args(model), log, port=port):
        client(url, 2)
        again = w.poll()
    assert again.note and "new window" in again.note
    s = w.summary(cost_files=[])
    assert s.counts.restarts == 1
    want = designed(model, 2)  # only the new process's traffic: never a negative delta
    assert s.counts.accepted_per_pos == want.accepted_per_pos
    assert (s.counts.draft_steps, s.counts.accepted) == (want.steps, want.draft_accepted)
    assert any("restarted" in n or "reset" in n for n in s.notes)


def _watch_cli(args: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app", "watch", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, **kw)


def _wait_attached(p: subprocess.Popen) -> str:
    """Read the watch's stderr up to its 'watching' line (it is attached then)."""
    assert p.stderr is not None
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("watching "):
            return "".join(seen)
    p.kill()
    pytest.fail("watch did not attach: " + "".join(seen))


def test_the_cli_prints_the_issues_json_and_keeps_the_key_secret(server_bin, make_model, tmp_path):
    model = make_model(P_REJECT)
    key = "watch-test-key-7f3a9c"
    key_file = tmp_path / "key.txt"
    key_file.write_text(f"# the server's key\n{key}\n")
    out = tmp_path / "watch.jsonl"
    want = designed(model, 4)
    with bare_server(server_bin, [*server_args(model), "--api-key", key], tmp_path / "server.log") as url:
        p = _watch_cli([url, "--duration", "6", "--interval", "0.5", "--api-key-file", str(key_file),
                        "--json", "--out", str(out)])
        err_head = _wait_attached(p)
        client(url, 4, key)
        stdout, err_tail = p.communicate(timeout=120)
    assert p.returncode == 0, err_head + err_tail
    d = json.loads(stdout)
    assert set(d) == {"accepted_per_pos", "draft_steps", "draft_tokens", "accepted", "requests", "requests_at_least",
                      "predicted", "recommendation"}
    assert d["accepted_per_pos"] == list(want.accepted_per_pos)
    assert (d["draft_steps"], d["draft_tokens"], d["accepted"]) == (want.steps, want.draft_n, want.draft_accepted)
    assert set(d["recommendation"]) == {"k", "reason"}
    for text in (stdout, err_head, err_tail, out.read_text()):
        assert key not in text
    (rec,) = load_watch_records(out)
    assert rec.accepted_per_pos == want.accepted_per_pos and rec.server_k == K
    assert load_records(out) == []  # a run reader skips the watch record


def test_without_the_key_the_watch_says_how_to_give_it(server_bin, make_model, tmp_path):
    model = make_model(P_REJECT)
    with bare_server(server_bin, [*server_args(model), "--api-key", "another-key-123456"], tmp_path / "s.log") as url:
        p = _watch_cli([url, "--duration", "1"], env={"LLAMA_API_KEY": ""})
        _, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert "--api-key-file" in err and "LLAMA_API_KEY" in err and "Traceback" not in err


def test_a_server_without_metrics_gets_the_flag_to_add(server_bin, make_model, tmp_path):
    model = make_model(P_REJECT)
    cmd = f"llama-server -m {model.name} --spec-type draft-mtp -np 1"
    with bare_server(server_bin, server_args(model, metrics=False), tmp_path / "server.log") as url:
        p = _watch_cli([url, "--duration", "2", "--command", cmd])
        _, err = p.communicate(timeout=60)
    assert p.returncode == 2, err
    assert "--metrics" in err and f"{cmd} --metrics" in err
    assert "Traceback" not in err


def test_it_predicts_with_a_matching_cost_record_and_refuses_another_devices(server_bin, make_model, tmp_path):
    """A cost record of this model made through llama-server here prices off and K=1..K_max (its
    numbers are the test's, not a measurement); one from another device is refused, saying so."""
    model = make_model(P_REJECT)
    here = server_costs({1: 10.0, 2: 10.4, 3: 10.8, 4: 11.2, 5: 11.6}, 0.4, model=str(model),
                        model_size=model.stat().st_size)
    away = dataclasses.replace(here, run_id="away", host={**here.host, "machine": "elsewhere-arch"},
                               timestamp_utc="2026-12-02T00:00:00.000+00:00")  # newer, but another device
    only_away, both = tmp_path / "away.jsonl", tmp_path / "both.jsonl"
    append_line(only_away, away.to_json())
    append_line(both, here.to_json())
    append_line(both, away.to_json())
    with bare_server(server_bin, server_args(model), tmp_path / "server.log") as url:
        w = Watcher(Client(url))
        w.attach()
        client(url, 4)
        w.poll()
        refused = w.summary(costs=str(only_away))
        priced = w.summary(costs=str(both))
    assert refused.predictions == [] and refused.recommendation.k is None
    assert "another device" in refused.recommendation.reason and "elsewhere-arch" in refused.recommendation.reason
    assert [p.k for p in priced.predictions] == [0, 1, 2, 3, 4]
    assert [p.extrapolated for p in priced.predictions] == [False, False, False, False, True]
    assert priced.record.cost_run_id == here.run_id and "you run K=3" in priced.recommendation.reason
