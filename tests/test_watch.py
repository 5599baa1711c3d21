"""watch without a server: the /metrics page parsed, windows (a reset or a restart starts a new
one), the intervals, the predictions (through the position model and the break-even code), the
recommendation's sentences, which cost record may price a server, the watch record, and a
recorded sequence of a real llama-server's pages replayed through the Watcher."""

from __future__ import annotations

import dataclasses
import json

import pytest

from helpers import ReplayClient, cli, clean_error, make_record, server_costs

from app.core.analysis import breakeven, positions
from app.core.common.redact import redact
from app.core.records.cost import CostRecord
from app.core.records.reader import load_cost_records, load_records, load_watch_records
from app.core.records.schema import host_info
from app.core.records.writer import ResultsWriter, append_line
from app.core.watch import predict as P
from app.core.watch.client import Client, normal_url, read_api_key
from app.core.analysis.costs import build_key
from app.core.watch.costs import ServerInfo, find_costs, mismatch
from app.core.watch.metrics import parse
from app.core.watch.watcher import Watcher, save, with_metrics
from app.core.watch.window import Counts, Tracker

PAGE = """# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 64
llamacpp:tokens_predicted_seconds_total 0.069382
llamacpp:spec_decode_num_draft_tokens_total 84
llamacpp:spec_decode_num_accepted_tokens_total 35
llamacpp:spec_decode_num_drafts_total 28
llamacpp:predicted_tokens_seconds 908.016
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 16
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 11
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 8
"""

COSTS = {1: 10.0, 2: 10.5, 3: 11.0, 4: 11.5, 5: 12.0, 6: 12.5}  # verify T(n) ms: a priced K up to 5


def page(drafts, per_pos, accepted=None, tokens=None, generated=0, seconds=0.0):
    lines = [f"llamacpp:spec_decode_num_drafts_total {drafts}",
             f"llamacpp:spec_decode_num_accepted_tokens_total {accepted if accepted is not None else sum(per_pos)}",
             f"llamacpp:spec_decode_num_draft_tokens_total {tokens if tokens is not None else drafts * len(per_pos)}",
             f"llamacpp:tokens_predicted_total {generated}", f"llamacpp:tokens_predicted_seconds_total {seconds}"]
    lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n}'
              for i, n in enumerate(per_pos)]
    return "\n".join(lines) + "\n"


def counts(per_pos, steps, seconds=60.0):
    return Counts(seconds, steps, steps * len(per_pos), sum(per_pos), tuple(per_pos), 0, 0.0, 1, 0, ())


# ---- the page, windows --------------------------------------------------------------------------


def test_the_page_is_read_as_llama_server_prints_it():
    r = parse(PAGE, 1.0, "123")
    assert r.values["drafts"] == 28 and r.values["draft_tokens"] == 84 and r.values["accepted"] == 35
    assert r.values["generated"] == 64 and r.values["gen_seconds"] == pytest.approx(0.069382)
    assert r.per_pos == {0: 16, 1: 11, 2: 8} and r.start == "123" and r.inexact == ()
    assert "predicted_tokens_seconds" not in r.values  # a gauge, not counted
    big = parse("llamacpp:spec_decode_num_draft_tokens_total 1.23457e+06\nllamacpp:spec_decode_num_drafts_total 5\n", 0)
    assert big.inexact == ("spec_decode_num_draft_tokens_total",)


def test_a_window_is_the_delta_and_a_reset_starts_a_new_one():
    t = Tracker()
    t.feed(parse(page(100, [60, 40, 20], generated=500, seconds=5), 0.0, "A"))
    assert not t.feed(parse(page(150, [90, 60, 30], generated=700, seconds=6), 10.0, "A"))
    c = t.counts()
    assert (c.draft_steps, c.accepted_per_pos, c.generated, c.seconds) == (50, (30, 20, 10), 200, 10.0)
    assert c.decode_tok_s == pytest.approx(200.0)
    assert c.rates == (0.6, 0.4, 0.2)
    # the counters go down (a reset): a new window from zero, never a negative delta
    assert t.feed(parse(page(8, [5, 3, 1]), 20.0, "A"))
    c = t.counts()
    assert (c.draft_steps, c.accepted_per_pos, c.restarts) == (8, (5, 3, 1), 1)
    # a new process (its start time) with counters above the old ones: a new window all the same
    assert t.feed(parse(page(400, [300, 200, 100]), 30.0, "B"))
    c = t.counts()
    assert (c.draft_steps, c.accepted_per_pos, c.restarts) == (400, (300, 200, 100), 2)
    assert t.server_k == 3


def test_requests_are_the_tasks_seen_in_slots_after_the_window_began():
    t = Tracker()
    t.feed(parse(page(0, []), 0.0))
    t.feed_slots([{"id": 0, "id_task": 7, "is_processing": False}])  # ran before the watch
    t.feed_slots([{"id": 0, "id_task": 12, "is_processing": True}])
    t.feed_slots([{"id": 0, "id_task": 12, "is_processing": False}])
    t.feed_slots([{"id": 0, "id_task": 20}, {"id": 1, "id_task": 21}, "junk"])
    t.feed_slots({"not": "a list"})
    assert t.counts().requests == 3


# ---- intervals, predictions, the recommendation ------------------------------------------------


def test_wilson():
    lo, hi = P.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert P.wilson(0, 20)[0] == 0.0 and P.wilson(20, 20)[1] == 1.0
    assert P.wilson(0, 0) == (0.0, 1.0)
    assert P.wilson(500, 1000)[1] - P.wilson(500, 1000)[0] < P.wilson(5, 10)[1] - P.wilson(5, 10)[0]


def test_a_llama_server_probe_prices_every_width_it_timed():
    """The probe through llama-server (issue 28) times whole steps and only the plain step (t_ms has
    n = 1 alone): watch predicts every width it timed, not none (read from t_ms, it saw none)."""
    from app.core.records.cost import Spread

    sp = lambda x: Spread(x, x, x, 5)  # noqa: E731
    rec = dataclasses.replace(server_costs({1: 10.0}, 0.0), ratio={1: sp(1.0)}, draft_ms=None,
                              step_ms={k: {"accept": sp(10.0 + 2 * k), "reject": sp(10.0 + k)} for k in (1, 2, 3, 4)},
                              plain_ms=sp(10.0))
    costs = breakeven.Costs.from_probe(rec)
    assert costs.whole_steps and list(costs.t_ms) == [1]
    preds = P.predict(counts([910, 728, 524], 1000), 3, costs)
    assert [p.k for p in preds] == [0, 1, 2, 3, 4] and preds[4].extrapolated
    assert all(p.speedup > 1.0 for p in preds[1:])


def test_predictions_are_the_position_model_priced_by_the_probe():
    c = counts([910, 728, 524], 1000)  # conditionals 0.91, 0.80, 0.72
    costs = breakeven.Costs.from_probe(server_costs(COSTS, 0.5))
    preds = P.predict(c, 3, costs)
    assert [p.k for p in preds] == [0, 1, 2, 3, 4, 5]  # off, then up to the largest width priced
    assert (preds[0].speedup, preds[0].lo, preds[0].hi, preds[0].extrapolated) == (1.0, 1.0, 1.0, False)
    model = positions.fit({3: positions.PositionCounts((910, 728, 524), 1000, 1)})
    for p in preds[1:]:
        assert p.speedup == pytest.approx(model.speedup(p.k, costs))  # the project's one formula
        assert p.lo < p.speedup < p.hi
        assert p.extrapolated == (p.k > 3)
    # more counts, the same shares: a narrower interval
    wide = P.predict(counts([91, 73, 52], 100), 3, costs)[3]
    assert wide.hi - wide.lo > preds[3].hi - preds[3].lo


def test_the_recommendation_says_which_k_and_why():
    costs = breakeven.Costs.from_probe(server_costs(COSTS, 0.5))
    c = counts([910, 728, 524], 1000, seconds=2400)
    r = P.recommend(P.predict(c, 3, costs), c, 3)
    assert r.reason.startswith("over the last 40 minutes (1,000 draft steps): acceptance by position 0.91 / 0.73 / 0.52;"
                               " you run K=3")
    assert r.k in (3, 4, 5)
    # low acceptance: MTP costs here, turn it off
    low = counts([180, 20, 2], 1000)
    r = P.recommend(P.predict(low, 3, breakeven.Costs.from_probe(server_costs(COSTS, 3.0))), low, 3)
    assert r.k == 0 and "MTP costs you" in r.reason and "turn it off" in r.reason
    # a clear gain at a narrower width
    mid = counts([700, 300, 60], 1000)
    steep = breakeven.Costs.from_probe(server_costs({1: 10.0, 2: 10.5, 3: 14.0, 4: 18.0, 5: 22.0}, 0.5))
    r = P.recommend(P.predict(mid, 3, steep), mid, 3)
    assert r.k in (1, 2) and f"run K={r.k}" in r.reason and "predicted +" in r.reason
    # few counts near a tie: too close to call, the current K stays
    steps = breakeven.Costs.from_probe(server_costs({1: 10.0, 2: 10.5, 3: 11.0, 4: 13.0, 5: 14.0}, 0.5))
    tie = counts([80, 50, 40], 100)
    r = P.recommend(P.predict(tie, 3, steps), tie, 3)
    assert r.k == 3 and r.reason.endswith("K=2 is predicted +2 % [-2, +7]: too close to call, K=3 is fine")
    # a wider width gaining clearly: past the server's own K, so a thing to try and watch again
    more = counts([80, 50, 48], 100)
    r = P.recommend(P.predict(more, 3, steps), more, 3)
    assert r.k == 4 and "K=4 (extrapolated) is predicted" in r.reason and "worth trying K=4" in r.reason


# ---- which cost record may price the server ------------------------------------------------------


def _server(**kw):
    return ServerInfo(**{"url": "http://127.0.0.1:8080", "model_path": "/models/calibrated-p0.3.gguf",
                         "build": "b0-unknown", "local": True, **kw})


def test_the_matching_cost_record_and_the_refusals():
    here = host_info()
    good = server_costs(COSTS, 0.5)
    assert mismatch(good, _server(), here) is None
    why = mismatch(dataclasses.replace(good, engine="inprocess"), _server(), here)
    assert "in process" in why and "not through llama-server" in why
    assert "priced" in mismatch(good, _server(model_path="/m/other.gguf"), here)
    other = dict(here, cpu_count=(here.get("cpu_count") or 1) + 64)
    why = mismatch(dataclasses.replace(good, host=other), _server(), here)
    assert "another device" in why and "CPU count" in why
    assert mismatch(dataclasses.replace(good, host=other), _server(local=False), here) is None  # remote: unknown here
    assert "llama.cpp" in mismatch(dataclasses.replace(good, llama_build="b11434 (515e855)"),
                                   _server(build="b11500-aaaaaaa"), here)
    assert mismatch(dataclasses.replace(good, llama_build="b11434 (515e855)"), _server(build="b11434-515e855"),
                    here) is None
    assert build_key("0.6.0-dev (build 0, commit unknown)") == (None, None)
    assert build_key("b11434-515e855") == (11434, "515e855")


def test_find_costs_takes_the_newest_match_or_says_how_to_make_one(tmp_path):
    f = tmp_path / "r.jsonl"
    rec, why = find_costs(_server(), host_info(), [])
    assert rec is None and "no cost record" in why and "mtp-tuner probe --model /models/calibrated-p0.3.gguf" in why
    append_line(f, dataclasses.replace(server_costs(COSTS, 0.5), engine="inprocess", run_id="old").to_json())
    rec, why = find_costs(_server(), host_info(), [f])
    assert rec is None and "matches this server" in why and "in process" in why
    append_line(f, dataclasses.replace(server_costs(COSTS, 0.5), run_id="a", timestamp_utc="2026-11-01").to_json())
    append_line(f, dataclasses.replace(server_costs(COSTS, 0.5), run_id="b", timestamp_utc="2026-11-20").to_json())
    rec, why = find_costs(_server(), host_info(), [f])
    assert rec.run_id == "b" and "b" in why


# ---- the record -------------------------------------------------------------------------------


def _replayed(cost_file=None, pages=None, min_steps=P.MIN_STEPS):
    w = Watcher(ReplayClient(pages))
    w.attach()
    ups = [w.poll() for _ in range(len(w.client.pages) - 1)]
    return w, ups, w.summary(cost_files=[cost_file] if cost_file else [], min_steps=min_steps)


def test_a_recorded_server_replayed_counts_and_predicts(tmp_path):
    f = tmp_path / "costs.jsonl"
    append_line(f, server_costs(COSTS, 0.5).to_json())
    w, ups, s = _replayed(f)
    assert set(w.client.paths) <= {"/metrics", "/props", "/slots", "/health"}  # nothing else is read
    assert s.counts.accepted_per_pos == (148, 124, 86) and s.counts.draft_steps == 247
    assert s.server_k == 3 and "draft-mtp" in s.spec_types
    assert [u.counts.draft_steps for u in ups] == [20, 58, 114, 189, 209, 247]
    assert [p.k for p in s.predictions] == [0, 1, 2, 3, 4, 5]
    assert s.recommendation.k is not None and "you run K=3" in s.recommendation.reason
    d = s.to_json()
    assert list(d) == ["accepted_per_pos", "draft_steps", "draft_tokens", "accepted", "requests", "requests_at_least",
                       "predicted", "recommendation"]
    # /metrics counts no requests: the ones seen finishing in /slots are a lower bound, said so everywhere
    assert d["requests_at_least"] is True and d["requests"] == s.counts.requests > 0
    from app.cli.watch import _line, format_summary

    assert f"requests        at least {s.counts.requests} (" in format_summary(s)
    assert f"at least {s.counts.requests} requests" in _line(ups[-1], 1.0)
    assert d["predicted"][0] == {"k": 0, "speedup": 1.0, "lo": 1.0, "hi": 1.0, "extrapolated": False}
    assert [p["extrapolated"] for p in d["predicted"]] == [False, False, False, False, True, True]
    json.dumps(d)
    # the record: saved, read back, and skipped by the run and cost readers
    out = tmp_path / "results.jsonl"
    with ResultsWriter(out) as wr:
        wr.append(make_record())
    save(s.record, out)
    append_line(out, server_costs(COSTS, 0.5).to_json())
    (rec,) = load_watch_records(out)
    assert rec == s.record and rec.cost_run_id == "c" and rec.predicted[1].k == 1
    problems: list[str] = []
    assert len(load_records(out, problems)) == 1 and problems == []
    assert len(load_cost_records(out)) == 1


def test_too_few_steps_or_no_cost_record_say_so(tmp_path):
    pages = ReplayClient().pages[:2]
    _, _, s = _replayed(None, pages)
    assert s.counts.draft_steps == 20 and s.predictions == [] and s.recommendation.k is None
    assert "only 20 verification steps" in s.recommendation.reason and "too few" in s.recommendation.reason
    _, _, s = _replayed(None)
    assert s.predictions == [] and "no cost record" in s.recommendation.reason
    assert s.record.cost_run_id is None and s.record.recommendation_k is None


# ---- the client: the address, the key --------------------------------------------------------


def test_the_address_and_the_endpoints(tmp_path):
    assert normal_url("127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert normal_url("http://host:8080/") == "http://host:8080"
    for bad in ("ftp://x", "http://host:8080/v1/chat", "http://u:p@host:1", "http://host:port"):
        with pytest.raises(Exception) as e:
            normal_url(bad)
        assert type(e.value).__name__ == "UserError"
    with pytest.raises(ValueError):
        Client("127.0.0.1:9").get("/completion")  # watch reads four endpoints, never another


def test_the_key_comes_from_a_file_or_the_environment_and_is_redacted(tmp_path, monkeypatch):
    f = tmp_path / "k"
    f.write_text("# comment\n\n  sk-file-key-123456  \n")
    assert read_api_key(str(f)) == "sk-file-key-123456"
    assert "sk-file-key-123456" not in redact("refused sk-file-key-123456")
    monkeypatch.setenv("LLAMA_API_KEY", "env-key-abcdef")
    assert read_api_key(None) == "env-key-abcdef"
    assert "env-key-abcdef" not in redact("x env-key-abcdef y")
    monkeypatch.setenv("LLAMA_API_KEY", "bad-key\r\nX-Injected: 1")
    with pytest.raises(Exception, match="control character") as e:
        read_api_key(None)
    assert "X-Injected" not in str(e.value)
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(Exception, match="holds no key"):
        read_api_key(str(tmp_path / "empty"))


def test_a_server_that_does_not_answer_is_one_clean_line():
    r = cli("watch", "http://127.0.0.1:9", "--duration", "1")
    clean_error(r, "http://127.0.0.1:9", "no answer")


def test_with_metrics_adds_the_flag_to_the_users_command():
    assert with_metrics("llama-server -m m.gguf -np 1") == "llama-server -m m.gguf -np 1 --metrics"
    assert with_metrics("llama-server --metrics -m m.gguf") == "llama-server --metrics -m m.gguf"
    assert with_metrics("") is None


def test_the_cost_record_type_is_the_probes():
    assert isinstance(server_costs(COSTS, 0.5), CostRecord)
