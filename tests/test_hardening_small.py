"""The smaller holes of issue 36's attack: a negative community figure, a task given twice in a
mix, a log folder that is a pipe, a budget that the pilot overran, and numbers written with
other digits than 0-9."""

from __future__ import annotations

import os

import pytest

from app.core.analysis.community import TableError, parse_table
from app.core.analysis.recommend import parse_mix
from app.core.common.errors import UserError
from app.core.measure.plan import parse_float_list, parse_int_list
from tests.helpers import clean_error, cli

HEAD = "| GPU | Baseline | With flag | n-max |\n|---|---|---|---|\n"


@pytest.mark.parametrize("cell", ["-30", "−30", "- 30"])
def test_a_negative_community_speed_is_an_error_not_its_absolute_value(cell):
    with pytest.raises(TableError, match="negative"):
        parse_table(HEAD + f"| RTX 3090 | {cell} | 40 | 3 |\n")
    with pytest.raises(TableError, match="negative"):
        parse_table(HEAD + f"| RTX 3090 | 30 | {cell} | 3 |\n")
    assert parse_table(HEAD + "| RTX 3090 | 30 | 40 | 3 |\n").rows[0].speedup == pytest.approx(40 / 30)


@pytest.mark.parametrize("cell", ["３０", "٣٠", "३०"])
def test_other_digits_are_no_community_figure(cell):
    with pytest.raises(TableError):
        parse_table(HEAD + f"| RTX 3090 | {cell} | 40 | 3 |\n")


def test_a_task_given_twice_in_the_mix_is_an_error():
    with pytest.raises(UserError, match="'code' is given twice"):
        parse_mix("code=0.5,story=0.5,code=0.9", ("code", "story"))
    with pytest.raises(UserError, match="given twice"):
        parse_mix("code=1, code =2", ("code",))
    assert parse_mix("code=3,story=1", ("code", "story")) == {"code": 0.75, "story": 0.25}


@pytest.mark.parametrize("text", ["３", "1,２", "٣-4"])
def test_lists_of_numbers_take_ascii_digits_only(text):
    with pytest.raises(UserError):
        parse_int_list(text, "--k")
    with pytest.raises(UserError):
        parse_float_list(text, "--p-min")
    with pytest.raises(UserError):
        parse_mix(f"code={text}", ("code",))


@pytest.mark.parametrize("args", [("--budget", "３s"), ("--budget", "1m３0s"), ("--reps", "３"),
                                  ("--n-predict", "٣٢")])
def test_cli_numbers_take_ascii_digits_only(args):
    r = cli("bench", "--demo", "--adaptive" if args[0] == "--budget" else "--demo", *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.strip().splitlines()[-1].startswith("mtp-tuner: error:")


def test_a_log_dir_that_is_a_pipe_or_a_file_is_an_error_before_anything_runs(tmp_path):
    fifo = tmp_path / "logs"
    os.mkfifo(fifo)
    r = cli("bench", "--demo", "--engine", "server", "--log-dir", str(fifo), timeout=60)
    clean_error(r, str(fifo), "pipe (FIFO)", "not a folder")
    f = tmp_path / "file"
    f.write_text("x")
    r = cli("bench", "--demo", "--engine", "server", "--log-dir", str(f), timeout=60)
    clean_error(r, str(f), "a file, not a folder")
