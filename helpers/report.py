"""What a person reads after a run: accuracy per label, the confusion matrix and the charts, and the
summary that accounts for every row, with the checks a run must pass whatever its data and model."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from helpers import labels as labels_
from helpers.parameters import Explained
from helpers.pipeline import ENGINE, POSTPROCESS, REJECTED


def per_label_table(truth: pd.Series, predicted: pd.Series, labels: Sequence[str]) -> pd.DataFrame:
    """Support, predictions, correct answers, precision and recall per label, and an overall row."""
    truth, predicted = truth.reset_index(drop=True), predicted.reset_index(drop=True)
    rows = []
    for label in labels:
        is_true, is_pred = truth == label, predicted == label
        hits = int((is_true & is_pred).sum())
        rows.append({"label": label, "support": int(is_true.sum()), "predicted": int(is_pred.sum()), "correct": hits,
                     "precision": hits / is_pred.sum() if is_pred.any() else float("nan"),
                     "recall": hits / is_true.sum() if is_true.any() else float("nan")})
    table = pd.DataFrame(rows).set_index("label")
    correct = int((truth == predicted).sum())
    table.loc["all"] = [len(truth), len(truth), correct, float("nan"), correct / len(truth) if len(truth) else float("nan")]
    return table


def confusion_matrix(truth: pd.Series, predicted: pd.Series, labels: Sequence[str]) -> pd.DataFrame:
    """Counts of (true label, predicted label): rows are the truth, columns the prediction."""
    cm = pd.crosstab(pd.Categorical(truth, categories=labels), pd.Categorical(predicted, categories=labels), dropna=False)
    cm.index.name, cm.columns.name = "true", "predicted"
    return cm.astype(int)


def plot_confusion_matrix(cm: pd.DataFrame, path=None, title: str = "Confusion matrix"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6))
    ax.imshow(cm.values, cmap="Blues")
    ax.set_xticks(range(len(cm.columns)), cm.columns, rotation=45, ha="right")
    ax.set_yticks(range(len(cm.index)), cm.index)
    ax.set(xlabel="predicted label", ylabel="true label", title=title)
    peak = cm.values.max() if cm.size else 0
    for (i, j), value in pd.DataFrame(cm.values).stack().items():
        if value:
            ax.text(j, i, str(value), ha="center", va="center", color="white" if value > peak / 2 else "black", fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_label_counts(predicted: pd.Series, labels: Sequence[str], truth: pd.Series | None = None, path=None):
    counts = pd.DataFrame({"predicted": predicted.value_counts().reindex(labels, fill_value=0)})
    if truth is not None:
        counts["true"] = truth.value_counts().reindex(labels, fill_value=0)
    ax = counts.plot.barh(figsize=(7, 4.5))
    ax.invert_yaxis()
    ax.set(xlabel="rows", ylabel="label", title="Labels: predicted" + (" vs true" if truth is not None else ""))
    fig = ax.get_figure()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def evaluate(predictions: pd.DataFrame, run: Any, labels: Sequence[str], *, answer: str, truth: str | None,
             review_below: float | None = None) -> dict[str, pd.DataFrame]:
    """The results section of a classification: the label chart (with the true labels where you have
    them), accuracy per label and the confusion matrix, the confidences against accuracy where the run
    computed them, and the least confident rows (``review.parquet``); every chart and table written
    through ``run``, so the next run moves them aside with the rest."""
    truths = predictions[truth] if truth else None
    plot_label_counts(predictions[answer], labels, truths, run.path("label_counts.png"))
    tables: dict[str, pd.DataFrame] = {}
    has_confidence = labels_.CONFIDENCE in predictions and predictions[labels_.CONFIDENCE].notna().any()
    if truth and len(predictions):
        tables["per label"] = per_label_table(truths, predictions[answer], labels).round(2)
        print(f"accuracy: {tables['per label'].loc['all', 'recall']:.1%} on {len(predictions)} rows "
              f"(chance with {len(labels)} labels: {1 / len(labels):.1%})")
        tables["confusion matrix"] = confusion_matrix(truths, predictions[answer], labels)
        plot_confusion_matrix(tables["confusion matrix"], run.path("confusion_matrix.png"),
                              title=f"{run.plan.model_source}: confusion matrix")
        if has_confidence:
            conf = predictions[labels_.CONFIDENCE]
            labels_.plot_reliability(labels_.reliability(truths, predictions[answer], conf), run.path("reliability.png"),
                                     title=f"{run.plan.model_source}: confidence against accuracy")
            tables["accuracy by confidence"] = labels_.above_thresholds(truths, predictions[answer], conf).round(3)
    if review_below is not None:
        review = labels_.review(predictions, review_below)
        review.to_parquet(run.path("review.parquet"), index=False)
        print(f"review.parquet: {len(review)} rows with a confidence under {review_below}")
        tables["to review"] = review.head(20)
    return tables


MAX_ENGINE_ERRORS = 0.1  # "the model answered" holds while at most this share of the rows sent (or one) failed there
#: Entries that hold whatever the data, labels or model: what the checked cell prints.
INVARIANTS = ("at least one row read", "at least one image read", "all rows accounted for", "all images accounted for",
              "the model answered", "every prediction is a label", "every rejected image has a reason")
COUNTS = ("rows read", "images read", "rejected before the model", "classified", "captioned", "engine errors",
          "postprocess errors")


def summary(written: Any, *, answer: str, labels: Sequence[str] | None = None, truth: str | None = None,
            ids_from_content: bool = False) -> dict:
    """Row accounting: every row read (counted by Ray where rows enter the processor, resumed rows
    added) is answered, rejected before the model, or failed, exactly once; with ``labels`` (a
    classification) every answer is one of them, else (captions) every reject has a reason. Identical
    rows share an id where ids come from content (``ids_from_content``), and are each answered."""
    what = "rows" if labels is not None else "images"
    answered, errors = written.answered, written.errors
    stages = errors["stage"].value_counts() if "stage" in errors else pd.Series(dtype=int)
    rejected, engine, post = (int(stages.get(s, 0)) for s in (REJECTED, ENGINE, POSTPROCESS))
    ids = pd.concat([answered.get("row_id", pd.Series(dtype=str)), errors.get("row_id", pd.Series(dtype=str))])
    read = written.rows_read
    sent = (read or 0) - rejected
    out = {f"{what} read": read if read is not None else "not counted (Ray gave no count of the rows entering)",
           "rejected before the model": rejected, "classified" if labels is not None else "captioned": len(answered),
           "engine errors": engine, **({"postprocess errors": post} if post else {}),
           f"at least one {what[:-1]} read": bool(read),
           f"all {what} accounted for": read is not None and len(answered) + rejected + engine + post == read
           and (bool(ids.is_unique) or ids_from_content),
           "row ids unique": bool(ids.is_unique),
           **({f"{what} identical to another (ids from content)": int(ids.duplicated().sum())}
              if ids_from_content and not ids.is_unique else {}),
           "the model answered": len(answered) > 0 and engine <= max(1, MAX_ENGINE_ERRORS * sent)}
    if labels is not None:
        outside = sorted(set(answered[answer]) - set(labels)) if len(answered) else []
        out.update({"every prediction is a label": not outside, "predictions outside the labels": outside})
        if truth and len(answered):
            table = per_label_table(answered[truth], answered[answer], labels).astype(object)
            out["accuracy"] = round(float(table.loc["all", "recall"]), 4)
            out["per label"] = {k: {c: (None if pd.isna(v) else round(float(v), 4)) for c, v in row.items()}
                                for k, row in table.iterrows()}
        if labels_.CONFIDENCE in answered:
            out["confidence"] = labels_.distribution(answered)
    else:
        out.update({"every rejected image has a reason": bool(errors["reason"].astype(str).str.len().gt(0).all()) if len(errors) else True,
                    "empty captions": int((answered[answer] == "").sum()) if len(answered) else 0})
    return out


def save(written: Any, *, whole_input: int | None = None, **how: Any) -> dict:
    """The run's summary (:func:`summary` with ``how``) written to ``summary.json`` with this run's timings
    and what the whole input would take, then the results copied to a bucket where ``OUTPUT_DIR`` is one;
    printed, and returned. Refused once a later run has moved this run's results aside."""
    summary_ = summary(written, **how)
    table = written.throughput(whole_input)[0]["value"]
    record = {**summary_, "run": "resuming an interrupted run" if written.run.resuming else "starting fresh",
              "rows entering the pipeline in this run (Ray's count)": written.rows_entered,
              "rows written in this run": written.rows_written, "pipeline seconds": round(written.seconds, 2),
              "rows/s end to end": round(written.rows_written / written.seconds, 3) if written.seconds else None,
              "rows/s steady state": None if math.isnan(written.steady) else round(written.steady, 3),
              "steady state": written.steady_basis,
              **{k: v for k, v in table.items() if k.startswith("whole input")}}
    written.run.path("summary.json").write_text(json.dumps(record, indent=2, default=str))
    print(format_summary({k: v for k, v in summary_.items() if not isinstance(v, dict)}))
    print(written.run.publish())
    return summary_


class RunCheckError(Explained, AssertionError):
    """A finished run broke what must hold for any data and model."""


def require(summary: dict, *, counts: bool = False) -> str:
    """The invariants (and with ``counts`` the row counts, for known data), one a line; raise naming
    each one that failed."""
    checks = {k: v for k, v in summary.items() if k in INVARIANTS}
    failed = [k for k, v in checks.items() if v is not True]
    if failed:
        numbers = ", ".join(f"{k} {summary[k]}" for k in COUNTS if k in summary)
        raise RunCheckError(f"this run failed its checks: {', '.join(failed)} ({numbers}). The errors table says why rows "
                            f"failed; at most {MAX_ENGINE_ERRORS:.0%} of the rows sent (or one) may be engine errors.")
    return format_summary({**({k: summary[k] for k in COUNTS if k in summary} if counts else {}), **checks})


def format_summary(summary: dict) -> str:
    width = max(len(k) for k in summary)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in summary.items())
