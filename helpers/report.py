"""Results a person reads: accuracy, per-label breakdowns, charts and throughput."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd


def per_label_table(truth: pd.Series, predicted: pd.Series, labels: Sequence[str]) -> pd.DataFrame:
    """Support, correct answers, precision and recall for each label (plus an overall row)."""
    truth, predicted = truth.reset_index(drop=True), predicted.reset_index(drop=True)
    rows = []
    for label in labels:
        is_true, is_pred = truth == label, predicted == label
        hits = int((is_true & is_pred).sum())
        rows.append({
            "label": label,
            "support": int(is_true.sum()),
            "predicted": int(is_pred.sum()),
            "correct": hits,
            "precision": hits / int(is_pred.sum()) if is_pred.any() else float("nan"),
            "recall": hits / int(is_true.sum()) if is_true.any() else float("nan"),
        })
    table = pd.DataFrame(rows).set_index("label")
    total = len(truth)
    correct = int((truth == predicted).sum())
    table.loc["all"] = [total, total, correct, float("nan"), correct / total if total else float("nan")]
    return table


def confusion_matrix(truth: pd.Series, predicted: pd.Series, labels: Sequence[str]) -> pd.DataFrame:
    """Counts of (true label, predicted label), rows = truth, columns = prediction, in label order."""
    cm = pd.crosstab(pd.Categorical(truth, categories=labels), pd.Categorical(predicted, categories=labels),
                     dropna=False)
    cm.index.name, cm.columns.name = "true", "predicted"
    return cm.astype(int)


def plot_confusion_matrix(cm: pd.DataFrame, path: Path | None = None, title: str = "Confusion matrix"):
    """Draw ``cm`` as a heat map with the counts written in; save to ``path`` if given."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6))
    ax.imshow(cm.values, cmap="Blues")
    ax.set_xticks(range(len(cm.columns)), cm.columns, rotation=45, ha="right")
    ax.set_yticks(range(len(cm.index)), cm.index)
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    peak = cm.values.max() if cm.size else 0
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            value = cm.values[i, j]
            if value:
                ax.text(j, i, str(value), ha="center", va="center",
                        color="white" if value > peak / 2 else "black", fontsize=9)
    ax.set_title(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_label_counts(predicted: pd.Series, labels: Sequence[str], truth: pd.Series | None = None,
                      path: Path | None = None):
    """Bar chart of how often each label was predicted (and, if given, how often it is true)."""
    import matplotlib.pyplot as plt

    counts = pd.DataFrame({"predicted": predicted.value_counts().reindex(labels, fill_value=0)})
    if truth is not None:
        counts["true"] = truth.value_counts().reindex(labels, fill_value=0)
    ax = counts.plot.barh(figsize=(7, 4.5))
    ax.invert_yaxis()
    ax.set_xlabel("rows")
    ax.set_ylabel("label")
    ax.set_title("Labels: predicted" + (" vs true" if truth is not None else ""))
    fig = ax.get_figure()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def throughput(rows: int, seconds: float, input_tokens: int, output_tokens: int) -> pd.Series:
    """Rows per second and tokens per row and in total, as a small table."""
    return pd.Series({
        "rows": rows,
        "wall time (s)": round(seconds, 1),
        "rows/s": round(rows / seconds, 2) if seconds else float("nan"),
        "input tokens (total)": input_tokens,
        "output tokens (total)": output_tokens,
        "input tokens/row": round(input_tokens / rows, 1) if rows else float("nan"),
        "output tokens/row": round(output_tokens / rows, 2) if rows else float("nan"),
        "output tokens/s": round(output_tokens / seconds, 1) if seconds else float("nan"),
    })


def _error_counts(errors: pd.DataFrame) -> tuple[int, int]:
    """(rows rejected before the model, rows that failed in the engine) in an errors table."""
    stages = errors["stage"].value_counts() if "stage" in errors else pd.Series(dtype=int)
    return int(stages.get("rejected before the model", 0)), int(stages.get("engine", 0))


def run_summary(*, rows_read: int, predictions: pd.DataFrame, errors: pd.DataFrame,
                prediction_column: str, labels: Sequence[str]) -> dict:
    """Row accounting for a run: every row read is classified, rejected or errored, exactly once."""
    rejected, engine_errors = _error_counts(errors)
    unknown = sorted(set(predictions[prediction_column]) - set(labels)) if len(predictions) else []
    return {
        "rows read": int(rows_read),
        "rejected before the model": rejected,
        "sent to the model": len(predictions) + engine_errors,
        "classified": len(predictions),
        "engine errors": engine_errors,
        "all rows accounted for": len(predictions) + rejected + engine_errors == rows_read,
        "every prediction is a label": not unknown,
        "predictions outside the labels": unknown,
    }


def caption_summary(*, rows_read: int, captions: pd.DataFrame, errors: pd.DataFrame) -> dict:
    """Row accounting for a captioning run: every image is captioned, rejected or errored, exactly once."""
    rejected, engine_errors = _error_counts(errors)
    ids = pd.concat([captions.get("row_id", pd.Series(dtype=str)), errors.get("row_id", pd.Series(dtype=str))])
    return {
        "images read": int(rows_read),
        "captioned": len(captions),
        "rejected before the model": rejected,
        "engine errors": engine_errors,
        "captioned + rejected + errors": len(captions) + rejected + engine_errors,
        "all images accounted for": len(captions) + rejected + engine_errors == rows_read and ids.is_unique,
        "empty captions": int((captions["caption"] == "").sum()) if len(captions) else 0,
    }


def format_summary(summary: dict) -> str:
    """One ``name: value`` line per entry, aligned, for a stable printed summary."""
    width = max(len(k) for k in summary)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in summary.items())


def plot_image_grid(items: Sequence[tuple[object, str, str]], path: Path | None = None, columns: int = 4,
                    wrap: int = 32):
    """A grid of images, each with a bold title and a wrapped caption under it.

    ``items`` holds ``(image, title, caption)``; the image is an array or a Pillow image.
    """
    import textwrap

    import matplotlib.pyplot as plt
    import numpy as np

    rows = max(1, -(-len(items) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 4.0 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (image, title, caption) in zip(axes.flat, items):
        ax.imshow(np.asarray(image))
        # Untrained models emit arbitrary bytes: show unprintable characters as a middle dot.
        caption = "".join(ch if ch.isprintable() else "·" for ch in caption)
        short = caption if len(caption) <= 4 * wrap else caption[: 4 * wrap - 1] + "…"
        ax.set_title(title, fontsize=9, fontweight="bold")
        ax.text(0.5, -0.04, "\n".join(textwrap.wrap(short, wrap)) or "(empty)", transform=ax.transAxes,
                ha="center", va="top", fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
