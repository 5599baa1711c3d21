"""A sweep over llama.cpp RPC workers, without starting any: the workers and their round trips in
the records (schema 8) and the "rpc" line after the sweep, both read back checked; the card that
says how many workers and their round trip but never where they are; the exported command with
--rpc and each worker's own command; a pasted --rpc as the sweep's workers; the CLI's --rpc."""

from __future__ import annotations

import dataclasses
import json

import pytest

from app.core.common.workers import Workers
from app.core.records.reader import load_records, load_rpc_records
from app.core.records.rpc import RECORD_TYPE, RpcRecord, link_text, rpc_field
from app.core.records.schema import SCHEMA_VERSION, RunRecord
from helpers import clear_sweep_file

WORKERS = ("192.168.77.20:50052", "10.9.8.7:51234")
LINK = rpc_field(WORKERS, (0.31, 2.0625))


def _over_rpc(tmp_path, link=LINK, name="rpc.jsonl"):
    runs = [dataclasses.replace(r, rpc=link) for r in clear_sweep_file(tmp_path / "plain.jsonl")]
    path = tmp_path / name
    path.write_text("\n".join(r.to_json() for r in runs) + "\n", encoding="utf-8")
    return runs, path


def test_the_workers_and_round_trips_round_trip_and_old_files_read(tmp_path):
    runs, path = _over_rpc(tmp_path)
    assert {json.dumps(r.rpc) for r in load_records(path)} == {json.dumps(LINK)}
    assert RunRecord.from_dict(json.loads(runs[0].to_json())).rpc == LINK  # the checking reader too
    assert SCHEMA_VERSION == 8
    old = json.loads(runs[0].to_json())
    del old["rpc"]
    assert RunRecord.from_dict(old).rpc is None
    assert {r.rpc for r in load_records(tmp_path / "plain.jsonl")} == {None}


@pytest.mark.parametrize("bad, why", [
    ({"workers": [], "rtt_start_ms": []}, "workers is empty"),
    ({"workers": list(WORKERS), "rtt_start_ms": [0.3]}, "1 times for 2 workers"),
    ({"workers": list(WORKERS), "rtt_start_ms": [0.3, -1]}, "rtt_start_ms[1]"),
    ({"workers": list(WORKERS), "rtt_start_ms": [0.3, "fast"]}, "rtt_start_ms[1]"),
    ({"workers": ["x" * 400], "rtt_start_ms": [None]}, "workers[0]"),
    ({"workers": [f"10.0.0.{i}:1" for i in range(65)], "rtt_start_ms": [None] * 65}, "at most 64"),
    ({"workers": "10.0.0.1:1", "rtt_start_ms": [None]}, "rpc.workers"),
])
def test_a_record_with_workers_no_app_writes_is_left_out_naming_why(tmp_path, bad, why):
    _runs, path = _over_rpc(tmp_path, link=bad)
    problems: list[str] = []
    assert load_records(path, problems) == []
    assert problems and all(why in p for p in problems), problems[:1]


def test_the_line_after_the_sweep_holds_both_ends_and_the_run_readers_skip_it(tmp_path):
    runs, path = _over_rpc(tmp_path)
    end = RpcRecord(SCHEMA_VERSION, RECORD_TYPE, "r1", runs[0].sweep_id, "2026-12-03T16:00:00.000+00:00", WORKERS,
                    (0.31, 2.0625), (0.4, None))
    with open(path, "a", encoding="utf-8") as f:
        f.write(end.to_json() + "\n")
        f.write(json.dumps({**json.loads(end.to_json()), "rtt_end_ms": [1.0]}) + "\n")  # one time for two
    problems: list[str] = []
    assert len(load_records(path, problems)) == len(runs) and problems == []
    assert load_rpc_records(path, problems) == [end]
    assert len(problems) == 1 and "rtt_end_ms has 1 times for 2 workers" in problems[0]


def test_link_text_says_how_many_and_the_round_trip():
    assert link_text([None, None]) == ""
    assert link_text([rpc_field(WORKERS[:1], (0.31,))]) == "over 1 RPC worker, round trip 0.31 ms"
    assert link_text([LINK, LINK]) == "over 2 RPC workers, round trip 0.31 to 2.1 ms"
    assert link_text([rpc_field(WORKERS, (None, None))]) == "over 2 RPC workers"


def test_the_card_never_shows_the_workers_addresses(tmp_path):
    """The card (its JSON, the Markdown row, the PNG's set-up line) says over how many workers and
    their round trip; no address or port of a worker appears anywhere in it."""
    from app.core.verdict.card import card_json, card_of, markdown_row, setup_line

    runs, _ = _over_rpc(tmp_path)
    card = card_of(runs)
    assert card.link == "over 2 RPC workers, round trip 0.31 to 2.1 ms"
    shared = card_json(card) + markdown_row(card) + setup_line(card)
    assert "over 2 RPC workers" in setup_line(card)
    for w in WORKERS:
        host, port = w.rsplit(":", 1)
        assert host not in shared and port not in shared, w
    assert card_of(clear_sweep_file(tmp_path / "p.jsonl")).link == ""


def test_the_png_is_drawn_from_the_card_without_addresses(tmp_path, monkeypatch):
    """Every text the PNG draws (card_png._text) is free of the workers' addresses."""
    pytest.importorskip("PySide6")
    from app.drawing import card_png
    from app.core.verdict.card import card_of

    drawn: list[str] = []
    real = card_png._text

    def spy(p, x, y, w, text, *args, **kw):
        drawn.append(text)
        return real(p, x, y, w, text, *args, **kw)

    monkeypatch.setattr(card_png, "_text", spy)
    runs, _ = _over_rpc(tmp_path)
    card_png.render_card(card_of(runs))
    text = " ".join(drawn)
    assert "over 2 RPC workers" in text
    assert not any(part in text for w in WORKERS for part in w.rsplit(":", 1))


# -- the exported command ------------------------------------------------------------------------
def _pick():
    from app.core.analysis.recommend import Pick
    from app.core.records.arm import Arm

    return Pick("code", Arm(2, 0.0, "draft-mtp"), None, "")


def test_the_export_carries_rpc_and_each_workers_own_command():
    from app.core.verdict.export import export_command

    e = export_command(_pick(), "/abs/M.gguf", None, None, rpc=Workers.parse("127.0.0.1:51200,192.168.77.20:50052"))
    assert e.argv[e.argv.index("--rpc") + 1] == "127.0.0.1:51200,192.168.77.20:50052"
    assert e.argv.index("--rpc") < e.argv.index("--spec-type")  # where the model runs, then the pick
    local, remote = e.workers
    assert local.argv == ("ggml-rpc-server", "-H", "127.0.0.1", "-p", "51200")
    assert "this machine" in local.note and "unauthenticated" not in local.note
    assert remote.command == "ggml-rpc-server -H 192.168.77.20 -p 50052"
    assert "machine at 192.168.77.20" in remote.note and "unauthenticated" in remote.note
    assert export_command(_pick(), "/abs/M.gguf", None, None).workers == ()


def test_the_users_own_command_gets_rpc_once():
    from app.core.verdict.export import export_command

    base = ("llama-server", "-m", "/abs/M.gguf", "-fa", "on")
    e = export_command(_pick(), "/abs/M.gguf", None, None, base_argv=base, rpc=Workers.parse("10.9.8.7:51234"))
    assert e.argv[:7] == (*base, "--rpc", "10.9.8.7:51234") and e.argv.count("--rpc") == 1
    assert "--spec-type" in e.argv


def test_the_verdict_exports_the_workers_the_sweep_ran_on_and_says_their_commands(tmp_path):
    from app.core.verdict import ExportOptions, build_verdict
    from app.core.verdict.report import command_dict, markdown_report, verdict_text

    runs, _ = _over_rpc(tmp_path)
    v = build_verdict(runs)
    c = v.command("code")
    assert c.export is not None and "--rpc 192.168.77.20:50052,10.9.8.7:51234" in c.export.command
    text = verdict_text(v)
    assert "before it, start each RPC worker on its own machine:" in text
    assert "ggml-rpc-server -H 10.9.8.7 -p 51234" in text and "unauthenticated" in text
    assert [w["endpoint"] for w in command_dict(c)["workers"]] == list(WORKERS)
    assert "ggml-rpc-server -H 192.168.77.20 -p 50052" in markdown_report(v)
    other = build_verdict(runs, options=ExportOptions(rpc=Workers.parse("192.168.1.5:50052")))  # recommend --rpc
    assert "--rpc 192.168.1.5:50052 " in other.command("code").export.command


# -- the user's own command and the CLI ----------------------------------------------------------
def test_a_pasted_rpc_is_the_sweeps_workers_not_a_flag_of_its_own():
    from app.core.engines.base import EngineSettings
    from app.core.engines.shell_split import split_command
    from app.core.engines.user_command import parse_argv
    from test_user_command import CAPS, HELP
    from app.core.engines.commands import Capabilities
    from app.core.engines.user_command import help_flags

    text = HELP + "--rpc SERVERS                           comma separated list of RPC servers\n"
    caps = Capabilities(flags=frozenset(help_flags(text)), version=CAPS.version, help_text=text)
    cmd = parse_argv(split_command("llama-server -m M.gguf -fa on --rpc 10.0.0.2:50052,10.0.0.3:50052")[0], "bash",
                     caps)
    assert cmd.rpc == ("10.0.0.2:50052", "10.0.0.3:50052")
    assert cmd.kept == ("-fa", "on") and "--rpc" not in cmd.base_argv()
    assert "split over 2 RPC workers" in cmd.note()
    assert cmd.settings(EngineSettings(), "/bin/llama-server").rpc == ("10.0.0.2:50052", "10.0.0.3:50052")
    asked = EngineSettings(rpc=Workers.parse("127.0.0.1:51201"))  # --rpc or the Machine tab's workers: those are asked for
    assert cmd.settings(asked, "/bin/llama-server").rpc == ("127.0.0.1:51201",)


@pytest.mark.parametrize("argv, message", [
    (["bench", "--demo", "--rpc", "nohost"], "expected HOST:PORT"),
    (["bench", "--demo", "--rpc", "10.0.0.1:50052,10.0.0.1:50052"], "a worker is named twice"),
    (["probe", "--model", "m.gguf", "--rpc", "10.0.0.1:0"], "expected HOST:PORT"),
    (["recommend", "r.jsonl", "--rpc", "a b:1"], "is not a host name"),
    (["bench", "--demo", "--rpc-local", "0"], "must be 1 to 16"),
])
def test_bad_workers_exit_2_with_the_sentence(capsys, argv, message):
    from app.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["bench", "--demo", "--engine", "inprocess", "--rpc", "127.0.0.1:51200"],
                                  ["bench", "--demo", "--engine", "inprocess", "--rpc-local", "1"],
                                  ["probe", "--model", "m.gguf", "--engine", "inprocess", "--rpc", "127.0.0.1:51200"]])
def test_the_in_process_engine_with_workers_is_refused_saying_why(capsys, argv):
    from app.cli import main

    assert main(argv) == 2
    assert "only llama-server does" in capsys.readouterr().err


def test_a_sweep_with_workers_runs_on_llama_server_and_checks_them(make_model):
    from app.core.engines.base import EngineKind, EngineSettings
    from app.core.common.errors import UserError
    from app.core.measure.plan import Plan, make_arms
    from app.core.records.prompt import Prompt
    from app.core.session.request import SweepRequest
    from app.core.session.rpc import RPC_ENGINE
    from app.core.session.sweep import prepare

    plan = Plan(model=str(make_model(0.3)), arms=make_arms([1]), prompts=(Prompt("a", "code", "hi"),),
                engine=EngineKind.INPROCESS, n_predict=8, reps=1, warmup=0)
    p = prepare(SweepRequest(plan, EngineSettings(rpc=Workers.parse("localhost:51200")), keep_results=False))
    assert p.request.plan.engine is EngineKind.SERVER and RPC_ENGINE in p.notes
    assert p.request.engine.rpc == ("localhost:51200",) and p.request.engine.kind is EngineKind.SERVER
    with pytest.raises(UserError, match="expected HOST:PORT"):  # at the door: no bad worker gets this far
        Workers.parse("localhost")
    assert prepare(SweepRequest(plan, keep_results=False)).request.engine.rpc is None


def test_the_window_sweeps_over_the_machine_tabs_workers_and_says_so(state, sweep_tab, make_model):
    """The window's engine settings carry AppState.rpc_workers (llama-server's, whatever engine the
    form names); the Sweep tab says over how many workers, and says nothing without any."""
    from app.core.engines.base import EngineKind

    assert state.engine_settings(EngineKind.INPROCESS).rpc is None and sweep_tab.rpc_label.isHidden()
    state.rpc_workers = WORKERS
    state.rpc_workers_changed.emit()
    settings = state.engine_settings(EngineKind.INPROCESS)
    assert settings.rpc == WORKERS and settings.kind is EngineKind.SERVER
    assert not sweep_tab.rpc_label.isHidden() and "split over 2 RPC workers" in sweep_tab.rpc_label.text()
    state.set_model(str(make_model(0.3)))
    assert sweep_tab.form.request().engine.rpc == WORKERS


def test_a_resumed_sweep_measures_where_the_sweep_did(tmp_path, capsys):
    from app.cli import main

    _runs, split = _over_rpc(tmp_path)
    assert main(["bench", "--resume", str(split)]) == 2
    assert "was split over RPC workers; name them again" in capsys.readouterr().err
    assert main(["bench", "--resume", str(tmp_path / "plain.jsonl"), "--rpc", "127.0.0.1:51200"]) == 2
    assert "ran on this machine only" in capsys.readouterr().err


def test_probe_with_workers_and_no_engine_named_goes_through_llama_server():
    from app.cli import build_parser
    from app.cli.options import rpc_of

    args = build_parser().parse_args(["probe", "--model", "m.gguf", "--rpc", "127.0.0.1:51200"])
    assert args.engine == "inprocess" and rpc_of(args) == ("127.0.0.1:51200",)  # the default: not refused
