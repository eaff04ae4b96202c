"""A representative subset of the bad-input table (``python -m audit.bad_inputs``): each case
fails before any worker starts, with exit status 2 and a one-line message naming the field.

The same cases and the same classification as the bench (``audit/bad_input_cases.py``),
run as ``python -m bidirl.cli`` subprocesses: one of every kind (config field, YAML file,
data file, reward file, scenario, flag, resume), each under a second or two.
"""

from __future__ import annotations

import pytest

from audit.bad_input_cases import FAST, OK_CLASSES, cases, classify, make_fixtures, run_case

SUBSET = cases(FAST)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    f = tmp_path_factory.mktemp("fixtures")
    make_fixtures(f)
    return f


def test_the_table_has_at_least_67_cases_before_start_up():
    assert len(cases()) >= 67
    assert {c.area for c in cases()} >= {"config", "yaml", "data", "reward", "scenario", "flags", "resume",
                                         "cluster"}


@pytest.mark.parametrize("case", SUBSET, ids=[c.name for c in SUBSET])
def test_bad_input_is_a_clean_one_line_error(case, fixtures, tmp_path):
    out = run_case(case, tmp_path, fixtures, timeout=120)
    assert out.cls == "clean", f"{case.name}: {out.cls} ({out.got}): {out.message}"
    assert out.message.startswith("bidirl"), out.message


def test_classification():
    err = cases(["plan --top 0"])[0]
    assert classify(err, 2, "", "bidirl plan: error: argument --top: must be >= 1\n", None)[0] == "clean"
    assert classify(err, 2, "", "bidirl plan: error: something else\n", None)[0] == "vague"
    assert classify(err, 1, "", "Traceback (most recent call last):\nValueError: x\n", None) == ("traceback",
                                                                                                  "ValueError: x")
    assert classify(err, 0, "", "", None)[0] == "wrong"
    assert classify(err, None, "", "", None)[0] == "hang"
    ok = cases(["plan --json"])[0]
    assert classify(ok, 0, "", "", None)[0] == "correct"
    assert classify(ok, 0, "", "", "plan.json not written") == ("wrong", "plan.json not written")
    assert set(OK_CLASSES) == {"clean", "correct"}
    model = cases(["model.path a BERT model"])[0]
    line = "bidirl train: error: model.path: architecture BertForMaskedLM in m/config.json cannot generate\n"
    assert classify(model, 2, "", line, None)[0] == "clean"
    assert classify(model, 2, "", line, "imported ray") == ("wrong", "imported ray"), "a check of an error case"
    term = cases(["SIGTERM 4 s after the start"])[0]
    assert classify(term, 143, "", "[bidirl] SIGTERM: stopped\n", None)[0] == "correct", "the exit status expected"
    assert classify(term, 0, "", "", None)[0] == "wrong"
