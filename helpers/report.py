"""Results a person reads: accuracy, per-label breakdowns, charts, and the run's summary with its checks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from helpers.errors import Explained


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


def _error_counts(errors: pd.DataFrame) -> tuple[int, int, int]:
    """Rows rejected before the model, failed in the engine, failed in ``postprocess``."""
    stages = errors["stage"].value_counts() if "stage" in errors else pd.Series(dtype=int)
    return (int(stages.get("rejected before the model", 0)), int(stages.get("engine", 0)),
            int(stages.get("postprocess", 0)))


#: "the model answered" holds while at most this share of the rows sent (or one row) came back as engine errors.
MAX_ENGINE_ERROR_SHARE = 0.1


def _accounting(result, answered: int, errors: pd.DataFrame, what: str, ids_from_content: bool) -> dict:
    """The counts every run shares, and the checks behind "all ... accounted for".

    Every row read is answered, rejected or failed, once: the counts must add up to the rows read,
    and the row ids must be unique, except where ids are hashes of the rows' content
    (``ids_from_content``: identical rows share one, and are each answered). Such runs never
    resume, so the counts alone show a row written twice or lost."""
    rejected, engine_errors, postprocess_errors = _error_counts(errors)
    failed = engine_errors + postprocess_errors
    ids = pd.concat([result.answered.get("row_id", pd.Series(dtype=str)), errors.get("row_id", pd.Series(dtype=str))])
    read = result.rows_read
    unique = bool(ids.is_unique)
    counts_add_up = read is not None and answered + rejected + failed == read
    sent = None if read is None else read - rejected
    return {
        f"{what} read": read if read is not None else "not counted (Ray gave no count of the rows entering)",
        "rejected before the model": rejected,
        "engine errors": engine_errors,
        "postprocess errors": postprocess_errors,
        f"all {what} accounted for": counts_add_up and (unique or ids_from_content),
        "row ids unique": unique,
        **({f"{what} identical to another (ids from content)": int(ids.duplicated().sum())}
           if ids_from_content and not unique else {}),
        f"at least one {what[:-1]} read": bool(read),
        # Every row sent came back (the counts) and most were answered: an engine that dies after
        # its first batch returns the rest as engine errors, and that is not a good run.
        "the model answered": answered > 0 and engine_errors <= max(1, MAX_ENGINE_ERROR_SHARE * (sent or 0)),
    }


def run_summary(result, *, prediction_column: str, labels: Sequence[str], ids_from_content: bool = False) -> dict:
    """Row accounting for a classification run (a :class:`helpers.pipeline.RunResult`): every row
    read (counted by Ray where rows enter the pipeline) is classified, rejected or errored, once.
    ``ids_from_content``: the row ids are content hashes (``ID_COLUMN=None``), shared by identical rows."""
    predictions = result.answered
    base = _accounting(result, len(predictions), result.errors, "rows", ids_from_content)
    unknown = sorted(set(predictions[prediction_column]) - set(labels)) if len(predictions) else []
    return {
        "rows read": base["rows read"],
        "rejected before the model": base["rejected before the model"],
        "classified": len(predictions),
        "engine errors": base["engine errors"],
        **({"postprocess errors": base["postprocess errors"]} if base["postprocess errors"] else {}),
        "at least one row read": base["at least one row read"],
        "all rows accounted for": base["all rows accounted for"],
        "row ids unique": base["row ids unique"],
        **{k: v for k, v in base.items() if k.endswith("(ids from content)")},
        "the model answered": base["the model answered"],
        "every prediction is a label": not unknown,
        "predictions outside the labels": unknown,
    }


def caption_summary(result) -> dict:
    """Row accounting for a captioning run: every image read is captioned, rejected or errored, once
    (every reader gives each row an id of its own, identical images included)."""
    captions = result.answered
    base = _accounting(result, len(captions), result.errors, "images", ids_from_content=False)
    return {
        "images read": base["images read"],
        "captioned": len(captions),
        "rejected before the model": base["rejected before the model"],
        "engine errors": base["engine errors"],
        **({"postprocess errors": base["postprocess errors"]} if base["postprocess errors"] else {}),
        "at least one image read": base["at least one image read"],
        "all images accounted for": base["all images accounted for"],
        "row ids unique": base["row ids unique"],
        **{k: v for k, v in base.items() if k.endswith("(ids from content)")},
        "the model answered": base["the model answered"],
        "every rejected image has a reason": bool(result.errors["reason"].astype(str).str.len().gt(0).all())
        if len(result.errors) else True,
        "empty captions": int((captions["caption"] == "").sum()) if len(captions) else 0,
    }


#: summary.json's count of rows that entered the processor in this run (after LIMIT, without rows
#: an interrupted run finished), from Ray's statistics.
ENTERED_NOW = "rows entering the pipeline in this run (Ray's count)"

#: Summary entries that hold whatever the data, labels or model (what a project's checked cell prints).
#: ("row ids unique" is not one: ids hashed from content are shared by identical rows; where ids must
#: be unique, "accounted for" requires it.)
INVARIANTS = ("at least one row read", "at least one image read", "all rows accounted for", "all images accounted for",
              "the model answered", "every prediction is a label", "every rejected image has a reason")
#: The counts a run on known data can pin (the bundled sample's, in the notebooks' checked cell).
COUNTS = ("rows read", "images read", "rejected before the model", "classified", "captioned", "engine errors",
          "postprocess errors")


def invariants(summary: dict) -> dict:
    """The entries of ``summary`` that must be True for any data, labels and model."""
    return {k: v for k, v in summary.items() if k in INVARIANTS}


class RunCheckError(Explained, AssertionError):
    """A finished run broke what must hold for any data and model; the message names each check."""


def require(summary: dict, *, counts: bool = False) -> dict:
    """The checks a run must pass (:func:`invariants`), and with ``counts`` its row counts (for known
    data, whose counts the checked cell's saved output pins); raise :class:`RunCheckError` naming
    every check that failed, with the numbers behind it."""
    checks = invariants(summary)
    failed = [k for k, v in checks.items() if v is not True]
    if failed:
        numbers = ", ".join(f"{k} {summary[k]}" for k in COUNTS if k in summary)
        raise RunCheckError(f"this run failed its checks: {', '.join(failed)} ({numbers}). The errors table says why "
                            f"rows failed; at most {MAX_ENGINE_ERROR_SHARE:.0%} of the rows sent (or one) may be engine errors.")
    return {**({k: summary[k] for k in COUNTS if k in summary} if counts else {}), **checks}


def save_summary(result, summary: dict, **extra) -> Path:
    """Write ``summary`` to ``summary.json`` in the output folder, with this run's timings and
    counts and any ``extra`` entries; return the file. Refused (:class:`helpers.outputs.ResultsMovedError`)
    when a later run has since moved this run's results aside: a summary never describes files
    that are not there."""
    import json

    if getattr(result, "run", None) is not None:
        result.run.check_current()
    t = result.throughput
    record = {**summary, ENTERED_NOW: result.rows_entered_now,
              "rows written in this run": result.rows_written_now, "pipeline seconds": round(t.seconds, 2),
              "rows/s end to end": round(t.end_to_end, 3),
              # JSON has no NaN: a steady state that was not measured is null, and the basis says why.
              "rows/s steady state": None if math.isnan(t.steady) else round(t.steady, 3),
              "steady state": t.steady_basis, **extra}
    path = result.root / "summary.json"
    path.write_text(json.dumps(record, indent=2, default=str))
    return path


def evaluation(truth: pd.Series, predicted: pd.Series, labels: Sequence[str]) -> dict:
    """Accuracy and the per-label table as plain JSON for ``summary.json`` (what the report shows)."""
    table = per_label_table(truth, predicted, labels)
    per_label = {label: {k: (None if isinstance(v, float) and math.isnan(v) else round(float(v), 4) if isinstance(v, float)
                             else int(v)) for k, v in row.items()} for label, row in table.iterrows()}
    accuracy = table.loc["all", "recall"]
    return {"accuracy": None if math.isnan(accuracy) else round(float(accuracy), 4), "per label": per_label}


def format_summary(summary: dict) -> str:
    """One ``name: value`` line per entry, aligned, for a stable printed summary."""
    width = max(len(k) for k in summary)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in summary.items())


def _drawable_characters():
    """A test for whether the charts' font has a glyph for a character (else it draws a box: tofu)."""
    from functools import lru_cache

    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    font = FT2Font(font_manager.findfont(font_manager.FontProperties()))

    @lru_cache(maxsize=None)
    def has(ch: str) -> bool:
        return ch.isprintable() and font.get_char_index(ord(ch)) != 0

    return has


def readable_caption(caption: str, drawable=None) -> str:
    """``caption`` as the chart can draw it. An untrained model (the offline one) emits arbitrary
    tokens: characters no installed font has, and U+FFFD for broken bytes, which drew as boxes
    and read as an encoding bug. Such characters become a middle dot; a caption made mostly of them
    is replaced by a note saying so."""
    drawable = drawable or _drawable_characters()
    shown = "".join(ch if ch != "\ufffd" and drawable(ch) else "·" for ch in caption)
    if caption and shown.count("·") > len(caption) / 2:
        return f"({len(caption)} characters, most without a glyph in the chart's font: see the captions table)"
    return shown


def plot_image_grid(items: Sequence[tuple[object, str, str]], path: Path | None = None, columns: int = 4,
                    wrap: int = 32):
    """A grid of images, each with a bold title and a wrapped caption under it.

    ``items`` holds ``(image, title, caption)``; the image is an array or a Pillow image.
    """
    import textwrap
    import warnings

    import matplotlib.pyplot as plt
    import numpy as np

    # Characters without a glyph are replaced (readable_caption); any left would warn once per glyph.
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)

    rows = max(1, -(-len(items) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 4.0 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    drawable = _drawable_characters()
    for ax, (image, title, caption) in zip(axes.flat, items):
        ax.imshow(np.asarray(image))
        caption = readable_caption(caption, drawable)
        short = caption if len(caption) <= 4 * wrap else caption[: 4 * wrap - 1] + "…"
        # Captions and file names are shown as written: "$...$" in them is text, not math.
        ax.set_title(title, fontsize=9, fontweight="bold", parse_math=False)
        ax.text(0.5, -0.04, "\n".join(textwrap.wrap(short, wrap)) or "(empty)", transform=ax.transAxes,
                ha="center", va="top", fontsize=8, parse_math=False)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
