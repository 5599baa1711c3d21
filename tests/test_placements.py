"""Where drafting runs over RPC workers: the placements as llama-server flags, each a setting of
the sweep (a named axis), named back from the records' flags, and the verdict naming the placement
that pays (or that none does) with its command, from recorded runs."""

from __future__ import annotations

import dataclasses
import math
import random
import re

import pytest

from app.core.common.workers import Workers
from app.core.analysis.settings import setting_label, split_by_setting
from app.core.common.errors import UserError
from app.core.engines.base import EngineSettings
from app.core.engines.backend_truth import Device
from app.core.measure.axes import Axis, axis_settings, engine_for
from app.core.measure.placements import (AXIS, parse_placements, placement_flags, placement_in, placements_for,
                                         nextn_blocks, nextn_override)
from app.core.verdict.export import ExportOptions
from app.core.verdict.joint import joint_verdict, with_setting
from helpers import make_record

OT = r"blk\.4\.=CPU"
CUDA = Device("CUDA0", "NVIDIA RTX 4090")
RPC = ("RPC0", "RPC1")


def test_parse_placements():
    assert parse_placements("auto") == ("auto",)
    assert parse_placements("mtp-local") == ("default", "mtp-local")  # the reference always first
    assert parse_placements(" workers, default ,mtp-local") == ("default", "workers", "mtp-local")
    for bad, fragment in (("", "name auto"), ("mtp", "not a placement"), ("default,default", "twice"),
                          ("auto,default", "not a placement")):
        with pytest.raises(UserError, match=fragment):
            parse_placements(bad)


def test_flags_of_each_placement():
    assert nextn_blocks(5, 1) == (4,) and nextn_blocks(62, 2) == (60, 61) and nextn_blocks(5, 0) == ()
    assert nextn_override((60, 61), "CPU") == r"blk\.60\.=CPU,blk\.61\.=CPU"
    flags = lambda name, local=(): placement_flags(name, nextn=(4,), rpc_devices=RPC, local=local)
    assert flags("default") == ()
    assert flags("drafter-local") == ("--device-draft", "none")  # no GPU here: the drafter on the CPU
    assert flags("drafter-local", (CUDA,)) == ("--device-draft", "CUDA0")
    assert flags("mtp-local") == ("-ot", OT)
    assert flags("mtp-local", (CUDA,)) == ("-ot", r"blk\.4\.=CUDA0")  # the local GPU holds it
    assert flags("workers", (CUDA,)) == ("--device", "RPC0,RPC1", "-ot", OT)


def test_which_placements_apply():
    chosen, notes = placements_for(("auto",), nextn=(4,), drafter=False, rpc_devices=RPC, local=())
    assert [n for n, _ in chosen] == ["default", "mtp-local"]
    assert notes == ["placement drafter-local left out: the sweep has no drafter model (--drafter)",
                     "placement workers left out: without a GPU here every layer llama.cpp offloads goes to the "
                     "workers already (the same as mtp-local)"]
    chosen, notes = placements_for(("auto",), nextn=(4,), drafter=True, rpc_devices=RPC, local=(CUDA,))
    assert [n for n, _ in chosen] == ["default", "drafter-local", "mtp-local", "workers"] and not notes
    chosen, _ = placements_for(("default", "workers"), nextn=(4,), drafter=False, rpc_devices=RPC, local=())
    assert chosen == (("default", ()), ("workers", ("--device", "RPC0,RPC1", "-ot", OT)))  # asked: measured
    with pytest.raises(UserError, match="mtp-local: the model has no MTP"):
        placements_for(("default", "mtp-local"), nextn=(), drafter=False, rpc_devices=RPC, local=())
    with pytest.raises(UserError, match="drafter-local: the sweep has no drafter"):
        placements_for(("default", "drafter-local"), nextn=(4,), drafter=False, rpc_devices=RPC, local=())


def _axis() -> Axis:
    chosen, _ = placements_for(("default", "mtp-local", "workers"), nextn=(4,), drafter=False,
                               rpc_devices=RPC, local=())
    return Axis(AXIS, tuple(n for n, _ in chosen), frozenset(), tuple(f for _, f in chosen))


def test_placements_are_settings_of_the_axis_machinery():
    axis = _axis()
    ub = Axis("-ub", ("64",), frozenset({"-ub"}))
    settings = axis_settings(("-fa", "on"), (ub, axis))
    assert settings == [(("-fa", "on", "-ub", "64"), "-ub 64 placement default"),
                        (("-fa", "on", "-ub", "64", "-ot", OT), "-ub 64 placement mtp-local"),
                        (("-fa", "on", "-ub", "64", "--device", "RPC0,RPC1", "-ot", OT), "-ub 64 placement workers")]
    base = EngineSettings(log_dir="logs", rpc=Workers.parse("127.0.0.1:1,127.0.0.1:2"))
    got = [engine_for(base, args, (ub, axis)) for args, _ in settings]
    assert [g.log_dir.split("/")[-1] for g in got] == [
        "ub-64_placement-default", "ub-64_placement-mtp-local", "ub-64_placement-workers"]
    assert got[2].user_args == settings[2][0] and got[2].rpc == base.rpc
    assert [axis.value_in(args) for args, _ in settings] == ["default", "mtp-local", "workers"]


def test_placement_named_from_the_flags():
    assert placement_in([("-ot", OT)]) == ("mtp-local", [])
    assert placement_in([("-fa", "on"), ("--device", "RPC0,RPC1"), ("-ot", OT)]) == ("workers", [("-fa", "on")])
    assert placement_in([("--device-draft", "none")]) == ("drafter-local", [])
    assert placement_in([("-ot", "exps=CPU"), ("--device", "CUDA0")]) == (None, [("-ot", "exps=CPU"), ("--device", "CUDA0")])
    assert placement_in([]) == (None, [])


def _runs(placement: tuple[str, ...], base_speed: float, k2_speedup: float, start: int, rng: random.Random) -> list:
    out = []
    for rep in range(6):
        for k, speed in ((None, base_speed), (2, base_speed * k2_speedup), (3, base_speed * k2_speedup * 0.9)):
            t = start + len(out)
            out.append(make_record(
                run_id=f"{placement}-{k}-{rep}", task="code", prompt_id="p", rep=rep,
                arm_kind="baseline" if k is None else "mtp", k=k, p_min=None if k is None else 0.0,
                draft_n=None if k is None else 10, draft_accepted=None if k is None else 7,
                acceptance=None if k is None else 0.7, mtp_engaged=None if k is None else True,
                tok_s=speed * math.exp(rng.gauss(0, 0.01)), server_args=placement, rpc=RPC_FIELD,
                timestamp_utc=f"2026-01-01T00:{t // 60:02d}:{t % 60:02d}+00:00"))
    return out


DEFAULT, MTP_LOCAL, WORKERS = (), ("-ot", OT), ("--device", "RPC0,RPC1", "-ot", OT)
RPC_FIELD = {"workers": ["192.168.1.20:50052", "192.168.1.21:50052"], "rtt_start_ms": [0.3, 0.4]}
RPC_ARG = ("--rpc", "192.168.1.20:50052,192.168.1.21:50052")


def test_each_placement_a_setting_named():
    rng = random.Random(2)
    runs = _runs(DEFAULT, 100, 0.5, 0, rng) + _runs(MTP_LOCAL, 100, 1.3, 100, rng) + _runs(WORKERS, 90, 1.3, 200, rng)
    groups = split_by_setting(runs)
    assert [setting_label(g, runs) for g in groups.values()] == [
        "llama.cpp's own split", "MTP block on this machine", "all but the MTP block on the workers"]
    with_ub = [dataclasses.replace(r, server_args=(*r.server_args, "-ub", "64")) for r in runs[:18]]
    assert setting_label(with_ub, with_ub + runs[18:36]) == "-ub 64, llama.cpp's own split"


def test_the_verdict_names_the_placement_that_pays_and_its_command_carries_it():
    rng = random.Random(4)
    runs = _runs(DEFAULT, 100, 0.5, 0, rng) + _runs(MTP_LOCAL, 100, 1.3, 100, rng) + _runs(WORKERS, 90, 1.3, 200, rng)
    jv = joint_verdict(runs, binary="llama-server")
    assert jv is not None and jv.placements and jv.best.label == "MTP block on this machine"
    assert jv.best.over_reference.estimate == pytest.approx(1.3, rel=0.02)
    assert re.match(r"over this link keep the MTP block on this machine: K=2 1\.(29|3\d)x \(95% CI ", jv.sentence)
    assert jv.sentence.endswith("over llama.cpp's own split without speculation")
    lines = jv.lines()
    assert lines[0] == f"where drafting runs: {jv.sentence}"
    assert lines[1].startswith("  llama.cpp's own split (reference): speculation off")
    argv = jv.best.verdict.export.argv  # the recorded flags: the placement that paid, then the pick's
    # --rpc first: llama.cpp reads its arguments in order, and RPC0 exists once --rpc registered it
    assert argv[:7] == ("llama-server", "-m", runs[0].model_path, *RPC_ARG, "-ot", OT) and "--spec-type" in argv
    assert jv.as_dict()["placement"] == "mtp-local"
    # over the user's own command: their -ot kept, the placement's added after it
    user = ("llama-server", "-m", "/m.gguf", "--rpc", "h:1,h:2", "-ot", "exps=CPU")
    assert with_setting(user, [("--device", "RPC0,RPC1"), ("-ot", OT)], None) == (*user, "--device", "RPC0,RPC1", "-ot", OT)
    jv = joint_verdict(runs, options=ExportOptions(base_argv=user, rpc=Workers(())))
    assert jv.best.verdict.export.argv[:9] == (*user, "-ot", OT)


def test_the_verdict_says_when_nothing_pays_over_the_link():
    rng = random.Random(6)
    runs = _runs(DEFAULT, 100, 0.4, 0, rng) + _runs(MTP_LOCAL, 100.5, 0.2, 100, rng)
    jv = joint_verdict(runs)
    assert jv is not None and jv.values[1].over_reference.estimate > 1 and jv.values[1].over_reference.lo < 1
    assert jv.best is jv.reference and jv.best.verdict.pick.arm is None  # no placement advised on noise
    assert jv.sentence == "over this link nothing pays: no placement makes speculation faster; leave it off"
    assert "-ot" not in jv.best.verdict.export.argv and "--spec-type" not in jv.best.verdict.export.argv
    # found measuring through a 2 ms relay: a plain server of mtp-local 1.17x faster (95% CI 1.04-1.32)
    # than the default's, measured later; without speculation the MTP block is not even loaded
    runs = _runs(DEFAULT, 100, 0.4, 0, rng) + _runs(MTP_LOCAL, 117, 0.2, 100, rng)
    jv = joint_verdict(runs)
    assert jv.values[1].over_reference.lo > 1 and jv.best is jv.reference
    assert jv.sentence == "over this link nothing pays: no placement makes speculation faster; leave it off"
    runs = _runs(DEFAULT, 100, 1.2, 0, rng) + _runs(WORKERS, 150, 0.5, 100, rng)
    jv = joint_verdict(runs)  # the workers' plain decoding beats the default with K=2
    assert jv.best.label == "all but the MTP block on the workers"
    assert jv.sentence.startswith("over this link put every layer but the MTP block on the workers and leave "
                                  "speculation off: 1.5")
    assert jv.best.verdict.export.argv[3:9] == (*RPC_ARG, "--device", "RPC0,RPC1", "-ot", OT)
    assert [w.argv[-1] for w in jv.best.verdict.export.workers] == ["50052", "50052"]  # each worker's command
    assert "--spec-type" not in jv.best.verdict.export.argv


def test_bench_refuses_placements_it_cannot_measure():
    from helpers import clean_error, cli

    clean_error(cli("bench", "--demo", "--placements", "mtp"), "--placements: 'mtp' is not a placement")
    clean_error(cli("bench", "--demo", "--engine", "server", "--placements", "auto"),
                "--placements: where drafting runs is measured over RPC workers; name them with --rpc")


def test_the_placements_a_sweep_measured_are_named_from_its_records():
    """bench --again measures a sweep's placements again: named from the records' server flags,
    default first; flags every setting shares (the user's own -ot) are none; no placements: ()."""
    from app.core.measure.placements import placements_measured

    user = ("-ot", r"blk\.2\.=CPU", "-ub", "64")  # the user's own command's flags, in every setting
    assert placements_measured([DEFAULT, MTP_LOCAL, WORKERS, MTP_LOCAL]) == ("default", "mtp-local", "workers")
    assert placements_measured([None, MTP_LOCAL]) == ("default", "mtp-local")
    assert placements_measured([user, (*user, *MTP_LOCAL)]) == ("default", "mtp-local")
    assert placements_measured([user, user]) == placements_measured([None]) == ()
    assert placements_measured([("-ub", "64"), ("-ub", "128")]) == ()  # an --axis sweep, no placement
    assert placements_measured([(), ("--device-draft", "none")]) == ("default", "drafter-local")


def test_again_measures_a_recorded_sweeps_placements_again_over_workers_named_again(capsys):
    """bench --again on a recorded sweep of placements (tests/data/placements_sweep.jsonl: bench
    --demo --rpc-local 2 --placements auto, on this CPU-only machine: the own split and mtp-local)
    asks for those placements again; its loopback workers are gone, so they must be named again."""
    from pathlib import Path

    from app.cli import build_parser, main
    from app.cli.bench import request_of
    from app.core.calibrated.demo import demo_model

    recorded, model = str(Path(__file__).parent / "data" / "placements_sweep.jsonl"), str(demo_model())
    assert main(["bench", "--again", recorded, "--model", model]) == 2
    err = capsys.readouterr().err
    assert "measured where drafting runs over RPC workers (default, mtp-local); name them again" in err
    assert main(["bench", "--again", recorded, "--model", model, "--rpc-local", "2", "--placements", "auto"]) == 2
    assert "--placements does not combine with it" in capsys.readouterr().err
    parse = build_parser().parse_args
    request = request_of(parse(["bench", "--again", recorded, "--model", model, "--rpc-local", "2"]))
    assert request.placements == ("default", "mtp-local") and request.rpc_local == 2
    assert {a.label for a in request.plan.arms} == {"baseline", "K=1", "K=2", "K=3"}
    request = request_of(parse(["bench", "--again", recorded, "--model", model, "--rpc", "127.0.0.1:51510"]))
    assert request.placements == ("default", "mtp-local") and request.engine.rpc == ("127.0.0.1:51510",)
