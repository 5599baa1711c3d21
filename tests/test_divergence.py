"""A greedy divergence explained, not alarmed (issue 55 item 4): recorded runs whose tokens leave
the baseline's, with the baseline's top-2 margin where they part (a record's ``divergence``, as
the sweep writes it: measure.divergence). A near tie is numerical, with its margin; a confident
token that changed is suspicious; the message names the mode, never "MTP" for another one."""

from __future__ import annotations

import pytest

from app.core.analysis.analysis import analyze
from app.core.analysis.fields import EQUIVALENCE_FIELDS, table as field_table
from app.core.records.arm import Arm
from app.core.records.schema import RunRecord, tokens_sha256
from tests.helpers import make_record

BASE = (10, 11, 12, 13, 14, 15)
DRAFT_SIMPLE = Arm(3, mode="draft-simple", drafter="/m/drafter.gguf")


def pair(arm: Arm, divergence=None, at=3, other=99):
    out = (*BASE[:at], other, *BASE[at + 1:])
    base = make_record(Arm(), run_id="b", output_tokens=BASE, output_sha256=tokens_sha256(BASE), n_generated=6)
    spec = make_record(arm, run_id="s", output_tokens=out, output_sha256=tokens_sha256(out), n_generated=6,
                       drafter={"path": arm.drafter} if arm.drafter else None, divergence=divergence)
    return [base, spec]


def differs(recs):
    return [f for f in analyze(recs).findings if f.code.startswith("output_differs")]


def tie(p1=0.41, p2=0.40, at=3):
    return {"at": at, "baseline": BASE[at], "arm": 99, "top": [BASE[at], p1], "second": [99, p2]}


def test_a_near_tie_is_numerical_with_its_margin_and_names_draft_simple():
    (f,) = differs(pair(DRAFT_SIMPLE, tie()))
    assert f.code == "output_differs_numerical"
    assert f.message == ("draft-simple output differs from the baseline at greedy in 1 run(s), numerical: the two "
                         "top tokens were within 0.010 where they parted (first: code/p draft-simple K=3, token 3, "
                         "top-2 margin 0.010)")
    assert "MTP" not in f.message + f.fix and "bug" not in f.fix


def test_a_confident_token_that_changed_is_suspicious_and_names_its_mode():
    (f,) = differs(pair(DRAFT_SIMPLE, tie(0.9, 0.05)))
    assert f.code == "output_differs" and "suspicious" in f.message and f.message.startswith("draft-simple ")
    assert f.fix.startswith("this llama.cpp build may have a draft-simple bug") and "MTP" not in f.message + f.fix
    (g,) = differs(pair(Arm(2), tie(0.9, 0.05)))  # draft-mtp: the MTP heads
    assert g.message.startswith("MTP (draft-mtp) output differs") and "may have an MTP (draft-mtp) bug" in g.fix


@pytest.mark.parametrize("arm,name", [(Arm(mode="ngram-mod"), "ngram-mod"), (DRAFT_SIMPLE, "draft-simple"),
                                      (Arm(2), "MTP (draft-mtp)")])
def test_an_unread_margin_names_the_mode_and_alarms_no_one(arm, name):
    (f,) = differs(pair(arm))
    assert f.code == "output_differs" and f.message.startswith(f"{name} output differs from the baseline")
    assert "the margin there was not read" in f.message and "bug" not in f.message + f.fix
    assert "selftest" in f.fix
    if not arm.is_mtp:
        assert "MTP" not in f.message


def test_in_between_is_neither_numerical_nor_suspicious():
    (f,) = differs(pair(DRAFT_SIMPLE, tie(0.5, 0.3)))
    assert f.code == "output_differs" and "not tied there, nor the baseline's token confident" in f.message
    assert "top-2 margin 0.200" in f.message and "bug" not in f.fix


@pytest.mark.parametrize("div", [
    tie(at=2),  # read at another place than where the tokens part
    {**tie(), "top": [BASE[3], 1.5]},  # not a probability
    {**tie(), "top": [BASE[3], "0.4"]},
    {**tie(), "second": [99, True]},
    {**tie(), "top": [BASE[3]]},
    {**tie(), "top": None},
    tie(0.3, 0.4),  # the second above the top
    "not a dict",
])
def test_a_files_divergence_is_checked_before_it_explains_anything(div):
    recs = pair(DRAFT_SIMPLE, div if isinstance(div, dict) else None)
    if not isinstance(div, dict):  # the record's type check refuses it on read
        line = recs[1].to_json().replace('"divergence":null', '"divergence":"not a dict"')
        import json
        with pytest.raises(ValueError, match="divergence"):
            RunRecord.from_dict(json.loads(line))
        return
    (f,) = differs(recs)
    assert f.code == "output_differs" and "the margin there was not read" in f.message


def test_the_divergence_survives_the_results_file_and_shows_in_the_equivalence_table(tmp_path):
    import json

    from app.core.records.reader import load_records
    from app.core.records.writer import ResultsWriter

    base, spec = pair(DRAFT_SIMPLE, tie())
    back = RunRecord.from_dict(json.loads(spec.to_json()))
    assert back.divergence == tie()
    with ResultsWriter(tmp_path / "r.jsonl") as w:
        w.append(base)
        w.append(spec)
    assert [r.divergence for r in load_records(tmp_path / "r.jsonl")] == [None, tie()]
    a = analyze([base, back])
    (e,) = a.equivalence
    assert not e.equal and e.first_divergence == 3 and e.margin == pytest.approx(0.01)
    headers, rows = field_table(a.equivalence, EQUIVALENCE_FIELDS)
    assert headers[-1] == "top-2 margin there" and rows[0][-1] == "0.010"


def test_equal_outputs_say_nothing():
    base = make_record(Arm(), run_id="b", output_tokens=BASE)
    spec = make_record(DRAFT_SIMPLE, run_id="s", output_tokens=BASE, drafter={"path": DRAFT_SIMPLE.drafter})
    assert not differs([base, spec])


@pytest.mark.parametrize("step,want", [
    ({"id": 5, "top_logprobs": [{"id": 5, "logprob": -0.1}, {"id": 7, "logprob": -2.5}]}, (5, 7)),
    ({"id": 7, "top_logprobs": [{"id": 7, "logprob": -2.5}, {"id": 5, "logprob": -0.1}]}, (5, 7)),  # sorted
    ({"id": 5, "top_probs": [{"id": 5, "prob": 0.6}, {"id": 7, "prob": 0.3}]}, (5, 7)),  # older builds
    ({"id": 5, "top_logprobs": [{"id": 5, "logprob": 0.5}, {"id": 7, "logprob": -1}]}, None),  # p > 1
    ({"id": 5, "top_logprobs": [{"id": 5, "logprob": 1e6}, {"id": 7, "logprob": -1}]}, None),  # overflow
    ({"id": 5, "top_logprobs": [{"id": "5", "logprob": -0.1}, {"id": 7, "logprob": -1}]}, None),
    ({"id": 5, "top_logprobs": [{"id": 5, "logprob": "x"}, {"id": 7, "logprob": -1}]}, None),
    ({"id": 5, "top_logprobs": [{"id": 5, "logprob": -0.1}]}, None),  # one only
    ({"id": 5}, None), ("text", None), (None, None), ({"id": 5, "top_logprobs": "x"}, None),
])
def test_llama_servers_probabilities_are_typed_and_bounded(step, want):
    from app.core.engines.server.engine import top_two_of

    got = top_two_of(step)
    assert (None if got is None else (got.first, got.second)) == want
    if got is not None:
        assert 0 <= got.p_second <= got.p_first <= 1
