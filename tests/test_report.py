"""A run's summary: it accounts for every row and never claims more than was counted."""

from types import SimpleNamespace

import pandas as pd
import pytest

from helpers import report
from helpers.pipeline import ENGINE, POSTPROCESS, REJECTED



def written(answered, errors, entered, before=0, task="text"):
    return SimpleNamespace(answered=answered, errors=errors, rows_entered=entered, rows_before=before,
                           rows_read=None if entered is None else entered + before,
                           run=SimpleNamespace(plan=SimpleNamespace(task=task)))


def errors(*stages):
    return pd.DataFrame({"row_id": [f"e{i}" for i in range(len(stages))], "stage": list(stages),
                         "reason": ["why"] * len(stages)})


def test_every_row_read_is_answered_rejected_or_failed_exactly_once():
    answered = pd.DataFrame({"row_id": ["a", "b", "c"], "label": ["A", "B", "A"]})
    summary = report.summary(written(answered, errors(REJECTED, ENGINE, POSTPROCESS), 6), checks={"yours": True})
    assert summary["rows read"] == 6 and summary["classified"] == 3 and summary["postprocess errors"] == 1
    assert summary["all rows accounted for"] and summary["every error has a reason"] and summary["yours"]
    assert not report.summary(written(answered, errors(REJECTED), 6))["all rows accounted for"]
    uncounted = report.summary(written(answered, errors(), None))
    assert uncounted["rows read"].startswith("not counted") and not uncounted["all rows accounted for"]
    twice = pd.concat([answered, answered.head(1)])
    assert not report.summary(written(twice, errors(), 4))["all rows accounted for"]
    same = report.summary(written(twice, errors(), 4), ids_from_content=True)
    assert same["all rows accounted for"] and same["rows identical to another (ids from content)"] == 1
    unexplained = errors(ENGINE).assign(reason="")
    assert not report.summary(written(answered, unexplained, 4))["every error has a reason"]


def test_a_resumed_runs_rows_read_include_what_the_interrupted_run_wrote():
    answered = pd.DataFrame({"row_id": list("abcd"), "caption": ["x", "y", "", "z"]})
    summary = report.summary(written(answered, errors(REJECTED), 3, before=2, task="vision"))
    assert summary["images read"] == 5 and summary["all images accounted for"] and summary["captioned"] == 4


def test_the_checked_cell_fails_on_no_rows_and_on_an_engine_that_died_after_its_first_batch():
    answered = pd.DataFrame({"row_id": ["a"], "label": ["A"]})
    died = report.summary(written(answered, errors(*[ENGINE] * 9), 10))
    with pytest.raises(report.RunCheckError, match="the model answered .*engine errors 9"):
        report.require(died)
    none = report.summary(written(answered.head(0), errors(), 0))
    with pytest.raises(report.RunCheckError, match="at least one row read"):
        report.require(none)
    with pytest.raises(report.RunCheckError, match="every prediction is a label"):
        report.require(report.summary(written(answered, errors(), 1), checks={"every prediction is a label": False}))
    fine = report.summary(written(answered, errors(ENGINE), 2))
    shown = report.require(fine, counts=True)
    assert shown.splitlines()[0] == "rows read:                 2" and "the model answered:        True" in shown
