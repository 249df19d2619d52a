"""What a person reads after a run: accuracy per label, the charts, and a summary that accounts for
every row and never claims more than was counted."""

from types import SimpleNamespace

import pandas as pd
import pytest

from helpers import report
from helpers.pipeline import ENGINE, POSTPROCESS, REJECTED

LABELS = ["A", "B", "C"]


def written(answered, errors, entered, before=0):
    return SimpleNamespace(answered=answered, errors=errors, rows_entered=entered, rows_before=before,
                           rows_read=None if entered is None else entered + before)


def errors(*stages):
    return pd.DataFrame({"row_id": [f"e{i}" for i in range(len(stages))], "stage": list(stages),
                         "reason": ["why"] * len(stages)})


def test_per_label_table_and_confusion_matrix():
    truth, predicted = pd.Series(["A", "A", "B", "C"]), pd.Series(["A", "B", "B", "B"])
    table = report.per_label_table(truth, predicted, LABELS)
    assert table.loc["A", "recall"] == 0.5 and table.loc["B", "precision"] == pytest.approx(1 / 3)
    assert table.loc["all", "recall"] == 0.5 and table.loc["all", "support"] == 4
    cm = report.confusion_matrix(truth, predicted, LABELS)
    assert cm.loc["A", "B"] == 1 and cm.loc["C", "B"] == 1 and int(cm.values.sum()) == 4


def test_every_row_read_is_answered_rejected_or_failed_exactly_once():
    answered = pd.DataFrame({"row_id": ["a", "b", "c"], "label": ["A", "B", "A"], "truth": ["A", "A", "A"],
                             "confidence": [0.9, 0.3, None]})
    summary = report.summary(written(answered, errors(REJECTED, ENGINE, POSTPROCESS), 6), answer="label",
                             labels=LABELS, truth="truth")
    assert summary["rows read"] == 6 and summary["classified"] == 3 and summary["postprocess errors"] == 1
    assert summary["all rows accounted for"] and summary["every prediction is a label"]
    assert summary["accuracy"] == 0.6667 and summary["per label"]["A"]["support"] == 3
    assert summary["confidence"]["rows with a confidence"] == 2 and summary["confidence"]["share under 0.5"] == 0.5
    assert not report.summary(written(answered, errors(REJECTED), 6), answer="label", labels=LABELS)["all rows accounted for"]
    uncounted = report.summary(written(answered, errors(), None), answer="label", labels=LABELS)
    assert uncounted["rows read"].startswith("not counted") and not uncounted["all rows accounted for"]
    twice = pd.concat([answered, answered.head(1)])
    assert not report.summary(written(twice, errors(), 4), answer="label", labels=LABELS)["all rows accounted for"]
    same = report.summary(written(twice, errors(), 4), answer="label", labels=LABELS, ids_from_content=True)
    assert same["all rows accounted for"] and same["rows identical to another (ids from content)"] == 1
    assert report.summary(written(answered.assign(label="Z"), errors(), 3), answer="label", labels=LABELS)[
        "predictions outside the labels"] == ["Z"]


def test_a_resumed_runs_rows_read_include_what_the_interrupted_run_wrote():
    answered = pd.DataFrame({"row_id": list("abcd"), "caption": ["x", "y", "", "z"]})
    summary = report.summary(written(answered, errors(REJECTED), 3, before=2), answer="caption")
    assert summary["images read"] == 5 and summary["all images accounted for"] and summary["empty captions"] == 1
    assert summary["every rejected image has a reason"]


def test_the_checked_cell_fails_on_no_rows_and_on_an_engine_that_died_after_its_first_batch():
    answered = pd.DataFrame({"row_id": ["a"], "label": ["A"]})
    died = report.summary(written(answered, errors(*[ENGINE] * 9), 10), answer="label", labels=LABELS)
    with pytest.raises(report.RunCheckError, match="the model answered .*engine errors 9"):
        report.require(died)
    none = report.summary(written(answered.head(0), errors(), 0), answer="label", labels=LABELS)
    with pytest.raises(report.RunCheckError, match="at least one row read"):
        report.require(none)
    fine = report.summary(written(answered, errors(ENGINE), 2), answer="label", labels=LABELS)
    shown = report.require(fine, counts=True)
    assert shown.splitlines()[0] == "rows read:                   2" and "the model answered:          True" in shown


def test_the_results_section_writes_its_charts_and_review_through_the_run(tmp_path):
    names: list[str] = []
    run = SimpleNamespace(plan=SimpleNamespace(model_source="m"), path=lambda name: names.append(name) or tmp_path / name)
    predictions = pd.DataFrame({"label": ["A", "B", "A", "C"], "truth": ["A", "A", "A", "C"],
                                "confidence": [0.9, 0.3, 0.6, None]})
    from helpers import labels

    tables = labels.evaluate(predictions, run, LABELS, answer="label", truth="truth", review_below=0.5)
    assert names == ["label_counts.png", "confusion_matrix.png", "reliability.png", "review.parquet"]
    assert all((tmp_path / n).stat().st_size > 0 for n in names)
    assert list(tables) == ["per label", "confusion matrix", "accuracy by confidence", "to review"]
    assert len(tables["to review"]) == 1
    names.clear()
    assert list(labels.evaluate(predictions.drop(columns="confidence"), run, LABELS, answer="label", truth=None)) == []
    assert names == ["label_counts.png"]
