"""Threads where users run (issue 58): both engines default to the same count, this machine's
physical cores (what llama-server itself picks with -t unset); every run records the count it ran
with; the verdict's set-up line (the card's, the report's, compare's) says it."""

from __future__ import annotations

import dataclasses

import pytest

from app.core.analysis.compare import _setup
from app.core.measure.threads import physical_cores
from app.core.engines.base import EngineKind, EngineSettings
from app.core.engines.inprocess import InProcessEngine
from app.core.records.reader import load_records
from app.core.session.events import RunFinished
from app.core.session.request import SweepRequest
from app.core.session.sweep import prepare, run
from app.core.verdict.card import card_from_json, card_json, card_of, setup_line
from app.core.verdict import build_verdict
from app.core.verdict.report import markdown_report
from test_session import plan_of


def test_both_engines_default_to_the_physical_cores_as_llama_server_does(monkeypatch, server_bin):
    """With no count chosen (no -t, no MTP_TUNER_THREADS) the in-process engine ran min(CPUs, 8)
    threads and llama-server was started without -t: two different defaults. Now both run the
    physical cores, and llama-server is given them."""
    from app.core.engines.server.engine import ServerEngine

    monkeypatch.delenv("MTP_TUNER_THREADS", raising=False)
    inproc = InProcessEngine()
    server = ServerEngine(server_bin)
    try:
        assert inproc.threads == server.threads == physical_cores()
        assert server.settings.threads == physical_cores()
    finally:
        server.close()
        inproc.close()
    # a count chosen still wins, in both
    assert InProcessEngine(threads=3).threads == 3


def test_every_run_records_the_threads_it_ran_with(make_model, tmp_path):
    out = tmp_path / "r.jsonl"
    request = prepare(SweepRequest(plan_of(make_model(0.0)), EngineSettings(ctx_size=512, threads=1), out=out)).request
    events = list(run(request))
    finished = [e.record for e in events if isinstance(e, RunFinished)]
    assert finished and all(r.threads == 1 for r in finished)
    assert [r.threads for r in load_records(out)] == [1] * len(finished)  # written and read back


def _records(make_model, tmp_path):
    out = tmp_path / "r.jsonl"
    request = prepare(SweepRequest(plan_of(make_model(0.0)), EngineSettings(ctx_size=512, threads=1), out=out)).request
    list(run(request))
    return load_records(out)


def test_the_set_up_line_says_the_threads(make_model, tmp_path):
    from app.core.analysis.compare import threads_text

    recs = _records(make_model, tmp_path)
    two = [dataclasses.replace(r, threads=2) for r in recs]
    card = card_of(two)
    assert "inprocess engine, 2 threads" in setup_line(card)
    assert card_from_json(card_json(card)).threads == "2 threads"
    assert _setup(two)["threads"] == "2"  # compare's set-up lines
    assert "engine: inprocess, 2 threads" in markdown_report(build_verdict(two))
    # an older file's runs, with no count recorded: the line says nothing of threads
    old = [dataclasses.replace(r, threads=None) for r in recs]
    assert "inprocess engine · " in setup_line(card_of(old)) and threads_text(old) == ""
    assert threads_text([*recs, *two]) == "1, 2 threads"
    # compare says a change of threads, not an older file's silence
    from app.core.analysis.compare import setting_changes

    assert ("threads", "1", "2") in setting_changes(recs, two)
    assert not [c for c in setting_changes(old, two) if c[0] == "threads"]


@pytest.mark.parametrize("bad", [0, -1, 100000])
def test_a_files_thread_count_is_bounded(bad, make_model, tmp_path):
    from app.core.records.schema import bad_numbers

    rec = _records(make_model, tmp_path)[0]
    assert "threads" in (bad_numbers(dataclasses.replace(rec, threads=bad)) or "")
