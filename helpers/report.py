"""What a person reads after a run: accuracy per label, the confusion matrix and the charts, and the
summary that accounts for every row, with the checks a run must pass whatever its data and model."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

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
        if "confidence" in answered:  # the answers' confidence among the labels (helpers.labels)
            conf = answered["confidence"].dropna().astype(float)
            out["confidence"] = {"rows with a confidence": len(conf), **({
                "mean": round(float(conf.mean()), 4), **{f"p{round(q * 100)}": round(float(v), 4) for q, v in
                                                         conf.quantile([0.1, 0.25, 0.5, 0.75, 0.9]).items()},
                "share under 0.5": round(float((conf < 0.5).mean()), 4),
                "share under 0.9": round(float((conf < 0.9).mean()), 4)} if len(conf) else {})}
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
