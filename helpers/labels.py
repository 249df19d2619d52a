"""The answers a classifier may give: the prompt's parameters checked, the longest label's token budget,
and each answer's confidence among the labels from the engine's own log-probabilities.

What vLLM returns: with ``logprobs=k``, each generated token's log-probability and the ``k`` likeliest
others. vLLM 0.29 applies the structured-output mask before its sampler computes them, so each step's
distribution is over the tokens the labels allow, at temperature 1 whatever ``TEMPERATURE`` samples.
Each token's text comes from :func:`pieces`: the notebook asks vLLM not to decode the ``k`` candidates
of every token (``"detokenize": False``; Ray's stage decodes the answer), CPU time per row on a GPU.

A label's probability is the sum over its spellings of the product of its tokens' probabilities, end
token included. Walking the answer, each other token at step ``t`` starts a branch of probability
``P(answer's first t tokens) * p(token)`` that belongs to the one label its text can still become:
the chosen label's mass and every label that leaves the answer's path are exact. A branch several
labels share beyond it, and tokens outside the top ``k``, are ``confidence_unresolved``."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from helpers.parameters import flag, number_in, raise_if, text

TOP_LOGPROBS = 20  # vLLM's default max_logprobs
CONFIDENCE, RUNNER_UP, RUNNER_UP_CONFIDENCE, UNRESOLVED = "confidence", "runner_up", "runner_up_confidence", "confidence_unresolved"


def check_prompt(labels: Any, task: Any, user_template: Any, temperature: Any, confidence: Any, review_below: Any) -> None:
    """``LABELS``, ``TASK``, ``USER_TEMPLATE``, ``TEMPERATURE``, ``CONFIDENCE``, ``REVIEW_BELOW``: raise listing every problem."""
    found = []
    if not (isinstance(labels, (list, tuple)) and len(labels) >= 2 and all(isinstance(x, str) and x.strip() for x in labels)):
        found.append(f"LABELS must be a list of at least two non-empty strings, got {labels!r}")
    elif len(set(labels)) != len(labels):
        found.append(f"LABELS has duplicates: {sorted({x for x in labels if list(labels).count(x) > 1})}")
    found += text("TASK", task)
    if not isinstance(user_template, str) or "{text}" not in user_template:
        found.append(f"USER_TEMPLATE must contain '{{text}}', got {user_template!r}")
    found += number_in("TEMPERATURE", temperature, 0, 2) + flag("CONFIDENCE", confidence)
    if review_below is not None:
        found += number_in("REVIEW_BELOW", review_below, 1e-9, 1)
        if confidence is False:
            found.append("REVIEW_BELOW needs CONFIDENCE = True: without it no row has a confidence")
    raise_if(found)


def _tokenizer(plan: Any) -> Any:
    """A plan's tokenizer (or ``plan``, a tokenizer already). Imported here: Ray's workers import this module
    with your ``postprocess`` and never need the planner (with it, cluster and engines) to read an answer."""
    from helpers.plans import tokenizer

    return tokenizer(plan) if hasattr(plan, "model_path") else plan


def max_tokens(plan: Any, labels: Sequence[str]) -> int:
    """Tokens the longest answer can take in the model's tokenizer: under a grammar the model may spell a
    label in finer pieces than the tokenizer's own (one token per character), so each label is counted
    both ways, plus the end-of-sequence token. Too few, and answers come back cut ("Manufacturi")."""
    encode = functools.partial(_tokenizer(plan).encode, add_special_tokens=False)
    return max(max(len(encode(label)), sum(len(encode(ch)) for ch in label)) for label in labels) + 1


def pieces(plan: Any, labels: Sequence[str]) -> dict[int, str]:
    """Each token a label can be spelled with, and its text; the special ones (the answer's end) "": the
    only tokens the structured-output mask allows (one pass over the vocabulary, ~1 s for 128,000)."""
    tokenizer = _tokenizer(plan)
    raw = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    # A SentencePiece token decoded alone loses its leading spaces ("▁Estate" -> "Estate"): put back, as vLLM does.
    texts = [" " * max(0, len(r or "") - len((r or "").lstrip("▁")) - len(t) + len(t.lstrip(" "))) + t for r, t in
             zip(raw, tokenizer.batch_decode([[i] for i in range(len(raw))], skip_special_tokens=True))]
    return {i: text for i, text in enumerate(texts) if not text or any(text in label for label in labels)}


def _steps(logprobs, texts: Mapping[int, str]) -> list[dict[int, tuple[float, str | None]]]:
    """Each step's ``{token id: (logprob, its text or None)}`` however Ray carried them (keys, None entries)."""
    steps = []
    for step in logprobs:
        found = {int(token): (entry or {}).get("logprob") for token, entry in dict(step).items()}
        steps.append({t: (float(lp), texts.get(t)) for t, lp in found.items()  # -inf: a masked token, probability 0
                      if lp is not None and not math.isnan(lp) and lp != -math.inf})
    return steps


def branches(tokens: Sequence[int], logprobs, labels: Sequence[str], texts: Mapping[int, str]) -> tuple[list, str | None]:
    """The answer's branches: each other token's text, its whole probability and the one label it can still
    become (None: several, none, or a token outside ``texts``), its own path last; and the label it spelled."""
    found: list[tuple[str, float, str | None]] = []
    path, prefix, chosen = 0.0, "", None
    for token, step in zip(tokens, _steps(logprobs, texts)):
        if step.get(int(token), (0, None))[1] is None:
            return found, None  # the answer's own token missing or unknown: nothing to say
        for other, (lp, piece) in step.items():
            if other != int(token):
                candidates = [label for label in labels if piece and label.startswith(prefix + piece)]
                ended = piece is not None and not candidates and prefix in labels  # a stop token after a label
                owner = candidates[0] if len(candidates) == 1 else prefix if ended else None
                found.append((prefix + (piece or ""), math.exp(path + lp), owner))
        lp, piece = step[int(token)]
        path += lp
        if prefix in labels and not (piece and any(label.startswith(prefix + piece) for label in labels)):
            chosen = prefix  # the answer's stop token
            break
        prefix += piece
    if chosen is None and prefix in labels and not any(label != prefix and label.startswith(prefix) for label in labels):
        chosen = prefix  # no stop token returned: the mask forces one after a label nothing extends
    if chosen is not None:
        found.append((chosen, math.exp(path), chosen))
    return found, chosen


def label_probabilities(tokens: Sequence[int], logprobs, labels: Sequence[str], texts: Mapping[int, str]) -> tuple:
    """Each label's probability, the mass not resolved to one label, and the label the answer spelled."""
    mass = dict.fromkeys(labels, 0.0)
    found, chosen = branches(tokens, logprobs, labels, texts)
    for _, p, owner in found if chosen is not None else []:
        if owner is not None:
            mass[owner] += p
    return mass, max(0.0, 1.0 - sum(mass.values())), chosen


def confidence(row: Mapping[str, Any], labels: Sequence[str], texts: Mapping[int, str]) -> dict[str, Any]:
    """An answered row's confidence columns for ``postprocess`` (``texts``: :func:`pieces`): the chosen label's
    probability, the runner-up and its, the unresolved mass; None without log-probabilities or a label."""
    none = {CONFIDENCE: None, RUNNER_UP: None, RUNNER_UP_CONFIDENCE: None, UNRESOLVED: None}
    logprobs, tokens = row.get("logprobs"), row.get("generated_tokens")
    if logprobs is None or tokens is None or len(logprobs) == 0:
        return none
    mass, unresolved, chosen = label_probabilities(list(tokens), list(logprobs), labels, texts)
    if chosen is None:
        return none
    second, runner = max(((p, label) for label, p in mass.items() if label != chosen), default=(0.0, None))
    return {CONFIDENCE: mass[chosen], RUNNER_UP: runner if second > 0 else None, RUNNER_UP_CONFIDENCE: second, UNRESOLVED: unresolved}


@dataclass(frozen=True)
class Choices:
    """The labels in the model's tokens: the longest answer's length (:func:`max_tokens`) and, where asked,
    each token a label can be spelled with (:func:`pieces`, read once here) for :func:`confidence`."""

    labels: tuple[str, ...]
    max_tokens: int
    texts: dict[int, str] | None = None

    def confidence(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """An answered row's confidence columns, as ``postprocess`` calls it (the labels' texts travel with it)."""
        if self.texts is None:
            raise ValueError("these choices were made without confidence: labels.choices(plan, LABELS, confidence=True)")
        return confidence(row, self.labels, self.texts)


def choices(plan: Any, labels: Sequence[str], confidence: bool = False) -> Choices:
    """``labels`` in ``plan``'s model's tokens (its tokenizer, read here): what the prompt cell needs."""
    return Choices(tuple(labels), max_tokens(plan, labels), pieces(plan, labels) if confidence else None)


def above_thresholds(truth: pd.Series, predicted: pd.Series, conf: pd.Series,
                     thresholds: Sequence[float] = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)) -> pd.DataFrame:
    """For each threshold, the rows at least that confident: how many, their share and their accuracy."""
    known, rows = conf.notna(), []
    for t in thresholds:
        n = int((kept := known & (conf >= t)).sum())
        rows.append({"confidence at least": t, "rows": n, "share of rows": n / max(int(known.sum()), 1),
                     "accuracy": float((truth[kept] == predicted[kept]).mean()) if n else float("nan")})
    return pd.DataFrame(rows).set_index("confidence at least")


def reliability(truth: pd.Series, predicted: pd.Series, conf: pd.Series, bins: int = 10) -> pd.DataFrame:
    """Accuracy per confidence bin: a calibrated model's accuracy equals its confidence."""
    known = conf.notna()
    grouped = pd.DataFrame({"bin": pd.cut(conf[known].astype(float), np.linspace(0, 1, bins + 1), include_lowest=True),
                            "right": (truth[known] == predicted[known]).astype(float),
                            "confidence": conf[known].astype(float)}).groupby("bin", observed=False)
    return pd.DataFrame({"rows": grouped.size(), "mean confidence": grouped["confidence"].mean(),
                         "accuracy": grouped["right"].mean()})


def plot_reliability(table: pd.DataFrame, path, title: str = "Confidence against accuracy"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5), layout="tight")
    shown = table[table["rows"] > 0]
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="calibrated")
    ax.plot(shown["mean confidence"], shown["accuracy"], marker="o", label="this run")
    for _, row in shown.iterrows():
        ax.annotate(f"{int(row['rows'])}", (row["mean confidence"], row["accuracy"]), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="confidence (mean per bin; rows per bin marked)", ylabel="accuracy", title=title)
    ax.legend(loc="upper left")
    fig.savefig(path, dpi=120)
    return fig


def review(predictions: pd.DataFrame, below: float) -> pd.DataFrame:
    """The rows less confident than ``below``, least confident first (rows without one left out)."""
    conf = predictions.get(CONFIDENCE, pd.Series(index=predictions.index, dtype=float))
    rows = predictions[conf.notna() & (conf.astype(float) < below)]
    return rows.sort_values(CONFIDENCE, kind="stable").reset_index(drop=True)


def confusion_matrix(truth: pd.Series, predicted: pd.Series, labels: Sequence[str]) -> pd.DataFrame:
    """Counts of (true label, predicted label): rows are the truth, columns the prediction."""
    cm = pd.crosstab(pd.Categorical(truth, categories=labels), pd.Categorical(predicted, categories=labels), dropna=False)
    cm.index.name, cm.columns.name = "true", "predicted"
    return cm.astype(int)


def plot_confusion_matrix(cm: pd.DataFrame, path, title: str = "Confusion matrix"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6), layout="tight")
    ax.imshow(cm.values, cmap="Blues")
    ax.set_xticks(range(len(cm.columns)), cm.columns, rotation=45, ha="right")
    ax.set_yticks(range(len(cm.index)), cm.index)
    ax.set(xlabel="predicted label", ylabel="true label", title=title)
    peak = cm.values.max() if cm.size else 0
    for (i, j), value in pd.DataFrame(cm.values).stack().items():
        if value:
            ax.text(j, i, str(value), ha="center", va="center", color="white" if value > peak / 2 else "black", fontsize=9)
    fig.savefig(path, dpi=120)
    return fig


def plot_label_counts(predicted: pd.Series, labels: Sequence[str], truth: pd.Series | None, path):
    counts = pd.DataFrame({"predicted": predicted.value_counts().reindex(labels, fill_value=0)})
    if truth is not None:
        counts["true"] = truth.value_counts().reindex(labels, fill_value=0)
    ax = counts.plot.barh(figsize=(7, 4.5))
    ax.invert_yaxis()
    ax.set(xlabel="rows", ylabel="label", title="Labels: predicted" + (" vs true" if truth is not None else ""))
    fig = ax.get_figure()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return fig


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


def checks(predictions: pd.DataFrame, labels: Sequence[str], *, answer: str, truth: str | None) -> dict[str, Any]:
    """What a classification's summary adds: every answer is a label; with true labels, accuracy per
    label; with confidences, their spread."""
    outside = sorted(set(predictions[answer]) - set(labels)) if len(predictions) else []
    out: dict[str, Any] = {"every prediction is a label": not outside, "predictions outside the labels": outside}
    if truth and len(predictions):
        table = per_label_table(predictions[truth], predictions[answer], labels).astype(object)
        out["accuracy"] = round(float(table.loc["all", "recall"]), 4)
        out["per label"] = {k: {c: (None if pd.isna(v) else round(float(v), 4)) for c, v in row.items()}
                            for k, row in table.iterrows()}
    if CONFIDENCE in predictions:
        conf = predictions[CONFIDENCE].dropna().astype(float)
        out["confidence"] = {"rows with a confidence": len(conf), **({
            "mean": round(float(conf.mean()), 4), **{f"p{round(q * 100)}": round(float(v), 4) for q, v in
                                                     conf.quantile([0.1, 0.25, 0.5, 0.75, 0.9]).items()},
            "share under 0.5": round(float((conf < 0.5).mean()), 4),
            "share under 0.9": round(float((conf < 0.9).mean()), 4)} if len(conf) else {})}
    return out


def evaluate(predictions: pd.DataFrame, run: Any, labels: Sequence[str], *, answer: str, truth: str | None,
             review_below: float | None = None) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """The results section of a classification: the label chart (with the true labels where you have
    them), accuracy per label and the confusion matrix, the confidences against accuracy where the run
    computed them, and the least confident rows (``review.parquet``); every chart and table written
    through ``run``, so the next run moves them aside with the rest; and what the summary checks (:func:`checks`)."""
    truths = predictions[truth] if truth else None
    plot_label_counts(predictions[answer], labels, truths, run.path("label_counts.png"))
    tables: dict[str, pd.DataFrame] = {}
    has_confidence = CONFIDENCE in predictions and predictions[CONFIDENCE].notna().any()
    if truth and len(predictions):
        tables["per label"] = per_label_table(truths, predictions[answer], labels).round(2)
        print(f"accuracy: {tables['per label'].loc['all', 'recall']:.1%} on {len(predictions)} rows "
              f"(chance with {len(labels)} labels: {1 / len(labels):.1%})")
        tables["confusion matrix"] = confusion_matrix(truths, predictions[answer], labels)
        plot_confusion_matrix(tables["confusion matrix"], run.path("confusion_matrix.png"),
                              title=f"{run.plan.model_source}: confusion matrix")
        if has_confidence:
            conf = predictions[CONFIDENCE]
            plot_reliability(reliability(truths, predictions[answer], conf), run.path("reliability.png"),
                             title=f"{run.plan.model_source}: confidence against accuracy")
            tables["accuracy by confidence"] = above_thresholds(truths, predictions[answer], conf).round(3)
    if review_below is not None:
        doubtful = review(predictions, review_below)
        doubtful.to_parquet(run.path("review.parquet"), index=False)
        print(f"review.parquet: {len(doubtful)} rows with a confidence under {review_below}")
        tables["to review"] = doubtful.head(20)
    return tables, checks(predictions, labels, answer=answer, truth=truth)
